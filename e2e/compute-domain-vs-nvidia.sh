#!/usr/bin/env bash
# e2e: gpu-dra's ComputeDomain side beside NVIDIA's own (sigs.k8s.io/dra-driver-nvidia-gpu v0.5.0,
# its compute-domain-kubelet-plugin and compute-domain-controller built from its module by
# `e2e/build-k8s.sh nvidia-compute-domain-kubelet-plugin nvidia-compute-domain-controller` with
# e2e/nvidia-driver/<version>.patch), on the same simulated GB200 node (sim:4xGB200-186GB, in an
# NVLink clique): the same fake libnvidia-ml in the same driver root.
#
#   1. Slices: NVIDIA's compute-domain-kubelet-plugin, then `gpu-dra run --compute-domains`,
#      each a host process, publishes the node's compute-domain.nvidia.com ResourceSlices; every
#      field of every device (channel and daemon devices) is compared with e2e/vs-nvidia.sh's
#      comparer (e2e/vs-nvidia-compare.py); a field that differs fails the run unless
#      e2e/compute-domain-vs-nvidia-explained.tsv says why it differs by design. Prints
#        compute-domain slices vs NVIDIA's driver: N devices, M fields compared, 0 mismatches (K differences explained)
#   2. Controller: NVIDIA's compute-domain-controller starts against the e2e control plane (the
#      ComputeDomain CRD as gpu-dra's chart installs it, NVIDIA's ComputeDomainClique CRD from its
#      chart, its templates from its module at /templates) and reconciles one ComputeDomain
#      (NVIDIA's demo imex/channel-injection.yaml): its finalizer, the workload's
#      ResourceClaimTemplate and the domain's IMEX DaemonSet; the domain deleted, all of it goes.
#      Then `gpu-dra compute-domain-controller` does the same with the same domain, and the two
#      templates' name, namespace, labels, finalizers and spec are compared (the domain's UID
#      aside; ownerReferences differ by design, see below).
#
# What it proves less than it seems: all host processes against the control plane, not the
# charts; no kubelet calls either plugin (no claim is prepared, no IMEX daemon runs: the
# claims side is e2e/computedomain.sh's); NVIDIA's controller's IMEX DaemonSet is created but
# never runs (no DaemonSet controller, no kubelet); NVIDIA's plugin reads /proc/devices from
# ALT_PROC_DEVICES_PATH (its own mock-NVML switch), which also skips its /proc/driver/nvidia
# unmount.
set -euo pipefail
NAME=compute-domain-vs-nvidia
NODE=cd-vs-nvidia-node
GPUS=sim:4xGB200-186GB
DRIVER_BACKEND=nvml
E2E=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$E2E/lib.sh"
NVIDIA_CD_PID='' NVIDIA_CTRL_PID='' CTRL_PID=''
# lib.sh's fail, showing the logs of NVIDIA's processes and our controller too.
eval "lib_$(declare -f fail)"
fail() {
    local f
    for f in "$WORK"/nvidia-cd.log "$WORK"/nvidia-controller.log "$WORK"/controller.log; do
        [[ -f $f ]] && { log "$f (tail):"; tail -n 20 "$f" | cut -c1-400 >&2; }
    done
    lib_fail "$@"
}
stop_pid() { # PID: SIGTERM, then SIGKILL after 5 s
    [[ -n $1 ]] || return 0
    kill -TERM "$1" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}
trap 'stop_driver; stop_pid "$NVIDIA_CD_PID"; stop_pid "$NVIDIA_CTRL_PID"; stop_pid "$CTRL_PID"
    [[ -z ${MADE_TEMPLATES:-} ]] || rmdir /templates 2>/dev/null || true
    "$E2E/cluster" down >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT

# shellcheck source=nvidia-plugin.sh
source "$E2E/nvidia-plugin.sh"
NVIDIA_CD_PLUGIN=$(dirname "$NVIDIA_PLUGIN")/nvidia-compute-domain-kubelet-plugin
NVIDIA_CD_CONTROLLER=$(dirname "$NVIDIA_PLUGIN")/nvidia-compute-domain-controller
[[ -x $NVIDIA_CD_PLUGIN && -x $NVIDIA_CD_CONTROLLER ]] || fail "build-k8s.sh did not build NVIDIA's compute-domain binaries"
# The fake NVML in the driver root, the GPUs' device nodes under it (its standard CDI spec names
# them), the simulated sysfs.
nvidia_node_setup
# The node in an NVLink clique (NVML's fabric info, read by both: NVIDIA's plugin logs it, gpu-dra
# also publishes it).
CLUSTER_UUID=7f1f1a8e-5b7d-4c1e-9a34-0c2e6d0b7201
"$GPU_DRA" sim --gpus "$GPUS" --node-name "$NODE" --sim-state "$WORK/hw.json" \
    fabric --cluster-uuid "$CLUSTER_UUID" --clique-id 3 >/dev/null
