#!/usr/bin/env bash
# Benchmark: concurrent prepares through the real kubelet. The driver image installed with the
# Helm chart as users do (e2e/install.sh's way: chart defaults, only the node's layout and the
# simulated GPUs set) on the real node (kubelet + containerd + runc, e2e/cluster up --real-node
# --service-network), simulated H100s whose MIG creates and destroys take --carve each
# (chart value simMigDelay). Three runs, each N pods with their own ResourceClaim on N different
# GPUs, all created by one `kubectl create`; the time from that create to each pod Running
# (a pod watch, stamped here to the millisecond):
#
#   1. whole GPU   claims for gpu.nvidia.com, `uuid == <GPU i>`: no carve, the pod start cost;
#   2. MIG         claims for mig.nvidia.com, 1g.10gb with `parentUUID == <GPU i>`: one carve
#                  per pod. Serialized prepares take ~N carves; concurrent ones ~1;
#   3. slow API    as 2, but the driver reaches the API server through a proxy (harness
#                  api-delay, routed in with `e2e/cluster route-service`) that holds every GET of
#                  the first claim, slow-0, for --api-delay. That pod is created first; the
#                  others must not wait for it.
#
#   4. NVIDIA's driver (--beside-nvidia): gpu-dra's chart uninstalled, NVIDIA's gpu-kubelet-plugin
#      v0.5.0 (DynamicMIG on, its carve on prepare) registered with the same kubelet as a host
#      process (e2e/nvidia-plugin.sh; its image and chart are not built here), the fake
#      libnvidia-ml's carves taking --carve too: runs 1 and 2 again, the same claims and pods.
#
# Printed: per-pod and all-Running seconds for each run, and the issue's target for run 2
# (≤ 1.5 carves + pod start, pod start = run 1's all-Running). The numbers are not checked.
# The exit status checks behaviour only: every pod runs, each MIG pod got its own GPU (one GPU
# instance per GPU), the proxy held slow-0's read, and no other pod of run 3 came up later than
# run 2's all-Running + 5 s.
#
# Usage: e2e/bench-kubelet.sh [--pods N] [--carve 1s] [--api-delay 10s] [--runs R]
#   --pods N        pods per run = simulated GPUs (sim:NxH100-SXM5-80GB); default 4
#   --carve D       simMigDelay (Go duration); default 1s
#   --api-delay D   how long the proxy holds slow-0's GETs; default 10s (keep it under the
#                   driver's --api-timeout, 20s)
#   --runs R        repeat runs 1 and 2 R times (medians printed); default 1
#   --beside-nvidia then runs 1 and 2 (R times) with NVIDIA's driver instead (run 4)
# IMAGE_BINARY: the gpu-dra binary for the image (default: `cargo build --profile node --locked
# --no-default-features`, target/node/gpu-dra); it is also the host's GPU_DRA unless that is set.
set -euo pipefail
E2E=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$E2E")
cd "$ROOT"
NAME=bench-kubelet
PODS=4 CARVE=1s API_DELAY=10s RUNS=1 BESIDE_NVIDIA=
while [[ $# -gt 0 ]]; do
    case $1 in
        --pods) PODS=${2:?--pods needs a value}; shift 2 ;;
        --carve) CARVE=${2:?--carve needs a value}; shift 2 ;;
        --api-delay) API_DELAY=${2:?--api-delay needs a value}; shift 2 ;;
        --runs) RUNS=${2:?--runs needs a value}; shift 2 ;;
        --beside-nvidia) BESIDE_NVIDIA=1; shift ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "$NAME: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[[ $PODS =~ ^[1-9][0-9]*$ && $RUNS =~ ^[1-9][0-9]*$ ]] || { echo "$NAME: --pods and --runs take a positive number" >&2; exit 2; }
