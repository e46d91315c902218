#!/usr/bin/env bash
# e2e: NVIDIA's own Go e2e suite (test/e2e of sigs.k8s.io/dra-driver-nvidia-gpu, Ginkgo, built by
# `e2e/build-k8s.sh nvidia-e2e-suite` with e2e/nvidia-driver/<version>.patch) run against gpu-dra
# as users install it: the driver image through gpu-dra's chart on the real node (kubelet,
# containerd, runc), simulated GPUs. Each consumable-shares spec runs under the mode it needs, as
# NVIDIA's CI runs them (the chart's default, then consumableShares=memory, then unlimited).
#
# Adapters (each only where the suite assumes what this machine lacks):
#   - its pods' images (ubuntu:22.04, nvcr.io/nvidia/cuda:12.2.0-base-ubuntu22.04) come from the
#     network: e2e/images/build.sh's cuda-standin image (busybox, whose sh is also `bash`, and a
#     C library) is tagged under those names in the node's containerd. Its pods' `nvidia-smi -L`
#     is the simulated driver root's, mounted at /usr/bin by the claim's CDI spec: it reads the
#     GPUs through the mounted libnvidia-ml (the fake one, in its container mode: the GPUs whose
#     device nodes the container was given, named and numbered as NVML does), so a pod lists the
#     UUIDs of the GPUs its claim holds, for either driver.
# Then NVIDIA's BATS suite (tests/bats) against gpu-dra (its own adapters below), and the Go suite
# against NVIDIA's own gpu-kubelet-plugin on the same node, registered with the same kubelet (a
# host process: its image and chart are not built here), so that a spec failing for NVIDIA's
# driver as for ours is told apart from one failing only for ours.
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
export GPU_DRA=${GPU_DRA:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/gpu-dra}
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

# The Go suite's pods (their namespaces are never finalized here) are gone first and our driver
# unprepared them; then our chart is uninstalled (NVIDIA's BATS suite installs it itself).
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

# ---------------------------------------------------------------- NVIDIA's BATS suite, gpu-dra
# tests/bats of the same release, as its mock-NVML CI lane runs it (MOCK_NVML=true: the tests that
# need real CUDA compute, a real MPS daemon or NGC's published charts skip themselves), on the
# GPU files of that lane plus test_gpu_consumable_shares; not its ComputeDomain files (multi-node
# NVLink and IMEX daemons across nodes: one node here) nor the MIG and DynMIG files (its lane
# leaves them out: they drive nvidia-smi on the host through NVIDIA's GPU operator pods). The
# suite installs the driver itself (`helm upgrade --install` of TEST_CHART_REPO, NVIDIA's values):
# here gpu-dra's chart. DISABLE_COMPUTE_DOMAINS=true: gpu-dra's chart installs no ComputeDomain
# controller by default (NVIDIA's Makefile variable for a cluster without one).
# Adapters (in the suite's copy, each only where the suite assumes its runner image, NVIDIA's
# chart's internals or the network):
#   - helpers.sh loads bats-support/-assert/-file from /bats-libraries (its runner image's
#     folder): Debian's packages install them under /usr/lib/bats.
#   - `helm` is a wrapper (below): `helm repo add/update` of NGC's repository answers without the
#     network (only its upgrade tests use it, and they skip under MOCK_NVML); its install of
#     the driver gets the simulated node's values appended (the locally built image, the
#     simulated GPUs, this node's kubelet, CDI and device folders), as e2e/chart.sh installs it.
#   - its pods' images (ubuntu:24.04, ubuntu:22.04) are the cuda-standin image tagged
#     under those names (above); the driver root's nvidia-smi, mounted by the claim's CDI spec,
#     lists the GPUs the container was given through the mounted libnvidia-ml.
BATS_SUITE=$("$E2E/build-k8s.sh" nvidia-bats-suite | tail -n 1)/nvidia-bats-suite
BATS_FILES=(test_gpu_basic test_gpu_cuda_workloads test_gpu_sharing test_gpu_robustness test_gpu_extres
    test_gpu_stress test_gpu_updowngrade test_gpu_consumable_shares)
