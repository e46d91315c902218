#!/usr/bin/env bash
# Predictions equal reality for gangs: `gpu-dra match --replicas` against kube-scheduler v1.37.2
# with its gang scheduling on (GenericWorkload, DRAWorkloadResourceClaims; scheduling.k8s.io/v1beta1
# served), on two simulated nodes of 4 H100s, each a real `gpu-dra run` (host process; no kubelet:
# what is checked is which pods the scheduler binds, with which devices; not what the pods get,
# which e2e/pods.sh checks through the chart and the kubelet). The workload controllers and
# Kueue are not run here: these are PodGroups and plain pods, the scheduler's own gangs.
#
# In order, each applied when the one before has settled (8 GPUs in all):
#   1. PodGroup shared (gang minCount 2) with a workload-level claim of 1 GPU its two pods share,
#      each pod with 1 GPU of its own -> both bind, on the shared GPU's node (3 GPUs there);
#   2. PodGroup gang-fits (gang minCount 2): two pods of 2 GPUs -> both bind, on the other node;
#   3. PodGroup gang-short (gang minCount 2): two pods of 1 GPU where 1 GPU is left -> none
#      binds, and the GPU stays free;
#   4. pods after-0..1 of 1 GPU each (no group) -> one binds, one stays Pending.
# The same objects, with the live ResourceSlices, go through `gpu-dra match --replicas`
# beforehand; per workload, the pods it places must be the pods the scheduler bound (their count;
# the node a pod of equal nodes goes to is the scheduler's choice). Prints `workloads: N applied,
# predictions equal reality for N`.
#
# Usage: e2e/workloads.sh   Environment: GPU_DRA, GPU_DRA_K8S_BIN.
set -euo pipefail
NAME=workloads-e2e
E2E=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$E2E")
# shellcheck source-path=SCRIPTDIR source=versions.env
source "$E2E/versions.env"
WORK=$(mktemp -d "/tmp/gpu-dra-$NAME.XXXXXX")
passed=0
DRIVER_PIDS=()
log() { echo "$NAME: $*" >&2; }
fail() {
    log "FAIL: $*"
    local f
    for f in "$WORK"/driver-*.log; do
        [[ -f $f ]] && { log "$f (tail):"; tail -n 15 "$f" >&2; }
    done
    echo "$passed passed, 1 failed"
    exit 1
}
ok() { passed=$((passed + 1)); log "ok - $*"; }
cleanup() {
    local pid
    for pid in "${DRIVER_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${DRIVER_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    [[ -n ${GPU_DRA_CLUSTER_DIR:-} ]] && "$E2E/cluster" down >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# shellcheck source-path=SCRIPTDIR source=sim-driver.sh
source "$E2E/sim-driver.sh"
use_private_binaries

NODES=(wl-1 wl-2)
GPUS=sim:4xH100-SXM5-80GB
export GPU_DRA_CLUSTER_DIR=$WORK/cluster
export GPU_DRA_CLUSTER_FEATURE_GATES="$K8S_FEATURE_GATES,GenericWorkload=true,DRAWorkloadResourceClaims=true"
export GPU_DRA_CLUSTER_RUNTIME_CONFIG=scheduling.k8s.io/v1beta1=true
"$E2E/cluster" up --nodes "$(IFS=,; echo "${NODES[*]}")" >/dev/null 2>"$WORK/cluster-up.log" \
    || { cat "$WORK/cluster-up.log" >&2; fail "the control plane did not start"; }
eval "$("$E2E/cluster" env)"
kubectl apply -f "$ROOT/deviceclasses/" >/dev/null
for node in "${NODES[@]}"; do
    start_sim_driver "$node" "$GPUS" "$WORK/$node" "$WORK/driver-$node.log" --mig off
    DRIVER_PIDS+=("$SIM_DRIVER_PID")
done
deadline=$((SECONDS + 60))
until [[ $(kubectl get resourceslices --no-headers 2>/dev/null | wc -l) -ge ${#NODES[@]} ]]; do
    ((SECONDS < deadline)) || fail "the drivers did not publish within 60s"
    sleep 0.2
done
kubectl get resourceslices -o yaml >"$WORK/slices.yaml"
ok "two nodes of 4 H100s published; kube-scheduler with GenericWorkload and DRAWorkloadResourceClaims"

# ------------------------------------------------------------------ the workloads
claim() { # name, GPUs
    printf 'apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: %s}\nspec:\n  devices:\n    requests:\n    - name: gpu\n      exactly: {deviceClassName: gpu.nvidia.com, count: %s}\n---\n' "$1" "$2"
}
pod() { # name, claim, [pod group]
    printf 'apiVersion: v1\nkind: Pod\nmetadata: {name: %s}\nspec:\n' "$1"
    [[ -z ${3:-} ]] || printf '  schedulingGroup: {podGroupName: %s}\n' "$3"
    printf '  containers:\n  - {name: c, image: registry.k8s.io/pause:3.10, resources: {claims: [{name: gpu}]}}\n  resourceClaims:\n  - {name: gpu, resourceClaimName: %s}\n---\n' "$2"
}
group() { # name, minCount, [shared claim]
    printf 'apiVersion: scheduling.k8s.io/v1beta1\nkind: PodGroup\nmetadata: {name: %s}\nspec:\n  schedulingPolicy:\n    gang: {minCount: %s}\n' "$1" "$2"
    [[ -z ${3:-} ]] || printf '  resourceClaims:\n  - {name: shared, resourceClaimName: %s}\n' "$3"
    printf -- '---\n'
}
# Two pods sharing the group's claim, each with one GPU of its own.
shared_group() {
    group shared 2 shared-gpu
    claim shared-gpu 1
    local i
    for ((i = 0; i < 2; i++)); do
        claim "shared-$i" 1
        printf 'apiVersion: v1\nkind: Pod\nmetadata: {name: shared-%s}\nspec:\n  schedulingGroup: {podGroupName: shared}\n' "$i"
        printf '  containers:\n  - {name: c, image: registry.k8s.io/pause:3.10, resources: {claims: [{name: gpu}, {name: shared}]}}\n'
        printf '  resourceClaims:\n  - {name: gpu, resourceClaimName: shared-%s}\n  - {name: shared, resourceClaimName: shared-gpu}\n---\n' "$i"
    done
}
gang() { # name, minCount, pods, GPUs each
    group "$1" "$2"
    local i
    for ((i = 0; i < $3; i++)); do
        claim "$1-$i" "$4"
        pod "$1-$i" "$1-$i" "$1"
    done
}
{
    shared_group
    gang gang-fits 2 2 2
    gang gang-short 2 2 1
    for i in 0 1; do
        claim "after-$i" 1
        pod "after-$i" "after-$i"
    done
} >"$WORK/workloads.yaml"

# The prediction, from the live slices and the same objects, before anything is applied.
set +e
"$GPU_DRA" match --slices "$WORK/slices.yaml" --classes "$ROOT/deviceclasses" -f "$WORK/workloads.yaml" \
    --replicas -o json >"$WORK/predicted.json" 2>"$WORK/predicted.txt"
set -e
predicted() { # pod -> 1 placed, 0 not
    jq -r --arg c "$1" '[.items[]? // . | select(.metadata.name == $c and .status.allocation != null)] | length' "$WORK/predicted.json"
}

# Reality: apply in order, each settled before the next.
settle() { # pods...; waits until each is bound or the scheduler has given up on it
    local p deadline=$((SECONDS + 90))
    for p in "$@"; do
        until [[ -n $(kubectl get pod "$p" -o jsonpath='{.spec.nodeName}') ]] \
            || [[ $(kubectl get pod "$p" -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].reason}') == Unschedulable ]]; do
            ((SECONDS < deadline)) || fail "pod $p neither bound nor unschedulable within 90s"
            sleep 0.3
        done
    done
}
apply_part() { # first object name prefix
    python3 - "$WORK/workloads.yaml" "$1" <<'EOF' | kubectl apply -f - >/dev/null
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
for d in docs:
    if d["metadata"]["name"].startswith(sys.argv[2]):
        print("---"); print(yaml.safe_dump(d))
EOF
}
applied=0 equal=0
check() { # workload, pods...
    local workload=$1 p bound=0 placed=0
    shift
    for p in "$@"; do
        [[ -z $(kubectl get pod "$p" -o jsonpath='{.spec.nodeName}') ]] || bound=$((bound + 1))
        placed=$((placed + $(predicted "$p")))
    done
    applied=$((applied + 1))
    if ((bound == placed)); then
        equal=$((equal + 1))
        ok "$workload: kube-scheduler bound $bound of $# pods; gpu-dra match placed $placed"
    else
        log "prediction (stderr of match):"
        cat "$WORK/predicted.txt" >&2
        fail "$workload: kube-scheduler bound $bound of $# pods, gpu-dra match placed $placed"
    fi
}
apply_part shared
settle shared-0 shared-1
check "PodGroup shared (minCount 2, a claim of the group)" shared-0 shared-1
[[ $(kubectl get pod shared-0 -o jsonpath='{.spec.nodeName}') == $(kubectl get pod shared-1 -o jsonpath='{.spec.nodeName}') ]] \
    || fail "the pods sharing the group's claim went to different nodes"
ok "PodGroup shared: both pods on the node of the group's claim ($(kubectl get resourceclaim shared-gpu -o jsonpath='{.status.reservedFor[*].resource}'))"
apply_part gang-fits
settle gang-fits-0 gang-fits-1
check "PodGroup gang-fits (minCount 2)" gang-fits-0 gang-fits-1
apply_part gang-short
settle gang-short-0 gang-short-1
sleep 5 # a gang that waits at Permit would hold devices a while: it must not
check "PodGroup gang-short (minCount 2)" gang-short-0 gang-short-1
apply_part after
settle after-0 after-1
check "pods after-0..1" after-0 after-1
grep -q 'PodGroup default/gang-short: none of its 2 pods binds' "$WORK/predicted.txt" \
    || fail "match did not say the short gang binds nothing: $(cat "$WORK/predicted.txt")"
line="workloads: $applied applied, predictions equal reality for $equal"
log "$line"
[[ -z ${GPU_DRA_TEST_REPORT:-} ]] || echo "$line" >>"$GPU_DRA_TEST_REPORT"
echo "$passed passed, 0 failed"