# The IMEX channels' character device major, which NVIDIA's plugin reads from /proc/devices for
# its CDI specs (the kernel module registers nvidia-caps-imex-channels; the simulated node has no
# such module).
sed '/^Block devices:/i 509 nvidia-caps-imex-channels' "$WORK/proc-devices" >"$WORK/proc-devices-imex"
# The ComputeDomain CRD as gpu-dra's chart installs it; NVIDIA's controller also watches
# ComputeDomainCliques (its ComputeDomainCliques gate, on by default in v0.5.0), a CRD gpu-dra
# has no use for: NVIDIA's own, from its chart as published.
NVIDIA_CHART=$("$E2E/build-k8s.sh" nvidia-chart nvidia-templates | tail -n 1)/nvidia-chart
NVIDIA_TEMPLATES=$(dirname "$NVIDIA_CHART")/nvidia-templates
kubectl apply -f "$ROOT/deploy/helm/gpu-dra/crds/resource.nvidia.com_computedomains.yaml" \
    -f "$NVIDIA_CHART/crds/resource.nvidia.com_computedomaincliques.yaml" >/dev/null
wait_for "the CRDs established" 30 kubectl wait --for condition=established --timeout 2s \
    crd/computedomains.resource.nvidia.com crd/computedomaincliques.resource.nvidia.com

SLICES_DRIVER=compute-domain.nvidia.com
# shellcheck source=driver-slices.sh
source "$E2E/driver-slices.sh"

# ---------------------------------------------------------------- 1. slices
mkdir -p "$WORK/nvidia-registry" "$WORK/nvidia-plugins"
env ALT_PROC_DEVICES_PATH="$WORK/proc-devices-imex" \
    "$NVIDIA_CD_PLUGIN" --node-name "$NODE" --kubeconfig "$KUBECONFIG" \
    --nvidia-driver-root "$NVIDIA_ROOT" --container-driver-root "$NVIDIA_ROOT" --cdi-root "$WORK/nvidia-cdi" \
    --kubelet-plugins-directory-path "$WORK/nvidia-plugins" \
    --kubelet-registrar-directory-path "$WORK/nvidia-registry" \
    --nvidia-cdi-hook-path "$BIN/nvidia-cdi-hook" >"$WORK/nvidia-cd.log" 2>&1 &
NVIDIA_CD_PID=$!
settled "$WORK/nvidia-slices.json" || fail "NVIDIA's compute-domain plugin published no settled slices"
grep -q "identified fabric clique UUID/ID.*$CLUSTER_UUID/3" "$WORK/nvidia-cd.log" \
    || fail "NVIDIA's compute-domain plugin did not see the node's clique"
stop_pid "$NVIDIA_CD_PID"
NVIDIA_CD_PID=
clear_slices
# gpu-dra's plugin refuses to serve domains on a driver root without nvidia-imex (it runs one
# daemon per domain): the fake one (e2e/fakenvml), as e2e/computedomain.sh's nodes have. NVIDIA's
# plugin leaves IMEX daemons to its DaemonSet's pods (the compute-domain-daemon image), never
# looks for it.
IMEX=${CARGO_TARGET_DIR:-$ROOT/target}/debug/nvidia-imex
[[ -x $IMEX ]] || (cd "$ROOT" && cargo build -q -p fakenvml --bin nvidia-imex) >&2
install -m 0755 "$IMEX" "$NVIDIA_ROOT/usr/bin/nvidia-imex"
install -m 0755 "$IMEX" "$NVIDIA_ROOT/usr/bin/nvidia-imex-ctl"
# gpu-dra reads the channels' major from /proc/devices too (no switch for another path): the same
# file, bound over /proc/devices in a mount namespace of its own (the PID stays the driver's).
cat >"$WORK/gpu-dra-in-ns" <<SH
#!/bin/sh
exec unshare -m --propagation private sh -c 'mount --bind "\$0" /proc/devices && exec "\$@"' "$WORK/proc-devices-imex" "$GPU_DRA" "\$@"
SH
chmod 0755 "$WORK/gpu-dra-in-ns"
GPU_DRA=$WORK/gpu-dra-in-ns \
    DRIVER_ARGS="--sysfs-root $WORK/sysfs --compute-domains --node-ip 127.0.0.1 --kubelet-plugins-directory-path $WORK/plugins" start_driver
settled "$WORK/ours-slices.json" || fail "gpu-dra published no settled compute-domain slices"
stop_driver
[[ -z ${VS_NVIDIA_KEEP:-} ]] || cp "$WORK/nvidia-slices.json" "$WORK/nvidia-cd.log" "$WORK/ours-slices.json" "$VS_NVIDIA_KEEP"/
summary=$(python3 "$E2E/vs-nvidia-compare.py" --explained "$E2E/compute-domain-vs-nvidia-explained.tsv" \
    --config compute-domain "$WORK/nvidia-slices.json" "$WORK/ours-slices.json") \
    || { echo "$summary" >&2; fail "compute-domain slices differ from NVIDIA's"; }
