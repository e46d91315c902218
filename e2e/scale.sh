#!/usr/bin/env bash
# Scale: a fleet of simulated gpu-dra nodes under the real kube-scheduler.
#
# On the e2e control plane (etcd, kube-apiserver, kube-scheduler; no kubelet, no
# controller-manager), N simulated GPU nodes each run a real `gpu-dra run` with its own node
# name, simulated hardware and folders. Pods are bound by the scheduler and never run: what is
# measured is publication and scheduling.
#
#   1. publication: seconds from starting the N drivers until all their ResourceSlices are
#      visible, the number of slices (and their JSON size), the API server's write requests for
#      resourceslices (apiserver_request_total, POST/PUT/PATCH/DELETE/APPLY), etcd, API server
#      and driver RSS;
#   2. restart: every driver stopped and started again, each re-syncs its pool, and the write
#      count is unchanged (asserted);
#   3. scheduling: M ResourceClaims, then M pods (each using its own claim) created as a burst by
#      4 parallel `kubectl create`; pods/s from the first pod create to the last bind, p50/p99
#      time to bind per pod (the create call's return, stamped by this script, to the first
#      watch event that shows the pod bound; sub-second), pods left unschedulable, the
#      scheduler's attempts by result, its CPU seconds and RSS.
#
# Layouts: `ours` (--mig dynamic, best-fit device order, the default), `name` (--mig dynamic
# --device-order name: NVIDIA's plain name order), `whole` (--mig off), `all` (the three in turn,
# each on a fresh cluster, side by side).
#
# Pod mix (MIG layouts), repeating every 20 pods, interleaved: 6 whole GPUs (class
# gpu.nvidia.com), 6 × 1g.10gb, 3 × 2g.20gb, 2 × 3g.40gb, 1 × 7g.80gb (class mig.nvidia.com, CEL
# selector on the profile attribute), 2 × two 1g.10gb on the same GPU (count 2, matchAttribute
# gpu.nvidia.com/parentUUID): half a GPU per pod, so 10 pods per 8-GPU node fill ~63% of it.
# --smoke uses a denser MIG-heavy mix (40 pods in 10 GPUs, big requests first), created by one
# `kubectl create` in order: the scheduler's queue is first in, first out, so the whole GPU and
# the 7g.80gb find empty GPUs and at least 32 1g.10gb places remain for 28 pods, whatever node
# the scheduler picks among equals. Parallel creators would let 1g.10gb pods fragment every GPU
# before the big ones arrive, and a pod that then does not fit is the mix's fault, not ours.
# `whole` cannot serve MIG requests: it gets a whole-GPU-only mix instead (every claim one GPU of
# class gpu.nvidia.com), M capped at the fleet's GPU count so that every pod can bind.
#
# Usage: e2e/scale.sh [--nodes N] [--pods M] [--layout ours|name|whole|all] [--gpus SPEC] [--smoke]
#   defaults: 100 nodes, 1000 pods, ours, sim:8xH100-SXM5-80GB
#   --smoke: 5 nodes × sim:2xH100-SXM5-80GB, 40 pods, ours; asserts every pod binds and no slice
#            write on restart (about a minute)
# Environment: GPU_DRA (driver binary, default target/debug/gpu-dra), GPU_DRA_K8S_BIN,
# SCALE_TIMEOUT (seconds to wait for the pods, default 900), SCALE_CREATORS (parallel kubectl
# create, default 4).
set -euo pipefail
NAME=scale-e2e
E2E=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$E2E")

NODES=100 PODS=1000 LAYOUT=ours GPUS=sim:8xH100-SXM5-80GB SMOKE='' MIX=standard
while [[ $# -gt 0 ]]; do
    case $1 in
        --nodes) NODES=${2:?}; shift 2 ;;
        --pods) PODS=${2:?}; shift 2 ;;
        --layout) LAYOUT=${2:?}; shift 2 ;;
        --gpus) GPUS=${2:?}; shift 2 ;;
        --smoke) SMOKE=1 NODES=5 PODS=40 LAYOUT=ours GPUS=sim:2xH100-SXM5-80GB MIX=dense; shift ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "$NAME: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[[ $NODES =~ ^[0-9]+$ && $NODES -ge 1 && $PODS =~ ^[0-9]+$ && $PODS -ge 1 ]] || { echo "$NAME: --nodes and --pods take positive numbers" >&2; exit 2; }