# Go durations as seconds (for the target line and the check): 1s, 500ms, 1.5s, 1m.
seconds() {
    awk -v d="$1" 'BEGIN {
        if (d ~ /^[0-9.]+ms$/) { sub(/ms$/, "", d); print d / 1000 }
        else if (d ~ /^[0-9.]+s$/) { sub(/s$/, "", d); print d + 0 }
        else if (d ~ /^[0-9.]+m$/) { sub(/m$/, "", d); print d * 60 }
        else exit 1 }'
}
CARVE_S=$(seconds "$CARVE") || { echo "$NAME: --carve '$CARVE': use ms, s or m" >&2; exit 2; }
API_DELAY_S=$(seconds "$API_DELAY") || { echo "$NAME: --api-delay '$API_DELAY': use ms, s or m" >&2; exit 2; }

WORK=$(mktemp -d /tmp/gpu-dra-bench-kubelet.XXXXXX)
export GPU_DRA_CLUSTER_DIR=$WORK/cluster
# shellcheck source=chart.sh
source "$E2E/chart.sh"
PROXY_PID='' WATCH_PID=''
T0=$SECONDS

log() { echo "$NAME: $*" >&2; }
ok() { log "ok - $* ($((SECONDS - T0))s)"; }
fail() {
    log "FAIL: $*"
    if [[ -n ${KUBECONFIG:-} ]]; then
        kubectl get pods -A -o wide 2>&1 | sed 's/^/    /' >&2 || true
        kubectl get events -A --sort-by=.lastTimestamp 2>&1 | tail -n 15 | sed 's/^/    /' >&2 || true
    fi
    [[ ! -s $WORK/nvidia.log ]] || { log "NVIDIA's plugin (tail):"; tail -n 15 "$WORK/nvidia.log" | sed 's/^/    /' >&2; }
    [[ ! -s $WORK/api-delay.log ]] || { log "api-delay log (tail):"; tail -n 10 "$WORK/api-delay.log" | sed 's/^/    /' >&2; }
    exit 1
}
cleanup() {
    ! declare -F stop_nvidia >/dev/null || stop_nvidia
    [[ -z $WATCH_PID ]] || kill "$WATCH_PID" 2>/dev/null || true
    [[ -z $PROXY_PID ]] || kill "$PROXY_PID" 2>/dev/null || true
    "$E2E/cluster" down >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

wait_for() { # description, timeout seconds, command...
    local what=$1 timeout=$2
    shift 2
    local deadline=$((SECONDS + timeout))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || fail "timed out after ${timeout}s waiting for: $what"
        sleep 0.2
    done
}

# ---------------------------------------------------------------- image, helm, cluster
BIN=${GPU_DRA_K8S_BIN:-$("$E2E/build-k8s.sh" | tail -n 1)}
export PATH="$BIN:$PATH"
API_DELAY_BIN=$("$E2E/build-k8s.sh" api-delay | tail -n 1)/api-delay
if [[ -z ${IMAGE_BINARY:-} ]]; then
    cargo build --profile node --locked --no-default-features --bin gpu-dra >&2
    IMAGE_BINARY=${CARGO_TARGET_DIR:-$ROOT/target}/node/gpu-dra
fi
# Private copies: a concurrent build must not swap the binary between the image and the host.
cp "$IMAGE_BINARY" "$WORK/gpu-dra"
export GPU_DRA=${GPU_DRA:-$WORK/gpu-dra}
IMAGE_BINARY=$WORK/gpu-dra chart_build_images

GPUS=sim:${PODS}xH100-SXM5-80GB
"$E2E/cluster" up --real-node --no-driver --service-network --gpus "$GPUS" >/dev/null || fail "the real node did not start"
eval "$("$E2E/cluster" env)"
LOGS=$GPU_DRA_CLUSTER_DIR/logs
PKI=$GPU_DRA_CLUSTER_DIR/pki
chart_import_images

# Values (e2e/chart.sh): the image, the simulated GPUs and this node's folders, and the carve
# time; everything else the defaults.
chart_install "$FIRST_REF" --set-string "simMigDelay=$CARVE"
registrations() { grep -c 'Registered DRA plugin.*gpu.nvidia.com' "$LOGS/kubelet.log" || true; }
# Predicates for wait_for, evaluated at every try (a `test "$(...)"` argument would be evaluated once).
registered_more_than() { (($(registrations) > $1)); }
wait_for "the kubelet registered the plugin" 30 registered_more_than 0
slices() { kubectl get resourceslices -o json --field-selector "spec.nodeName=$E2E_NODE"; }
# The GPUs' UUIDs in minor order, as a user reads them off the slices.
gpu_uuids() {
    slices | jq -r '[.items[].spec.devices[]? | select(.attributes.type.string == "gpu")
        | {minor: (.name | ltrimstr("gpu-") | tonumber), uuid: .attributes.uuid.string}]
        | sort_by(.minor) | .[].uuid'
}
gpus_published() { (($(gpu_uuids | wc -l) >= PODS)); }
wait_for "$PODS GPUs in the slices of $E2E_NODE" 30 gpus_published
mapfile -t UUIDS < <(gpu_uuids)
ok "driver image installed with the chart ($GPUS, simMigDelay $CARVE), registered, ${#UUIDS[@]} GPUs published"

