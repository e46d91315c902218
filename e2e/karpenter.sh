#!/usr/bin/env bash
# Scale from zero with Karpenter: a GPU node appears for a pending claim only one node model can
# satisfy, gpu-dra publishes on it, the pod binds, and the emptied node is consolidated away.
#
# On the e2e control plane (etcd, kube-apiserver, kube-scheduler; no Node at the start):
#   - Karpenter (sigs.k8s.io/karpenter, KARPENTER_VERSION) with its kwok cloud provider, built
#     with e2e/karpenter: four instance types, a cheap CPU-only one and three GPU models whose
#     DynamicResources are `gpu-dra templates --form karpenter` of that model (8xH100 with
#     dynamic MIG, 4xL40S, a 4xGB200 tray); DRA on (IGNORE_DRA_REQUESTS=false);
#   - kwok (KWOK_VERSION) as the kubelet of the nodes Karpenter makes (Ready, pods Running);
#   - for each node Karpenter makes: `gpu-dra run` as a host process with that model's
#     simulated GPUs and the node's name (what the chart's DaemonSet pod would run there; no
#     kubelet calls it: nothing is prepared, the claim is allocated and the pod bound). So this
#     does not show the chart's pod starting on a new node (DaemonSet, image, kubelet
#     registration): e2e/install.sh shows that on the real node.
# Claims (each a ResourceClaim; Karpenter reads a template's claim only once the resourceclaim
# controller, not run here, has made it):
#   1. a whole H100 (productName)            -> only gpu-8xh100
#   2. a 3g.40gb MIG device                  -> only gpu-8xh100 (dynamic MIG placement)
#   3. 4 GPUs of at least 180Gi on one node  -> only gpu-gb200
# For each: the node Karpenter makes is of that type, Karpenter's NodeClaim is Initialized only
# once gpu-dra's pool is complete, the pod binds there with the claim allocated from gpu-dra's
# live slices, those slices equal the templates Karpenter planned with (e2e/templates-vs-live.py:
# all but the GPUs' UUIDs), and after the pod is deleted the node is consolidated away.
# Prints per claim the time from pod creation to bound (Karpenter's decision, kwok's and
# gpu-dra's start; no cloud latency) and the total `templates vs live slices` line.
#
# Usage: e2e/karpenter.sh   Environment: GPU_DRA, GPU_DRA_K8S_BIN.
set -euo pipefail
NAME=karpenter-e2e
E2E=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$E2E")
# shellcheck source-path=SCRIPTDIR source=versions.env
source "$E2E/versions.env"
WORK=$(mktemp -d "/tmp/gpu-dra-$NAME.XXXXXX")
passed=0
PIDS=()
DRIVER_PID=
log() { echo "$NAME: $*" >&2; }
fail() {
    log "FAIL: $*"
    local f
    for f in "$WORK"/karpenter.log "$WORK"/kwok.log "$WORK"/driver-*.log; do
        [[ -f $f ]] && { log "$f (tail):"; tail -n 25 "$f" >&2; }
    done
    echo "$passed passed, 1 failed"
    exit 1
}
ok() { passed=$((passed + 1)); log "ok - $*"; }
stop_pid() {
    kill -TERM "$1" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}
