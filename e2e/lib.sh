# Shared by the driver e2e scripts: a control plane, the driver as a child process, kubelet-sim,
# and TAP-like reporting that ends with "N passed, N failed". Source it after setting NAME
# (log prefix), NODE and GPUS; it starts the cluster and installs a cleanup trap.
# shellcheck shell=bash
E2E=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$E2E")
# shellcheck source-path=SCRIPTDIR source=manifests.sh
source "$E2E/manifests.sh"
WORK=$(mktemp -d "/tmp/gpu-dra-$NAME.XXXXXX")
export GPU_DRA_CLUSTER_DIR=$WORK/cluster
DRIVER_PID=
passed=0

log() { echo "$NAME: $*" >&2; }
fail() {
    log "FAIL: $*"
    [[ -f $WORK/driver.log ]] && { log "driver log (tail):"; tail -n 40 "$WORK/driver.log" >&2; }
    echo "$passed passed, 1 failed"
    exit 1
}
ok() { passed=$((passed + 1)); log "ok - $*"; }

stop_driver() {
    if [[ -n $DRIVER_PID ]] && kill -0 "$DRIVER_PID" 2>/dev/null; then
        kill -TERM "$DRIVER_PID" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$DRIVER_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$DRIVER_PID" 2>/dev/null || true
    fi
    [[ -n $DRIVER_PID ]] && wait "$DRIVER_PID" 2>/dev/null || true
    DRIVER_PID=
}
# MPS control daemons the driver started (e2e/mps-folder.sh: their own cgroups, chrooted into
# the driver root), every MPS process (daemons and servers), and their shm mounts.
# shellcheck source=mps-folder.sh
source "$(dirname "${BASH_SOURCE[0]}")/mps-folder.sh"
mps_pids() { mps_daemons_of "$WORK/"; }
mps_all_pids() { mps_processes "$WORK/"; }
mps_mounts() { awk -v w="$WORK/" 'index($5, w) == 1 { print $5 }' /proc/self/mountinfo; }
cleanup() {
    # A signal arriving now must not cut the cleanup short.
    trap '' TERM INT
    stop_driver
    local pids m
    pids=$(mps_all_pids)
    # shellcheck disable=SC2086
    [[ -z $pids ]] || kill -KILL $pids 2>/dev/null || true
    for m in $(mps_mounts); do umount -l "$m" 2>/dev/null || true; done
    "$E2E/cluster" down >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
# Stopped by a signal (a parent script, Ctrl-C): exit through the cleanup too.
trap 'exit 143' TERM
trap 'exit 130' INT

GPU_DRA=${GPU_DRA:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/gpu-dra}
if [[ ! -x $GPU_DRA ]]; then
    (cd "$ROOT" && cargo build --bin gpu-dra) >&2
fi
# A private copy: a concurrent `cargo build` must not swap the binary between two runs.
cp "$GPU_DRA" "$WORK/gpu-dra"
GPU_DRA=$WORK/gpu-dra

# DRIVER_BACKEND=nvml runs the driver's real NVML code path against the fake libnvidia-ml
# (e2e/fakenvml) on the same simulated hardware; the default drives the simulator directly.
DRIVER_BACKEND=${DRIVER_BACKEND:-sim}
GPU_ARGS=(--gpus "$GPUS")
if [[ $DRIVER_BACKEND == nvml ]]; then
    FAKE_NVML=${FAKE_NVML:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/libnvidia_ml.so}
    [[ -f $FAKE_NVML ]] || (cd "$ROOT" && cargo build -p fakenvml) >&2
    cp "$FAKE_NVML" "$WORK/libnvidia-ml.so.1"
    export FAKE_NVML_GPUS=$GPUS FAKE_NVML_NODE=$NODE FAKE_NVML_STATE=$WORK/hw.json
    # Real GPUs need a driver root with the running driver's files (the CDI specs mount them).
    "$GPU_DRA" sim --gpus "$GPUS" --node-name "$NODE" --sim-state "$WORK/hw.json" \
        driver-root "$WORK/driver-root" >/dev/null
    GPU_ARGS=(--gpus nvml --nvml-lib "$WORK/libnvidia-ml.so.1" --nvidia-driver-root "$WORK/driver-root")
fi
BIN=${GPU_DRA_K8S_BIN:-$("$E2E/build-k8s.sh" | tail -n 1)}
export PATH="$BIN:$PATH"

"$E2E/cluster" up --nodes "$NODE" >&2 || fail "the control plane did not start"
eval "$("$E2E/cluster" env)"

kubelet() { kubelet-sim --registration-socket "$WORK/registry/gpu.nvidia.com-reg.sock" --expect-name gpu.nvidia.com "$@"; }

# start_driver [ENV=VALUE ...]: runs `gpu-dra run` on the simulated node until its
# registration socket exists. Extra arguments are environment settings (e.g. a failpoint).
start_driver() {
    launch_driver "$@"
    # A killed predecessor leaves its socket file behind; ready means registration answers.
    for _ in $(seq 100); do
        kill -0 "$DRIVER_PID" 2>/dev/null || fail "the driver exited at start"
        [[ -S $WORK/registry/gpu.nvidia.com-reg.sock ]] && kubelet register --timeout 2s >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    fail "the driver did not register"
}

# launch_driver [ENV=VALUE ...]: starts `gpu-dra run` (DRIVER_PID) without waiting for it.
launch_driver() {
    env RUST_LOG="${RUST_LOG:-info}" "$@" "$GPU_DRA" run --node-name "$NODE" "${GPU_ARGS[@]}" \
        --sim-state "$WORK/hw.json" --kubeconfig "$KUBECONFIG" \
        --registrar-dir "$WORK/registry" --plugin-dir "$WORK/plugin" \
        --cdi-root "$WORK/cdi" --state-dir "$WORK/state" \
        --gc-interval-seconds 2 --gc-grace-seconds 2 --resync-interval-seconds 5 ${DRIVER_ARGS:-} >>"$WORK/driver.log" 2>&1 &
    DRIVER_PID=$!
}

# shellcheck source=metrics-sample.sh
source "$(dirname "${BASH_SOURCE[0]}")/metrics-sample.sh"

wait_for() { # description, timeout seconds, command...
    local what=$1 timeout=$2
    shift 2
    local deadline=$((SECONDS + timeout))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || fail "timed out after ${timeout}s waiting for: $what"
        sleep 0.5
    done
}

slices_json() { kubectl get resourceslices -o json --field-selector "spec.nodeName=$NODE"; }
# Simulated hardware: the number of GPU instances that exist.
gpu_instances() {
    "$GPU_DRA" sim --gpus "$GPUS" --node-name "$NODE" --sim-state "$WORK/hw.json" show \
        | jq '[.gpus[].gpu_instances[]] | length'
}

# token_kubeconfig FILE TOKEN: a kubeconfig for this cluster that authenticates with TOKEN only.
token_kubeconfig() {
    local server ca
    server=$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')
    ca=$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.certificate-authority}')
    {
        kubectl config --kubeconfig "$1" set-cluster e2e --server "$server" --certificate-authority "$ca"
        kubectl config --kubeconfig "$1" set-credentials user --token "$2"
        kubectl config --kubeconfig "$1" set-context e2e --cluster e2e --user user
        kubectl config --kubeconfig "$1" use-context e2e
    } >/dev/null
}

# claim_and_pod NAME CLASS CEL: a ResourceClaim for one device of CLASS matching CEL, and a pod
# using it.
claim_and_pod() { # name class cel-expression
    { claim_yaml "$1" "$2" "$3"; echo ---; pod_using_claim "$1" "$1"; } | kubectl apply -f - >&2
}