# ---------------------------------------------------------------- one run
# manifest KIND NAME GPU: a ResourceClaim NAME on GPU number GPU (kind gpu: the whole GPU; mig:
# a 1g.10gb MIG device on it) and a pod NAME using it, labelled bench=$RUN_TAG.
manifest() {
    local kind=$1 name=$2 uuid=${UUIDS[$3]} class cel
    if [[ $kind == gpu ]]; then
        class=gpu.nvidia.com cel="device.attributes['gpu.nvidia.com'].uuid == '$uuid'"
    else
        class=mig.nvidia.com
        cel="device.attributes['gpu.nvidia.com'].profile == '1g.10gb' && device.attributes['gpu.nvidia.com'].parentUUID == '$uuid'"
    fi
    cat <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: $name, labels: {bench: $RUN_TAG}}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: $class
        selectors:
        - cel: {expression: "$cel"}
---
apiVersion: v1
kind: Pod
metadata: {name: $name, labels: {bench: $RUN_TAG}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: ctr
    image: $E2E_IMAGE
    imagePullPolicy: Never
    command: [sh, -c, "trap 'exit 0' TERM; sleep 3600 & wait"]
    resources: {claims: [{name: gpu}]}
  resourceClaims:
  - {name: gpu, resourceClaimName: $name}
---
EOF
}

