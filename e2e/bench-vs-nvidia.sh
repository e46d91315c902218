#!/usr/bin/env bash
# gpu-dra and NVIDIA's driver (dra-driver-nvidia-gpu v0.5.0, built by e2e/build-k8s.sh) side by
# side, in one run, on the same simulated node (8×H100 behind the fake libnvidia-ml, the same
# driver root and sysfs), the same control plane and the same claims, each plugin alone in turn:
#
#   - exec to registration socket (the moment kubelet's plugin watcher could see it);
#   - idle RSS and idle CPU (user + system) over IDLE_SECONDS once the slices are published; the
#     start and idle figures are the median of IDLE_ROUNDS rounds, the drivers alternating;
#   - prepare latency p50/p99 through the plugin socket (kubelet-sim, the kubelet's own gRPC
#     stubs): a whole GPU, and a MIG carve (DynamicMIG placement: both carve on prepare);
#   - 4 carves on 4 GPUs in one NodePrepareResources call (the kubelet sends a pod's claims in one
#     call): NVIDIA's driver serialises them node-wide, gpu-dra overlaps GPUs;
#   - RSS after CYCLES prepare/unprepare cycles of a whole GPU;
#   - create to Running of 4 pods through the real kubelet (whole GPUs, then 4 MIG carves), by
#     e2e/bench-kubelet.sh --beside-nvidia on a cluster of its own with a real node: gpu-dra's
#     image through its chart, NVIDIA's plugin as a host process on the same node;
#   - binary size, and the size of gpu-dra's image (e2e/build-image.sh from the same binary).
#
# Both run as host processes with each one's defaults (gpu-dra: `--mig auto`, health probes every
# 5 s, MIG changes read at their NVML event, rescans every 60 s; NVIDIA's: no health check, no
# DynamicMIG), then with the features of the other: NVIDIA's with its NVMLDeviceHealthCheck gate, gpu-dra's with its probe and rescan
# 1 h apart; the prepare figures with NVIDIA's DynamicMIG on (its carve-on-prepare). The fake
# libnvidia-ml's event wait sleeps until the simulated state changes, as the real call blocks in
# the kernel: an idle figure is the driver's own work. NVIDIA's plugin needs the GPUs' device
# nodes and MIG capability files of a real driver: e2e/nvidia-plugin.sh gives it those. Not in
# run-tests (a benchmark: numbers, no pass/fail beyond "both ran"); the table in docs/benchmarks.md
# (and README's glance) is its output.
#
# Usage: e2e/bench-vs-nvidia.sh   (GPU_DRA=path: the node-profile binary by default, as shipped;
#   FAKE_NVML=path: the release build by default; IDLE_SECONDS=30 IDLE_ROUNDS=3 CYCLES=1000 ROUNDS=50
#   MIG_DELAY_MS=250)
set -euo pipefail
NAME=bench-vs-nvidia
NODE=bench-node-1
GPUS=sim:8xH100-SXM5-80GB
DRIVER_BACKEND=nvml
IDLE_SECONDS=${IDLE_SECONDS:-30}
IDLE_ROUNDS=${IDLE_ROUNDS:-3}
CYCLES=${CYCLES:-1000}
ROUNDS=${ROUNDS:-50}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -z ${GPU_DRA:-} ]]; then
    (cd "$ROOT" && CARGO_INCREMENTAL=0 cargo build --profile node --locked --no-default-features --bin gpu-dra) >&2
    GPU_DRA=${CARGO_TARGET_DIR:-$ROOT/target}/node/gpu-dra
fi
# The fake libnvidia-ml optimised too: its per-call cost (it reads the simulated node's state) is
# the fake's, not either driver's, and counts in both drivers' idle CPU.
if [[ -z ${FAKE_NVML:-} ]]; then
    (cd "$ROOT" && CARGO_INCREMENTAL=0 cargo build --release --locked -p fakenvml) >&2
    FAKE_NVML=${CARGO_TARGET_DIR:-$ROOT/target}/release/libnvidia_ml.so
fi
E2E=$ROOT/e2e
# shellcheck source=lib.sh
source "$E2E/lib.sh"
trap 'stop_driver; stop_nvidia; "$E2E/cluster" down >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT

# shellcheck source=nvidia-plugin.sh
source "$E2E/nvidia-plugin.sh"
nvidia_node_setup

