#!/usr/bin/env bash
# Seamless driver upgrade on the real node (KEP-4381, the kubelet plugin library's RollingUpdate
# mode) as users do it: the driver image installed by the Helm chart (e2e/chart.sh,
# `seamlessUpgrade: true`, its default), then `helm upgrade` to a new image tag while pods keep
# arriving. The DaemonSet starts the new pod beside the old one (maxSurge 1), each with its own
# sockets; the kubelet registers both; the old pod goes once the new one is Ready.
# Nothing may fail in between: every pod runs, no prepare fails, and the new instance unprepares
# what the old one prepared (CDI specs removed, MIG instances destroyed).
set -euo pipefail
E2E=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$E2E")
NAME=rolling-update
WORK=$(mktemp -d "/tmp/gpu-dra-$NAME.XXXXXX")
export GPU_DRA_CLUSTER_DIR=$WORK/cluster
# shellcheck source=chart.sh
source "$E2E/chart.sh"
ARCHIVER=
passed=0

log() { echo "$NAME: $*" >&2; }
fail() {
    log "FAIL: $*"
    if [[ -n ${E2E_POD_LOGS:-} ]]; then
        log "driver pods' logs:"
        driver_logs | grep -E "WARN|ERROR|unprepared|prepared claim" | tail -n 25 | cut -c1-400 >&2
    fi
    echo "$passed passed, 1 failed"
    exit 1
}
ok() { passed=$((passed + 1)); log "ok - $*"; }
cleanup() {
    [[ -z $ARCHIVER ]] || kill "$ARCHIVER" 2>/dev/null || true
    "$E2E/cluster" down >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
wait_for() { # description, timeout seconds, command...
    local what=$1 timeout=$2
    shift 2
    local deadline=$((SECONDS + timeout))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || fail "timed out after ${timeout}s waiting for: $what"
        sleep 0.3
    done
}

chart_build_images
"$E2E/cluster" up --real-node --no-driver --service-network --gpus sim:2xH100-SXM5-80GB >&2 \
    || fail "the real-node cluster did not start"
eval "$("$E2E/cluster" env)"
export PATH=$GPU_DRA_K8S_BIN:$PATH
LOGS=$GPU_DRA_CLUSTER_DIR/logs
REGISTRY=$E2E_KUBELET_ROOT/plugins_registry
chart_import_images
chart_install "$FIRST_REF"
OLD_POD=$(driver_ready) || fail "no ready driver pod after helm install"
mig_instances() {
    "$E2E_GPU_DRA" sim --gpus "$E2E_GPUS" --node-name "$E2E_NODE" --sim-state "$GPU_DRA_SIM_STATE" show \
        | jq '[.gpus[].gpu_instances[]] | length'
}

reg_sockets() { find "$REGISTRY" -maxdepth 1 -type s -name '*-reg.sock' -printf '%f\n' | sort; }
wait_for "the driver pod's registration socket" 30 bash -c "[[ -n \$(find '$REGISTRY' -maxdepth 1 -type s -name '*-reg.sock') ]]"
OLD_SOCKET=$(reg_sockets)
[[ $(wc -l <<<"$OLD_SOCKET") == 1 && $OLD_SOCKET != gpu.nvidia.com-reg.sock ]] \
    || fail "the old instance should have one per-instance registration socket: $OLD_SOCKET"
ok "driver pod $OLD_POD ($FIRST_REF) registered on its own socket ($OLD_SOCKET)"

kubectl apply -f - >/dev/null <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: one-slice, namespace: default}
spec:
  spec:
    devices:
      requests:
      - name: mig
        exactly:
          deviceClassName: mig.nvidia.com
          selectors:
          - cel: {expression: "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"}
EOF

pod() { # NAME
    kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default, labels: {app: rolling}}
spec:
  nodeSelector: {kubernetes.io/hostname: $E2E_NODE}
  terminationGracePeriodSeconds: 0
  containers:
  - name: c
    image: $E2E_IMAGE
    imagePullPolicy: Never
    command: [sh, -c, 'echo "\$NVIDIA_VISIBLE_DEVICES"; sleep 3600']
    resources: {claims: [{name: mig}]}
  resourceClaims:
  - {name: mig, resourceClaimTemplateName: one-slice}
EOF
}

# Pods arrive every half second across the switch, and two more once the old instance is gone
# (at most 12: two H100s hold 14 1g.10gb slices).
(
    n=0 after=0
    # At most 14: the 1g.10gb slices two H100s have.
    while ((n < 14 && after < 2)); do
        n=$((n + 1))
        pod "p$n"
        echo "p$n" >>"$WORK/pods"
        [[ -e $WORK/old-stopped ]] && after=$((after + 1))
        sleep 1
    done
) &
ARRIVALS=$!

# The kubelet removes a pod's logs with the pod: keep copies while the DaemonSet rolls, and
# record every registration socket seen.
(
    while true; do
        driver_logs_archive
        reg_sockets >>"$WORK/sockets-seen"
        sleep 0.2
    done
) &
ARCHIVER=$!

