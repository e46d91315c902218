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
# Not yet: the same suite against NVIDIA's own driver on the same node (issue 54), and its BATS
# suite (tests/bats).
#
# Prints `NVIDIA's suites: passed P, failed F, skipped S (reasons)`; in e2e/run-tests.
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
        fail "$label: NVIDIA's suite: $summary"
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

line="NVIDIA's suites: passed $total_passed, failed $total_failed, skipped $total_skipped (test/e2e of $NVIDIA_DRA_VERSION against gpu-dra's chart, each consumable-shares spec in its mode; its BATS suite and a run against NVIDIA's own driver not yet)"
log "$line"
[[ -z ${GPU_DRA_TEST_REPORT:-} ]] || echo "$line" >>"$GPU_DRA_TEST_REPORT"
report_mode "the driver image installed by the Helm chart; NVIDIA's test/e2e suite, its pods' images tagged locally"
echo "$passed passed, 0 failed"
