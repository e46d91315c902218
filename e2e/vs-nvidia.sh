#!/usr/bin/env bash
# e2e: gpu-dra beside NVIDIA's own DRA driver (sigs.k8s.io/dra-driver-nvidia-gpu, built from its
# module by e2e/build-k8s.sh with e2e/nvidia-driver/<version>.patch), on the same simulated node:
# the same fake libnvidia-ml in the same driver root, the same simulated sysfs. Each plugin, a host
# process, publishes the node's ResourceSlices to the e2e control plane in turn, and every field
# of every device is compared (e2e/vs-nvidia-compare.py): names, attributes and their types,
# capacities, counters and counter sets, taints, node selection, pool and slice layout. A field
# that differs fails the run unless e2e/vs-nvidia-explained.tsv says why it differs by design.
#
# Configurations: each simulated model set below under NVIDIA's default feature gates, and under
# the gates that change what NVIDIA publishes (CONFIGS). Prints
#   slices vs NVIDIA's driver: N devices, M fields compared, 0 mismatches (K differences explained)
#
# Both run as host processes against the same control plane (no kubelet calls them here: slices
# are published without one); the kubelet side (prepare through the socket) is issue 54's claim
# differential, not this script.
set -euo pipefail
NAME=vs-nvidia
NODE=vs-nvidia-node
GPUS=${VS_NVIDIA_GPUS:-sim:2xH100-SXM5-80GB,1xA100-SXM4-40GB,1xT4}
DRIVER_BACKEND=nvml
E2E=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$E2E/lib.sh"
trap 'stop_driver; stop_nvidia; "$E2E/cluster" down >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT

# shellcheck source=nvidia-plugin.sh
source "$E2E/nvidia-plugin.sh"
nvidia_fake_nvml
# shellcheck source=driver-slices.sh
source "$E2E/driver-slices.sh"

# CONFIGS: label | NVIDIA's --feature-gates and flags | gpu-dra's flags (the same settings).
# NVIDIA's default gates publish whole GPUs and the MIG devices that exist: gpu-dra's --mig static.
CONFIGS=(
    "default||--mig static"
    "dynamic-mig|--feature-gates=DynamicMIG=true|--mig dynamic"
    "sharing|--feature-gates=MPSSupport=true,TimeSlicingSettings=true|--mig static"
    "consumable-memory|--feature-gates=ConsumableShares=true --consumable-shares=memory|--mig static --consumable-shares memory"
    "consumable-unlimited|--feature-gates=ConsumableShares=true --consumable-shares=unlimited|--mig static --consumable-shares unlimited"
    "list-type|--feature-gates=DRAListTypeAttributes=true|--mig static --feature-gates DRAListTypeAttributes=true"
    "passthrough|--feature-gates=PassthroughSupport=true|--mig static --passthrough"
)
# MODEL_SETS: one simulated node each, together every simulated model. The first runs every
# configuration; the others the two that change which devices exist.
MODEL_SETS=(
    "$GPUS"
    sim:1xA100-SXM4-80GB,1xA30-24GB,1xH100-PCIE-80GB,1xH100-NVL-94GB
    sim:1xH20-96GB,1xGH200-96GB,1xH200-SXM5-141GB,1xB200-SXM6-180GB
    sim:1xGB200-186GB,1xRTX-PRO-6000-BSE-96GB,1xL40S,1xL4,1xA10
    sim:1xGB10
)

