#!/usr/bin/env bash
# e2e: the slice fields behind Kubernetes alpha gates (driver --feature-gates, chart
# featureGates), against the real kube-apiserver and kube-scheduler:
#
#   1. gates on (e2e/versions.env), the Node declaring DRANodeAllocatableResources as a kubelet
#      with that gate does: the stored slices carry numaNode as a one-element list and each
#      device's overhead from --node-allocatable-overhead (whole GPU, MIG profile entry); a
#      claim selecting `0 in device.attributes["resource.kubernetes.io"].numaNode` is allocated
#      by the scheduler as `gpu-dra match` predicts, and the scheduler records the device's
#      overhead on the pod (status.nodeAllocatableResourceClaimStatuses);
#   2. a Node that does not declare the feature: the API server refuses the overhead, and the
#      driver refuses to start, naming the gate, before publishing anything;
#   3. an API server with DRAListTypeAttributes and DRANodeAllocatableResources off: the driver
#      refuses to start naming each gate, instead of publishing slices the server mangles.
#
# Mode: the driver runs as a host process publishing slices (no kubelet, no container): what is
# under test is what the API server and the scheduler accept. The chart's rendering of the same
# flags, and the list-valued numaNode under the chart's permissions, are in e2e/helm.sh.
#
# Usage: e2e/gates.sh   (GPU_DRA=path/to/gpu-dra, default target/debug/gpu-dra)
set -euo pipefail
NAME=gates-e2e
NODE=gates-node-1
GPUS=sim:2xH100-SXM5-80GB
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

GATES=$(source "$ROOT/e2e/versions.env" && echo "$K8S_FEATURE_GATES")
cat >"$WORK/overhead.yaml" <<'EOF'
"NVIDIA H100 80GB HBM3":
  memory: {perPod: 2Gi, perContainer: 512Mi}
  cpu: {perPod: 100m}
"NVIDIA H100 80GB HBM3/1g.10gb":
  memory: {perPod: 256Mi}
EOF
GATED="--feature-gates DRAListTypeAttributes=true,DRANodeAllocatableResources=true --node-allocatable-overhead $WORK/overhead.yaml"
declare_feature() {
    kubectl patch node "$NODE" --subresource=status --type=merge -p "{\"status\":{\"declaredFeatures\":$1}}" >&2
}
# The driver must exit, and say why: start_driver waits for registration, this does not.
refused_start() { # expected-text...
    : >"$WORK/driver.log"
    DRIVER_ARGS=$GATED launch_driver
    local rc=0
    wait "$DRIVER_PID" || rc=$?
    DRIVER_PID=
    ((rc != 0)) || fail "the driver started: $(tail -n 5 "$WORK/driver.log")"
    local want
    for want in "$@"; do
        grep -qF -- "$want" "$WORK/driver.log" || fail "the driver's error lacks '$want': $(tail -n 3 "$WORK/driver.log")"
    done
    [[ -z $(kubectl get resourceslices -o name) ]] || fail "slices were published before the refusal"
}

kubectl apply -f "$ROOT/deviceclasses/" >&2
bound() { [[ -n $(kubectl get pod "$1" -o jsonpath='{.spec.nodeName}') ]]; }

# ---------------------------------------------------------------- 2. the node does not declare it
refused_start "DRANodeAllocatableResources" "does not support DRANodeAllocatableResources feature" "turn the DRANodeAllocatableResources feature gate on"
ok "a Node whose kubelet does not declare DRANodeAllocatableResources: the driver refuses to start naming the gate; nothing published"

# ---------------------------------------------------------------- 1. gates on
declare_feature '["DRANodeAllocatableResources"]'
DRIVER_ARGS=$GATED start_driver
wait_for "devices published" 30 bash -c "kubectl get resourceslices -o json | jq -e '[.items[].spec.devices[]?.name] | index(\"gpu-1\")'"
stored=$(slices_json | jq -c '[.items[].spec.devices[]? | select(.name == "gpu-0" or .name == "gpu-0-mig-1g10gb-19-0")
    | {name, numa: .attributes["resource.kubernetes.io/numaNode"], overhead: (.nodeAllocatableResources | map_values(.overhead))}] | sort_by(.name)')
want='[{"name":"gpu-0","numa":{"ints":[0]},"overhead":{"cpu":{"perPod":"100m"},"memory":{"perContainer":"512Mi","perPod":"2Gi"}}},{"name":"gpu-0-mig-1g10gb-19-0","numa":{"ints":[0]},"overhead":{"memory":{"perPod":"256Mi"}}}]'
[[ $stored == "$want" ]] || fail "stored slices: $stored"
ok "the API server keeps numaNode as [0] and the per-device overhead (H100 2Gi + 512Mi per container + 100m CPU; its 1g.10gb 256Mi)"

# The scheduler reads the list: `gpu-dra match` on the stored objects predicts its choice.
kubectl get resourceslices -o yaml >"$WORK/slices.yaml"
claim_yaml numa gpu.nvidia.com 'device.attributes["gpu.nvidia.com"].type == "gpu" && 0 in device.attributes["resource.kubernetes.io"].numaNode' >"$WORK/numa.yaml"
predicted=$("$GPU_DRA" match --slices "$WORK/slices.yaml" --classes "$ROOT/deviceclasses/" --node "$NODE" \
    --feature-gates "$GATES" -o json "$WORK/numa.yaml" | jq -r '.status.allocation.devices.results[0].device') \
    || fail "gpu-dra match on the list-valued numaNode"
{ cat "$WORK/numa.yaml"; echo ---; pod_using_claim numa numa; } | kubectl apply -f - >&2
wait_for "numa pod scheduled" 60 bound numa
got=$(kubectl get resourceclaim numa -o jsonpath='{.status.allocation.devices.results[0].device}')
[[ $got == "$predicted" ]] || fail "the scheduler allocated $got, gpu-dra match predicted $predicted"
overhead=$(kubectl get pod numa -o json | jq -c '.status.nodeAllocatableResourceClaimStatuses[0].overhead | sort_by(.name)')
[[ $overhead == '[{"name":"cpu","perPod":"100m"},{"name":"memory","perContainer":"512Mi","perPod":"2Gi"}]' ]] \
    || fail "the scheduler recorded the pod's overhead as $overhead"
ok "a claim selecting on the list-valued numaNode: the scheduler allocates $got as gpu-dra match predicts, and records the device's overhead on the pod"
stop_driver

# ---------------------------------------------------------------- 3. the API server's gates off
"$E2E/cluster" down >&2
off=$(tr ',' '\n' <<<"$GATES" | grep -v -e '^DRAListTypeAttributes=' -e '^DRANodeAllocatableResources=' | paste -sd,)
GPU_DRA_CLUSTER_FEATURE_GATES=$off "$E2E/cluster" up --nodes "$NODE" >&2 || fail "the control plane (alpha gates off) did not start"
eval "$("$E2E/cluster" env)"
kubectl apply -f "$ROOT/deviceclasses/" >&2
refused_start "DRAListTypeAttributes" "turn the DRAListTypeAttributes feature gate on in kube-apiserver and kube-scheduler"
GATED="--feature-gates DRANodeAllocatableResources=true --node-allocatable-overhead $WORK/overhead.yaml"
declare_feature '["DRANodeAllocatableResources"]'
refused_start "DRANodeAllocatableResources" "drops it from the ResourceSlices it stores"
ok "an API server with the alpha gates off: the driver refuses to start, naming DRAListTypeAttributes, then DRANodeAllocatableResources; nothing published"
echo "$passed passed, 0 failed"