read -r devices fields explained <<<"$(tail -n 1 <<<"$summary")"
sed '$d' <<<"$summary" >&2
ok "compute-domain.nvidia.com slices on $GPUS: $devices devices, $fields fields compared, 0 mismatches ($explained differences explained)"
line="compute-domain slices vs NVIDIA's driver: $devices devices, $fields fields compared, 0 mismatches ($explained differences explained)"
log "$line"
[[ -z ${GPU_DRA_TEST_REPORT:-} ]] || echo "$line" >>"$GPU_DRA_TEST_REPORT"

# ---------------------------------------------------------------- 2. controllers
# The domain of NVIDIA's demo spec (the pod is not needed: no kubelet runs it).
domain() { awk '/^---/ { n++ } n == 1' "$E2E/pods/nvidia/channel-injection.yaml"; }
template_json() { kubectl get resourceclaimtemplate imex-channel-0 -o json 2>/dev/null; }
# reconcile WHO: the domain created, its finalizer and template made (NVIDIA's controller also
# makes the domain's IMEX DaemonSet); the domain deleted, all of it gone. The template is kept in
# $WORK/template-WHO.json.
reconcile() {
    local who=$1 uid
    domain | kubectl apply -f - >/dev/null
    wait_for "$who's controller made the domain's ResourceClaimTemplate" 60 template_json
    wait_for "$who's controller added its finalizer" 30 bash -c \
        "[[ \$(kubectl get computedomain imex-channel-injection -o json | jq '.metadata.finalizers | length') -gt 0 ]]"
    [[ $who != nvidia ]] || wait_for "NVIDIA's controller made the domain's IMEX DaemonSet" 30 bash -c \
        "[[ -n \$(kubectl get daemonsets -A -o name) ]]"
    uid=$(kubectl get computedomain imex-channel-injection -o jsonpath='{.metadata.uid}')
    # The domain's UID is the one value the two runs cannot share.
    template_json | sed "s/$uid/DOMAIN-UID/g" >"$WORK/template-$who.json"
    kubectl delete computedomain imex-channel-injection --wait=false >/dev/null
    wait_for "$who's controller let the domain go" 60 bash -c "! kubectl get computedomain imex-channel-injection >/dev/null 2>&1"
    wait_for "$who's controller deleted the template" 30 bash -c "! kubectl get resourceclaimtemplate imex-channel-0 >/dev/null 2>&1"
    wait_for "$who's controller deleted what it made for the domain" 30 bash -c "[[ -z \$(kubectl get daemonsets,resourceclaimtemplates -A -o name) ]]"
}
# It reads its templates (the daemon's DaemonSet, its claim template, the workload's claim
# template) from /templates, where its image has them: NVIDIA's from its module, bound there in a
# mount namespace of its own. A machine without /templates gets an empty mount point for the run.
if [[ ! -e /templates ]]; then
    mkdir /templates
    MADE_TEMPLATES=1
fi
# shellcheck disable=SC2016 # expanded by the namespace's shell
unshare -m --propagation private sh -c 'mount --bind "$0" /templates && exec "$@"' "$NVIDIA_TEMPLATES" \
    "$NVIDIA_CD_CONTROLLER" --kubeconfig "$KUBECONFIG" --namespace default --pod-name nvidia-cd-controller-e2e \
    --image-name gpu-dra-e2e/none:0 --log-verbosity-cd-daemon 1 \
    >"$WORK/nvidia-controller.log" 2>&1 &
NVIDIA_CTRL_PID=$!
reconcile nvidia
stop_pid "$NVIDIA_CTRL_PID"
NVIDIA_CTRL_PID=
[[ -z ${MADE_TEMPLATES:-} ]] || { rmdir /templates; MADE_TEMPLATES=; }
"$GPU_DRA" compute-domain-controller --kubeconfig "$KUBECONFIG" --namespace default --resync-interval 2s \
    >"$WORK/controller.log" 2>&1 &
CTRL_PID=$!
reconcile ours
stop_pid "$CTRL_PID"
CTRL_PID=
[[ -z ${VS_NVIDIA_KEEP:-} ]] || cp "$WORK/template-nvidia.json" "$WORK/template-ours.json" "$WORK/nvidia-controller.log" "$VS_NVIDIA_KEEP"/
# Compared: the template's name, namespace, labels, finalizers and spec. Not compared, by design:
# ownerReferences (gpu-dra's template is also owned by its domain, so the garbage collector
# removes it should the domain go without the controller; NVIDIA's relies on its finalizer alone).
template_fields() { jq -S '{name: .metadata.name, namespace: .metadata.namespace, labels: .metadata.labels, finalizers: .metadata.finalizers, spec}' "$1"; }
if ! diff <(template_fields "$WORK/template-nvidia.json") <(template_fields "$WORK/template-ours.json") >&2; then
    fail "the domain's ResourceClaimTemplate (< NVIDIA's, > gpu-dra's) differs from the one NVIDIA's controller makes"
fi
ok "NVIDIA's compute-domain-controller and gpu-dra's reconcile imex-channel-injection (finalizer, template imex-channel-0, NVIDIA's IMEX DaemonSet; deleted: all gone); the templates' name, labels, finalizers and spec are equal"

echo "$passed passed, 0 failed"
