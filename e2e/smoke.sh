#!/usr/bin/env bash
# Smoke e2e: the real kube-scheduler allocates a ResourceClaim from a hand-written
# ResourceSlice and binds the pod that uses it to a simulated node; alloc-oracle (the same
# allocator, run offline) must predict the same device.
#
#   e2e/smoke.sh      (builds the components on first use; see e2e/build-k8s.sh)
#
# The control plane is always stopped on exit (trap), pass or fail. Uses its own state dir
# (GPU_DRA_CLUSTER_DIR, default /tmp/gpu-dra-smoke) so it never touches a dev cluster.
set -euo pipefail

E2E_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=versions.env
source "$E2E_DIR/versions.env"
export GPU_DRA_CLUSTER_DIR=${GPU_DRA_CLUSTER_DIR:-/tmp/gpu-dra-smoke}
NODE=sim-node-1
NS=default
TIMEOUT=${SMOKE_TIMEOUT:-60}

passed=0 failed=0
summary() { echo "$passed passed, $failed failed"; }
pass() { echo "PASS: $*"; passed=$((passed + 1)); }
fail() { echo "FAIL: $*" >&2; failed=$((failed + 1)); }

WORK=
cleanup() {
    local rc=$?
    [[ -z $WORK ]] || rm -rf "$WORK"
    "$E2E_DIR/cluster" down || { echo "smoke: cluster down failed" >&2; rc=1; }
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if ! "$E2E_DIR/cluster" up --nodes "$NODE"; then
    echo "FAIL: control plane did not start (see the log above)" >&2
    failed=1
    summary
    exit 1
fi
eval "$("$E2E_DIR/cluster" env)"
kubectl() { "$GPU_DRA_K8S_BIN/kubectl" "$@"; }

diagnose() {
    echo "--- diagnostics" >&2
    kubectl get resourceslices,deviceclasses -o wide >&2 || true
    kubectl -n "$NS" get resourceclaim gpu-claim -o yaml >&2 || true
    kubectl -n "$NS" describe pod gpu-pod >&2 || true
    echo "--- kube-scheduler log (tail)" >&2
    tail -n 30 "$GPU_DRA_CLUSTER_DIR/logs/kube-scheduler.log" >&2 || true
}

# Two GPUs: gpu-0 (24Gi) comes first, so a first-fit without the selector would take it;
# only gpu-1 (80GB) satisfies memory >= 40Gi.
WORK=$(mktemp -d)
cat >"$WORK/class.yaml" <<EOF
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: gpu.nvidia.com
spec:
  selectors:
  - cel:
      expression: device.driver == 'gpu.nvidia.com'
EOF
cat >"$WORK/slice.yaml" <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata:
  name: $NODE-gpu.nvidia.com
spec:
  driver: gpu.nvidia.com
  nodeName: $NODE
  pool:
    name: $NODE
    generation: 1
    resourceSliceCount: 1
  devices:
  - name: gpu-0
    attributes:
      type: {string: gpu}
      uuid: {string: GPU-4b0e8f3c-2d1a-4a57-9c55-0f0b6a1e7d21}
      productName: {string: NVIDIA L4}
      architecture: {string: Ada Lovelace}
      cudaComputeCapability: {version: 8.9.0}
      driverVersion: {version: 580.126.20}
      resource.kubernetes.io/pciBusID: {string: "0000:17:00.0"}
      resource.kubernetes.io/numaNode: {int: 0}
    capacity:
      memory: {value: 23034Mi}
  - name: gpu-1
    attributes:
      type: {string: gpu}
      uuid: {string: GPU-9a3c61d2-7e44-4f0b-8d2e-5b7c0a9f1e33}
      productName: {string: NVIDIA H100 80GB HBM3}
      architecture: {string: Hopper}
      cudaComputeCapability: {version: 9.0.0}
      driverVersion: {version: 580.126.20}
      resource.kubernetes.io/pciBusID: {string: "0000:9a:00.0"}
      resource.kubernetes.io/numaNode: {int: 1}
    capacity:
      memory: {value: 81559Mi}
EOF
cat >"$WORK/claim.yaml" <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: gpu-claim
  namespace: $NS
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
        selectors:
        - cel:
            expression: device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0
EOF
cat >"$WORK/pod.yaml" <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: gpu-pod
  namespace: $NS
spec:
  resourceClaims:
  - name: gpu
    resourceClaimName: gpu-claim
  containers:
  - name: main
    image: registry.k8s.io/pause:3.10
    resources:
      claims:
      - name: gpu
EOF
for f in class slice claim pod; do kubectl apply -f "$WORK/$f.yaml"; done

# wait_jsonpath OBJECT JSONPATH: print the value once non-empty, or fail after TIMEOUT.
wait_jsonpath() {
    local deadline=$((SECONDS + TIMEOUT)) v
    while ((SECONDS < deadline)); do
        v=$(kubectl -n "$NS" get "$1" -o "jsonpath=$2" 2>/dev/null || true)
        if [[ -n $v ]]; then
            echo "$v"
            return 0
        fi
        sleep 0.5
    done
    return 1
}

if device=$(wait_jsonpath resourceclaim/gpu-claim '{.status.allocation.devices.results[0].device}'); then
    pool=$(kubectl -n "$NS" get resourceclaim gpu-claim -o jsonpath='{.status.allocation.devices.results[0].pool}')
    if [[ $device == gpu-1 && $pool == "$NODE" ]]; then
        pass "claim allocated to $pool/$device (the only GPU with >= 40Gi)"
    else
        fail "claim allocated to $pool/$device, expected $NODE/gpu-1"
    fi
else
    fail "claim gpu-claim has no status.allocation after ${TIMEOUT}s"
fi

if node=$(wait_jsonpath pod/gpu-pod '{.spec.nodeName}'); then
    if [[ $node == "$NODE" ]]; then pass "pod bound to $node"; else fail "pod bound to $node, expected $NODE"; fi
else
    fail "pod gpu-pod not bound after ${TIMEOUT}s"
fi

reserved=$(kubectl -n "$NS" get resourceclaim gpu-claim -o jsonpath='{.status.reservedFor[*].name}' 2>/dev/null || true)
if [[ $reserved == gpu-pod ]]; then
    pass "claim reserved for gpu-pod"
else
    fail "claim reservedFor is '$reserved', expected gpu-pod"
fi

# The Go allocation oracle must predict what the real scheduler did (same library, same gates).
if oracle_bin=$("$E2E_DIR/build-k8s.sh" alloc-oracle | tail -n 1) &&
    oracle=$("$oracle_bin/alloc-oracle" --feature-gates "$K8S_FEATURE_GATES" --node "$NODE" \
        --slices "$WORK/slice.yaml" --classes "$WORK/class.yaml" --claims "$WORK/claim.yaml"); then
    predicted=$(grep -o '"device": *"[^"]*"' <<<"$oracle" | head -n 1 | sed 's/.*"\([^"]*\)"$/\1/')
    if [[ $predicted == "${device:-}" ]]; then
        pass "alloc-oracle predicts the scheduler's choice ($predicted)"
    else
        fail "alloc-oracle predicts '$predicted', scheduler chose '${device:-}'"$'\n'"$oracle"
    fi
else
    fail "alloc-oracle did not run"
fi

((failed == 0)) || diagnose
summary
((failed == 0))