cleanup() {
    [[ -n $DRIVER_PID ]] && stop_pid "$DRIVER_PID"
    local pid
    for pid in "${PIDS[@]}"; do stop_pid "$pid"; done
    [[ -n ${GPU_DRA_CLUSTER_DIR:-} ]] && "$E2E/cluster" down >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# shellcheck source-path=SCRIPTDIR source=sim-driver.sh
source "$E2E/sim-driver.sh"
use_private_binaries
KBIN=$("$E2E/build-karpenter.sh" | tail -n 1) || fail "building Karpenter and kwok failed"
now() { echo "$EPOCHREALTIME"; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# ------------------------------------------------------------------ instance types
declare -A MODEL=([gpu-8xh100]=sim:8xH100-SXM5-80GB [gpu-4xl40s]=sim:4xL40S [gpu-gb200]=sim:4xGB200-186GB)
DRIVER_FLAGS=(--mig dynamic)
mkdir -p "$WORK/templates"
for type in "${!MODEL[@]}"; do
    # Pools are told apart by name across instance types: each type's its own.
    "$GPU_DRA" templates --gpus "${MODEL[$type]}" "${DRIVER_FLAGS[@]}" --node-name "$type" --form karpenter -o json \
        >"$WORK/templates/$type.json"
done
offering() { # price
    echo "[{\"Price\": $1, \"Available\": true, \"Requirements\": [{\"key\": \"karpenter.sh/capacity-type\", \"operator\": \"In\", \"values\": [\"on-demand\"]}, {\"key\": \"topology.kubernetes.io/zone\", \"operator\": \"In\", \"values\": [\"test-zone-a\"]}]}]"
}
cat >"$WORK/instance-types.json" <<EOF
[
 {"name": "cpu-4x", "offerings": $(offering 0.1), "architecture": "amd64", "operatingSystems": ["linux"], "resources": {"cpu": "4", "memory": "16Gi", "pods": "110", "ephemeral-storage": "100Gi"}},
 {"name": "gpu-4xl40s", "offerings": $(offering 8), "architecture": "amd64", "operatingSystems": ["linux"], "resources": {"cpu": "48", "memory": "384Gi", "pods": "110", "ephemeral-storage": "1Ti"}},
 {"name": "gpu-8xh100", "offerings": $(offering 30), "architecture": "amd64", "operatingSystems": ["linux"], "resources": {"cpu": "192", "memory": "2048Gi", "pods": "110", "ephemeral-storage": "4Ti"}},
 {"name": "gpu-gb200", "offerings": $(offering 40), "architecture": "arm64", "operatingSystems": ["linux"], "resources": {"cpu": "144", "memory": "960Gi", "pods": "110", "ephemeral-storage": "4Ti"}}
]
EOF

# ------------------------------------------------------------------ cluster and controllers
export GPU_DRA_CLUSTER_DIR=$WORK/cluster
"$E2E/cluster" up --nodes= >/dev/null 2>"$WORK/cluster-up.log" || { cat "$WORK/cluster-up.log" >&2; fail "the control plane did not start"; }
eval "$("$E2E/cluster" env)"
kubectl apply -f "$ROOT/deviceclasses/" >/dev/null
kubectl apply --server-side -f "$KBIN/karpenter-crds/" >/dev/null
kubectl wait --for condition=established --timeout 60s crd/nodepools.karpenter.sh crd/nodeclaims.karpenter.sh \
    crd/kwoknodeclasses.karpenter.kwok.sh >/dev/null
kubectl apply -f - >/dev/null <<EOF
apiVersion: karpenter.kwok.sh/v1alpha1
kind: KWOKNodeClass
metadata: {name: default}
---
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {name: gpu}
spec:
  template:
    spec:
      nodeClassRef: {group: karpenter.kwok.sh, kind: KWOKNodeClass, name: default}
      requirements:
      - {key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}
      expireAfter: Never
  disruption:
    consolidationPolicy: WhenEmptyOrUnderutilized
    consolidateAfter: 0s
EOF
env KUBECONFIG="$KUBECONFIG" DISABLE_LEADER_ELECTION=true IGNORE_DRA_REQUESTS=false \
    METRICS_PORT="$(free_port)" HEALTH_PROBE_PORT="$(free_port)" BATCH_MAX_DURATION=2s BATCH_IDLE_DURATION=1s \
    INSTANCE_TYPES_FILE_PATH="$WORK/instance-types.json" GPU_DRA_TEMPLATES_DIR="$WORK/templates" \
    "$KBIN/karpenter-gpu" >"$WORK/karpenter.log" 2>&1 &
PIDS+=("$!")
"$KBIN/kwok" --kubeconfig "$KUBECONFIG" --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --server-address "127.0.0.1:$(free_port)" -c "$KBIN/kwok-stages.yaml" >"$WORK/kwok.log" 2>&1 &
PIDS+=("$!")
deadline=$((SECONDS + 120))
until grep -q '"gpu-dra templates".*"gpu-gb200"' "$WORK/karpenter.log" 2>/dev/null \
    && [[ $(kubectl get nodepool gpu -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]; do
    ((SECONDS < deadline)) || fail "Karpenter did not read the templates or its NodePool is not Ready within 120s"
    for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null || fail "Karpenter or kwok exited"; done
    sleep 1
done
ok "Karpenter $KARPENTER_VERSION (kwok provider, gpu-dra's templates for ${!MODEL[*]}) and kwok up; NodePool Ready"

# ------------------------------------------------------------------ one claim, one node
nodeclaim_condition() { # node, type, field
    kubectl get nodeclaims -o jsonpath="{.items[?(@.status.nodeName==\"$1\")].status.conditions[?(@.type==\"$2\")].$3}" 2>/dev/null
}
TOTAL_SLICES=0 TOTAL_DEVICES=0 TOTAL_COUNTERS=0 TOTAL_MISMATCHES=0 TIMES=()
scale_from_zero() { # name, want type, request yaml
    local name=$1 want=$2 request=$3
    kubectl apply -f - >/dev/null <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: $name}
spec:
  devices:
    requests:
$request
---
apiVersion: v1
kind: Pod
metadata: {name: $name}
spec:
  containers:
  - name: c
    image: registry.k8s.io/pause:3.10
    resources:
      requests: {cpu: 100m}
      claims: [{name: gpu}]
  resourceClaims:
  - {name: gpu, resourceClaimName: $name}
EOF
    local t0 node='' type deadline=$((SECONDS + 180))
    t0=$(now)
    until node=$(kubectl get nodes -l karpenter.sh/nodepool=gpu -o jsonpath='{.items[0].metadata.name}' 2>/dev/null) && [[ -n $node ]]; do
        ((SECONDS < deadline)) || fail "[$name] no node made for the pending pod within 180s"
        sleep 0.5
    done
    local t_node
    t_node=$(now)
    type=$(kubectl get node "$node" -o jsonpath='{.metadata.labels.node\.kubernetes\.io/instance-type}')
    [[ $type == "$want" ]] || fail "[$name] Karpenter made a $type node, want $want (only it can satisfy the claim)"
    # Karpenter's gate: the node is not initialised while the driver it planned for has published
    # no complete pool.
    local initialized='' reason=''
    until [[ $reason == DRADriverPoolsNotPublished ]]; do
        ((SECONDS < deadline)) || fail "[$name] Karpenter's NodeClaim never waited for gpu-dra's pool (Initialized $initialized, reason '$reason')"
        initialized=$(nodeclaim_condition "$node" Initialized status)
        reason=$(nodeclaim_condition "$node" Initialized reason)
        [[ $initialized != True ]] || fail "[$name] Karpenter initialised $node before gpu-dra published"
        sleep 0.2
    done
    start_sim_driver "$node" "${MODEL[$type]}" "$WORK/node-$name" "$WORK/driver-$name.log" "${DRIVER_FLAGS[@]}"
    DRIVER_PID=$SIM_DRIVER_PID
    local t_driver bound=''
    t_driver=$(now)
    until bound=$(kubectl get pod "$name" -o jsonpath='{.spec.nodeName}') && [[ -n $bound ]]; do
        ((SECONDS < deadline)) || fail "[$name] pod not bound within 180s ($(kubectl get nodeclaims -o jsonpath='{.items[0].status.conditions}'))"
        kill -0 "$DRIVER_PID" 2>/dev/null || fail "[$name] gpu-dra exited"
        sleep 0.2
    done
    local seconds after_driver t_bound
    t_bound=$(now)
    seconds=$(elapsed "$t0" "$t_bound") after_driver=$(elapsed "$t_driver" "$t_bound")
    [[ $bound == "$node" ]] || fail "[$name] bound to $bound, not the new node $node"
    until [[ $(nodeclaim_condition "$node" Initialized status) == True ]]; do
        ((SECONDS < deadline)) || fail "[$name] the pod bound but Karpenter's NodeClaim is not Initialized ($(nodeclaim_condition "$node" Initialized reason))"
        sleep 0.2
    done
    local pools
    pools=$(kubectl get resourceclaim "$name" -o jsonpath='{.status.allocation.devices.results[*].pool}')
    [[ $(tr ' ' '\n' <<<"$pools" | sort -u) == "$node" ]] || fail "[$name] claim allocated from pools '$pools', not $node's"
    TIMES+=("$name ${seconds}s")
    ok "[$name] pending to bound in ${seconds}s: Karpenter made a $type node ($node) in $(elapsed "$t0" "$t_node")s, held it uninitialised until gpu-dra's pool was complete; bound ${after_driver}s after gpu-dra started, claim allocated there"

    # The templates Karpenter planned with vs what gpu-dra published on the node.
    kubectl get resourceslices -o json >"$WORK/live.json"
    "$GPU_DRA" templates --gpus "${MODEL[$type]}" "${DRIVER_FLAGS[@]}" --node-name "$node" --form slices -o json >"$WORK/templates-$name.json"
    local line
    line=$(python3 "$E2E/templates-vs-live.py" "$WORK/live.json" "$WORK/templates-$name.json") || fail "[$name] $line"
    read -r s d c m < <(sed -n '1s/.* \([0-9]*\) slices, \([0-9]*\) devices, \([0-9]*\) counter sets, \([0-9]*\) mismatches/\1 \2 \3 \4/p' <<<"$line")
    TOTAL_SLICES=$((TOTAL_SLICES + s)) TOTAL_DEVICES=$((TOTAL_DEVICES + d)) TOTAL_COUNTERS=$((TOTAL_COUNTERS + c)) TOTAL_MISMATCHES=$((TOTAL_MISMATCHES + m))
    ok "[$name] $line"

    # Consolidation: the emptied node goes.
    local t1
    kubectl delete pod "$name" --grace-period=0 --force >/dev/null 2>&1
    t1=$(now)
    deadline=$((SECONDS + 180))
    while kubectl get node "$node" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || fail "[$name] the empty node $node was not consolidated within 180s"
        sleep 1
    done
    ok "[$name] node $node consolidated away $(elapsed "$t1" "$(now)")s after its pod was deleted"
    stop_pid "$DRIVER_PID"
    DRIVER_PID=
    kubectl delete resourceslices --field-selector "spec.nodeName=$node" >/dev/null 2>&1 || true
    kubectl delete resourceclaim "$name" --wait=false >/dev/null 2>&1 || true
}

scale_from_zero whole-h100 gpu-8xh100 '    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
        selectors:
        - cel: {expression: "device.attributes[\"gpu.nvidia.com\"].productName.contains(\"H100\")"}'
scale_from_zero mig-3g40gb gpu-8xh100 '    - name: gpu
      exactly:
        deviceClassName: mig.nvidia.com
        selectors:
        - cel: {expression: "device.attributes[\"gpu.nvidia.com\"].profile == \"3g.40gb\""}'
scale_from_zero four-big-gpus gpu-gb200 '    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
        count: 4
        selectors:
        - cel: {expression: "device.capacity[\"gpu.nvidia.com\"].memory.compareTo(quantity(\"180Gi\")) >= 0"}'

((TOTAL_MISMATCHES == 0)) || fail "templates vs live slices: $TOTAL_MISMATCHES mismatches"
line="templates vs live slices: 3 nodes Karpenter made, $TOTAL_SLICES slices, $TOTAL_DEVICES devices, $TOTAL_COUNTERS counter sets, 0 mismatches"
log "$line"
[[ -z ${GPU_DRA_TEST_REPORT:-} ]] || echo "$line" >>"$GPU_DRA_TEST_REPORT"
log "pending to bound, scale from zero: ${TIMES[*]}"
echo "$passed passed, 0 failed"