sleep 1.5
chart_upgrade "$SECOND_REF"
wait_for "the old driver pod $OLD_POD gone" 60 bash -c "! kubectl -n $CHART_NAMESPACE get pod $OLD_POD"
touch "$WORK/old-stopped"
NEW_POD=$(driver_ready) || fail "no ready driver pod after the upgrade"
[[ $NEW_POD != "$OLD_POD" ]] || fail "the DaemonSet did not replace $OLD_POD"
[[ $(sort -u "$WORK/sockets-seen" | wc -l) -ge 2 ]] || fail "never saw the new instance's registration socket: $(sort -u "$WORK/sockets-seen")"
grep -qx "$OLD_SOCKET" <(sort -u "$WORK/sockets-seen") || fail "the old socket was never seen"
[[ ! -e $REGISTRY/$OLD_SOCKET && $(reg_sockets | wc -l) == 1 ]] || fail "the old instance left its registration socket: $(reg_sockets)"
wait_for "the new instance to take over slice publication" 20 bash -c "cat $E2E_POD_LOGS/${CHART_NAMESPACE}_${NEW_POD}_*/driver/*.log | grep -q 'publishing ResourceSlices for this node'"
ok "helm upgrade: $NEW_POD ($SECOND_REF) registered beside $OLD_POD on its own socket; the old pod went; the new one publishes"

wait "$ARRIVALS" || fail "creating pods failed"
mapfile -t PODS <"$WORK/pods"
# Right after binding, the API server's node authorizer may refuse the kubelet's claim lookup
# ("no relationship found between node"); the kubelet then waits for its next periodic sync.
# Not the driver's doing: an annotation makes the kubelet sync the pod again at once.
authorizer_refusals() { # pod
    kubectl get events -o json --field-selector "involvedObject.name=$1,reason=FailedPrepareDynamicResources" |
        jq '[.items[] | select(.message | contains("no relationship found between node"))] | length'
}
for p in "${PODS[@]}"; do
    deadline=$((SECONDS + 60))
    until kubectl wait --for=condition=Ready "pod/$p" --timeout=1s >/dev/null 2>&1; do
        ((SECONDS < deadline)) || fail "timed out waiting for pod $p to run"
        n=$(authorizer_refusals "$p")
        if ((n > 0)) && [[ $(kubectl get pod "$p" -o jsonpath='{.metadata.annotations.e2e-nudged}') != "$n" ]]; then
            kubectl annotate pod "$p" --overwrite "e2e-nudged=$n" >/dev/null
        fi
    done
done
ok "all ${#PODS[@]} pods that arrived during the switch run"

failures=$(kubectl get events -o json | jq '[.items[] | select(.reason == "FailedPrepareDynamicResources"
    and (.message | contains("no relationship found between node") | not))] | length')