now_ms() { date +%s%3N; }
clear_slices() {
    kubectl delete resourceslices --field-selector "spec.nodeName=$NODE" --wait=true >/dev/null 2>&1 || true
}
# cpu_ticks PID: user + system time of the process and its reaped children, in clock ticks.
cpu_ticks() { awk '{ print $14 + $15 + $16 + $17 }' "/proc/$1/stat"; }
rss_mib() { awk '/VmRSS/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status"; }
TICK_HZ=$(getconf CLK_TCK)

# Who runs: WHO=ours|nvidia, PID, REG (its registration socket).
launch() { # who [extra flags...]
    local who=$1
    shift
    if [[ $who == nvidia ]]; then
        # Each start is a first start (no checkpoint of an earlier one), as gpu-dra's are.
        rm -rf "$WORK/nvidia-registry" "$WORK/nvidia-plugins"
        launch_nvidia "$WORK/nvidia-plugins" "$WORK/nvidia-registry" "$WORK/nvidia-cdi" "$WORK/nvidia.log" "$@"
        PID=$NVIDIA_PID REG=$WORK/nvidia-registry/gpu.nvidia.com-reg.sock
    else
        rm -rf "$WORK/registry/gpu.nvidia.com-reg.sock" "$WORK/state"
        env RUST_LOG="${BENCH_RUST_LOG:-warn}" "$GPU_DRA" run --node-name "$NODE" "${GPU_ARGS[@]}" \
            --sim-state "$WORK/hw.json" --kubeconfig "$KUBECONFIG" \
            --registrar-dir "$WORK/registry" --plugin-dir "$WORK/plugin" \
            --cdi-root "$WORK/cdi" --state-dir "$WORK/state" --sysfs-root "$WORK/sysfs" \
            "$@" >>"$WORK/driver.log" 2>&1 &
        DRIVER_PID=$! PID=$! REG=$WORK/registry/gpu.nvidia.com-reg.sock
    fi
}
stop_who() { if [[ $1 == nvidia ]]; then stop_nvidia; else stop_driver; fi; }
# start WHO [flags]: START_MS from exec to the registration socket; then registered and published.
start() {
    local who=$1 t0 t1
    clear_slices
    t0=$(now_ms)
    launch "$@"
    until [[ -S $REG ]]; do
        kill -0 "$PID" 2>/dev/null || { tail -n 20 "$WORK/nvidia.log" "$WORK/driver.log" >&2 2>/dev/null; fail "$who exited at start"; }
        sleep 0.001
    done
    t1=$(now_ms)
    START_MS=$((t1 - t0))
    kubelet-sim --registration-socket "$REG" --expect-name gpu.nvidia.com register --timeout 5s >/dev/null ||
        fail "$who: registration failed"
    wait_for "$who: slices published" 60 bash -c "(( \$(kubectl get resourceslices -o json --field-selector spec.nodeName=$NODE | jq '[.items[].spec.devices[]?] | length') > 0 ))"
}
# idle WHO: IDLE_RSS, IDLE_CPU_MS (per IDLE_SECONDS) after 5 s of settling. In a cpuacct cgroup of
# its own (nanoseconds, every thread, those that ended included) where the host has one;
# otherwise from /proc/PID/stat (10 ms ticks).
CPUACCT=/sys/fs/cgroup/cpuacct
idle() {
    local t0 t1 group=$CPUACCT/gpu-dra-bench-$$
    sleep 5
    if mkdir "$group" 2>/dev/null && echo "$PID" >"$group/cgroup.procs" 2>/dev/null; then
        t0=$(cat "$group/cpuacct.usage")
        sleep "$IDLE_SECONDS"
        t1=$(cat "$group/cpuacct.usage")
        IDLE_CPU_MS=$(awk -v d=$((t1 - t0)) 'BEGIN { printf "%.1f", d / 1e6 }')
        echo "$PID" >"$CPUACCT/cgroup.procs"
        rmdir "$group"
    else
        rmdir "$group" 2>/dev/null || true
        t0=$(cpu_ticks "$PID")
        sleep "$IDLE_SECONDS"
        t1=$(cpu_ticks "$PID")
        IDLE_CPU_MS=$(((t1 - t0) * 1000 / TICK_HZ))
    fi
    IDLE_RSS=$(rss_mib "$PID")
}

declare -A RESULT
# measure_idle KEY WHO [flags]: one start and idle period, appended to KEY's samples.
measure_idle() {
    local key=$1
    shift
    start "$@"
    idle
    RESULT[$key.start]+="$START_MS " RESULT[$key.idle_rss]+="$IDLE_RSS " RESULT[$key.idle_cpu]+="$IDLE_CPU_MS "
    log "$key: exec to registration ${START_MS} ms, idle RSS ${IDLE_RSS} MiB, idle CPU ${IDLE_CPU_MS} ms per ${IDLE_SECONDS} s"
    stop_who "$1"
}
# median_of KEY: KEY's samples replaced by their median (idle figures this small move 2-3x
# between runs on a shared machine; rounds alternate the drivers, so drift hits both alike).
median_of() { RESULT[$1]=$(tr ' ' '\n' <<<"${RESULT[$1]}" | grep . | sort -n | awk '{ v[NR] = $1 } END { printf "%.1f", v[int((NR + 1) / 2)] }'); }

# percentile P FILE-OF-NUMBERS: nearest-rank percentile.
percentile() { sort -n "$2" | awk -v p="$1" '{ v[NR] = $1 } END { i = int((p * NR + 99) / 100); if (i < 1) i = 1; printf "%.1f", v[i] }'; }
# cycles KEY ROUNDS CLAIM...: ROUNDS prepare+unprepare calls of CLAIMs (one call each) through the
# plugin socket; KEY.p50/.p99 of the prepares.
cycles() {
    local key=$1 rounds=$2 out args=()
    shift 2
    for c in "$@"; do args+=(--claim "default/$c/$(kubectl get resourceclaim "$c" -o jsonpath='{.metadata.uid}')"); done
    out=$(kubelet-sim --registration-socket "$REG" --expect-name gpu.nvidia.com --timeout 120s cycle --rounds "$rounds" "${args[@]}") ||
        fail "$key: $(jq -r '.error // empty' <<<"$out" 2>/dev/null || echo "$out")"
    jq -r '.prepare_ms[]' <<<"$out" >"$WORK/$key.ms"
    RESULT[$key.p50]=$(percentile 50 "$WORK/$key.ms") RESULT[$key.p99]=$(percentile 99 "$WORK/$key.ms")
    log "$key: prepare p50 ${RESULT[$key.p50]} ms, p99 ${RESULT[$key.p99]} ms over $rounds rounds"
}
measure_prepare() { # who [flags]
    local who=$1
    start "$@"
    wait_for "$who: the claims' devices published" 60 bash -c "(( \$(kubectl get resourceslices -o json --field-selector spec.nodeName=$NODE | jq '[.items[].spec.devices[]?] | length') >= 8 ))"
    cycles "$who.whole" "$ROUNDS" whole
    cycles "$who.carve" "$ROUNDS" carve-0
    cycles "$who.carve4" "$((ROUNDS / 5 + 1))" carve-0 carve-1 carve-2 carve-3
    cycles "$who.cycles" "$CYCLES" whole
    RESULT[$who.cycles_rss]=$(rss_mib "$PID")
    log "$who: RSS after $CYCLES prepare/unprepare cycles ${RESULT[$who.cycles_rss]} MiB"
    stop_who "$who"
}

for _ in $(seq "$IDLE_ROUNDS"); do
    measure_idle nvidia nvidia
    measure_idle ours ours
    NVIDIA_GATES=NVMLDeviceHealthCheck=true measure_idle nvidia-health nvidia
    measure_idle ours-noprobe ours --health-probe-interval 1h --rescan-interval 1h
done
for key in nvidia ours nvidia-health ours-noprobe; do
    for figure in start idle_rss idle_cpu; do median_of "$key.$figure"; done
done

# The claims, allocated once by kube-scheduler from gpu-dra's slices (the same device names as
# NVIDIA's under DynamicMIG: e2e/vs-nvidia.sh), prepared by each driver in turn: a whole GPU, a
# 1g.10gb carve on GPU 1, and four carves on GPUs 1-4 in one call. Every MIG create and destroy
# takes FAKE_NVML_MIG_DELAY_MS, as real ones take time.
export FAKE_NVML_MIG_DELAY_MS=${MIG_DELAY_MS:-250}
kubectl apply -f "$ROOT/deviceclasses/" >&2
start ours
uuid_of() { kubectl get resourceslices -o json --field-selector "spec.nodeName=$NODE" |
    jq -r --arg d "$1" '.items[].spec.devices[]? | select(.name == $d) | .attributes.uuid.string'; }
wait_for "GPUs 0-4 published" 60 bash -c "[[ \$(kubectl get resourceslices -o json | jq '[.items[].spec.devices[]? | select(.name | test(\"^gpu-[0-4]\$\"))] | length') == 5 ]]"
claim_and_pod whole gpu.nvidia.com "device.attributes[\"gpu.nvidia.com\"].uuid == \"$(uuid_of gpu-0)\""
for i in 0 1 2 3; do
    claim_and_pod "carve-$i" mig.nvidia.com "device.attributes[\"gpu.nvidia.com\"].profile == \"1g.10gb\" && device.attributes[\"gpu.nvidia.com\"].parentUUID == \"$(uuid_of "gpu-$((i + 1))")\""
done
for c in whole carve-0 carve-1 carve-2 carve-3; do
    for _ in $(seq 120); do
        [[ -n $(kubectl get resourceclaim "$c" -o jsonpath='{.status.allocation}') ]] && continue 2
        sleep 0.5
    done
    kubectl describe pod "$c" | tail -n 8 >&2
    fail "claim $c was not allocated"
done
stop_driver
measure_prepare ours
NVIDIA_GATES=DynamicMIG=true measure_prepare nvidia

# Pods through the real kubelet: e2e/bench-kubelet.sh --beside-nvidia (its own cluster with a real
# node: gpu-dra's image through its chart, then NVIDIA's plugin as a host process on the same
# node), 4 pods each with a claim on its own GPU created by one kubectl, create to all Running
# (scheduling included, the same for both), the median of 3 runs; MIG carves take the same time.
"$E2E/cluster" down >/dev/null 2>&1 || true
kubelet_out=$(env -u GPU_DRA IMAGE_BINARY="$GPU_DRA" FAKE_NVML="$FAKE_NVML" "$E2E/bench-kubelet.sh" --beside-nvidia --pods 4 --runs 3 \
    --carve "${FAKE_NVML_MIG_DELAY_MS}ms" 2>"$WORK/bench-kubelet.log") ||
    { tail -n 20 "$WORK/bench-kubelet.log" >&2; fail "e2e/bench-kubelet.sh --beside-nvidia"; }
echo "$kubelet_out" >&2
# all_running LABEL: the all-Running seconds of gpu-dra's (first) and NVIDIA's (second) LABEL line.
all_running() { grep -F "$1" <<<"$kubelet_out" | sed -n 's/.*all Running \([0-9.]*\)s.*/\1/p' | paste -sd' '; }
read -r ours_whole_pods nvidia_whole_pods < <(all_running 'whole GPU (no carve)')
read -r ours_mig_pods nvidia_mig_pods < <(all_running 'MIG 1g.10gb (carve)')
[[ -n $nvidia_mig_pods ]] || fail "e2e/bench-kubelet.sh printed no NVIDIA figures: $kubelet_out"

# gpu-dra's image as e2e/build-image.sh builds it from this binary (what the chart runs).
image_size=$("$E2E/build-image.sh" --binary "$GPU_DRA" --out "$WORK/image" 2>/dev/null | sed -n 's/^IMAGE_SIZE_BYTES=//p')
[[ -n $image_size ]] || fail "e2e/build-image.sh did not build gpu-dra's image"
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
row() { printf '%-44s %16s %16s\n' "$@"; }
echo
row "8×H100 (fake NVML), one run, same node" "gpu-dra" "NVIDIA v0.5.0"
row "exec to registration socket" "${RESULT[ours.start]} ms" "${RESULT[nvidia.start]} ms"
row "idle RSS" "${RESULT[ours.idle_rss]} MiB" "${RESULT[nvidia.idle_rss]} MiB"
row "idle CPU per ${IDLE_SECONDS} s, defaults" "${RESULT[ours.idle_cpu]} ms" "${RESULT[nvidia.idle_cpu]} ms"
row "idle CPU, NVIDIA's health check on" "" "${RESULT[nvidia-health.idle_cpu]} ms"
row "idle CPU, gpu-dra's probe and rescan 1h" "${RESULT[ours-noprobe.idle_cpu]} ms" ""
row "prepare whole GPU p50 / p99" "${RESULT[ours.whole.p50]} / ${RESULT[ours.whole.p99]} ms" "${RESULT[nvidia.whole.p50]} / ${RESULT[nvidia.whole.p99]} ms"
row "prepare MIG carve p50 / p99" "${RESULT[ours.carve.p50]} / ${RESULT[ours.carve.p99]} ms" "${RESULT[nvidia.carve.p50]} / ${RESULT[nvidia.carve.p99]} ms"
row "prepare 4 carves, 4 GPUs, one call p50" "${RESULT[ours.carve4.p50]} ms" "${RESULT[nvidia.carve4.p50]} ms"
row "create to 4 pods Running, whole GPUs" "$ours_whole_pods s" "$nvidia_whole_pods s"
row "create to 4 pods Running, 4 MIG carves" "$ours_mig_pods s" "$nvidia_mig_pods s"
row "RSS after $CYCLES prepare/unprepare cycles" "${RESULT[ours.cycles_rss]} MiB" "${RESULT[nvidia.cycles_rss]} MiB"
row "binary" "$(mib "$(stat -c %s "$GPU_DRA")") MiB" "$(mib "$(stat -c %s "$NVIDIA_PLUGIN")") MiB"
row "image (uncompressed; NVIDIA's not built here)" "$(mib "$image_size") MiB" "-"
echo "(MIG create/destroy: ${FAKE_NVML_MIG_DELAY_MS} ms each)"
ok "both drivers measured on the same node in one run"
echo "$passed passed, 0 failed"
