#!/usr/bin/env bash
# e2e: dynamic MIG on the real control plane, on a simulated 1×H100 node.
#
#   1. a claim for class mig.nvidia.com with profile == '3g.40gb' is allocated by kube-scheduler
#      and prepared: a GPU instance + compute instance exist in the simulated hardware and the
#      CDI spec has the MIG capability nodes; its TimeSlicing config (accepted, as NVIDIA's
#      driver accepts it) gets a Warning Event on the claim saying it changes nothing;
#   2. a claim for the whole GPU stays unschedulable while the MIG device is allocated;
#   3. after unprepare and deallocation it is allocated and prepared (MIG mode switched off).
set -euo pipefail
NAME=mig-e2e
NODE=mig-node-1
GPUS=sim:1xH100-SXM5-80GB
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

kubectl apply -f "$ROOT/deviceclasses/" >&2
start_driver
wait_for "26 devices published" 30 bash -c "[[ \$(kubectl get resourceslices -o json | jq '[.items[].spec.devices[]?] | length') == 26 ]]"
ok "1 whole GPU + 25 MIG placements and a counter set published"

claim_and_pod() { # name class selector [opaque parameters as JSON]
    local config=
    [[ -z ${4:-} ]] || config="{requests: [gpu], opaque: {driver: gpu.nvidia.com, parameters: $4}}"
    kubectl apply -f - >&2 <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: $1, namespace: default}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: $2
        selectors: [{cel: {expression: "$3"}}]
    config: [$config]
---
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default}
spec:
  containers: [{name: c, image: registry.k8s.io/pause:3.10, resources: {claims: [{name: gpu}]}}]
  resourceClaims: [{name: gpu, resourceClaimName: $1}]
EOF
}
allocated_device() { kubectl get resourceclaim "$1" -o json | jq -r '.status.allocation.devices.results[0].device // empty'; }
ref() { echo "default/$1/$(kubectl get resourceclaim "$1" -o jsonpath='{.metadata.uid}')"; }
prepare() {
    local out
    out=$(kubelet prepare --claim "$(ref "$1")") || fail "prepare $1: $out"
    [[ $(jq -r '.claims[0].error' <<<"$out") == "" ]] || fail "prepare $1: $(jq -r '.claims[0].error' <<<"$out")"
}

# ---------------------------------------------------------------- 1. a 3g.40gb slice
claim_and_pod slice mig.nvidia.com "device.attributes['gpu.nvidia.com'].profile == '3g.40gb'" \
    '{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig", "sharing": {"strategy": "TimeSlicing"}}'
wait_for "MIG claim allocated" 60 bash -c "[[ -n \$(kubectl get resourceclaim slice -o json | jq -r '.status.allocation.devices.results[0].device // empty') ]]"
device=$(allocated_device slice)
[[ $device == gpu-0-mig-3g40gb-9-* ]] || fail "unexpected device $device"
prepare slice
hw=$("$GPU_DRA" sim --gpus "$GPUS" --node-name "$NODE" --sim-state "$WORK/hw.json" show)
[[ $(jq '[.gpus[0].gpu_instances[] | select(.profile_id == 9)] | length' <<<"$hw") == 1 ]] || fail "no 3g GPU instance: $hw"
[[ $(jq '.gpus[0].gpu_instances[0].compute_instances | length' <<<"$hw") == 1 ]] || fail "no compute instance: $hw"
gi=$(jq '.gpus[0].gpu_instances[0].id' <<<"$hw")
uid=$(kubectl get resourceclaim slice -o jsonpath='{.metadata.uid}')
spec=$WORK/cdi/k8s.gpu.nvidia.com-claim_$uid.json
jq -e --arg cap "/dev/nvidia-caps/nvidia-cap$((3 + 9 * gi))" \
    '[.devices[0].containerEdits.deviceNodes[].path] | index($cap) != null' "$spec" >/dev/null \
    || fail "CDI spec lacks the GI capability node: $(cat "$spec")"
jq -e '.devices[0].containerEdits.env[0] | startswith("NVIDIA_VISIBLE_DEVICES=MIG-")' "$spec" >/dev/null || fail "no MIG UUID in the spec"
if [[ $DRIVER_BACKEND == nvml ]]; then
    # Real GPUs: the driver root's files are mounted (found once, at start).
    jq -e '[.containerEdits.mounts[].containerPath] | index("/usr/lib/x86_64-linux-gnu/libcuda.so.1") != null' "$spec" >/dev/null \
        || fail "the CDI spec does not mount the driver root's libcuda: $(jq -c .containerEdits "$spec")"
fi
ok "kube-scheduler allocated $device; prepare carved GI $gi + CI, CDI has nvidia-cap$((3 + 9 * gi))"
wait_for "a TimeSlicingNotApplied Warning Event on claim slice" 20 bash -c \
    "kubectl get events -o json --field-selector involvedObject.name=slice | jq -e '.items[] | select(.type == \"Warning\" and .reason == \"TimeSlicingNotApplied\" and .involvedObject.kind == \"ResourceClaim\")'"
ok "TimeSlicing on the MIG device: prepared, with a Warning Event on the claim (TimeSlicingNotApplied)"

# ---------------------------------------------------------------- 2. the whole GPU must wait
claim_and_pod whole gpu.nvidia.com "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0"
# The scheduler's verdict, not a guess at how long it takes: PodScheduled=False, Unschedulable.
wait_for "the whole-GPU pod unschedulable" 60 bash -c \
    "kubectl get pod whole -o json | jq -e '.status.conditions[]? | select(.type == \"PodScheduled\" and .status == \"False\" and .reason == \"Unschedulable\")'"
[[ -z $(allocated_device whole) ]] || fail "the whole GPU was allocated while a MIG device is in use"
[[ $(kubectl get pod whole -o jsonpath='{.spec.nodeName}') == "" ]] || fail "the whole-GPU pod was bound"
ok "a whole-GPU claim stays unschedulable while the MIG device lives"

# ---------------------------------------------------------------- 3. release, then the whole GPU
out=$(kubelet unprepare --claim "$(ref slice)") || fail "unprepare: $out"
[[ $(gpu_instances) == 0 ]] || fail "GPU instance left after unprepare"
kubectl delete pod slice --grace-period=0 --force >&2 2>/dev/null || true
kubectl patch resourceclaim slice --type=merge -p '{"metadata":{"finalizers":null}}' >&2 || true
kubectl delete resourceclaim slice --wait=false >&2
wait_for "whole GPU allocated" 90 bash -c "[[ \$(kubectl get resourceclaim whole -o json | jq -r '.status.allocation.devices.results[0].device // empty') == gpu-0 ]]"
prepare whole
hw=$("$GPU_DRA" sim --gpus "$GPUS" --node-name "$NODE" --sim-state "$WORK/hw.json" show)
[[ $(jq '.gpus[0].mig_current' <<<"$hw") == false ]] || fail "MIG mode still on for the whole GPU"
ok "after unprepare and deallocation the whole GPU is allocated and prepared (MIG mode off)"

echo "$passed passed, 0 failed"
