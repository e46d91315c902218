#!/usr/bin/env bash
# e2e: one H100 shared by memory (--consumable-shares memory, KEP-5075) on the real control plane:
#
#   1. the driver publishes gpu-0 for several claims (allowMultipleAllocations, a memory request
#      policy in 1Mi steps) and the API server accepts it; so it does a dynamic-MIG node's shared
#      devices, whose engine counts each allocation takes none of;
#   2. three pods, each with a claim for 20Gi of a GPU with MPS, are allocated by the real
#      kube-scheduler to gpu-0 with their own shareIDs; a fourth asking 30Gi does not fit what is
#      left and stays Pending;
#   3. kubelet-sim prepares the three claims: one MPS daemon serves the GPU (EXCLUSIVE_PROCESS),
#      each claim's containers get its pipe and their own limits (20480M pinned, 26% threads);
#      this node cannot enforce memory per container (NVML limits: cgroup v2 and the toolkit's
#      hook): each claim gets a GpuMemoryNotEnforced Warning Event saying so;
#   4. unpreparing all three stops the daemon, removes its folder and mount and gives the GPU
#      back its compute mode: the simulated GPU is exactly as before.
#
# Usage: e2e/sharing.sh   (GPU_DRA=path/to/gpu-dra, default target/debug/gpu-dra)
set -euo pipefail
NAME=sharing-e2e
NODE=share-node-1
GPUS=sim:1xH100-SXM5-80GB
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# shellcheck source=mps-folder.sh
source "$(dirname "${BASH_SOURCE[0]}")/mps-folder.sh"

hw() { "$GPU_DRA" sim --gpus "$GPUS" --node-name "$NODE" --sim-state "$WORK/hw.json" show; }
"$GPU_DRA" sim --gpus "$GPUS" --node-name "$NODE" --sim-state "$WORK/hw.json" driver-root "$WORK/driver-root" >/dev/null
MPS_CONTROL=${FAKE_MPS_CONTROL:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/nvidia-cuda-mps-control}
[[ -x $MPS_CONTROL ]] || (cd "$ROOT" && cargo build -q -p fakenvml --bin nvidia-cuda-mps-control) >&2
install -m 0755 "$MPS_CONTROL" "$WORK/driver-root/usr/bin/nvidia-cuda-mps-control"
# The GPUs' state, without who holds them open (the driver's own NVML session changes with it).
gpu_state() { hw | jq -c '[.gpus[] | del(.holders)]'; }
before=$(gpu_state)

# ---------------------------------------------------------------- 1. publish
kubectl apply -f "$ROOT/deviceclasses/" >&2
DRIVER_ARGS="--mig off --consumable-shares memory --nvidia-driver-root $WORK/driver-root" start_driver
wait_for "gpu-0 published" 30 bash -c "kubectl get resourceslices -o json | jq -e '[.items[].spec.devices[]?] | length == 1'"
gpu=$(slices_json | jq -c '.items[].spec.devices[0]')
jq -e '.allowMultipleAllocations == true and .capacity.memory.requestPolicy.validRange.step == "1Mi"' <<<"$gpu" >/dev/null \
    || fail "gpu-0 not published for sharing: $gpu"
ok "gpu-0 published for several claims (memory $(jq -r .capacity.memory.value <<<"$gpu"), 1Mi steps), accepted by the API server"
reg=$(kubelet register) || fail "registration: $reg"
# Under dynamic MIG (the default on Hopper) whole GPUs and placements also publish engine counts
# (multiprocessors, copy engines, ...); shared, each allocation takes none of them (request policy
# 0), or one claim would use up a device whatever its shares. The API server takes that too.
"$GPU_DRA" slices --gpus sim:2xH100-SXM5-80GB --node-name "$NODE-dynamic" --mig dynamic --consumable-shares 4 -o json >"$WORK/dynamic-shared.json"
jq -e '[.items[].spec.devices[]? | select(.allowMultipleAllocations == true)
        | .capacity.multiprocessors.requestPolicy.validValues == ["0"]] | length > 0 and all' "$WORK/dynamic-shared.json" >/dev/null \
    || fail "dynamic-MIG devices shared without a zero policy on their engine counts"
out=$(kubectl create --dry-run=server -f "$WORK/dynamic-shared.json" 2>&1) || fail "the API server refused the shared dynamic-MIG slices: $out"
ok "shared dynamic-MIG devices (whole GPUs and placements) take no engine counts per allocation; the API server accepts them (dry run)"

# ---------------------------------------------------------------- 2. schedule
claim_and_pod() { # name memory
    kubectl apply -f - >&2 <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: $1, namespace: default}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
        capacity:
          requests:
            memory: $2
    config:
    - requests: ["gpu"]
      opaque:
        driver: gpu.nvidia.com
        parameters:
          apiVersion: resource.nvidia.com/v1beta1
          kind: GpuConfig
          sharing:
            strategy: MPS
---
$(pod_using_claim "$1" "$1")
EOF
}
for c in share-a share-b share-c; do
    claim_and_pod "$c" 20Gi
done
declare -A uid=()
for c in share-a share-b share-c; do
    wait_for "$c allocated and bound" 60 bash -c "[[ \$(kubectl get pod $c -o jsonpath='{.spec.nodeName}') == $NODE ]]"
    result=$(kubectl get resourceclaim "$c" -o json | jq -c '.status.allocation.devices.results[0]')
    jq -e '.device == "gpu-0" and (.shareID | length > 0) and .consumedCapacity.memory == "20Gi"' <<<"$result" >/dev/null \
        || fail "$c allocation: $result"
    uid[$c]=$(kubectl get resourceclaim "$c" -o jsonpath='{.metadata.uid}')
