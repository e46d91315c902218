#!/usr/bin/env bash
# Driver footprint on a simulated 8×H100 node against the real control plane (release build):
#   - start-to-registered: from exec to the registration socket answering kubelet-sim;
#   - idle RSS after the first slice sync;
#   - the same for a restart (checkpoint present, slices already published).
# Usage: e2e/bench-driver.sh   (builds target/release/gpu-dra if missing)
set -euo pipefail
NAME=bench-driver
NODE=bench-node-1
GPUS=sim:8xH100-SXM5-80GB
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -z ${GPU_DRA:-} ]]; then
    (cd "$ROOT" && cargo build --release --bin gpu-dra) >&2
    GPU_DRA=$ROOT/target/release/gpu-dra
fi
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

now_ms() { date +%s%3N; }
measure() { # label
    local t0 t1
    t0=$(now_ms)
    start_driver
    t1=$(now_ms)
    wait_for "slices published" 30 bash -c "[[ \$(kubectl get resourceslices -o json | jq '[.items[].spec.devices[]?] | length') == 208 ]]"
    sleep 3
    local rss
    rss=$(awk '/VmRSS/ {print $2}' "/proc/$DRIVER_PID/status")
    printf '%-22s start-to-registered %4d ms (upper bound: includes kubelet-sim start)   idle RSS %6.1f MiB\n' \
        "$1" "$((t1 - t0))" "$(echo "$rss / 1024" | bc -l)"
    stop_driver
}
measure "first start"
measure "restart"
grep -o 'elapsed_ms=[0-9]*' "$WORK/driver.log" | sed 's/^/in-process start to serving: /'
