#!/usr/bin/env bash
# Fleet replay: one arrival/departure trace of MIG requests on N simulated GPU nodes, placed by
# the real kube-scheduler from the slices our drivers publish: NVIDIA's name order against ours.
#
# The trace is `gpu-dra-packing-study`'s (same generator, seed, lifetimes and mix), printed with
# --print-trace. Events run one at a time: the requests whose lifetime ended leave (kubelet-sim
# unprepares the claim over the node's plugin socket, as the kubelet does when the pod ends, then
# the pod and the claim are deleted), then one arrival: a ResourceClaim and a pod. The scheduler
# binds the pod or marks it Unschedulable; an unschedulable pod is a failed placement and is
# deleted at once (the study counts the same). A bound pod's claim is prepared over the plugin
# socket (the driver carves the MIG instance in its simulated GPU), and the next event waits until
# the API server holds the order the driver republishes for the node's new state, as a busy
# cluster would some time later.
#
# What is real: etcd, kube-apiserver, kube-scheduler (1.37, default configuration), the drivers'
# plugin sockets and publication. What is not: the drivers run as host processes with simulated
# GPUs, kubelet-sim plays the kubelet (no pod runs), and no controller-manager runs (this script
# deletes pods and claims itself). It measures placement, not node behaviour.
#
# Phase 1 (always): one node. The scheduler has no node to choose, so every outcome must equal
# the study's replay of the same trace through our copy of the allocator (asserted, per order).
# Phase 2: N nodes (--nodes), failed placements per order, side by side; the scheduler chooses
# the node (1.37 scores no DRA device fullness; see docs/concepts/mig-and-packing.md, "Packing across a fleet").
#
# Usage: e2e/fleet-replay.sh [--nodes N] [--gpus SPEC] [--events E] [--seed S]
#                           [--mean-lifetime L] [--mix MIX] [--smoke]
#   defaults: 4 nodes × sim:2xH100-SXM5-80GB, 400 events, seed 1, mean lifetime 20, mix default
#   --smoke: 2 nodes × sim:1xH100-SXM5-80GB, 40 events, seed 2, mean lifetime 3 (on one node the
#            study says name order 10 failed, ours 7: the check tells the orders apart; CI, about 2 min:
#            the two orders run side by side, each on its own control plane)
# Environment: GPU_DRA (driver binary, default target/debug/gpu-dra), PACKING_STUDY (the study's
# binary, default target/debug/gpu-dra-packing-study), GPU_DRA_K8S_BIN.
set -euo pipefail
NAME=fleet-replay
E2E=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$E2E")
# shellcheck source-path=SCRIPTDIR source=manifests.sh
source "$E2E/manifests.sh"

NODES=4 GPUS=sim:2xH100-SXM5-80GB EVENTS=400 SEED=1 LIFETIME=20 MIX=default
while [[ $# -gt 0 ]]; do
    case $1 in
        --nodes) NODES=${2:?}; shift 2 ;;
        --gpus) GPUS=${2:?}; shift 2 ;;
        --events) EVENTS=${2:?}; shift 2 ;;
        --seed) SEED=${2:?}; shift 2 ;;
        --mean-lifetime) LIFETIME=${2:?}; shift 2 ;;
        --mix) MIX=${2:?}; shift 2 ;;
        --smoke) NODES=2 GPUS=sim:1xH100-SXM5-80GB EVENTS=40 SEED=2 LIFETIME=3; shift ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "$NAME: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[[ $NODES =~ ^[0-9]+$ && $NODES -ge 1 && $EVENTS =~ ^[0-9]+$ && $EVENTS -ge 1 ]] ||
    { echo "$NAME: --nodes and --events take positive numbers" >&2; exit 2; }