done
shares=$(for c in share-a share-b share-c; do kubectl get resourceclaim "$c" -o jsonpath='{.status.allocation.devices.results[0].shareID}{"\n"}'; done | sort -u | wc -l)
[[ $shares == 3 ]] || fail "the three claims do not have three shareIDs"
claim_and_pod share-too-big 30Gi
wait_for "share-too-big unschedulable" 60 bash -c \
    "kubectl get pod share-too-big -o json | jq -e '.status.conditions[]? | select(.type == \"PodScheduled\" and .status == \"False\")'"
ok "kube-scheduler put three 20Gi claims on gpu-0 (three shareIDs); a 30Gi claim does not fit the rest and stays Pending"

# ---------------------------------------------------------------- 3. prepare
for c in share-a share-b share-c; do
    out=$(kubelet prepare --claim "default/$c/${uid[$c]}") || fail "prepare $c: $out"
    [[ $(jq -r '.claims[0].error' <<<"$out") == "" ]] || fail "prepare $c: $(jq -r '.claims[0].error' <<<"$out")"
    spec=$WORK/cdi/k8s.gpu.nvidia.com-claim_${uid[$c]}.json
    env=$(jq -c '.containerEdits.env' "$spec")
    for want in CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=26; do
        jq -e --arg w "$want" 'index($w) != null' <<<"$env" >/dev/null || fail "$c: no $want in its containers' environment: $env"
    done
done
gpu_uuid=$(slices_json | jq -r '.items[].spec.devices[0].attributes.uuid.string')
daemon=$(mps_folder "$WORK/state" "shared-$gpu_uuid")
[[ $(mps_pids | wc -l) == 1 ]] || fail "want one MPS daemon for the shared GPU, have: $(mps_pids | tr '\n' ' ')"
grep -q "CUDA_VISIBLE_DEVICES=$gpu_uuid " "$daemon/log/control.log" || fail "daemon not limited to the GPU: $(cat "$daemon/log/control.log")"
for c in share-a share-b share-c; do
    jq -e --arg p "$daemon/pipe" '.containerEdits.mounts[] | select(.hostPath == $p and .containerPath == "/tmp/nvidia-mps")' \
        "$WORK/cdi/k8s.gpu.nvidia.com-claim_${uid[$c]}.json" >/dev/null || fail "$c: not given the shared daemon's pipe"
done
[[ $(hw | jq -r '.gpus[0].compute_mode') == ExclusiveProcess ]] || fail "the shared GPU is not in EXCLUSIVE_PROCESS"
hw | jq -e --arg u "$gpu_uuid" '.mps_daemons | length == 1 and .[0].devices == [$u]' >/dev/null ||
    fail "the simulated hardware does not know the shared daemon: $(hw | jq -c '.mps_daemons')"
ok "three claims prepared on gpu-0: one MPS daemon, each claim held to 20480M pinned and 26% of the threads"
# This node cannot hold each container to its claim on the GPU itself (NVML memory limits need the
# toolkit's hook and cgroup v2): each claim's owner is told, and what holds it instead.
for c in share-a share-b share-c; do
    wait_for "a GpuMemoryNotEnforced Warning Event on claim $c" 20 bash -c \
        "kubectl get events -o json --field-selector involvedObject.name=$c | jq -e '.items[] | select(.type == \"Warning\" and .reason == \"GpuMemoryNotEnforced\" and (.message | contains(\"20480 MiB\") and contains(\"the MPS client\")))'"
done
ok "each claim's owner told why the GPU does not enforce its 20480 MiB per container here, and that the MPS limit holds it (GpuMemoryNotEnforced)"

# ---------------------------------------------------------------- 4. unprepare
for c in share-a share-b; do
    out=$(kubelet unprepare --claim "default/$c/${uid[$c]}") || fail "unprepare $c: $out"
    [[ $(jq -r '.claims[0].error' <<<"$out") == "" ]] || fail "unprepare $c: $out"
done
[[ $(mps_pids | wc -l) == 1 ]] || fail "the shared daemon stopped while share-c still uses the GPU"
out=$(kubelet unprepare --claim "default/share-c/${uid[share-c]}") || fail "unprepare share-c: $out"
[[ $(jq -r '.claims[0].error' <<<"$out") == "" ]] || fail "unprepare share-c: $out"
[[ -z $(mps_all_pids) && -z $(mps_mounts) && ! -e $daemon ]] || fail "left after the last unprepare: MPS processes '$(mps_all_pids)', mounts '$(mps_mounts)'"
[[ $(gpu_state) == "$before" ]] || fail "the GPU differs from before: $(gpu_state) vs $before"
[[ $(hw | jq '.mps_daemons // [] | length') == 0 ]] || fail "MPS daemons left in the simulated hardware: $(hw | jq -c '.mps_daemons')"
ok "the daemon served until the last claim left; then stopped, shm unmounted, folder removed; the GPU is exactly as before"
log "mode: the driver as a host process on the API server (no kubelet: prepare is called through kubelet-sim); MPS and the image through the chart on the real node run in e2e/install.sh"
echo "$passed passed, 0 failed"