# measure FILE: creates FILE's claims and pods with one kubectl and waits for every pod to be
# Running; sets RESULT to "NAME=SECONDS ..." (create to Running, in creation order) and ALL to
# the last one. A pod watch started before the create stamps each phase change as it arrives.
measure() {
    local file=$1 events=$WORK/$RUN_TAG.events names=() n t
    mapfile -t names < <(awk '/^kind: Pod$/ { pod = 1 } pod && /^metadata:/ { sub(/.*name: /, ""); sub(/,.*/, ""); print; pod = 0 }' "$file")
    kubectl get pods -l "bench=$RUN_TAG" --watch -o jsonpath='{.metadata.name} {.status.phase}{"\n"}' 2>/dev/null \
        > >(while read -r n t; do echo "$EPOCHREALTIME $n $t"; done >"$events") &
    WATCH_PID=$!
    sleep 1 # the watch is open
    local start=$EPOCHREALTIME deadline=$((SECONDS + 60 + ${#names[@]} * (${CARVE_S%.*} + 1) * 2 + ${API_DELAY_S%.*}))
    kubectl create -f "$file" >/dev/null || fail "kubectl create -f $file"
    until (($(awk '$3 == "Running" { print $2 }' "$events" | sort -u | wc -l) == ${#names[@]})); do
        ((SECONDS < deadline)) || fail "$RUN_TAG: not every pod Running after $((SECONDS - T0))s: $(cut -d' ' -f2- "$events" | sort -u | tr '\n' ' ')"
        sleep 0.1
    done
    kill "$WATCH_PID" 2>/dev/null || true
    wait "$WATCH_PID" 2>/dev/null || true
    WATCH_PID=
    RESULT='' ALL=0
    for n in "${names[@]}"; do
        t=$(awk -v n="$n" -v s="$start" '$2 == n && $3 == "Running" { printf "%.2f", $1 - s; exit }' "$events")
        RESULT+="$n=$t "
        ALL=$(awk -v a="$ALL" -v b="$t" 'BEGIN { print (b > a) ? b : a }')
    done
}

# clear: deletes this run's pods and claims and waits until the driver has unprepared them
# (no claim CDI spec left) and every carved GPU instance is destroyed.
gpu_instances() {
    "$GPU_DRA" sim --gpus "$E2E_GPUS" --node-name "$E2E_NODE" --sim-state "$GPU_DRA_SIM_STATE" show |
        jq '[.gpus[].gpu_instances[]] | length'
}
no_gpu_instances() { (($(gpu_instances) == 0)); }
clear_run() {
    kubectl delete pods -l "bench=$RUN_TAG" --wait --timeout 120s >/dev/null || fail "deleting the $RUN_TAG pods"
    kubectl delete resourceclaims -l "bench=$RUN_TAG" --wait --timeout 60s >/dev/null || fail "deleting the $RUN_TAG claims"
    wait_for "the $RUN_TAG claims unprepared" 60 bash -c "! compgen -G '$GPU_DRA_CDI_ROOT/*claim_*' >/dev/null"
    wait_for "no GPU instance left after $RUN_TAG" 60 no_gpu_instances
}

# run KIND TAG [FIRST]: one run of $PODS pods of KIND; FIRST names pod 0 (default TAG-0).
run() {
    local kind=$1 i file=$WORK/$2.yaml
    RUN_TAG=$2
    for ((i = 0; i < PODS; i++)); do
        if ((i == 0)); then manifest "$kind" "${3:-$RUN_TAG-0}" 0; else manifest "$kind" "$RUN_TAG-$i" "$i"; fi
    done >"$file"
    measure "$file"
    if [[ $kind == mig ]]; then
        local per_gpu
        per_gpu=$("$GPU_DRA" sim --gpus "$E2E_GPUS" --node-name "$E2E_NODE" --sim-state "$GPU_DRA_SIM_STATE" show |
            jq -c '[.gpus[] | .gpu_instances | length]')
        [[ $per_gpu == "[$(seq -s, "$PODS" | sed 's/[0-9]\+/1/g')]" ]] ||
            fail "$RUN_TAG: GPU instances per GPU $per_gpu, not one carve on each GPU"
    fi
    log "$RUN_TAG: all Running ${ALL}s (${RESULT% })"
    clear_run
}

median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
fmt_pods() { tr ' ' '\n' | grep . | sed 's/=/ /' | awk '{ printf "%s %ss  ", $1, $2 }'; }

# runs_1_and_2 [TAG_PREFIX [VAR_PREFIX]]: RUNS rounds of runs 1 and 2 (pods tagged
# TAG_PREFIX{whole,mig}); sets VAR_PREFIX{WHOLE,MIG}_ALL (every round's all-Running),
# VAR_PREFIX{WHOLE,MIG} (their medians) and VAR_PREFIX{WHOLE,MIG}_PODS (the last round's pods).
runs_1_and_2() {
    local r sfx kind whole_all='' mig_all=''
    for ((r = 1; r <= RUNS; r++)); do
        sfx=$( ((RUNS == 1)) || echo "-r$r")
        for kind in whole mig; do
            run "$([[ $kind == whole ]] && echo gpu || echo mig)" "${1:-}$kind$sfx"
            if [[ $kind == whole ]]; then whole_all+="$ALL "; else mig_all+="$ALL "; fi
            printf -v "${2:-}${kind^^}_PODS" '%s' "$RESULT"
        done
    done
    printf -v "${2:-}WHOLE_ALL" '%s' "$whole_all"
    printf -v "${2:-}MIG_ALL" '%s' "$mig_all"
    printf -v "${2:-}WHOLE" '%s' "$(median <<<"$whole_all")"
    printf -v "${2:-}MIG" '%s' "$(median <<<"$mig_all")"
}
runs_1_and_2
ok "whole GPU and MIG runs ($RUNS each)"

# ---------------------------------------------------------------- run 3: a slow API server
# The proxy listens on the pods' gateway; the Service is routed to it and the driver pod
# restarted, so its new connections go through the proxy (open ones keep their route).
api_port=$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}' | sed 's/.*://')
for _ in $(seq 100); do
    PROXY_PORT=$((20000 + RANDOM % 10000))
    ss -Htln "sport = :$PROXY_PORT" | grep -q . || break
done
"$API_DELAY_BIN" --listen "$E2E_POD_GATEWAY:$PROXY_PORT" --upstream "https://127.0.0.1:$api_port" \
    --cert "$PKI/apiserver.crt" --key "$PKI/apiserver.key" --ca "$PKI/ca.crt" \
    --delay-claims '^slow-' --delay "$API_DELAY" >"$WORK/api-delay.log" 2>&1 &
PROXY_PID=$!
wait_for "api-delay answers /readyz as the API server" 10 bash -c \
    "curl -sf --cacert '$PKI/ca.crt' --resolve 'kubernetes:$PROXY_PORT:$E2E_POD_GATEWAY' https://kubernetes:$PROXY_PORT/readyz | grep -qx ok"
"$E2E/cluster" route-service "$PROXY_PORT" || fail "routing the kubernetes Service to api-delay"
before=$(registrations)
driver_restart
wait_for "the kubelet registered the new driver pod" 30 registered_more_than "$before"
driver_ip=$(kubectl -n "$CHART_NAMESPACE" get pod "$DRIVER_POD" -o jsonpath='{.status.podIP}')
grep -qF "connection from $driver_ip:" "$WORK/api-delay.log" ||
    fail "the new driver pod ($driver_ip) does not reach the API server through api-delay"
ok "api-delay in front of the API server for the driver pod (kubernetes Service -> $E2E_POD_GATEWAY:$PROXY_PORT), slow-* GETs held $API_DELAY"

run mig delayed slow-0
SLOW_PODS=$RESULT SLOW_ALL=$ALL
grep -q 'holding GET resourceclaim default/slow-0' "$WORK/api-delay.log" || fail "api-delay never held slow-0's GET: the run did not test a slow read"

# ---------------------------------------------------------------- run 4: NVIDIA's driver
# The same runs with NVIDIA's plugin on the same node: gpu-dra's chart uninstalled (its checkpoint,
# holding no claim, removed: NVIDIA's plugin refuses one it did not write), NVIDIA's registered.
if [[ -n $BESIDE_NVIDIA ]]; then
    "$HELM" uninstall "$CHART_RELEASE" --namespace "$CHART_NAMESPACE" --wait --timeout 120s >/dev/null || fail "helm uninstall"
    kubectl delete resourceslices --field-selector "spec.nodeName=$E2E_NODE" >/dev/null 2>&1 || true
    kubectl apply -f "$ROOT/deviceclasses/" >/dev/null
    checkpoint=$E2E_KUBELET_ROOT/plugins/gpu.nvidia.com/checkpoint.json
    if [[ -f $checkpoint ]]; then
        jq -e '.claims == {}' "$checkpoint" >/dev/null || fail "gpu-dra's checkpoint still holds claims"
        rm -f "$checkpoint"
    fi
    NODE=$E2E_NODE NVIDIA_ROOT=$E2E_DRIVER_ROOT NVIDIA_STATE=$GPU_DRA_SIM_STATE
    NVIDIA_FAKE_NVML=${FAKE_NVML:-${CARGO_TARGET_DIR:-$ROOT/target}/release/libnvidia_ml.so}
    [[ -f $NVIDIA_FAKE_NVML ]] || (cd "$ROOT" && CARGO_INCREMENTAL=0 cargo build --release --locked -p fakenvml) >&2
    # shellcheck source=nvidia-plugin.sh
    source "$E2E/nvidia-plugin.sh"
    nvidia_node_setup
    export FAKE_NVML_GPUS=$GPUS FAKE_NVML_NODE=$NODE FAKE_NVML_STATE=$NVIDIA_STATE
    FAKE_NVML_MIG_DELAY_MS=$(awk -v s="$CARVE_S" 'BEGIN { printf "%d", s * 1000 }')
    export FAKE_NVML_MIG_DELAY_MS
    before=$(registrations)
    NVIDIA_GATES=DynamicMIG=true launch_nvidia "$E2E_KUBELET_ROOT/plugins" "$E2E_KUBELET_ROOT/plugins_registry" \
        "$GPU_DRA_CDI_ROOT" "$WORK/nvidia.log"
    wait_for "the kubelet registered NVIDIA's plugin" 60 registered_more_than "$before"
    wait_for "NVIDIA's plugin published $PODS GPUs" 60 gpus_published
    [[ "$(gpu_uuids | tr '\n' ' ')" == "${UUIDS[*]} " ]] || fail "NVIDIA's plugin publishes other GPU UUIDs than gpu-dra"
    runs_1_and_2 nvidia- NV_
    stop_nvidia
    ok "the same runs with NVIDIA's driver ($RUNS each)"
fi

# ---------------------------------------------------------------- report
target=$(awk -v c="$CARVE_S" -v w="$WHOLE" 'BEGIN { printf "%.2f", 1.5 * c + w }')
verdict=$(awk -v m="$MIG" -v t="$target" 'BEGIN { print (m <= t) ? "met" : "not met" }')
limit=$(awk -v m="$MIG" 'BEGIN { printf "%.2f", m + 5 }')
others_max=$(tr ' ' '\n' <<<"$SLOW_PODS" | grep -v '^slow-' | grep . | cut -d= -f2 | sort -g | tail -n 1)
slow=$(tr ' ' '\n' <<<"$SLOW_PODS" | grep '^slow-0=' | cut -d= -f2)
cat <<EOF
bench-kubelet: $PODS pods on $GPUS through the real kubelet, driver image from the chart (defaults; simMigDelay $CARVE), $RUNS run(s)
  whole GPU (no carve):  all Running ${WHOLE}s$( ((RUNS == 1)) || echo " (median of ${WHOLE_ALL% }; pods of the last run)")   $(fmt_pods <<<"$WHOLE_PODS")
  MIG 1g.10gb (carve):   all Running ${MIG}s$( ((RUNS == 1)) || echo " (median of ${MIG_ALL% }; pods of the last run)")   $(fmt_pods <<<"$MIG_PODS")
  target: 1.5 carves + pod start = 1.5 x ${CARVE_S}s + ${WHOLE}s = ${target}s: $verdict ($(awk -v m="$MIG" -v c="$CARVE_S" -v w="$WHOLE" 'BEGIN { printf "%.1f", (m - w) / c }') carves beyond pod start)
  slow API (slow-0's GETs held $API_DELAY): all Running ${SLOW_ALL}s   $(fmt_pods <<<"$SLOW_PODS")
  others: last Running ${others_max:-none}s (limit: MIG run + 5 s = ${limit}s); slow-0 ${slow}s
EOF
if [[ -n $BESIDE_NVIDIA ]]; then
    cat <<EOF
  NVIDIA v0.5.0 (host process, DynamicMIG; same node, claims and pods):
  whole GPU (no carve):  all Running ${NV_WHOLE}s$( ((RUNS == 1)) || echo " (median of ${NV_WHOLE_ALL% }; pods of the last run)")   $(fmt_pods <<<"$NV_WHOLE_PODS")
  MIG 1g.10gb (carve):   all Running ${NV_MIG}s$( ((RUNS == 1)) || echo " (median of ${NV_MIG_ALL% }; pods of the last run)")   $(fmt_pods <<<"$NV_MIG_PODS")
EOF
fi
echo "  took $((SECONDS - T0))s"
if [[ -n $others_max ]] && awk -v o="$others_max" -v l="$limit" 'BEGIN { exit !(o > l) }'; then
    fail "the slow claim delayed the others: last other pod Running at ${others_max}s > ${limit}s"
fi
ok "a claim whose reads take $API_DELAY did not delay the other pods"
