#!/usr/bin/env bash
# e2e: a node whose driver root has tools that cannot run there. On GKE's Container-Optimized OS
# (and any driver root without its own loader and C library) `nvidia-smi` and
# `nvidia-cuda-mps-control` cannot run chrooted into the driver root, where the driver runs
# them. They serve only time-slicing intervals and MPS: the node must still publish and serve
# whole GPUs and MIG devices, refuse only the claims that need a tool (with the reason, in the
# pod's events as the kubelet reports the prepare error), and say so in a metric.
#
# The real node (kubelet, containerd, runc) with the driver image installed by the Helm chart
# (its defaults plus the node's folders), 4×H100 simulated; the fake driver root's loader is
# removed before the install, so its fake tools cannot run, as on such a node.
#
# Then a GPU whose MIG calls hang: a claim stuck in prepare while the kubelet and 20 more callers
# retry it; other claims prepare and faults become taints meanwhile (see the section below).
set -euo pipefail
E2E=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$E2E")
cd "$ROOT"
NAME=degraded-node
WORK=$(mktemp -d /tmp/gpu-dra-degraded.XXXXXX)
# shellcheck source=chart.sh
source "$E2E/chart.sh"
export GPU_DRA_CLUSTER_DIR=$WORK/cluster
passed=0

log() { echo "$NAME: $*" >&2; }
ok() { passed=$((passed + 1)); log "ok - $*"; }
fail() {
    log "FAIL: $*"
    if [[ -n ${KUBECONFIG:-} ]]; then
        kubectl get pods,resourceclaims -o wide 2>&1 | sed 's/^/    /' >&2 || true
    fi
    if [[ -n ${E2E_POD_LOGS:-} ]]; then
        log "driver pods' logs (tail):"
        driver_logs | tail -n 25 | cut -c1-400 | sed 's/^/    /' >&2
    fi
    echo "$passed passed, 1 failed"
    exit 1
}
cleanup() {
    "$E2E/cluster" down >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
# Loud on anything unexpected, not only on the checks' own fail calls.
set -E
trap 'fail "line $LINENO: unexpected failure of: $BASH_COMMAND"' ERR
export GPU_DRA=${GPU_DRA:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/gpu-dra}
[[ -x $GPU_DRA ]] || (cd "$ROOT" && cargo build --bin gpu-dra) >&2
BIN=${GPU_DRA_K8S_BIN:-$("$E2E/build-k8s.sh" | tail -n 1)}
export GPU_DRA_K8S_BIN=$BIN PATH="$BIN:$PATH"

chart_build_images
chart_cluster_up --gpus sim:4xH100-SXM5-80GB
eval "$("$E2E/cluster" env)"
# The driver root loses its loader: its tools (the fake nvidia-smi and MPS control daemon, linked
# to it) can no longer run chrooted into it. NVML is still loaded by the driver itself.
loader=$E2E_DRIVER_ROOT/lib/ld-gpu-dra-driver-root.so
[[ -e $loader ]] || fail "the fake driver root has no loader at $loader to remove"
rm -f "$loader"
chroot "$E2E_DRIVER_ROOT" /usr/bin/nvidia-smi -L >/dev/null 2>&1 && fail "nvidia-smi still runs in the driver root"
chart_import_images
chart_install "$FIRST_REF"
DRIVER_POD=$(driver_ready) || fail "no ready driver pod after helm install"
ok "the driver starts on a driver root whose tools cannot run ($DRIVER_POD Ready)"

apply() { # FILE [POD_NAME [CLAIM]]: an e2e/pods/ manifest (or a path) with the image filled in
    local file=$E2E/pods/$1
    [[ $1 == */* ]] && file=$1
    sed -e "s|\${E2E_IMAGE}|$E2E_IMAGE|g" -e "s|\${NAME}|${2:-}|g" -e "s|\${CLAIM}|${3:-}|g" "$file" |
        kubectl apply -f - >&2
}
running() { [[ $(kubectl get pod "$1" -o jsonpath='{.status.phase}') == Running ]]; }
# prepare_error POD: the kubelet's FailedPrepareDynamicResources message for the pod, if any.
prepare_error() {
    kubectl get events -o json --field-selector "involvedObject.name=$1,reason=FailedPrepareDynamicResources" |
        jq -r '.items[-1].message // empty'
}
has_prepare_error() { [[ -n $(prepare_error "$1") ]]; }
slice_devices() { kubectl get resourceslices -o json --field-selector "spec.nodeName=$E2E_NODE" | jq -r '.items[].spec.devices[]?.name'; }

wait_for "the node's ResourceSlices" 30 bash -c "[[ -n \$(kubectl get resourceslices --field-selector spec.nodeName=$E2E_NODE -o name) ]]"
devices=$(slice_devices)
grep -qx gpu-0 <<<"$devices" && grep -qx gpu-1 <<<"$devices" || fail "whole GPUs not published: $devices"
grep -q -- '-mig-1g.10gb-' <<<"$devices" || grep -q -- '-mig-1g10gb-' <<<"$devices" || fail "MIG placements not published: $devices"
ok "whole GPUs and MIG placements published ($(wc -l <<<"$devices") devices)"

apply gpu-pod.yaml whole
apply mig-pod.yaml slice
wait_for "the whole-GPU pod to run" 90 running whole
wait_for "the MIG pod to run" 90 running slice
ok "a whole GPU and a carved 1g.10gb MIG device prepared and running"

apply "$ROOT/deploy/examples/gpu-mps.yaml"
apply mps-pod.yaml mps mps-gpu
wait_for "the kubelet's prepare error for the MPS pod" 60 has_prepare_error mps
message=$(prepare_error mps)
[[ $message == *"sharing.strategy"* && $message == *nvidia-cuda-mps-control* && $message == *"cannot run"* ]] ||
    fail "the MPS claim's refusal does not give the reason: $message"
running mps && fail "the MPS pod runs"
ok "the MPS claim is refused with the reason: ${message:0:240}"

apply "$ROOT/deploy/examples/gpu-timesliced.yaml"
apply mps-pod.yaml sliced time-sliced-gpu
wait_for "the kubelet's prepare error for the time-sliced pod" 60 has_prepare_error sliced
message=$(prepare_error sliced)
[[ $message == *sharing.timeSlicingConfig.interval* && $message == *nvidia-smi* && $message == *"cannot run"* ]] ||
    fail "the time-sliced claim's refusal does not give the reason: $message"
ok "the time-sliced claim (interval Long) is refused with the reason: ${message:0:240}"

metrics=$(chart_scrape) || fail "cannot scrape the driver's /metrics"
for tool in nvidia-smi nvidia-cuda-mps-control; do
    grep -qx "gpu_dra_driver_tool_unusable{tool=\"$tool\"} 1" <<<"$metrics" ||
        fail "no gpu_dra_driver_tool_unusable series for $tool: $(grep tool_unusable <<<"$metrics")"
done
ok "/metrics: gpu_dra_driver_tool_unusable names nvidia-smi and nvidia-cuda-mps-control"

# Refused claims changed nothing: no MPS daemon folder, the GPU's compute mode untouched; the
# other pods still run, and everything is unprepared when they go.
kubectl delete pod mps sliced whole slice --wait=true --timeout=60s >/dev/null || fail "deleting the pods"
mig_instances() {
    "$E2E_GPU_DRA" sim --gpus "$E2E_GPUS" --node-name "$E2E_NODE" --sim-state "$GPU_DRA_SIM_STATE" show |
        jq '[.gpus[].gpu_instances[]] | length'
}
no_mig() { [[ $(mig_instances) == 0 ]]; }
wait_for "the MIG instance destroyed" 60 no_mig
wait_for "every CDI spec removed" 30 bash -c "! ls '$GPU_DRA_CDI_ROOT'/k8s.gpu.nvidia.com-claim_*.json"
modes=$("$E2E_GPU_DRA" sim --gpus "$E2E_GPUS" --node-name "$E2E_NODE" --sim-state "$GPU_DRA_SIM_STATE" show |
    jq -r '[.gpus[].compute_mode // "Default"] | unique | join(",")')
[[ $modes == Default ]] || fail "a refused claim changed a GPU's compute mode: $modes"
ok "every pod unprepared; the refused claims changed nothing"

# ---------------------------------------------------------------- a GPU whose MIG calls hang
# Every GPU's MIG calls hang (a sick GPU: `gpu-dra sim stall`). A MIG pod's prepare then never
# returns; the kubelet gives up on the call and calls again, and so does a Go client on the
# kubelet's own stubs over the plugin socket, 20 times, each giving up after 2 s as the kubelet
# does after its deadline. Each retry joins the running prepare (on no thread) instead of parking
# another blocking thread behind it: meanwhile a whole-GPU pod prepares and runs, and a fault on
# another GPU still becomes a device taint. Once the GPU answers, the claim is prepared once.
sim() { "$E2E_GPU_DRA" sim --gpus "$E2E_GPUS" --node-name "$E2E_NODE" --sim-state "$GPU_DRA_SIM_STATE" "$@"; }
for g in 0 1 2 3; do sim stall --gpu "$g" --enabled true; done
apply mig-pod.yaml stuck
claim_of_pod() { kubectl get pod "$1" -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}'; }
wait_for "the stuck pod's claim" 30 bash -c "[[ -n \$(kubectl get pod stuck -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}') ]]"
stuck_claim=$(claim_of_pod stuck)
allocated_claim() { [[ -n $(kubectl get resourceclaim "$stuck_claim" -o jsonpath='{.status.allocation}') ]]; }
wait_for "the stuck pod's claim allocated" 30 allocated_claim
stuck_uid=$(kubectl get resourceclaim "$stuck_claim" -o jsonpath='{.metadata.uid}')
stuck_gpu=$(kubectl get resourceclaim "$stuck_claim" -o jsonpath='{.status.allocation.devices.results[0].device}')
stuck_gpu=${stuck_gpu#gpu-}
stuck_gpu=${stuck_gpu%%-*}
# The driver pod's registration socket (named per instance, for seamless upgrades).
reg_socket=$(find "$E2E_KUBELET_ROOT/plugins_registry" -name 'gpu.nvidia.com-*reg.sock' -type s | head -n 1)
[[ -n $reg_socket ]] || fail "no registration socket of the driver under $E2E_KUBELET_ROOT/plugins_registry"
retries=()
for i in $(seq 20); do
    kubelet-sim --registration-socket "$reg_socket" \
        --expect-name gpu.nvidia.com --timeout 2s prepare --claim "default/$stuck_claim/$stuck_uid" \
        >"$WORK/retry-$i.json" 2>"$WORK/retry-$i.err" &
    retries+=("$!")
done
for p in "${retries[@]}"; do wait "$p" || true; done
gave_up=$(cat "$WORK"/retry-*.json | jq -s '[.[] | select(.ok == false and (.error | test("DeadlineExceeded|Timeout expired")))] | length')
((gave_up == 20)) || fail "not every retry hit its deadline while the GPU hangs ($gave_up of 20): $(cat "$WORK"/retry-1.json "$WORK"/retry-1.err)"
running stuck && fail "the pod with the stuck claim runs"
# A whole GPU (no MIG call) on another GPU prepares and runs meanwhile.
apply gpu-pod.yaml whole-meanwhile
wait_for "a whole-GPU pod to run beside the stuck claim" 60 running whole-meanwhile
# A fault on a GPU the stuck claim does not use still becomes a taint.
faulty=$(( (stuck_gpu + 1) % 4 ))
whole_gpu=$(kubectl get resourceclaim "$(claim_of_pod whole-meanwhile)" -o jsonpath='{.status.allocation.devices.results[0].device}')
[[ gpu-$faulty == "$whole_gpu" ]] && faulty=$(( (stuck_gpu + 2) % 4 ))
sim inject --gpu "$faulty" --xid 79 >/dev/null
tainted() { kubectl get resourceslices -o json | jq -e --arg d "gpu-$faulty" '[.items[].spec.devices[]? | select(.name == $d) | .taints[]?] | length > 0' >/dev/null; }
wait_for "gpu-$faulty tainted after its XID 79, while the claim on GPU $stuck_gpu hangs" 20 tainted
ok "a claim whose MIG call hangs on GPU $stuck_gpu: 20 retries over the plugin socket gave up after 2 s each beside the kubelet's own call; meanwhile a whole-GPU pod ran and gpu-$faulty was tainted after an XID 79"
for g in 0 1 2 3; do sim stall --gpu "$g" --enabled false; done
kubectl annotate pod stuck --overwrite e2e-gpu-answers=true >/dev/null
wait_for "the stuck pod to run once its GPU answers" 90 running stuck
prepared=$(driver_logs | grep -c "INFO gpu_dra::prepare::state: prepared claim .*claimUID=$stuck_uid" || true)
((prepared == 1)) || fail "the stuck claim was prepared $prepared times"
ok "once the GPU answered the pod ran; its claim was prepared once for all the retries"
sim inject --gpu "$faulty" --reset >/dev/null
kubectl delete pod stuck whole-meanwhile --wait=true --timeout=60s >/dev/null || fail "deleting the pods"
wait_for "the stuck pod's MIG instance destroyed" 60 no_mig

report_mode "the driver image installed by the Helm chart on a driver root whose tools cannot run"
echo "$passed passed, 0 failed"