# Tests that fail against gpu-dra on this node for a reason that is not a fault of ours, each
# with it (a test failing that is not listed fails the run; one listed that passes is reported).
declare -A BATS_EXPECTED_FAILURES=(
    ["GPUs: kubelet-plugin exposes Prometheus metrics"]="it runs curl or wget in the plugin's container named gpus; gpu-dra's image has no shell or tools (distroless) and its container is named driver: the metric it looks for, nvidia_dra_prepared_devices, is served on the metrics port (e2e/chart.sh's metrics test reads it). Against NVIDIA's host process it fails too: the stand-in pod has no such container"
    ["GPUs: ResourceSlice device count matches host GPU count"]="it counts /dev/nvidia[0-9]* in the host's /dev; the simulated GPUs' device nodes are in the node's device root, not /dev (fails for any driver on simulated GPUs)"
    ["GPUs: ConsumableShares — MPS request fails when consumable shares enabled"]="gpu-dra runs MPS on a consumable-shares GPU (each claim's share becomes its MPS client limits; e2e/sharing.sh), where NVIDIA's plugin refuses MPS: the suite asserts the refusal"
)
bats_root=$WORK/nvidia-bats
mkdir -p "$bats_root/tests" "$WORK/bats-tmp" "$WORK/bats-bin"
cp -r "$BATS_SUITE" "$bats_root/tests/bats"
chmod -R u+w "$bats_root/tests/bats"
sed -i 's|/bats-libraries/|/usr/lib/bats/|' "$bats_root/tests/bats/helpers.sh"
grep -q '/usr/lib/bats/bats-support/load.bash' "$bats_root/tests/bats/helpers.sh" || fail "NVIDIA's helpers.sh no longer loads /bats-libraries: revisit the adapter"
for ref in docker.io/library/ubuntu:24.04; do
    "$E2E_CTR" --address "$E2E_CONTAINERD_ADDRESS" -n k8s.io images tag --force "$CUDA_STANDIN_IMAGE" "$ref" >/dev/null
done
bats_release=dra-driver-nvidia-gpu-batssuite
printf '%s\n' --set "image.repository=$REPOSITORY" --set "image.tag=${FIRST_REF##*:}" --set image.pullPolicy=Never \
    --set-string "gpus=${E2E_GPUS//,/\\,}" --set "mig=$E2E_MIG" --set "simState=$GPU_DRA_SIM_STATE" \
    --set "devRoot=$GPU_DRA_DEV_ROOT" --set "kubeletDir=$E2E_KUBELET_ROOT" --set "cdiRoot=$GPU_DRA_CDI_ROOT" \
    >"$WORK/bats-helm-args"
# The helm wrapper: BATS_DRIVER (gpu-dra or nvidia) says which driver the suite's install gets.
cat >"$WORK/bats-bin/helm" <<WRAPPER
#!/usr/bin/env bash
# The helm NVIDIA's BATS suite runs (e2e/nvidia-suite.sh says why each case exists).
set -euo pipefail
case "\$1 \${2:-}" in
    "repo add" | "repo update") echo "helm \$*: not done (no network here)"; exit 0 ;;
esac
if [[ \$1 != upgrade || " \$* " != *" $bats_release "* ]]; then
    exec "$HELM" "\$@"
fi
if [[ \$BATS_DRIVER == gpu-dra ]]; then
    mapfile -t simulated <"$WORK/bats-helm-args"
    exec "$HELM" "\$@" "\${simulated[@]}"
