#!/usr/bin/env bash
# e2e: what users install is what runs. The driver image (e2e/build-image.sh, an OCI archive of
# the node binary and its libraries) and the Helm chart (deploy/helm/gpu-dra), installed as a
# user would on the real node (kubelet + containerd + runc, e2e/cluster up --real-node), with
# pods reaching the API server through the kubernetes Service with their ServiceAccount token:
#
#   1. the image is imported into containerd; `helm install` with that image
#      (imagePullPolicy Never), simulated GPUs whose state lives on a hostPath, and the node's
#      fake driver root; the chart's DeviceClasses replace the cluster's;
#   2. the DaemonSet pod becomes Ready through its own probes, registers with the real kubelet
#      and publishes the node's slices with nothing but the chart's ServiceAccount (RBAC and
#      the admission policy in force: no authorization errors in its log);
#   3. a user pod with a claim runs with its GPU (device node, NVIDIA_VISIBLE_DEVICES);
#   4. `helm upgrade` to a new image tag rolls the DaemonSet (new pod beside the old, seamless
#      registration): the running pod keeps running, no prepare fails, and a pod started after
#      the upgrade is prepared by the new driver, and the first pod's claim unprepared by it;
#   5. `helm uninstall`: the running pod and its prepared device (CDI spec) are left alone, and
#      no socket of the driver is left on the node.
#
# Usage: e2e/install.sh   (GPU_DRA: the debug binary for the node's fake driver root, default
#                          target/debug/gpu-dra; the image is built from the node profile
#                          unless IMAGE_BINARY names another gpu-dra binary)
set -euo pipefail
E2E=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$E2E")
cd "$ROOT"
NAME=install-e2e
NAMESPACE=gpu-dra
RELEASE=gpu-dra
WORK=$(mktemp -d /tmp/gpu-dra-install.XXXXXX)
# A long kubelet folder (as microk8s' is): the seamless-upgrade socket names, a pod UID each,
# must still fit a unix socket path's 107 bytes.
export GPU_DRA_CLUSTER_DIR=$WORK/cluster
passed=0
T0=$SECONDS