case $LAYOUT in
    ours | name | whole) LAYOUTS=("$LAYOUT") ;;
    all) LAYOUTS=(ours name whole) ;;
    *) echo "$NAME: --layout ours|name|whole|all, not '$LAYOUT'" >&2; exit 2 ;;
esac
TIMEOUT=${SCALE_TIMEOUT:-900}
CREATORS=${SCALE_CREATORS:-$([[ -n $SMOKE ]] && echo 1 || echo 4)}

WORK=$(mktemp -d "/tmp/gpu-dra-$NAME.XXXXXX")
passed=0
DRIVER_PIDS=()
WATCH_PGID=
log() { echo "$NAME: $*" >&2; }
fail() {
    log "FAIL: $*"
    local f
    for f in "$WORK"/run/node-1/driver*.log; do
        [[ -f $f ]] && { log "$f (tail):"; tail -n 20 "$f" >&2; }
    done
    echo "$passed passed, 1 failed"
    exit 1
}
ok() { passed=$((passed + 1)); log "ok - $*"; }

stop_drivers() {
    local pid
    for pid in "${DRIVER_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${DRIVER_PIDS[@]}"; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    DRIVER_PIDS=()
}
stop_watch() {
    [[ -n $WATCH_PGID ]] && kill -TERM -- "-$WATCH_PGID" 2>/dev/null || true
    WATCH_PGID=
}
cleanup() {
    stop_watch
    stop_drivers
    [[ -n ${GPU_DRA_CLUSTER_DIR:-} ]] && "$E2E/cluster" down >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# shellcheck source-path=SCRIPTDIR source=sim-driver.sh
source "$E2E/sim-driver.sh"
use_private_binaries
CLK_TCK=$(getconf CLK_TCK)

now() { echo "$EPOCHREALTIME"; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
rss_mib() { awk '/^VmRSS/ { printf "%.0f", $2 / 1024 }' "/proc/$1/status" 2>/dev/null || echo 0; }
hwm_mib() { awk '/^VmHWM/ { printf "%.0f", $2 / 1024 }' "/proc/$1/status" 2>/dev/null || echo 0; }
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
component_pid() { awk -v n="$1" '$1 == n { print $2 }' "$GPU_DRA_CLUSTER_DIR/pids"; }
drivers_rss_mib() {
    local pid total=0 kb
    for pid in "${DRIVER_PIDS[@]}"; do
        kb=$(awk '/^VmRSS/ { print $2 }' "/proc/$pid/status" 2>/dev/null || echo 0)
        total=$((total + kb))
    done
    echo $((total / 1024))
}
# Write requests for resourceslices the API server has served (any code) since it started.
slice_writes() {
    kubectl get --raw /metrics | awk '
        /^apiserver_request_total\{/ && /resource="resourceslices"/ && /verb="(POST|PUT|PATCH|DELETE|APPLY)"/ { n += $NF }
        END { printf "%d", n }'
}
slice_count() { kubectl get resourceslices --no-headers 2>/dev/null | wc -l; }
scheduler_metrics() {
    local port
    port=$(awk -F= '$1 == "SCHED_PORT" { print $2 }' "$GPU_DRA_CLUSTER_DIR/ports")
    curl -sk --cert "$GPU_DRA_CLUSTER_DIR/pki/admin.crt" --key "$GPU_DRA_CLUSTER_DIR/pki/admin.key" \
        "https://127.0.0.1:$port/metrics"
}
attempts() { scheduler_metrics | awk -v r="$1" '/^scheduler_schedule_attempts_total\{/ && index($0, "result=\"" r "\"") { n += $NF } END { printf "%d", n }'; }

# ---------------------------------------------------------------- the pods

# kind_of INDEX: what pod INDEX (0-based) asks for.
STANDARD=(whole 1g.10gb whole 2g.20gb pair whole 1g.10gb 3g.40gb whole 1g.10gb
    2g.20gb whole 1g.10gb 7g.80gb whole 1g.10gb pair 2g.20gb 3g.40gb 1g.10gb)
# Dense (smoke): 40 pods in 10 H100s (64 of 70 compute slices); the big ones first.
DENSE_HEAD=(whole 7g.80gb 3g.40gb 3g.40gb 2g.20gb 2g.20gb 2g.20gb 2g.20gb pair pair pair pair)
kind_of() {
    local i=$1
    case $MIX in
        whole) echo whole ;;
        standard) echo "${STANDARD[i % ${#STANDARD[@]}]}" ;;
        dense) if ((i < ${#DENSE_HEAD[@]})); then echo "${DENSE_HEAD[i]}"; else echo 1g.10gb; fi ;;
    esac
}
claim_yaml() { # name kind
    local request
    case $2 in
        whole) request="exactly: {deviceClassName: gpu.nvidia.com}" ;;
        pair) request="exactly: {deviceClassName: mig.nvidia.com, allocationMode: ExactCount, count: 2, selectors: [{cel: {expression: 'device.attributes[\"gpu.nvidia.com\"].profile == \"1g.10gb\"'}}]}" ;;
        *) request="exactly: {deviceClassName: mig.nvidia.com, selectors: [{cel: {expression: 'device.attributes[\"gpu.nvidia.com\"].profile == \"$2\"'}}]}" ;;
    esac
    cat <<EOF
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: $1, namespace: default, labels: {scale.gpu-dra/kind: "$2"}}
spec:
  devices:
    requests:
    - name: gpu
      $request
