#!/usr/bin/env bash
# e2e: switching a real node from NVIDIA's driver to gpu-dra's chart while pods run (issue 54,
# item 5), on the real node (kubelet, containerd, runc) with 8 simulated H100s.
#
#   1. NVIDIA's gpu-kubelet-plugin v0.5.0 (DynamicMIG and TimeSlicingSettings on) registers with
#      the node's kubelet; three pods start with claims it prepares: a whole GPU, a time-sliced GPU
#      (interval Long) and a 1g.10gb MIG device it carves. Their containers run.
#   2. NVIDIA's plugin stops (its chart's uninstall stops its pod: SIGTERM) and gpu-dra's chart is
#      installed, without draining. The pods keep running: the same containers, no restart. gpu-dra
#      takes NVIDIA's checkpoint over (kept aside as checkpoint.json.dra-driver-nvidia-gpu),
#      leaves the hardware as NVIDIA left it, replaces NVIDIA's CDI specs with its own, publishes
#      the node, and a new pod asking for five whole GPUs gets exactly the five the three claims
#      do not hold (nothing held is handed out twice).
#   3. The pods are deleted: the kubelet asks gpu-dra to unprepare NVIDIA's claims; the MIG device
#      NVIDIA carved is destroyed, the GPU's time-slice is back to the default, no claim's CDI spec
#      and no claim in the checkpoint is left.
#
# What this proves less than it seems: NVIDIA's plugin runs as a host process registered with the
# real kubelet (its image and chart are not built here), in a mount namespace where
# /proc/driver/nvidia and /proc/devices are a real driver's layout for the simulated GPUs, and its
# `nvidia-smi` a stand-in that sets the simulated GPUs' time-slice (e2e/nvidia-plugin.sh). gpu-dra
# runs as users run it: its image through its chart. An MPS claim is not in it (NVIDIA's control
# daemon is a Deployment of its image); e2e/switch-from-nvidia.sh shows such a claim refused with
# its reason.
#
# Prints `switch on the real node: ...`; in e2e/run-tests.
set -euo pipefail
E2E=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$E2E")
cd "$ROOT"
NAME=switch-on-node
WORK=$(mktemp -d /tmp/gpu-dra-switch-on-node.XXXXXX)
# shellcheck source=chart.sh
source "$E2E/chart.sh"
# shellcheck source=manifests.sh
source "$E2E/manifests.sh"
export GPU_DRA_CLUSTER_DIR=$WORK/cluster
passed=0

