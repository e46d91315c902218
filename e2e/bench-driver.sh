#!/usr/bin/env bash
# Driver footprint on a simulated 8×H100 node against the real control plane (the shipped
# `node` profile build):
#   - start-to-registered: from exec until the registration socket exists (then kubelet-sim
#     registers through it);
#   - idle RSS after the first slice sync;
#   - the same for a restart (checkpoint present, slices already published).
# Usage: e2e/bench-driver.sh   (GPU_DRA=path, default: builds target/node/gpu-dra as the image
# does, without the offline tools)
set -euo pipefail
NAME=bench-driver
NODE=bench-node-1
GPUS=sim:8xH100-SXM5-80GB
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The `node` profile without default features is what the image ships (size-optimised, LTO, no
# CEL engine or allocator).
if [[ -z ${GPU_DRA:-} ]]; then
    (cd "$ROOT" && cargo build --profile node --no-default-features --bin gpu-dra) >&2
    GPU_DRA=${CARGO_TARGET_DIR:-$ROOT/target}/node/gpu-dra
fi
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

now_ms() { date +%s%3N; }
# Starts the driver and times it from exec until its registration socket exists (the moment
# kubelet's plugin watcher could see it), polling every millisecond.
timed_start() {
    local t0 t1
    t0=$(now_ms)
    env RUST_LOG=warn "$GPU_DRA" run --node-name "$NODE" "${GPU_ARGS[@]}" \
        --sim-state "$WORK/hw.json" --kubeconfig "$KUBECONFIG" \
        --registrar-dir "$WORK/registry" --plugin-dir "$WORK/plugin" \
        --cdi-root "$WORK/cdi" --state-dir "$WORK/state" >>"$WORK/driver.log" 2>&1 &
    DRIVER_PID=$!
    until [[ -S $WORK/registry/gpu.nvidia.com-reg.sock ]]; do
        kill -0 "$DRIVER_PID" 2>/dev/null || fail "the driver exited at start"
        sleep 0.001
    done
    t1=$(now_ms)
    kubelet register >/dev/null || fail "registration failed"
    START_MS=$((t1 - t0))
}
measure() { # label
    local rss
    timed_start
    wait_for "slices published" 30 bash -c "[[ \$(kubectl get resourceslices -o json | jq '[.items[].spec.devices[]?] | length') == 208 ]]"
    sleep 3
    rss=$(awk '/VmRSS/ {print $2}' "/proc/$DRIVER_PID/status")
    printf '%-12s exec to registration socket %4d ms   idle RSS %6.1f MiB\n' "$1" "$START_MS" "$(echo "$rss / 1024" | bc -l)"
    stop_driver
}
measure "first start"
measure "restart"
