#!/usr/bin/env bash
# e2e: NVIDIA's own Go e2e suite (test/e2e of sigs.k8s.io/dra-driver-nvidia-gpu, Ginkgo, built by
# `e2e/build-k8s.sh nvidia-e2e-suite` with e2e/nvidia-driver/<version>.patch) run against gpu-dra
# as users install it: the driver image through gpu-dra's chart on the real node (kubelet,
# containerd, runc), simulated GPUs. Each consumable-shares spec runs under the mode it needs, as
# NVIDIA's CI runs them (the chart's default, then consumableShares=memory, then unlimited).
#
# Adapters (each only where the suite assumes what this machine lacks):
#   - its pods' images (ubuntu:22.04, nvcr.io/nvidia/cuda:12.2.0-base-ubuntu22.04) come from the
#     network: e2e/images/build.sh's cuda-standin image is tagged under those names in the node's
#     containerd (its `bash` is busybox's sh). Its `nvidia-smi` is a stand-in in /usr/local/bin
#     (e2e/images/nvidia-smi-standin.sh) that lists the GPU device nodes the container got and
#     fails without one: the simulated driver root's nvidia-smi, which our CDI spec mounts at
#     /usr/bin, runs only chrooted into that root. (Before the stand-in, `nvidia-smi -L` failed
#     in every container; the [sharing] spec, whose pods need it to succeed, passed only when its
#     poll caught the crash-looping pods in their moment of readiness: the flake seen once in 5.)
# Then the same suite against NVIDIA's own gpu-kubelet-plugin on the same node, registered with the
# same kubelet (a host process: its image and chart are not built here), so that a spec failing
# for NVIDIA's driver as for ours is told apart from one failing only for ours. Not yet: NVIDIA's
# BATS suite (tests/bats).
#
# Prints `NVIDIA's suites: passed P, failed F (ours only: X), skipped S; NVIDIA's own driver on
# the same node: passed ...`; in e2e/run-tests. A spec failing against ours fails the run; one
# failing against NVIDIA's is counted.
set -euo pipefail
E2E=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$E2E")
cd "$ROOT"
NAME=nvidia-suite
WORK=$(mktemp -d /tmp/gpu-dra-nvidia-suite.XXXXXX)
# shellcheck source=chart.sh
source "$E2E/chart.sh"
export GPU_DRA_CLUSTER_DIR=$WORK/cluster
passed=0

