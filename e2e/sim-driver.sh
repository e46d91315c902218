# shellcheck shell=bash
# Shared by e2e scripts whose simulated nodes run `gpu-dra run` as host processes (scale.sh,
# fleet-replay.sh, karpenter.sh, workloads.sh): what they prove stops at the driver's gRPC
# socket and the API server; the image through the chart is e2e/install.sh's and pods.sh's.
# Source after setting E2E, ROOT and WORK.

# A private copy of the driver (a concurrent `cargo build` must not swap it under the fleet), and
# the pinned Kubernetes binaries first on PATH. Sets GPU_DRA and BIN.
use_private_binaries() {
    GPU_DRA=${GPU_DRA:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/gpu-dra}
    [[ -x $GPU_DRA ]] || (cd "$ROOT" && cargo build --bin gpu-dra) >&2
    cp "$GPU_DRA" "$WORK/gpu-dra"
    GPU_DRA=$WORK/gpu-dra
    BIN=${GPU_DRA_K8S_BIN:-$("$E2E/build-k8s.sh" | tail -n 1)}
    export GPU_DRA_K8S_BIN=$BIN
    export PATH="$BIN:$PATH"
}

# start_sim_driver NODE GPUS DIR LOG [FLAGS...]: `gpu-dra run` for node NODE with simulated GPUS,
# its hardware state, sockets, CDI specs and checkpoint under DIR, in the background; sets
# SIM_DRIVER_PID.
start_sim_driver() {
    local node=$1 gpus=$2 dir=$3 log=$4
    shift 4
    mkdir -p "$dir"
    "$GPU_DRA" run --node-name "$node" --gpus "$gpus" "$@" --sim-state "$dir/hw.json" \
        --kubeconfig "$KUBECONFIG" --registrar-dir "$dir/registry" --plugin-dir "$dir/plugin" \
        --cdi-root "$dir/cdi" --state-dir "$dir/state" >>"$log" 2>&1 &
    SIM_DRIVER_PID=$!
}