# compare SET_INDEX GPUS LABEL NVIDIA_FLAGS OURS_FLAGS: both plugins in turn on a fresh simulated
# node with GPUS, their slices compared.
compare() {
    local set=$1 gpus=$2 label=$3 nvidia_flags=$4 ours_flags=$5 run summary devices fields explained
    run=$set-$label
    rm -rf "$WORK/hw.json" "$WORK/sysfs" "$WORK/host-root" "$WORK/state" "$WORK/nvidia-plugins"
    export FAKE_NVML_GPUS=$gpus FAKE_NVML_STATE=$WORK/hw.json
    GPUS=$gpus
    # Both read PCIe roots and NUMA nodes from the same simulated sysfs; NVIDIA's also reads the
    # host's /sys through --host-root.
    "$GPU_DRA" sim --gpus "$gpus" --node-name "$NODE" --sim-state "$WORK/hw.json" sysfs "$WORK/sysfs" >/dev/null
    mkdir -p "$WORK/host-root" "$WORK/nvidia-registry" "$WORK/nvidia-plugins/gpu.nvidia.com"
    ln -s "$WORK/sysfs" "$WORK/host-root/sys"
    clear_slices
    # Its PCI scan for passthrough (go-nvlib's nvpci) reads /sys/bus/pci/devices itself: in a
    # mount namespace of its own, /sys is the simulated one.
    # It also picks each GPU's VFIO driver from the running kernel's /lib/modules/<release>/
    # modules.alias (this machine has none): there, the aliases a 6.18 kernel declares for
    # vfio_pci and its Grace variant (gpu_dra::gpu::pci::NVGRACE_DEVICE_IDS).
    local in_sim_sys=() modules id
    if [[ $label == passthrough ]]; then
        in_sim_sys=(unshare -m --propagation private sh -c 'mount --bind "$0" /sys && mount --bind "$1" /lib/modules && shift && exec "$@"'
            "$WORK/sysfs" "$WORK/modules")
        # A machine without kernel modules (a container, some VMs) has no mount point for them:
        # an empty one, removed again after the run.
        if [[ ! -e /lib/modules ]]; then
            mkdir /lib/modules
            MADE_LIB_MODULES=1
        fi
        modules=$WORK/modules/$(uname -r)
        mkdir -p "$modules"
        {
            echo "alias vfio_pci:v*d*sv*sd*bc*sc*i* vfio_pci"
            for id in 2342 2345 2348 2941 31C2; do echo "alias vfio_pci:v000010DEd0000${id}sv*sd*bc*sc*i* nvgrace_gpu_vfio_pci"; done
        } >"$modules/modules.alias"
    fi
    # shellcheck disable=SC2086 # flags split on purpose
    env NVIDIA_DRA_SYSFS_ROOT="$WORK/sysfs" "${in_sim_sys[@]}" \
        "$NVIDIA_PLUGIN" --node-name "$NODE" --kubeconfig "$KUBECONFIG" \
        --nvidia-driver-root "$WORK/driver-root" --container-driver-root "$WORK/driver-root" \
        --host-root "$WORK/host-root" --cdi-root "$WORK/nvidia-cdi" \
        --kubelet-plugins-directory-path "$WORK/nvidia-plugins" \
        --kubelet-registrar-directory-path "$WORK/nvidia-registry" \
        --nvidia-cdi-hook-path "$BIN/nvidia-cdi-hook" --image-name gpu-dra-e2e/none:0 \
        $nvidia_flags >"$WORK/nvidia-$run.log" 2>&1 &
    NVIDIA_PID=$!
    settled "$WORK/nvidia-$run.json" || { tail -n 30 "$WORK/nvidia-$run.log" >&2; fail "$run ($gpus): NVIDIA's plugin published no settled slices"; }
    stop_nvidia
    if [[ -n ${MADE_LIB_MODULES:-} ]]; then
        rmdir /lib/modules
        MADE_LIB_MODULES=
    fi
    clear_slices
    DRIVER_ARGS="--sysfs-root $WORK/sysfs $ours_flags" start_driver
    settled "$WORK/ours-$run.json" || fail "$run ($gpus): gpu-dra published no settled slices"
    stop_driver
    [[ -z ${VS_NVIDIA_KEEP:-} ]] || cp "$WORK/nvidia-$run.json" "$WORK/nvidia-$run.log" "$WORK/ours-$run.json" "$VS_NVIDIA_KEEP"/
    summary=$(python3 "$E2E/vs-nvidia-compare.py" --explained "$E2E/vs-nvidia-explained.tsv" --config "$label" \
        "$WORK/nvidia-$run.json" "$WORK/ours-$run.json") || { echo "$summary" >&2; fail "$run ($gpus): slices differ from NVIDIA's"; }
    read -r devices fields explained <<<"$(tail -n 1 <<<"$summary")"
    total_devices=$((total_devices + devices)) total_fields=$((total_fields + fields)) total_explained=$((total_explained + explained))
    sed '$d' <<<"$summary" >&2
    ok "$label on $gpus: $devices devices, $fields fields compared, 0 mismatches ($explained differences explained)"
}

total_devices=0 total_fields=0 total_explained=0
for set in "${!MODEL_SETS[@]}"; do
    for config in "${CONFIGS[@]}"; do
        IFS='|' read -r label nvidia_flags ours_flags <<<"$config"
        ((set == 0)) || [[ $label == default || $label == dynamic-mig ]] || continue
        # VS_NVIDIA_ONLY=LABEL: one configuration (for a look at it; the totals are then partial).
        [[ -z ${VS_NVIDIA_ONLY:-} || $label == "$VS_NVIDIA_ONLY" ]] || continue
        compare "$set" "${MODEL_SETS[$set]}" "$label" "$nvidia_flags" "$ours_flags"
    done
done
line="slices vs NVIDIA's driver: $total_devices devices, $total_fields fields compared, 0 mismatches ($total_explained differences explained)"
log "$line"
[[ -z ${GPU_DRA_TEST_REPORT:-} ]] || echo "$line" >>"$GPU_DRA_TEST_REPORT"
echo "$passed passed, 0 failed"