WORK=$(mktemp -d "/tmp/gpu-dra-$NAME.XXXXXX")
passed=0
DRIVER_PIDS=() REPLAY_PIDS=()
log() { echo "$NAME: $*" >&2; }
fail() {
    log "FAIL: $*"
    local f
    for f in "$WORK"/*/run/*/driver.log; do
        [[ -f $f ]] && { log "$f (tail):"; tail -n 15 "$f" >&2; }
    done
    echo "$passed passed, 1 failed"
    exit 1
}
ok() { passed=$((passed + 1)); log "ok - $*"; }
stop_drivers() {
    local pid
    for pid in "${DRIVER_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${DRIVER_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    DRIVER_PIDS=()
}
cleanup() {
    # A signal arriving now must not cut the cleanup short.
    trap '' TERM INT
    stop_drivers
    # Replays run in background subshells: their drivers and clusters are not in this shell's
    # variables when an interrupt lands here; find them by their folders.
    local pid dir
    for pid in "${REPLAY_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    pkill -TERM -f "$WORK/gpu-dra run" 2>/dev/null || true
    for dir in "$WORK"/*/cluster; do
        [[ -d $dir ]] && GPU_DRA_CLUSTER_DIR=$dir "$E2E/cluster" down >/dev/null 2>&1 || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# shellcheck source-path=SCRIPTDIR source=sim-driver.sh
source "$E2E/sim-driver.sh"
use_private_binaries

# The study is its own binary (crates/packing-study), not a command of the driver's.
PACKING_STUDY=${PACKING_STUDY:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/gpu-dra-packing-study}
[[ -x $PACKING_STUDY ]] || (cd "$ROOT" && cargo build -p gpu-dra-packing-study) >&2
study_args=(--events "$EVENTS" --seed "$SEED" --mean-lifetime "$LIFETIME" --mix "$MIX")
"$PACKING_STUDY" --gpus "$GPUS" "${study_args[@]}" --print-trace >"$WORK/trace" ||
    fail "gpu-dra-packing-study --print-trace refused the trace's arguments"
# Index, request (MIG profile or `gpu`), index of the event it leaves at.
mapfile -t TRACE <"$WORK/trace"
((${#TRACE[@]} == EVENTS)) || fail "the trace has ${#TRACE[@]} arrivals, want $EVENTS"

# Each replay's folder (its cluster, its nodes): RUN, set by replay.
node_dir() { echo "$RUN/run/$1"; }
kubelet() { # node subcommand args...
    local n=$1
    shift
    kubelet-sim --registration-socket "$(node_dir "$n")/registry/gpu.nvidia.com-reg.sock" \
        --expect-name gpu.nvidia.com --timeout 30s "$@"
}
# The arrival's ResourceClaim and its pod (YAML).
arrival_yaml() { # name request
    if [[ $2 == gpu ]]; then
        claim_yaml "$1" gpu.nvidia.com
    else
        claim_yaml "$1" mig.nvidia.com "device.attributes[\"gpu.nvidia.com\"].profile == \"$2\""
    fi
    echo ---
    pod_using_claim "$1" "$1"
}
# The device names of a node's pool as the API server holds them, in the scheduler's order
# (slices by name, devices in slice order).
api_order() {
    kubectl get resourceslices --field-selector "spec.nodeName=$1" -o json |
        jq -c '[.items | sort_by(.metadata.name)[] | .spec.devices[]?.name]'
}
# What the driver publishes for the node's simulated hardware as it is now.
expected_order() {
    "$GPU_DRA" slices --gpus "$GPUS" --node-name "$1" --sim-state "$(node_dir "$1")/hw.json" \
        --mig dynamic -o json | jq -c '[.items[] | .spec.devices[]?.name]'
}
wait_republished() { # node layout
    [[ $2 == ours ]] || return 0 # name order does not change with the instances
    local want _
    want=$(expected_order "$1")
    for _ in $(seq 100); do
        [[ $(api_order "$1") == "$want" ]] && return 0
        sleep 0.05
    done
    fail "$1: the API server does not hold the order for the node's new state after 5s"
}

# replay LAYOUT NODE_COUNT: prints "failed placed"; its own cluster and nodes under
# $WORK/LAYOUT-NODE_COUNT, so replays can run side by side.
replay() {
    local layout=$1 count=$2 flags=(--mig dynamic)
    [[ $layout == name ]] && flags+=(--device-order name)
    RUN=$WORK/$layout-$count
    mkdir -p "$RUN"
    export GPU_DRA_CLUSTER_DIR=$RUN/cluster
    local nodes i n
    nodes=$(seq -f 'replay-%g' 1 "$count" | paste -sd,)
    "$E2E/cluster" up --nodes "$nodes" >/dev/null 2>"$RUN/cluster-up.log" ||
        { cat "$RUN/cluster-up.log" >&2; fail "the control plane did not start"; }
    eval "$("$E2E/cluster" env)"
    kubectl apply -f "$ROOT/deviceclasses/" >/dev/null
    for ((i = 1; i <= count; i++)); do
        n=replay-$i
        mkdir -p "$(node_dir "$n")"
        env RUST_LOG=info "$GPU_DRA" run --node-name "$n" --gpus "$GPUS" "${flags[@]}" \
            --sim-state "$(node_dir "$n")/hw.json" --kubeconfig "$KUBECONFIG" \
            --registrar-dir "$(node_dir "$n")/registry" --plugin-dir "$(node_dir "$n")/plugin" \
            --cdi-root "$(node_dir "$n")/cdi" --state-dir "$(node_dir "$n")/state" \
            >>"$(node_dir "$n")/driver.log" 2>&1 &
        DRIVER_PIDS+=("$!")
    done
    local _
    for ((i = 1; i <= count; i++)); do
        n=replay-$i
        for _ in $(seq 150); do
            [[ -S $(node_dir "$n")/registry/gpu.nvidia.com-reg.sock ]] && kubelet "$n" register >/dev/null 2>&1 && break
            sleep 0.2
        done
        kubelet "$n" register >/dev/null || fail "$n: the driver did not register"
        for _ in $(seq 150); do
            [[ $(api_order "$n") != "[]" ]] && break
            sleep 0.2
        done
        wait_republished "$n" "$layout"
    done
    local -A node_of=() uid_of=()
    local failed=0 placed=0 event index wanted leaves j state pod
    for event in "${TRACE[@]}"; do
        read -r index wanted leaves <<<"$event"
        # Departures first, as the study does.
        for j in "${!node_of[@]}"; do
            read -r _ _ leaves_j <<<"${TRACE[j]}"
            ((leaves_j <= index)) || continue
            n=${node_of[$j]}
            kubelet "$n" unprepare --claim "default/r$j/${uid_of[$j]}" >"$RUN/out" ||
                fail "unprepare r$j on $n: $(cat "$RUN/out")"
            jq -e '.ok and all(.claims[]; .error == null or .error == "")' "$RUN/out" >/dev/null ||
                fail "unprepare r$j on $n: $(cat "$RUN/out")"
            kubectl delete pod "r$j" --force --grace-period=0 >/dev/null 2>&1
            kubectl patch resourceclaim "r$j" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null
            kubectl delete resourceclaim "r$j" --wait=true >/dev/null
            unset "node_of[$j]" "uid_of[$j]"
            wait_republished "$n" "$layout"
        done
        arrival_yaml "r$index" "$wanted" | kubectl create -f - >/dev/null
        for _ in $(seq 300); do
            state=$(kubectl get pod "r$index" -o jsonpath='{.spec.nodeName}|{.status.conditions[?(@.type=="PodScheduled")].reason}')
            [[ $state == "|" ]] || break
            sleep 0.05
        done
        case $state in
            replay-*)
                n=${state%%|*}
                node_of[$index]=$n
                uid_of[$index]=$(kubectl get resourceclaim "r$index" -o jsonpath='{.metadata.uid}')
                kubelet "$n" prepare --claim "default/r$index/${uid_of[$index]}" >"$RUN/out" ||
                    fail "prepare r$index on $n: $(cat "$RUN/out")"
                jq -e '.ok and all(.claims[]; .error == null or .error == "")' "$RUN/out" >/dev/null ||
                    fail "prepare r$index on $n: $(cat "$RUN/out")"
                placed=$((placed + 1))
                wait_republished "$n" "$layout"
                ;;
            '|Unschedulable')
                failed=$((failed + 1))
                kubectl delete pod "r$index" --force --grace-period=0 >/dev/null 2>&1
                kubectl delete resourceclaim "r$index" >/dev/null
                ;;
            *) fail "pod r$index ($wanted) neither bound nor unschedulable after 15s: '$state'" ;;
        esac
    done
    stop_drivers
    "$E2E/cluster" down >/dev/null 2>&1 || true
    unset GPU_DRA_CLUSTER_DIR
    echo "$failed $placed"
}

# The study's failures for the same trace on one node: "name ours".
study() {
    "$PACKING_STUDY" --gpus "$GPUS" "${study_args[@]}" | awk '
        /name order \(NVIDIA.s\):/ { for (i = 1; i <= NF; i++) if ($i == "failed") name = $(i - 1) }
        /best-fit order \(ours\):/ { for (i = 1; i <= NF; i++) if ($i == "failed") ours = $(i - 1) }
        END { print name, ours }'
}

T0=$SECONDS
read -r predicted_name predicted_ours <<<"$(study)"
[[ -n $predicted_ours ]] || fail "gpu-dra-packing-study printed no result"
log "trace: $EVENTS arrivals, seed $SEED, mean lifetime $LIFETIME, mix $MIX; the study predicts, on one node of $GPUS: name order $predicted_name failed, ours $predicted_ours"
declare -A RESULT
# replay_both NODE_COUNT: name order and ours side by side, each on its own cluster (a replay
# mostly waits on the scheduler and the drivers); RESULT[NODE_COUNT-LAYOUT] = "failed placed".
replay_both() {
    local count=$1 layout pid status=0 where f p
    for layout in name ours; do
        replay "$layout" "$count" >"$WORK/result-$layout-$count" &
        REPLAY_PIDS+=("$!")
    done
    for pid in "${REPLAY_PIDS[@]}"; do wait "$pid" || status=1; done
    REPLAY_PIDS=()
    ((status == 0)) || fail "a replay on $count node(s) failed (above)"
    where="$count nodes"
    ((count > 1)) || where="one node"
    for layout in name ours; do
        read -r f p <"$WORK/result-$layout-$count"
        RESULT[$count-$layout]="$f $p"
        log "$where, $layout order: $f failed, $p placed ($((SECONDS - T0))s)"
    done
}
replay_both 1
read -r f1 _ <<<"${RESULT[1-name]}"
read -r f2 _ <<<"${RESULT[1-ours]}"
[[ $f1 == "$predicted_name" && $f2 == "$predicted_ours" ]] ||
    fail "one node through the real scheduler: name $f1, ours $f2 failed; the study says name $predicted_name, ours $predicted_ours"
ok "one node: the real scheduler placed the trace exactly as the study predicts (name order $f1 failed, ours $f2)"

if ((NODES > 1)); then
    replay_both "$NODES"
    read -r fn pn <<<"${RESULT[$NODES-name]}"
    read -r fo po <<<"${RESULT[$NODES-ours]}"
    ((fn + pn == EVENTS && fo + po == EVENTS)) || fail "arrivals lost: name $fn+$pn, ours $fo+$po of $EVENTS"
    ok "$NODES nodes × $GPUS, $EVENTS arrivals: failed placements name order $fn, ours $fo (every arrival bound or unschedulable)"
    echo "| $NODES × ${GPUS#sim:} | $EVENTS | $LIFETIME | $MIX | $fn | $fo |"
fi
echo "$passed passed, 0 failed ($((SECONDS - T0))s)"