log() { echo "$NAME: $*" >&2; }
ok() { passed=$((passed + 1)); log "ok - $*"; }
fail() {
    log "FAIL: $*"
    if [[ -n ${KUBECONFIG:-} ]]; then
        kubectl get pods,resourceclaims -A -o wide 2>&1 | sed 's/^/    /' >&2 || true
    fi
    if [[ -f $WORK/nvidia.log ]]; then
        echo "    NVIDIA's plugin (tail):" >&2
        tail -n 25 "$WORK/nvidia.log" | sed 's/^/    /' >&2
    fi
    if [[ -n ${E2E_POD_LOGS:-} ]]; then
        echo "    gpu-dra's driver pod (tail):" >&2
        driver_logs | cut -d' ' -f4- | tail -n 25 | cut -c1-400 | sed 's/^/    /' >&2
    fi
    echo "$passed passed, 1 failed"
    exit 1
}
cleanup() {
    ! declare -F stop_nvidia >/dev/null || stop_nvidia
    "$E2E/cluster" down >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
set -E
trap 'fail "line $LINENO: unexpected failure of: $BASH_COMMAND"' ERR
# shellcheck source=versions.env
source "$E2E/versions.env"
export GPU_DRA=${GPU_DRA:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/gpu-dra}
BIN=${GPU_DRA_K8S_BIN:-$("$E2E/build-k8s.sh" | tail -n 1)}
export GPU_DRA_K8S_BIN=$BIN PATH="$BIN:$PATH"

chart_build_images
chart_cluster_up --gpus sim:8xH100-SXM5-80GB
eval "$("$E2E/cluster" env)"
chart_import_images
kubectl apply -f "$ROOT/deviceclasses/" >&2 # NVIDIA's chart installs the same classes

# ---------------------------------------------------------------- 1. NVIDIA's driver, pods running
GPUS=$E2E_GPUS NODE=$E2E_NODE NVIDIA_ROOT=$E2E_DRIVER_ROOT NVIDIA_STATE=$GPU_DRA_SIM_STATE
NVIDIA_FAKE_NVML=${FAKE_NVML:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/libnvidia_ml.so}
[[ -f $NVIDIA_FAKE_NVML ]] || (cd "$ROOT" && cargo build -p fakenvml) >&2
# shellcheck source=nvidia-plugin.sh
source "$E2E/nvidia-plugin.sh"
export FAKE_NVML_GPUS=$GPUS FAKE_NVML_NODE=$NODE FAKE_NVML_STATE=$NVIDIA_STATE
nvidia_node_setup
PLUGINS=$E2E_KUBELET_ROOT/plugins
NVIDIA_GATES=DynamicMIG=true,TimeSlicingSettings=true \
    launch_nvidia "$PLUGINS" "$E2E_KUBELET_ROOT/plugins_registry" "$GPU_DRA_CDI_ROOT" "$WORK/nvidia.log"
wait_for "the kubelet registered NVIDIA's plugin" 60 grep -q 'Registered DRA plugin.*gpu.nvidia.com' "$GPU_DRA_CLUSTER_DIR/logs/kubelet.log"
slices() { kubectl get resourceslices -o json --field-selector "spec.nodeName=$NODE"; }
wait_for "NVIDIA's plugin published 8 GPUs" 60 bash -c \
    "[[ \$(kubectl get resourceslices -o json | jq '[.items[].spec.devices[]? | select(.name | test(\"^gpu-[0-9]+\$\"))] | length') == 8 ]]"
nvidia_uuids
uuid_of() { slices | jq -r --arg d "$1" '.items[].spec.devices[]? | select(.name == $d) | .attributes.uuid.string'; }

# pod POD CLAIM: a pod whose container lists the GPU device nodes it got, then sleeps.
pod() {
    cat <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: $E2E_IMAGE
    command: [sh, -c, 'ls /dev/nvidia0 /dev/nvidia1 /dev/nvidia2 /dev/nvidia3 /dev/nvidia4 /dev/nvidia5 /dev/nvidia6 /dev/nvidia7 /dev/nvidia-caps 2>/dev/null; trap "exit 0" TERM; sleep 100000 & wait']
    resources: {claims: [{name: gpu}]}
  resourceClaims:
  - {name: gpu, resourceClaimName: $2}
EOF
}
{ claim_yaml whole gpu.nvidia.com "device.attributes[\"gpu.nvidia.com\"].uuid == \"$(uuid_of gpu-0)\""; echo ---; pod whole whole; } | kubectl apply -f - >&2
{ claim_yaml carved mig.nvidia.com "device.attributes[\"gpu.nvidia.com\"].profile == \"1g.10gb\" && device.attributes[\"gpu.nvidia.com\"].parentUUID == \"$(uuid_of gpu-2)\""
    echo ---; pod carved carved; } | kubectl apply -f - >&2
{ timesliced_claim_yaml sliced "device.attributes[\"gpu.nvidia.com\"].uuid == \"$(uuid_of gpu-1)\"" Long; echo ---; pod sliced sliced; } |
    kubectl apply -f - >&2
running() { [[ $(kubectl get pod "$1" -o jsonpath='{.status.containerStatuses[0].state.running.startedAt}') != "" ]]; }
for p in whole sliced carved; do wait_for "pod $p running on NVIDIA's driver" 90 running "$p"; done
# container POD: its container's ID and restart count.
container() { kubectl get pod "$1" -o jsonpath='{.status.containerStatuses[0].containerID} {.status.containerStatuses[0].restartCount}'; }
declare -A before
for p in whole sliced carved; do before[$p]=$(container "$p"); done
uid_of() { kubectl get resourceclaim "$1" -o jsonpath='{.metadata.uid}'; }
gpu_state() { jq -c --argjson m "$1" '.gpus[] | select(.minor == $m) | {compute_mode, timeslice, instances: (.gpu_instances | length)}' "$NVIDIA_STATE"; }
[[ $(gpu_state 2 | jq .instances) == 1 ]] || fail "NVIDIA's driver did not carve: $(gpu_state 2)"
[[ $(gpu_state 1 | jq .timeslice) == 3 ]] || fail "NVIDIA's driver did not set the time-slice: $(gpu_state 1)"
for p in whole sliced carved; do
    [[ -f $GPU_DRA_CDI_ROOT/k8s.gpu.nvidia.com-claim_$(uid_of "$p").yaml ]] || fail "no NVIDIA spec for $p"
done
ctr_log() { cat "$E2E_POD_LOGS"/default_"$1"_*/c/0.log 2>/dev/null | cut -d' ' -f4-; }
ctr_log whole | grep -qx /dev/nvidia0 || fail "the whole-GPU pod did not get /dev/nvidia0: $(ctr_log whole)"
ctr_log carved | grep -qx /dev/nvidia2 || fail "the MIG pod did not get its parent's /dev/nvidia2: $(ctr_log carved)"
ok "NVIDIA's driver on the real node: pods running with a whole GPU, a time-sliced GPU and a MIG device it carved"

# ---------------------------------------------------------------- 2. the switch, without draining
stop_nvidia
checkpoint=$PLUGINS/gpu.nvidia.com/checkpoint.json
nvidia_checkpoint=$(sha256sum <"$checkpoint")
nvidia_specs=$(cd "$GPU_DRA_CDI_ROOT" && ls)
chart_install "$FIRST_REF"
driver_wait_ready
wait_for "gpu-dra took the claims over" 30 jq -e '(.claims | length) == 3 and ([.claims[] | select(.takenOver)] | length) == 3' "$checkpoint"
[[ $(sha256sum <"$checkpoint.dra-driver-nvidia-gpu") == "$nvidia_checkpoint" ]] || fail "NVIDIA's checkpoint not kept aside"
driver_logs | grep -q "taken over" || fail "the driver did not say what it took over"
for p in whole sliced carved; do
    running "$p" || fail "pod $p stopped running during the switch"
    [[ $(container "$p") == "${before[$p]}" ]] || fail "pod $p's container changed during the switch: ${before[$p]} -> $(container "$p")"
    uid=$(uid_of "$p")
    [[ -f $GPU_DRA_CDI_ROOT/k8s.gpu.nvidia.com-claim_$uid.json ]] || fail "no gpu-dra spec for $p"
    [[ ! -e $GPU_DRA_CDI_ROOT/k8s.gpu.nvidia.com-claim_$uid.yaml ]] || fail "NVIDIA's spec for $p is still there"
done
[[ $(gpu_state 2 | jq .instances) == 1 && $(gpu_state 1 | jq .timeslice) == 3 ]] ||
    fail "the switch changed the hardware: $(gpu_state 1) $(gpu_state 2)"
wait_for "gpu-dra publishes the node's 8 GPUs" 60 bash -c \
    "[[ \$(kubectl get resourceslices -o json | jq '[.items[].spec.devices[]? | select(.name | test(\"^gpu-[0-9]+\$\"))] | length') == 8 ]]"
ok "switched without draining: the three pods run on in the same containers (no restart), gpu-dra took the claims over (NVIDIA's checkpoint kept aside), the hardware is as NVIDIA left it, NVIDIA's specs replaced by gpu-dra's"

# Five whole GPUs: only gpu-3..gpu-7 are free (gpu-0 whole, gpu-1 time-sliced, gpu-2 carved).
kubectl apply -f - >&2 <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: rest, namespace: default}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu.nvidia.com, allocationMode: ExactCount, count: 5}
EOF
pod rest rest | kubectl apply -f - >&2
wait_for "pod rest running on gpu-dra" 90 running rest
got=$(kubectl get resourceclaim rest -o json | jq -r '[.status.allocation.devices.results[].device] | sort | join(" ")')
[[ $got == "gpu-3 gpu-4 gpu-5 gpu-6 gpu-7" ]] || fail "five whole GPUs after the switch should be gpu-3..gpu-7, got: $got"
ok "a new pod for five whole GPUs gets gpu-3..gpu-7, what NVIDIA's claims do not hold, prepared by gpu-dra"

