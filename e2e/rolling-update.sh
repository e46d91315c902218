#!/usr/bin/env bash
# Seamless driver upgrade on the real node (KEP-4381, the kubelet plugin library's RollingUpdate
# mode): while pods keep arriving, a second driver instance starts beside the first with its own
# sockets, the kubelet registers both, the old one is stopped, and the new one serves on.
# Nothing may fail in between: every pod runs, no prepare fails, and the new instance unprepares
# what the old one prepared (CDI specs removed, MIG instances destroyed).
set -euo pipefail
E2E=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$E2E")
NAME=rolling-update
WORK=$(mktemp -d "/tmp/gpu-dra-$NAME.XXXXXX")
export GPU_DRA_CLUSTER_DIR=$WORK/cluster
NEW_PID=
passed=0

log() { echo "$NAME: $*" >&2; }
fail() {
    log "FAIL: $*"
    for f in gpu-dra.log gpu-dra-new.log; do
        [[ -f $GPU_DRA_CLUSTER_DIR/logs/$f ]] && { log "$f (tail):"; grep -E "WARN|ERROR|unprepared|prepared claim" "$GPU_DRA_CLUSTER_DIR/logs/$f" | tail -n 25 >&2; }
    done
    echo "$passed passed, 1 failed"
    exit 1
}
ok() { passed=$((passed + 1)); log "ok - $*"; }
cleanup() {
    if [[ -n $NEW_PID ]]; then
        kill -TERM -- "-$NEW_PID" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$NEW_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL -- "-$NEW_PID" 2>/dev/null || true
    fi
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

"$E2E/cluster" up --real-node --gpus sim:2xH100-SXM5-80GB --driver-args "--rolling-update-uid instance-old" >&2 \
    || fail "the real-node cluster did not start"
eval "$("$E2E/cluster" env)"
export PATH=$GPU_DRA_K8S_BIN:$PATH
LOGS=$GPU_DRA_CLUSTER_DIR/logs
REGISTRY=$E2E_KUBELET_ROOT/plugins_registry
mig_instances() {
    "$E2E_GPU_DRA" sim --gpus "$E2E_GPUS" --node-name "$E2E_NODE" --sim-state "$GPU_DRA_SIM_STATE" show \
        | jq '[.gpus[].gpu_instances[]] | length'
}

# Per-instance names: <driver>-<uid>-reg.sock, or a shorter digest form where the path would not
# fit a unix socket address (as here, under a temp dir).
reg_sockets() { find "$REGISTRY" -maxdepth 1 -type s -name '*-reg.sock' -printf '%f\n' | sort; }
OLD_SOCKET=$(reg_sockets)
[[ $(wc -l <<<"$OLD_SOCKET") == 1 && $OLD_SOCKET != gpu.nvidia.com-reg.sock ]] \
    || fail "the old instance should have one per-instance registration socket: $OLD_SOCKET"
ok "old instance registered on its own socket ($OLD_SOCKET)"

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
    while ((n < 12 && after < 2)); do
        n=$((n + 1))
        pod "p$n"
        echo "p$n" >>"$WORK/pods"
        [[ -e $WORK/old-stopped ]] && after=$((after + 1))
        sleep 0.5
    done
) &
ARRIVALS=$!

# The new instance: the same command line with another instance id (a DaemonSet surge pod).
sleep 1.5
mapfile -d '' -t ARGV <"$GPU_DRA_CLUSTER_DIR/cmd/gpu-dra"
for i in "${!ARGV[@]}"; do [[ ${ARGV[$i]} == instance-old ]] && ARGV[i]=instance-new; done
setsid "${ARGV[@]}" </dev/null >>"$LOGS/gpu-dra-new.log" 2>&1 &
NEW_PID=$!
# The kubelet's verdict reaches the instance through NotifyRegistrationStatus.
wait_for "the kubelet to register the new instance" 20 grep -q 'registered with kubelet' "$LOGS/gpu-dra-new.log"
[[ $(reg_sockets | wc -l) == 2 ]] && grep -qx "$OLD_SOCKET" <(reg_sockets) \
    || fail "both instances should be registered side by side: $(reg_sockets)"
ok "new instance registered beside the old one"

sleep 1
"$E2E/cluster" stop gpu-dra >&2
touch "$WORK/old-stopped"
[[ ! -e $REGISTRY/$OLD_SOCKET && $(reg_sockets | wc -l) == 1 ]] || fail "the old instance left its registration socket: $(reg_sockets)"
wait_for "the new instance to take over slice publication" 20 grep -q 'publishing ResourceSlices for this node' "$LOGS/gpu-dra-new.log"
ok "old instance stopped; the new one publishes"

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
prepared_by_old=$(grep -c 'prepared claim' "$LOGS/gpu-dra.log" || true)
prepared_by_new=$(grep -c 'prepared claim' "$LOGS/gpu-dra-new.log" || true)
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

kill -0 "$NEW_PID" || fail "the new instance exited"
log "mode: two driver host processes (the second started beside the first with its own sockets, stopped at a chosen moment); the chart's rolling upgrade of the image, with pods arriving, runs in e2e/install.sh"
echo "$passed passed, 0 failed"