[[ $failures == 0 ]] || fail "$failures prepare failures during the switch: $(kubectl get events | grep -i prepare)"
kill "$ARCHIVER" 2>/dev/null || true
wait "$ARCHIVER" 2>/dev/null || true
ARCHIVER=
driver_logs_archive
pod_logs() { cat "$WORK"/driver-pod-logs/"${CHART_NAMESPACE}_$1"_*.log 2>/dev/null || true; }
prepared_by_old=$(pod_logs "$OLD_POD" | grep -c 'INFO gpu_dra::prepare::state: prepared claim' || true)
prepared_by_new=$(pod_logs "$NEW_POD" | grep -c 'INFO gpu_dra::prepare::state: prepared claim' || true)
log "prepares logged: old instance $prepared_by_old, new instance $prepared_by_new"
((prepared_by_old > 0 && prepared_by_new > 0)) || fail "both instances should have prepared claims (old $prepared_by_old, new $prepared_by_new)"
((prepared_by_old + prepared_by_new == ${#PODS[@]})) || fail "each claim is prepared once: $prepared_by_old + $prepared_by_new prepares for ${#PODS[@]} pods"
[[ $(mig_instances) == "${#PODS[@]}" ]] || fail "expected ${#PODS[@]} MIG instances, found $(mig_instances)"
ok "no prepare failed; one MIG instance per pod"

kubectl delete pods -l app=rolling --wait=true --timeout=60s >/dev/null
no_mig_instances() { [[ $(mig_instances) == 0 ]]; }
wait_for "all MIG instances destroyed" 60 no_mig_instances
wait_for "all CDI specs removed" 30 bash -c "! ls '$GPU_DRA_CDI_ROOT'/k8s.gpu.nvidia.com-claim_*.json"
ok "the new instance unprepared every claim, including the old instance's"

[[ $(driver_ready) == "$NEW_POD" ]] || fail "the new driver pod is not Ready any more"

# A new driver pod that prepares a claim and goes away while the old pod serves (here
# `kubectl rollout undo` of an upgrade; a crash-looping new image is the same), the old pod having
# done nothing in between: before its next operation the old pod must read what the new one
# wrote (the claim, its MIG instance), not trust its own book. Garbage collection every hour
# keeps the old pod idle; minReadySeconds keeps it beside the new one.
chart_upgrade "$FIRST_REF" --set 'extraEnv[0].name=GPU_DRA_GC_INTERVAL' --set 'extraEnv[0].value=1h'
IDLE_POD=$(driver_ready) || fail "no ready driver pod after the third upgrade"
# One claim prepared and unprepared by the old pod alone: from here on it knows it is alone and
# in step with the node's state, so only what it learns of the new pod can make it read again.
pod q0
wait_for "pod q0 to run" 60 kubectl wait --for=condition=Ready pod/q0 --timeout=1s
kubectl delete pod q0 --wait=true --timeout=60s >/dev/null
wait_for "q0's MIG instance destroyed" 60 no_mig_instances
DAEMONSET=$(kubectl -n "$CHART_NAMESPACE" get ds -l "app.kubernetes.io/instance=$CHART_RELEASE" -o name)
[[ $(wc -l <<<"$DAEMONSET") == 1 ]] || fail "expected one DaemonSet: $DAEMONSET"
kubectl -n "$CHART_NAMESPACE" patch "$DAEMONSET" --type merge -p '{"spec":{"minReadySeconds":3600}}' >/dev/null
driver_logs_archive
"$HELM" upgrade "$CHART_RELEASE" "$ROOT/deploy/helm/gpu-dra" "${CHART_ARGS[@]}" --set "image.tag=${SECOND_REF##*:}" \
    --set 'extraEnv[0].name=GPU_DRA_GC_INTERVAL' --set 'extraEnv[0].value=1h' >&2 \
    || fail "helm upgrade (no wait) failed"
surge_ready() { # the DaemonSet's pod other than $IDLE_POD, once it is Ready
    driver_pods | jq -e -r --arg idle "$IDLE_POD" '[.items[] | select(.metadata.name != $idle and .metadata.deletionTimestamp == null)
        | select(any(.status.conditions[]?; .type == "Ready" and .status == "True")) | .metadata.name] | select(length == 1) | .[0]'
}
wait_for "a new driver pod Ready beside $IDLE_POD" 90 surge_ready
SURGE_POD=$(surge_ready)
wait_for "two registration sockets" 30 bash -c "[[ \$(find '$REGISTRY' -maxdepth 1 -type s -name '*-reg.sock' | wc -l) == 2 ]]"
pod q1
wait_for "pod q1 to run" 60 kubectl wait --for=condition=Ready pod/q1 --timeout=1s
driver_logs_archive
pod_logs "$SURGE_POD" | grep -q 'prepared claim' || fail "the new pod $SURGE_POD did not prepare q1's claim (the kubelet calls the newest instance)"
kubectl -n "$CHART_NAMESPACE" rollout undo "$DAEMONSET" >/dev/null || fail "rollout undo failed"
# The undone template is the old pod's again; it counts as available (and the new one goes) once
# minReadySeconds no longer holds it back.
kubectl -n "$CHART_NAMESPACE" patch "$DAEMONSET" --type merge -p '{"spec":{"minReadySeconds":0}}' >/dev/null
wait_for "the new pod $SURGE_POD gone after rollout undo" 90 bash -c "! kubectl -n $CHART_NAMESPACE get pod $SURGE_POD"
wait_for "one registration socket again" 30 bash -c "[[ \$(find '$REGISTRY' -maxdepth 1 -type s -name '*-reg.sock' | wc -l) == 1 ]]"
[[ $(driver_ready) == "$IDLE_POD" ]] || fail "$IDLE_POD should be the one driver pod after the undo"
ok "$SURGE_POD prepared q1's claim beside $IDLE_POD and went away (rollout undo)"
# The old pod's next prepare must not write its stale book over the claim the new one recorded,
# and its unprepare of that claim must undo it.
pod q2
wait_for "pod q2 to run" 60 kubectl wait --for=condition=Ready pod/q2 --timeout=1s
[[ $(mig_instances) == 2 ]] || fail "expected q1's and q2's MIG instances, found $(mig_instances)"
kubectl delete pods q1 q2 --wait=true --timeout=60s >/dev/null
wait_for "q1's and q2's MIG instances destroyed by $IDLE_POD" 60 no_mig_instances
wait_for "q1's and q2's CDI specs removed by $IDLE_POD" 30 bash -c "! ls '$GPU_DRA_CDI_ROOT'/k8s.gpu.nvidia.com-claim_*.json"
ok "$IDLE_POD read what $SURGE_POD wrote before its next operation: q2 prepared beside q1, both unprepared, nothing left"

report_mode "the driver image installed by the Helm chart, rolled by helm upgrade (seamlessUpgrade)"
echo "$passed passed, 0 failed"