# ---------------------------------------------------------------- 3. unprepare through the kubelet
kubectl delete pod whole sliced carved rest --timeout=60s >&2
no_claim_specs() { ! ls "$GPU_DRA_CDI_ROOT" | grep -q claim; }
wait_for "gpu-dra unprepared every claim" 60 no_claim_specs
wait_for "the checkpoint holds no claim" 30 jq -e '.claims == {}' "$checkpoint"
[[ $(gpu_state 2 | jq .instances) == 0 ]] || fail "the MIG device NVIDIA carved is left: $(gpu_state 2)"
[[ $(gpu_state 1) == "$(gpu_state 0)" && $(gpu_state 1 | jq .timeslice) == 0 ]] || fail "GPU 1 not set back: $(gpu_state 1)"
left=$(cd "$GPU_DRA_CDI_ROOT" && ls)
[[ -z $left ]] || fail "CDI specs left after the unprepare: $left (before the switch: $nvidia_specs)"
ok "the pods deleted: gpu-dra unprepared NVIDIA's claims through the kubelet (MIG device destroyed, time-slice back to the default), no CDI spec and no claim in the checkpoint left"

line="switch on the real node: 3 pods kept running (same containers, no restart) while NVIDIA's driver gave way to gpu-dra's chart; 3 claims taken over and unprepared fully, 0 leaks"
log "$line"
[[ -z ${GPU_DRA_TEST_REPORT:-} ]] || echo "$line" >>"$GPU_DRA_TEST_REPORT"
report_mode "NVIDIA's plugin as a host process on the real node, then gpu-dra's image through its chart"
echo "$passed passed, 0 failed"