log() { echo "$NAME: $*" >&2; }
ok() { passed=$((passed + 1)); log "ok - $*"; }
fail() {
    log "FAIL: $*"
    if [[ -n ${KUBECONFIG:-} ]]; then
        kubectl get pods,resourceclaims -A -o wide 2>&1 | sed 's/^/    /' >&2 || true
    fi
    if [[ -f $WORK/nvidia.log ]]; then
        echo "    NVIDIA's plugin (tail):" >&2
        tail -n 25 "$WORK/nvidia.log" | sed 's/^/    /' >&2
    fi
    echo "$passed passed, 1 failed"
    exit 1
}
cleanup() {
    "$E2E/cluster" down >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
set -E
trap 'fail "line $LINENO: unexpected failure of: $BASH_COMMAND"' ERR
# shellcheck source=versions.env
source "$E2E/versions.env"
export GPU_DRA=${GPU_DRA:-$ROOT/target/debug/gpu-dra}
BIN=${GPU_DRA_K8S_BIN:-$("$E2E/build-k8s.sh" | tail -n 1)}
export GPU_DRA_K8S_BIN=$BIN PATH="$BIN:$PATH"
SUITE=$("$E2E/build-k8s.sh" nvidia-e2e-suite | tail -n 1)/nvidia-e2e-suite

chart_build_images
# Eight GPUs: the suite deletes each spec's namespace, but this cluster runs no namespace
# controller, so earlier specs' pods keep their GPUs.
chart_cluster_up --gpus sim:8xH100-SXM5-80GB
eval "$("$E2E/cluster" env)"
chart_import_images
eval "$("$E2E/images/build.sh" | grep '^CUDA_STANDIN_')"
"$E2E_CTR" --address "$E2E_CONTAINERD_ADDRESS" -n k8s.io images import "$CUDA_STANDIN_ARCHIVE" >/dev/null
for ref in docker.io/library/ubuntu:22.04 nvcr.io/nvidia/cuda:12.2.0-base-ubuntu22.04; do
    "$E2E_CTR" --address "$E2E_CONTAINERD_ADDRESS" -n k8s.io images tag --force "$CUDA_STANDIN_IMAGE" "$ref" >/dev/null
done

total_passed=0 total_failed=0 total_skipped=0
# suite LABEL FOCUS: NVIDIA's suite, the specs matching FOCUS, against the installed driver.
suite() {
    local label=$1 focus=$2 out summary p f s ran of
    out=$WORK/suite-$label.out
    (cd "$WORK" && "$SUITE" -ginkgo.focus "$focus" -ginkgo.no-color -ginkgo.timeout 10m >"$out" 2>&1) || true
    [[ -z ${NVIDIA_SUITE_KEEP:-} ]] || cp "$out" "$NVIDIA_SUITE_KEEP"/
    summary=$(grep -E '^(SUCCESS|FAIL)! -- [0-9]+ Passed \| [0-9]+ Failed' "$out" | tail -n 1)
    [[ -n $summary ]] || { tail -n 40 "$out" >&2; fail "$label: NVIDIA's suite printed no summary"; }
    read -r p f s < <(sed -E 's/.* ([0-9]+) Passed \| ([0-9]+) Failed \| [0-9]+ Pending \| ([0-9]+) Skipped.*/\1 \2 \3/' <<<"$summary")
    # Ginkgo counts the specs the focus leaves out as skipped: only the others are skips.
    read -r ran of < <(sed -nE 's/^Ran ([0-9]+) of ([0-9]+) Specs.*/\1 \2/p' "$out" | tail -n 1)
    s=$((s - (of - ran)))
    total_passed=$((total_passed + p)) total_failed=$((total_failed + f)) total_skipped=$((total_skipped + s))
    if ((f > 0)); then
        grep -E '^\s*\[FAIL\]|Expected|to (equal|be)' "$out" | head -n 20 >&2 || true
        # Against NVIDIA's own driver a failure is counted, not ours to fail on.
        [[ $label == nvidia-* ]] || fail "$label: NVIDIA's suite: $summary"
        log "$label: NVIDIA's suite against NVIDIA's driver: $summary"
        return 0
    fi
    ok "$label: NVIDIA's suite ($focus): $p passed, $s skipped (of $ran selected)"
}

chart_install "$FIRST_REF"
driver_ready >/dev/null || fail "no ready driver pod after helm install"
suite defaults '\[install\]|\[cel/|\[sharing\]|\[negative\]'
chart_upgrade "$FIRST_REF" --set consumableShares=memory
driver_ready >/dev/null || fail "no ready driver pod with consumableShares=memory"
suite consumable-memory '\[consumable-shares/memory\]'
chart_upgrade "$FIRST_REF" --set consumableShares=unlimited
driver_ready >/dev/null || fail "no ready driver pod with consumableShares=unlimited"
suite consumable-unlimited '\[consumable-shares/unlimited\]'

ours_passed=$total_passed ours_failed=$total_failed ours_skipped=$total_skipped

# ---------------------------------------------------------------- the same suite, NVIDIA's driver
# NVIDIA's gpu-kubelet-plugin v0.5.0 on the same node, the same simulated GPUs, registered with the
# same real kubelet through the same plugin folders: a host process (its image and chart are not
# built here), the fake libnvidia-ml in the node's driver root (what it dlopens), the GPUs'
# device nodes under that root (where its CDI specs name them), the simulator's sysfs. The
# earlier specs' pods (their namespaces are never finalized here) are gone first and our
# driver unprepared them; then our chart is uninstalled.
for ns in $(kubectl get ns -o name | sed -n 's|^namespace/\(gpu-e2e-.*\)|\1|p'); do
    kubectl -n "$ns" delete pods --all --grace-period=0 --force >/dev/null 2>&1 || true
done
wait_for "our driver unprepared the suite's claims" 90 bash -c "[[ -z \$(ls $GPU_DRA_CDI_ROOT/k8s.gpu.nvidia.com-claim_* 2>/dev/null) ]]"
for ns in $(kubectl get ns -o name | sed -n 's|^namespace/\(gpu-e2e-.*\)|\1|p'); do
    for c in $(kubectl -n "$ns" get resourceclaims -o name); do
        kubectl -n "$ns" patch "$c" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
        kubectl -n "$ns" delete "$c" --wait=false >/dev/null 2>&1 || true
    done
done
"$HELM" uninstall "$CHART_RELEASE" --namespace "$CHART_NAMESPACE" --wait --timeout 120s >&2 || fail "helm uninstall"
kubectl delete resourceslices --field-selector "spec.nodeName=$E2E_NODE" >/dev/null 2>&1 || true
# The uninstall took the chart's DeviceClasses; NVIDIA's chart installs the same ones (deviceclasses/).
kubectl apply -f "$ROOT/deviceclasses/" >/dev/null
# NVIDIA's plugin refuses a checkpoint it did not write (its checksum): gpu-dra's, which holds
# no claim now, goes (what an admin switching back does).
checkpoint=$E2E_KUBELET_ROOT/plugins/gpu.nvidia.com/checkpoint.json
if [[ -f $checkpoint ]]; then
    jq -e '.claims == {}' "$checkpoint" >/dev/null || fail "gpu-dra's checkpoint still holds claims: $(cat "$checkpoint")"
    rm -f "$checkpoint"
fi
NVIDIA_PLUGIN=$("$E2E/build-k8s.sh" nvidia-gpu-kubelet-plugin | tail -n 1)/nvidia-gpu-kubelet-plugin
FAKE_NVML=${FAKE_NVML:-$ROOT/target/debug/libnvidia_ml.so}
[[ -f $FAKE_NVML ]] || (cd "$ROOT" && cargo build -p fakenvml) >&2
cp "$FAKE_NVML" "$(find "$E2E_DRIVER_ROOT" -name 'libnvidia-ml.so.*' -type f | head -n 1)"
mkdir -p "$E2E_DRIVER_ROOT/dev"
cp -a "$GPU_DRA_DEV_ROOT/dev/." "$E2E_DRIVER_ROOT/dev/"
"$GPU_DRA" sim --gpus "$E2E_GPUS" --node-name "$E2E_NODE" --sim-state "$GPU_DRA_SIM_STATE" sysfs "$WORK/sysfs" >/dev/null
mkdir -p "$WORK/host-root"
ln -s "$WORK/sysfs" "$WORK/host-root/sys"
NVIDIA_PID=
stop_nvidia() {
    [[ -n $NVIDIA_PID ]] || return 0
    kill -TERM "$NVIDIA_PID" 2>/dev/null || true
    wait "$NVIDIA_PID" 2>/dev/null || true
    NVIDIA_PID=
}
trap 'stop_nvidia; cleanup' EXIT
# run_nvidia FLAGS...: NVIDIA's plugin with FLAGS, until the kubelet registered it and it
# published the node's eight GPUs.
run_nvidia() {
    local registrations
    stop_nvidia
    registrations=$(grep -c 'Registered DRA plugin.*gpu.nvidia.com' "$GPU_DRA_CLUSTER_DIR/logs/kubelet.log" || true)
    env FAKE_NVML_GPUS="$E2E_GPUS" FAKE_NVML_NODE="$E2E_NODE" FAKE_NVML_STATE="$GPU_DRA_SIM_STATE" \
        NVIDIA_DRA_SYSFS_ROOT="$WORK/sysfs" \
        "$NVIDIA_PLUGIN" --node-name "$E2E_NODE" --kubeconfig "$KUBECONFIG" \
        --nvidia-driver-root "$E2E_DRIVER_ROOT" --container-driver-root "$E2E_DRIVER_ROOT" \
        --host-root "$WORK/host-root" --cdi-root "$GPU_DRA_CDI_ROOT" \
        --kubelet-plugins-directory-path "$E2E_KUBELET_ROOT/plugins" \
        --kubelet-registrar-directory-path "$E2E_KUBELET_ROOT/plugins_registry" \
        --nvidia-cdi-hook-path "$BIN/nvidia-cdi-hook" --image-name gpu-dra-e2e/none:0 "$@" >>"$WORK/nvidia.log" 2>&1 &
    NVIDIA_PID=$!
    wait_for "the kubelet registered NVIDIA's plugin" 60 bash -c \
        "(( \$(grep -c 'Registered DRA plugin.*gpu.nvidia.com' $GPU_DRA_CLUSTER_DIR/logs/kubelet.log) > $registrations ))" ||
        { tail -n 20 "$WORK/nvidia.log" >&2; fail "NVIDIA's plugin did not register"; }
    wait_for "NVIDIA's plugin published 8 GPUs" 60 bash -c \
        "[[ \$(kubectl get resourceslices -o json --field-selector spec.nodeName=$E2E_NODE | jq '[.items[].spec.devices[]? | select(.name | test(\"^gpu-[0-9]+\$\"))] | length') == 8 ]]"
}
total_passed=0 total_failed=0 total_skipped=0
run_nvidia
suite nvidia-defaults '\[install\]|\[cel/|\[sharing\]|\[negative\]'
run_nvidia --feature-gates=ConsumableShares=true --consumable-shares=memory
suite nvidia-consumable-memory '\[consumable-shares/memory\]'
run_nvidia --feature-gates=ConsumableShares=true --consumable-shares=unlimited
suite nvidia-consumable-unlimited '\[consumable-shares/unlimited\]'
stop_nvidia

line="NVIDIA's suites: passed $ours_passed, failed $ours_failed (ours only: $ours_failed), skipped $ours_skipped; NVIDIA's own driver on the same node: passed $total_passed, failed $total_failed, skipped $total_skipped (test/e2e of $NVIDIA_DRA_VERSION, each consumable-shares spec in its mode; its BATS suite not yet)"
log "$line"
[[ -z ${GPU_DRA_TEST_REPORT:-} ]] || echo "$line" >>"$GPU_DRA_TEST_REPORT"
report_mode "the driver image installed by the Helm chart, then NVIDIA's plugin as a host process on the same node; NVIDIA's test/e2e suite, its pods' images a local stand-in"
echo "$passed passed, 0 failed"