log() { echo "$NAME: $*" >&2; }
ok() { passed=$((passed + 1)); log "ok - $* ($((SECONDS - T0))s)"; }
fail() {
    log "FAIL: $*"
    if [[ -n ${KUBECONFIG:-} ]]; then
        kubectl get pods -A -o wide 2>&1 | sed 's/^/    /' >&2 || true
        kubectl -n "$NAMESPACE" get events --sort-by=.lastTimestamp 2>&1 | tail -n 15 | sed 's/^/    /' >&2 || true
        local f
        for f in "$E2E_POD_LOGS"/"$NAMESPACE"_*/driver/*.log; do
            [[ -f $f ]] || continue
            log "driver container log $f (tail):"
            tail -n 20 "$f" | cut -c1-400 | sed 's/^/    /' >&2
        done
    fi
    if [[ -f $GPU_DRA_CLUSTER_DIR/logs/kubelet.log ]]; then
        log "kubelet log (tail):"
        grep -v '^\s' "$GPU_DRA_CLUSTER_DIR/logs/kubelet.log" | tail -n 20 | cut -c1-400 | sed 's/^/    /' >&2
    fi
    echo "$passed passed, 1 failed"
    exit 1
}
cleanup() {
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
        sleep 0.5
    done
}

# ---------------------------------------------------------------- 0. image, helm, cluster
BIN=${GPU_DRA_K8S_BIN:-$("$E2E/build-k8s.sh" | tail -n 1)}
export PATH="$BIN:$PATH"
HELM=$("$E2E/build-helm.sh" | tail -n 1)/helm
GPU_DRA=${GPU_DRA:-$ROOT/target/debug/gpu-dra}
[[ -x $GPU_DRA ]] || cargo build --bin gpu-dra >&2
export GPU_DRA

# Two tags of the same build: the upgrade rolls the DaemonSet to the second. IMAGE_BINARY
# (optional) puts another build of gpu-dra in the image instead of the node profile's.
image_args=(--out "$WORK/image")
[[ -z ${IMAGE_BINARY:-} ]] || image_args+=(--binary "$IMAGE_BINARY")
eval "$("$E2E/build-image.sh" "${image_args[@]}" --tag e2e-1)"
FIRST_ARCHIVE=$IMAGE_ARCHIVE FIRST_REF=$IMAGE_REF
eval "$("$E2E/build-image.sh" "${image_args[@]}" --tag e2e-2)"
SECOND_ARCHIVE=$IMAGE_ARCHIVE SECOND_REF=$IMAGE_REF
REPOSITORY=${FIRST_REF%:*}
log "image $FIRST_REF: $((IMAGE_SIZE_BYTES / 1024)) KiB"

"$E2E/cluster" up --real-node --no-driver --service-network >/dev/null || fail "the real node did not start"
eval "$("$E2E/cluster" env)"
LOGS=$GPU_DRA_CLUSTER_DIR/logs
ctr() { "$E2E_CTR" --address "$E2E_CONTAINERD_ADDRESS" -n k8s.io "$@" 2>>"$WORK/ctr.log"; }
ctr images import "$FIRST_ARCHIVE" >/dev/null || fail "ctr could not import $FIRST_ARCHIVE"
ctr images import "$SECOND_ARCHIVE" >/dev/null || fail "ctr could not import $SECOND_ARCHIVE"
ctr images ls -q | grep -qx "$FIRST_REF" || fail "containerd does not list $FIRST_REF after the import"
ok "images $FIRST_REF and $SECOND_REF imported into the node's containerd"

# ---------------------------------------------------------------- 1-2. helm install
# The cluster applied deviceclasses/ for the other tests; here the chart owns them.
kubectl delete deviceclass --all >&2
install_args=(
    --namespace "$NAMESPACE" --create-namespace
    --set "image.repository=$REPOSITORY" --set image.pullPolicy=Never
    --set-string "gpus=${E2E_GPUS//,/\\,}" --set "mig=$E2E_MIG" --set "simState=$GPU_DRA_SIM_STATE"
    --set "nvidiaDriverRoot=$E2E_DRIVER_ROOT" --set "devRoot=$GPU_DRA_DEV_ROOT"
    --set "kubeletDir=$E2E_KUBELET_ROOT" --set "cdiRoot=$GPU_DRA_CDI_ROOT"
)
"$HELM" install "$RELEASE" deploy/helm/gpu-dra "${install_args[@]}" --set "image.tag=${FIRST_REF##*:}" \
    --wait --timeout 120s >&2 || fail "helm install did not reach a ready release"
driver_pods() { kubectl -n "$NAMESPACE" get pods -l "app.kubernetes.io/instance=$RELEASE" -o json; }
DRIVER_POD=$(driver_pods | jq -r '.items[0].metadata.name')
ready=$(driver_pods | jq -r '.items[0].status.conditions[] | select(.type == "Ready") | .status')
[[ $ready == True ]] || fail "driver pod $DRIVER_POD is not Ready"
image=$(driver_pods | jq -r '.items[0].spec.containers[0].image')
[[ $image == "$FIRST_REF" ]] || fail "driver pod runs $image, not $FIRST_REF"
ok "helm install: DaemonSet pod $DRIVER_POD Ready through its probes, image $image"

wait_for "the kubelet registered the plugin" 30 grep -q 'Registered DRA plugin.*gpu.nvidia.com' "$LOGS/kubelet.log"
slices() { kubectl get resourceslices -o json --field-selector "spec.nodeName=$E2E_NODE"; }
wait_for "slices of $E2E_NODE" 30 bash -c "[[ \$(kubectl get resourceslices --field-selector spec.nodeName=$E2E_NODE -o name | wc -l) -gt 0 ]]"
devices=$(slices | jq '[.items[].spec.devices[]?] | length')
((devices > 0)) || fail "no devices published"
kubectl get validatingadmissionpolicybinding "$RELEASE-resourceslices" >/dev/null 2>&1 ||
    fail "the chart's ResourceSlice admission policy is not in force"
# The container's only credentials are its projected ServiceAccount token.
token_user=$(kubectl -n "$NAMESPACE" get pod "$DRIVER_POD" -o json | jq -r '.spec.serviceAccountName')
[[ $token_user == "$RELEASE" ]] || fail "driver pod runs as ServiceAccount $token_user"
driver_log() { cat "$E2E_POD_LOGS"/"$NAMESPACE"_"$1"_*/driver/*.log 2>/dev/null; }
if driver_log "$DRIVER_POD" | grep -qiE 'forbidden|unauthorized|denied request'; then
    fail "the driver hit an authorization error: $(driver_log "$DRIVER_POD" | grep -iE 'forbidden|unauthorized|denied request' | head -n 2)"
fi
ok "registered with the real kubelet; $devices devices published with the chart's ServiceAccount (RBAC + admission policy), no authorization error"

# ---------------------------------------------------------------- 3. a user pod with a GPU
user_pod() { # NAME
    sed -e "s|\${E2E_IMAGE}|$E2E_IMAGE|g" -e "s|\${NAME}|$1|g" "$E2E/pods/gpu-pod.yaml" | kubectl apply -f - >&2
}
pod_running() { [[ $(kubectl get pod "$1" -o jsonpath='{.status.phase}') == Running ]]; }
ctr_out() { # pod: what its container printed, once it printed "ready"
    local uid f
    uid=$(kubectl get pod "$1" -o jsonpath='{.metadata.uid}')
    f=$E2E_POD_LOGS/default_$1_$uid/ctr/0.log
    wait_for "$1 printed ready" 60 grep -q ' ready$' "$f"
    cut -d' ' -f4- "$f"
}
claim_of() { kubectl get pod "$1" -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}'; }
check_gpu() { # pod: one /dev/nvidiaN and the allocated GPU's UUID in NVIDIA_VISIBLE_DEVICES
    local out claim dev uuid
    out=$(ctr_out "$1")
    claim=$(claim_of "$1")
    dev=$(kubectl get resourceclaim "$claim" -o jsonpath='{.status.allocation.devices.results[0].device}')
    [[ $dev =~ ^gpu-([0-9]+)$ ]] || fail "$1: claim $claim allocated '$dev'"
    grep -qx "dev=nvidia${BASH_REMATCH[1]}" <<<"$out" || fail "$1: no /dev/nvidia${BASH_REMATCH[1]} in the container"
    uuid=$(slices | jq -r --arg d "$dev" '.items[].spec.devices[]? | select(.name == $d) | .attributes.uuid.string')
    grep -qx "NVIDIA_VISIBLE_DEVICES=$uuid" <<<"$out" || fail "$1: NVIDIA_VISIBLE_DEVICES is not $uuid"
    echo "$claim"
}
user_pod before-upgrade
wait_for "pod before-upgrade Running" 90 pod_running before-upgrade
FIRST_CLAIM=$(check_gpu before-upgrade)
FIRST_UID=$(kubectl get resourceclaim "$FIRST_CLAIM" -o jsonpath='{.metadata.uid}')
[[ -f $GPU_DRA_CDI_ROOT/k8s.gpu.nvidia.com-claim_$FIRST_UID.json ]] || fail "no CDI spec for claim $FIRST_CLAIM"
ok "user pod runs with its GPU, prepared by the installed driver"

# ---------------------------------------------------------------- 4. helm upgrade
"$HELM" upgrade "$RELEASE" deploy/helm/gpu-dra "${install_args[@]}" --set "image.tag=${SECOND_REF##*:}" \
    --wait --timeout 180s >&2 || fail "helm upgrade did not reach a ready release"
kubectl -n "$NAMESPACE" rollout status "daemonset/$RELEASE" --timeout 120s >&2 || fail "the DaemonSet did not roll"
NEW_POD=$(driver_pods | jq -r --arg img "$SECOND_REF" '[.items[] | select(.spec.containers[0].image == $img and .metadata.deletionTimestamp == null)][0].metadata.name')
[[ -n $NEW_POD && $NEW_POD != null && $NEW_POD != "$DRIVER_POD" ]] || fail "no driver pod runs $SECOND_REF after the upgrade"
wait_for "the old driver pod $DRIVER_POD gone" 60 bash -c "! kubectl -n $NAMESPACE get pod $DRIVER_POD"
pod_running before-upgrade || fail "pod before-upgrade stopped running during the upgrade"
failed_prepares=$(grep -c 'NodePrepareResources.*failed\|PrepareDynamicResources failed\|FailedPrepareDynamicResources' "$LOGS/kubelet.log" || true)
((failed_prepares == 0)) || fail "$failed_prepares failed prepares in the kubelet log during the upgrade"
user_pod after-upgrade
wait_for "pod after-upgrade Running" 90 pod_running after-upgrade
SECOND_CLAIM=$(check_gpu after-upgrade)
SECOND_UID=$(kubectl get resourceclaim "$SECOND_CLAIM" -o jsonpath='{.metadata.uid}')
driver_log "$NEW_POD" | grep -q "prepared claim .*$SECOND_UID" || fail "the new driver pod did not prepare $SECOND_CLAIM"
kubectl delete pod before-upgrade --timeout 60s >&2 || fail "deleting pod before-upgrade"
wait_for "the first claim's CDI spec removed" 60 bash -c "[[ ! -e $GPU_DRA_CDI_ROOT/k8s.gpu.nvidia.com-claim_$FIRST_UID.json ]]"
driver_log "$NEW_POD" | grep -q "unprepared claim .*$FIRST_UID" || fail "the new driver pod did not unprepare $FIRST_CLAIM"
ok "helm upgrade rolled $DRIVER_POD -> $NEW_POD ($SECOND_REF): no failed prepare, the running pod kept its GPU, the new driver prepares and unprepares"

# ---------------------------------------------------------------- 5. helm uninstall
"$HELM" uninstall "$RELEASE" --namespace "$NAMESPACE" --wait --timeout 120s >&2 || fail "helm uninstall"
wait_for "driver pods gone" 60 bash -c "[[ \$(kubectl -n $NAMESPACE get pods -o name | wc -l) == 0 ]]"
pod_running after-upgrade || fail "pod after-upgrade stopped running when the driver was uninstalled"
[[ -f $GPU_DRA_CDI_ROOT/k8s.gpu.nvidia.com-claim_$SECOND_UID.json ]] || fail "uninstall removed the running pod's CDI spec"
sockets=$(find "$E2E_KUBELET_ROOT/plugins_registry" "$E2E_KUBELET_ROOT/plugins/gpu.nvidia.com" -type s 2>/dev/null || true)
[[ -z $sockets ]] || fail "sockets left after uninstall: $sockets"
ok "helm uninstall: the running pod and its prepared GPU are left alone, no driver socket is left on the node"

echo "$passed passed, 0 failed"