fi
# NVIDIA's driver: its plugin restarted as a host process with the gates and consumable-shares
# mode of the suite's --set values (the others are what the host process's command line
# already gives: driver root, sysfs root, no ComputeDomains), and a stand-in pod with the
# kubelet-plugin label the suite waits for.
gates=() shares=
while ((\$#)); do
    if [[ \$1 == --set ]]; then
        case \$2 in
            featureGates.*=*) gates+=("\${2#featureGates.}") ;;
            consumableShares=*) shares=\${2#*=} ;;
        esac
        shift 2
    else
        shift
    fi
done
flags=()
((\${#gates[@]} == 0)) || flags+=("--feature-gates=\$(IFS=,; echo "\${gates[*]}")")
[[ -z \$shares ]] || flags+=("--consumable-shares=\$shares")
"$WORK/nvidia-start" "\${flags[@]}" >&2
kubectl create namespace dra-driver-nvidia-gpu >/dev/null 2>&1 || true
kubectl -n dra-driver-nvidia-gpu get pod nvidia-plugin-standin >/dev/null 2>&1 ||
    kubectl -n dra-driver-nvidia-gpu run nvidia-plugin-standin --image="$CUDA_STANDIN_IMAGE" --image-pull-policy=Never \
        --labels=dra-driver-nvidia-gpu-component=kubelet-plugin --command -- sleep 86400 >/dev/null
kubectl -n dra-driver-nvidia-gpu wait --for=condition=Ready pod/nvidia-plugin-standin --timeout=60s >/dev/null
echo "NVIDIA's plugin running with \${flags[*]:-its defaults}"
WRAPPER
chmod +x "$WORK/bats-bin/helm"
bats_files=()
for f in "${BATS_FILES[@]}"; do bats_files+=("tests/bats/$f.bats"); done

# run_bats DRIVER: the suite against DRIVER (gpu-dra or nvidia); sets bats_passed, bats_skipped,
# bats_skip_text and bats_failures (the failed tests' names, one per line).
run_bats() {
    local tap=$WORK/bats-$1.tap line reason
    local -A skips=()
    log "NVIDIA's BATS suite (${BATS_FILES[*]}) against $1"
    (cd "$bats_root" && env BATS_DRIVER="$1" PATH="$WORK/bats-bin:$PATH" TMPDIR="$WORK/bats-tmp" MOCK_NVML=true DISABLE_COMPUTE_DOMAINS=true \
        TEST_CHART_REPO="$ROOT/deploy/helm/gpu-dra" TEST_CHART_VERSION="$(sed -n 's/^version: //p' "$ROOT/deploy/helm/gpu-dra/Chart.yaml")" \
        TEST_NVIDIA_DRIVER_ROOT="$E2E_DRIVER_ROOT" TEST_GPU_STRESS_PODS_N=20 TEST_GPU_STRESS_ITERATIONS=1 TEST_GPU_STRESS_DELAY=1 \
        bats --tap --print-output-on-failure "${bats_files[@]}" >"$tap" 2>&1) || true
    [[ -z ${NVIDIA_SUITE_KEEP:-} ]] || cp "$tap" "$NVIDIA_SUITE_KEEP"/
    grep -qE '^1\.\.[0-9]+' "$tap" || { tail -n 40 "$tap" >&2; fail "NVIDIA's BATS suite did not run against $1"; }
    bats_passed=0 bats_skipped=0 bats_failures=''
    while IFS= read -r line; do
        if [[ $line =~ ^ok\ [0-9]+\ (.*)\ \#\ skip\ ?(.*)$ ]]; then
            bats_skipped=$((bats_skipped + 1))
            reason=${BASH_REMATCH[2]:-no reason given}
            skips[$reason]=$((${skips[$reason]:-0} + 1))
        elif [[ $line =~ ^ok\ [0-9]+\ (.*)$ ]]; then
            bats_passed=$((bats_passed + 1))
        elif [[ $line =~ ^not\ ok\ [0-9]+\ (.*)$ ]]; then
            bats_failures+="${BASH_REMATCH[1]}"$'\n'
        fi
    done <"$tap"
    bats_skip_text=$(for reason in "${!skips[@]}"; do echo "${skips[$reason]}: $reason"; done | sort | paste -sd ';' | sed 's/;/; /g')
}

run_bats gpu-dra
ours_bats_failures=$bats_failures bats_expected=0 unexpected=()
while IFS= read -r name; do
    [[ -n $name ]] || continue
    if [[ -n ${BATS_EXPECTED_FAILURES[$name]:-} ]]; then
        bats_expected=$((bats_expected + 1))
        log "BATS: failed with the reason listed: $name (${BATS_EXPECTED_FAILURES[$name]})"
    else
        unexpected+=("$name")
    fi
done <<<"$ours_bats_failures"
for name in "${!BATS_EXPECTED_FAILURES[@]}"; do
    grep -qxF "$name" <<<"$ours_bats_failures" || log "now passes (remove it from BATS_EXPECTED_FAILURES): $name"
done
if ((${#unexpected[@]} > 0)); then
    grep -E -A30 '^not ok' "$WORK/bats-gpu-dra.tap" | head -n 120 >&2
    fail "NVIDIA's BATS suite against gpu-dra: $(printf '%s; ' "${unexpected[@]}")"
fi
ok "NVIDIA's BATS suite against gpu-dra: $bats_passed passed, $bats_expected failed with the reason listed, $bats_skipped skipped ($bats_skip_text)"
ours_passed=$((ours_passed + bats_passed)) ours_failed=$((ours_failed + bats_expected)) ours_skipped=$((ours_skipped + bats_skipped))
# What a failed test left (every object of the suite has the label env=batssuite) goes, and our
# driver unprepares it, before the uninstall.
kubectl delete deployments,jobs,pods,resourceclaims,resourceclaimtemplates -l env=batssuite --wait=false >/dev/null 2>&1 || true
wait_for "our driver unprepared the BATS suite's claims" 90 bash -c "[[ -z \$(ls $GPU_DRA_CDI_ROOT/k8s.gpu.nvidia.com-claim_* 2>/dev/null) ]]"
"$HELM" uninstall "$bats_release" --namespace dra-driver-nvidia-gpu --wait --timeout 120s >&2 || fail "helm uninstall of the BATS suite's release"

# ---------------------------------------------------------------- the same suites, NVIDIA's driver
# NVIDIA's gpu-kubelet-plugin v0.5.0 on the same node, the same simulated GPUs, registered with the
# same real kubelet through the same plugin folders: a host process (its image and chart are not
# built here), the fake libnvidia-ml in the node's driver root (what it dlopens), the GPUs'
# device nodes under that root (where its CDI specs name them), the simulator's sysfs. For the
# BATS suite, which installs the driver by its chart, the helm wrapper restarts the host process
# with the install's gates and mode, and a stand-in pod carries the plugin pod's label.
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
# The node's layout for e2e/nvidia-plugin.sh (as e2e/switch-on-node.sh): its device nodes under
# the driver root, MIG capability files and /proc/devices in its mount namespace, the simulated
# sysfs, and its nvidia-smi a stand-in that sets the simulated time-slice (the driver root's fake
# one runs only chrooted; NVIDIA's plugin runs it as a host program).
GPUS=$E2E_GPUS NODE=$E2E_NODE NVIDIA_ROOT=$E2E_DRIVER_ROOT NVIDIA_STATE=$GPU_DRA_SIM_STATE
NVIDIA_FAKE_NVML=${FAKE_NVML:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/libnvidia_ml.so}
[[ -f $NVIDIA_FAKE_NVML ]] || (cd "$ROOT" && cargo build -p fakenvml) >&2
# shellcheck source=nvidia-plugin.sh
source "$E2E/nvidia-plugin.sh"
nvidia_node_setup
# nvidia-start [stop | FLAGS...]: stops NVIDIA's plugin if it runs; with FLAGS, starts it with them
# (nvidia-plugin.sh's launch_nvidia) and waits until the kubelet registered it and it published
# the node's eight GPUs. A script, not a function: the BATS suite's helm wrapper runs it too.
cat >"$WORK/nvidia-start" <<START
#!/usr/bin/env bash
set -euo pipefail
# None of the BATS suite's descriptors (its TAP stream, its output pipes) goes to the plugin: bats
# waits for whoever holds them open.
for fd in \$(ls /proc/\$\$/fd); do
    ((fd <= 2)) || eval "exec \$fd>&-"
done
export KUBECONFIG=$KUBECONFIG PATH=$BIN:\$PATH FAKE_NVML_GPUS=$GPUS FAKE_NVML_NODE=$NODE FAKE_NVML_STATE=$NVIDIA_STATE
E2E=$E2E WORK=$WORK GPU_DRA=$GPU_DRA BIN=$BIN GPUS=$GPUS NODE=$NODE NVIDIA_ROOT=$NVIDIA_ROOT NVIDIA_STATE=$NVIDIA_STATE
source "$E2E/nvidia-plugin.sh"
pidfile=$WORK/nvidia.pid
if [[ -f \$pidfile ]]; then
    pid=\$(cat "\$pidfile")
    kill -TERM "\$pid" 2>/dev/null || true
    # Not our child once the starter exited: gone, or a zombie no one reaped yet.
    for _ in \$(seq 100); do
        [[ -e /proc/\$pid && \$(awk '{print \$3}' "/proc/\$pid/stat" 2>/dev/null) != Z ]] || break
        sleep 0.1
    done
    rm -f "\$pidfile"
fi
[[ \${1:-} != stop ]] || exit 0
kubelet_log=$GPU_DRA_CLUSTER_DIR/logs/kubelet.log
registrations=\$(grep -c 'Registered DRA plugin.*gpu.nvidia.com' "\$kubelet_log" || true)
launch_nvidia "$E2E_KUBELET_ROOT/plugins" "$E2E_KUBELET_ROOT/plugins_registry" "$GPU_DRA_CDI_ROOT" "$WORK/nvidia.log" "\$@" </dev/null
echo "\$NVIDIA_PID" >"\$pidfile"
for _ in \$(seq 600); do
    (( \$(grep -c 'Registered DRA plugin.*gpu.nvidia.com' "\$kubelet_log") > registrations )) && break
    kill -0 "\$NVIDIA_PID" 2>/dev/null || { tail -n 20 "$WORK/nvidia.log" >&2; echo "NVIDIA's plugin exited" >&2; exit 1; }
    sleep 0.1
done
(( \$(grep -c 'Registered DRA plugin.*gpu.nvidia.com' "\$kubelet_log") > registrations )) || { echo "NVIDIA's plugin did not register in 60s" >&2; exit 1; }
for _ in \$(seq 120); do
    if [[ \$(kubectl get resourceslices -o json --field-selector spec.nodeName=$NODE | jq '[.items[].spec.devices[]? | select(.name | test("^gpu-[0-9]+\$"))] | length') == 8 ]]; then
        nvidia_uuids
        exit 0
    fi
    sleep 0.5
done
echo "NVIDIA's plugin did not publish 8 GPUs in 60s" >&2
exit 1
START
chmod +x "$WORK/nvidia-start"
stop_nvidia() { "$WORK/nvidia-start" stop; }
trap 'stop_nvidia; cleanup' EXIT
run_nvidia() { "$WORK/nvidia-start" "$@" || fail "NVIDIA's plugin did not start with: $*"; }
total_passed=0 total_failed=0 total_skipped=0
run_nvidia
suite nvidia-defaults '\[install\]|\[cel/|\[sharing\]|\[negative\]'
run_nvidia --feature-gates=ConsumableShares=true --consumable-shares=memory
suite nvidia-consumable-memory '\[consumable-shares/memory\]'
run_nvidia --feature-gates=ConsumableShares=true --consumable-shares=unlimited
suite nvidia-consumable-unlimited '\[consumable-shares/unlimited\]'
# Its BATS suite: the Go suite's pods go first (NVIDIA's plugin unprepares them).
for ns in $(kubectl get ns -o name | sed -n 's|^namespace/\(gpu-e2e-.*\)|\1|p'); do
    kubectl -n "$ns" delete pods --all --grace-period=0 --force >/dev/null 2>&1 || true
done
run_bats nvidia
nvidia_bats_failures=$bats_failures
total_passed=$((total_passed + bats_passed)) total_skipped=$((total_skipped + bats_skipped))
total_failed=$((total_failed + $(grep -c . <<<"$nvidia_bats_failures" || true)))
stop_nvidia
# Each test that failed against gpu-dra: did it fail against NVIDIA's driver too?
both=0 ours_only=0
while IFS= read -r name; do
    [[ -n $name ]] || continue
    if grep -qxF "$name" <<<"$nvidia_bats_failures"; then
        both=$((both + 1))
        log "BATS: fails for both drivers: $name"
    else
        ours_only=$((ours_only + 1))
        log "BATS: fails for gpu-dra only (the reason listed): $name"
    fi
done <<<"$ours_bats_failures"
while IFS= read -r name; do
    [[ -z $name ]] || grep -qxF "$name" <<<"$ours_bats_failures" || log "BATS: fails for NVIDIA's driver only: $name"
done <<<"$nvidia_bats_failures"

line="NVIDIA's suites: passed $ours_passed, failed $ours_failed (ours only: $ours_only, each a listed deliberate difference; $both fail for NVIDIA's driver too), skipped $ours_skipped ($bats_skip_text); NVIDIA's own driver on the same node: passed $total_passed, failed $total_failed, skipped $total_skipped (test/e2e of $NVIDIA_DRA_VERSION, each consumable-shares spec in its mode, and tests/bats, its mock-NVML lane's GPU files)"
log "$line"
[[ -z ${GPU_DRA_TEST_REPORT:-} ]] || echo "$line" >>"$GPU_DRA_TEST_REPORT"
report_mode "the driver image installed by the Helm chart, then NVIDIA's plugin as a host process on the same node; NVIDIA's test/e2e and tests/bats suites, their pods' images a local stand-in"
echo "$passed passed, 0 failed"