EOF
    [[ $2 != pair ]] || cat <<EOF
    constraints:
    - {requests: [gpu], matchAttribute: gpu.nvidia.com/parentUUID}
EOF
}
pod_yaml() { # name
    cat <<EOF
---
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default}
spec:
  containers:
  - name: c
    image: registry.k8s.io/pause:3.10
    resources:
      claims: [{name: gpu}]
  resourceClaims:
  - name: gpu
    resourceClaimName: $1
EOF
}

# ---------------------------------------------------------------- one layout

launch_drivers() { # suffix (log file name)
    local i dir
    for ((i = 1; i <= NODES; i++)); do
        dir=$WORK/run/node-$i
        # gpu_dra::node=debug: "ResourceSlices up to date" tells that a restart's sync wrote nothing.
        RUST_LOG="info,gpu_dra::node=debug" start_sim_driver "scale-$i" "$GPUS" "$dir" "$dir/driver$1.log" \
            "${DRIVER_FLAGS[@]}"
        DRIVER_PIDS+=("$SIM_DRIVER_PID")
    done
}

run_layout() {
    local layout=$1
    local R=$WORK/result-$layout
    case $layout in
        ours) DRIVER_FLAGS=(--mig dynamic) ;;
        name) DRIVER_FLAGS=(--mig dynamic --device-order name) ;;
        whole) DRIVER_FLAGS=(--mig off) ;;
    esac
    local gpus_per_node pods=$PODS
    gpus_per_node=$("$GPU_DRA" slices --gpus "$GPUS" --node-name scale-1 --mig off -o json | jq '[.items[].spec.devices[]?] | length')
    if [[ $layout == whole ]]; then
        MIX=whole
        ((pods <= NODES * gpus_per_node)) || pods=$((NODES * gpus_per_node))
    fi
    local per_node expected
    per_node=$("$GPU_DRA" slices --gpus "$GPUS" --node-name scale-1 "${DRIVER_FLAGS[@]:0:2}" -o json | jq '.items | length')
    expected=$((NODES * per_node))

    rm -rf "$WORK/run"
    mkdir -p "$WORK/run"
    export GPU_DRA_CLUSTER_DIR=$WORK/cluster
    local nodes t
    nodes=$(seq -f 'scale-%g' 1 "$NODES" | paste -sd,)
    t=$SECONDS
    "$E2E/cluster" up --nodes "$nodes" >/dev/null 2>"$WORK/cluster-up.log" || { cat "$WORK/cluster-up.log" >&2; fail "the control plane did not start"; }
    eval "$("$E2E/cluster" env)"
    kubectl apply -f "$ROOT/deviceclasses/" >/dev/null
    log "[$layout] control plane and $NODES Node objects up in $((SECONDS - t))s; starting $NODES drivers (${DRIVER_FLAGS[*]}, $GPUS)"
    local api_pid etcd_pid sched_pid
    api_pid=$(component_pid kube-apiserver) etcd_pid=$(component_pid etcd) sched_pid=$(component_pid kube-scheduler)

    # ------------------------------------------------------------ 1. publication
    local w0 t0 t1 count=0 deadline=$((SECONDS + 300))
    w0=$(slice_writes)
    t0=$(now)
    launch_drivers ""
    until count=$(slice_count) && ((count >= expected)); do
        ((SECONDS < deadline)) || fail "[$layout] $count of $expected ResourceSlices after 300s"
        sleep 0.2
    done
    t1=$(now)
    local pub_s writes json_bytes incomplete
    pub_s=$(elapsed "$t0" "$t1")
    sleep 2 # late writes (a second sync) count too
    writes=$(($(slice_writes) - w0))
    kubectl get resourceslices -o json >"$WORK/slices.json"
    json_bytes=$(stat -c %s "$WORK/slices.json")
    count=$(jq '.items | length' "$WORK/slices.json")
    # Every pool complete: as many slices of its generation as it says.
    incomplete=$(jq '[.items | group_by(.spec.pool.name)[] | select(length != .[0].spec.pool.resourceSliceCount)] | length' "$WORK/slices.json")
    # An autoscaler's templates (`gpu-dra templates`, the form Cluster Autoscaler takes; the
    # Karpenter form holds the same specs) equal what each node's driver published, but for
    # each GPU's own UUIDs and the pool generation.
    for ((i = 1; i <= NODES; i++)); do
        "$GPU_DRA" templates --gpus "$GPUS" "${DRIVER_FLAGS[@]}" --node-name "scale-$i" \
            --form slices -o json >"$WORK/templates-$i.json"
    done
    local differential
    differential=$(python3 "$E2E/templates-vs-live.py" "$WORK/slices.json" "$WORK"/templates-*.json) \
        || fail "[$layout] $differential"
    rm -f "$WORK/slices.json" "$WORK"/templates-*.json
    ((count == expected && incomplete == 0)) || fail "[$layout] $count slices (want $expected), $incomplete incomplete pools"
    local etcd_rss api_rss drv_rss
    etcd_rss=$(rss_mib "$etcd_pid") api_rss=$(rss_mib "$api_pid") drv_rss=$(drivers_rss_mib)
    ok "[$layout] $differential"
    ok "[$layout] $NODES nodes published $count ResourceSlices ($((json_bytes / 1048576)) MiB JSON) in ${pub_s}s with $writes API writes; RSS etcd ${etcd_rss} MiB, apiserver ${api_rss} MiB, drivers ${drv_rss} MiB ($((drv_rss / NODES)) each)"

    # ------------------------------------------------------------ 2. restart
    local w1 t2 i
    w1=$(slice_writes)
    stop_drivers
    t2=$(now)
    launch_drivers .restart
    deadline=$((SECONDS + 300))
    for ((i = 1; i <= NODES; i++)); do
        until grep -qE 'ResourceSlices (up to date|published)' "$WORK/run/node-$i/driver.restart.log" 2>/dev/null; do
            ((SECONDS < deadline)) || fail "[$layout] scale-$i did not sync within 300s of its restart"
            sleep 0.2
        done
    done
    local restart_s rewrites
    restart_s=$(elapsed "$t2" "$(now)")
    sleep 2
    rewrites=$(($(slice_writes) - w1))
    ((rewrites == 0)) || fail "[$layout] restarting the $NODES drivers wrote $rewrites times (want 0); $(grep -h 'ResourceSlices published' "$WORK"/run/node-*/driver.restart.log | head -n 3)"
    [[ $(slice_count) == "$expected" ]] || fail "[$layout] slices changed over the restart"
    ok "[$layout] every driver restarted and re-synced in ${restart_s}s: 0 ResourceSlice writes"

    # ------------------------------------------------------------ 3. scheduling
    local claims="$WORK/claims.yaml" k
    : >"$claims"
    for ((i = 0; i < CREATORS; i++)); do : >"$WORK/pods-$i.yaml"; done
    declare -A kinds=()
    for ((i = 0; i < pods; i++)); do
        k=$(kind_of "$i")
        kinds[$k]=$((${kinds[$k]:-0} + 1))
        claim_yaml "$(printf 'p%05d' "$i")" "$k" >>"$claims"
        pod_yaml "$(printf 'p%05d' "$i")" >>"$WORK/pods-$((i % CREATORS)).yaml"
    done
    local mix_text=''
    for k in whole 7g.80gb 3g.40gb 2g.20gb 1g.10gb pair; do
        [[ -n ${kinds[$k]:-} ]] && mix_text+="${mix_text:+, }${kinds[$k]} $k"
    done
    t=$SECONDS
    kubectl create -f "$claims" >/dev/null || fail "[$layout] creating the claims"
    log "[$layout] $pods ResourceClaims created in $((SECONDS - t))s ($mix_text); creating $pods pods as a burst ($( ((CREATORS > 1)) && echo "$CREATORS parallel creators" || echo "one creator, in order"))"

    # Bind times: a watch of the pods, each line stamped here.
    local watch_log=$WORK/watch.log created_log=$WORK/created.log
    : >"$watch_log"
    : >"$created_log"
    # The API server closes a watch that falls behind a burst (kubectl then exits quietly): start
    # it again, its initial list stamps what happened meanwhile (late, so bind times of those
    # pods are over-, never under-estimated); restarts are counted and reported.
    : >"$WORK/watch.restarts"
    setsid bash -c 'while :; do
            kubectl get pods -w -o jsonpath="{.metadata.name}|{.spec.nodeName}|{.status.conditions[?(@.type==\"PodScheduled\")].reason}{\"\\n\"}"
            echo "$EPOCHREALTIME" >>"$2"
            sleep 0.2
        done | while IFS= read -r line; do echo "$EPOCHREALTIME|$line"; done >"$1"' _ "$watch_log" "$WORK/watch.restarts" </dev/null 2>"$WORK/watch.err" &
    WATCH_PGID=$!
    sleep 1.5
    local cpu0 att_s0 att_u0 tc0 tc1
    cpu0=$(cpu_ticks "$sched_pid")
    att_s0=$(attempts scheduled) att_u0=$(attempts unschedulable)
    tc0=$(now)
    local creators=()
    for ((i = 0; i < CREATORS; i++)); do
        kubectl create -f "$WORK/pods-$i.yaml" 2>>"$WORK/create.err" |
            while IFS= read -r line; do echo "$EPOCHREALTIME $line"; done >>"$created_log" &
        creators+=("$!")
    done
    for i in "${creators[@]}"; do wait "$i" || fail "[$layout] creating pods: $(tail -n 3 "$WORK/create.err")"; done
    tc1=$(now)
    local made
    made=$(wc -l <"$created_log")
    ((made == pods)) || fail "[$layout] $made of $pods pods created: $(tail -n 3 "$WORK/create.err")"

    # Until every pod is bound, or the rest have been unschedulable (and nothing bound) for 15 s.
    local bound unsched last_bound=-1 still_since=$SECONDS
    deadline=$((SECONDS + TIMEOUT))
    while :; do
        read -r bound unsched < <(awk -F'|' '
            $3 != "" { b[$2] = 1 }
            $4 == "Unschedulable" && $3 == "" { u[$2] = 1 }
            END { nb = length(b); nu = 0; for (p in u) if (!(p in b)) nu++; print nb, nu }' "$watch_log")
        ((bound == pods)) && break
        if ((bound != last_bound)); then last_bound=$bound still_since=$SECONDS; fi
        if ((bound + unsched >= pods && SECONDS - still_since >= 15)); then break; fi
        if ((SECONDS >= deadline)); then
            log "[$layout] timed out after ${TIMEOUT}s: $bound bound, $unsched unschedulable"
            break
        fi
        sleep 1
    done
    local cpu1 sched_rss sched_hwm att_s att_u
    cpu1=$(cpu_ticks "$sched_pid")
    sched_rss=$(rss_mib "$sched_pid") sched_hwm=$(hwm_mib "$sched_pid")
    att_s=$(($(attempts scheduled) - att_s0)) att_u=$(($(attempts unschedulable) - att_u0))
    local restarts
    restarts=$(wc -l <"$WORK/watch.restarts")
    stop_watch
    # Per pod: created (its create call returned) → first seen bound.
    local durations=$WORK/durations last_bound
    last_bound=$(awk -F'|' -v t="$tc0" '$3 != "" && $1 > t { t = $1 } END { print t }' "$watch_log")
    awk '
        FNR == NR { split($2, a, "/"); created[a[2]] = $1; next }
        { split($0, f, "|") }
        f[3] != "" && !(f[2] in bound) { bound[f[2]] = f[1]; if (f[2] in created) printf "%.3f\n", f[1] - created[f[2]] }
    ' "$created_log" "$watch_log" | sort -n >"$durations"
    local stats
    stats=$(awk -v tc0="$tc0" -v last="$last_bound" '
        { d[NR] = $1 }
        END {
            n = NR
            p50 = n ? d[int((n - 1) * 0.50) + 1] : 0
            p99 = n ? d[int((n - 1) * 0.99) + 1] : 0
            span = last - tc0
            printf "%d %.2f %.1f %.2f %.2f\n", n, span, (span > 0 ? n / span : 0), p50, p99
        }' "$durations")
    local nbound span rate p50 p99
    read -r nbound span rate p50 p99 <<<"$stats"
    local failed=$((pods - nbound)) cpu_s
    cpu_s=$(awk -v a="$cpu0" -v b="$cpu1" -v t="$CLK_TCK" 'BEGIN { printf "%.1f", (b - a) / t }')
    local create_s
    create_s=$(elapsed "$tc0" "$tc1")
    if ((failed == 0)); then
        ok "[$layout] all $pods pods bound: ${rate} pods/s (first create → last bind ${span}s; creating took ${create_s}s), time to bind p50 ${p50}s p99 ${p99}s; scheduler ${cpu_s} CPU-s, RSS ${sched_rss} MiB (peak ${sched_hwm}); attempts ${att_s} scheduled, ${att_u} unschedulable; pod watch restarted ${restarts}×"
    else
        if [[ -n $SMOKE ]]; then
            local unbound
            unbound=$(kubectl get pods -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.spec.nodeName}{"\n"}{end}' | awk 'NF == 1 { print $1 }')
            for p in $unbound; do
                log "[$layout] not bound: $p ($(kubectl get resourceclaim "$p" -o jsonpath='{.metadata.labels.scale\.gpu-dra/kind}')): $(kubectl get pod "$p" -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].message}')"
            done
            log "[$layout] allocations (claim kind devices @ node):"
            kubectl get resourceclaims -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.metadata.labels.scale\.gpu-dra/kind}{" "}{.status.allocation.devices.results[*].device}{" @ "}{.status.allocation.devices.results[0].pool}{"\n"}{end}' >&2 || true
            fail "[$layout] $failed of $pods pods not bound ($unsched unschedulable)"
        fi
        log "[$layout] $nbound of $pods pods bound, $failed not (unschedulable): ${rate} pods/s (${span}s), time to bind p50 ${p50}s p99 ${p99}s; scheduler ${cpu_s} CPU-s, RSS ${sched_rss} MiB; attempts ${att_s} scheduled, ${att_u} unschedulable"
    fi
    etcd_rss=$(rss_mib "$etcd_pid") api_rss=$(rss_mib "$api_pid")
    cat >"$R" <<EOF
layout=$layout
flags='${DRIVER_FLAGS[*]}'
slices=$count
slice_mib=$(awk -v b="$json_bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
writes=$writes
pub_s=$pub_s
restart_s=$restart_s
rewrites=$rewrites
drivers_rss=$drv_rss
pods=$pods
bound=$nbound
failed=$failed
rate=$rate
span=$span
create_s=$create_s
p50=$p50
p99=$p99
sched_cpu=$cpu_s
sched_rss=$sched_rss
sched_hwm=$sched_hwm
att_s=$att_s
att_u=$att_u
watch_restarts=$restarts
etcd_rss=$etcd_rss
api_rss=$api_rss
mix='$mix_text'
EOF

    stop_drivers
    "$E2E/cluster" down >/dev/null 2>&1
    rm -f "$WORK"/pods-*.yaml "$claims"
}

log "$NODES nodes × $GPUS, $PODS pods, layout $LAYOUT${SMOKE:+ (smoke)}"
for layout in "${LAYOUTS[@]}"; do
    run_layout "$layout"
done

# ---------------------------------------------------------------- report
field() { (source "$WORK/result-$1" && eval "echo \"\${$2}\""); }
{
    printf '\n%-28s' "layout"
    for l in "${LAYOUTS[@]}"; do printf '%14s' "$l"; done
    printf '\n'
    for row in "ResourceSlices:slices" "slices JSON MiB:slice_mib" "API writes (publish):writes" \
        "publish s:pub_s" "writes on restart:rewrites" "restart re-sync s:restart_s" "drivers RSS MiB (all):drivers_rss" \
        "etcd RSS MiB (end):etcd_rss" "apiserver RSS MiB (end):api_rss" \
        "pods:pods" "bound:bound" "unschedulable:failed" "pods/s:rate" "first create→last bind s:span" \
        "time to bind p50 s:p50" "time to bind p99 s:p99" "scheduler CPU s:sched_cpu" "scheduler RSS MiB:sched_rss" \
        "scheduler peak RSS MiB:sched_hwm" "attempts scheduled:att_s" "attempts unschedulable:att_u" "pod watch restarts:watch_restarts"; do
        printf '%-28s' "${row%%:*}"
        for l in "${LAYOUTS[@]}"; do printf '%14s' "$(field "$l" "${row##*:}")"; done
        printf '\n'
    done
    for l in "${LAYOUTS[@]}"; do printf '%s (%s): %s\n' "$l" "$(field "$l" flags)" "$(field "$l" mix)"; done
} >&2

summary="$NODES nodes × $GPUS, $PODS pods:"
for l in "${LAYOUTS[@]}"; do
    summary+=" $l $(field "$l" rate) pods/s (p99 $(field "$l" p99)s, $(field "$l" failed) unschedulable, $(field "$l" slices) slices, $(field "$l" writes) writes);"
done
if [[ -f $WORK/result-ours && -f $WORK/result-name ]]; then
    summary+=" ours/name pods/s $(awk -v a="$(field ours rate)" -v b="$(field name rate)" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')×,"
    summary+=" scheduler CPU ours/name $(awk -v a="$(field ours sched_cpu)" -v b="$(field name sched_cpu)" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')×"
fi
log "$summary"
echo "$passed passed, 0 failed"
