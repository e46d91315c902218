# NVIDIA's gpu-kubelet-plugin (dra-driver-nvidia-gpu v0.5.0, built by e2e/build-k8s.sh) as a host
# process on lib.sh's simulated node (DRIVER_BACKEND=nvml), beside or instead of gpu-dra: the same
# fake libnvidia-ml in the same driver root, the same simulated sysfs. Source it after lib.sh.
#
#   nvidia_fake_nvml       puts the fake libnvidia-ml where NVIDIA's plugin loads it from
#   nvidia_node_setup      makes the node NVIDIA's plugin can run on (once; includes the above)
#   nvidia_uuids           tells the nvidia-smi stand-in the GPUs' UUIDs (once published)
#   launch_nvidia DIRS...  starts it (NVIDIA_PID), NVIDIA_GATES its --feature-gates;
#                          NVIDIA_BINDS="DIR:PATH ..." bind-mounts each DIR on PATH in its mount
#                          namespace (e.g. the simulated sysfs on /sys: go-nvlib's PCI scan and
#                          passthrough binding use /sys itself; PATH must exist)
#   start_nvidia DIRS...   launch_nvidia, then waits until it registered and published the
#                          node's four GPUs, and tells the stand-in their UUIDs
#   fake_nvidia_smi        gpu-dra's nvidia-smi in the driver root (the fake one, chrooted)
#   stop_nvidia            stops it as its DaemonSet's pod would be (SIGTERM, then SIGKILL)
#
# The node's layout, lib.sh's by default (set before sourcing for another, e.g. the real node's):
# NVIDIA_ROOT (driver root), NVIDIA_STATE (simulator state), NVIDIA_FAKE_NVML (the fake library),
# GPUS and NODE.
# shellcheck shell=bash
NVIDIA_ROOT=${NVIDIA_ROOT:-$WORK/driver-root}
NVIDIA_STATE=${NVIDIA_STATE:-$WORK/hw.json}
NVIDIA_FAKE_NVML=${NVIDIA_FAKE_NVML:-$WORK/libnvidia-ml.so.1}

NVIDIA_PLUGIN=$("$E2E/build-k8s.sh" nvidia-gpu-kubelet-plugin nvidia-compute-domain-kubelet-plugin nvidia-compute-domain-controller | tail -n 1)/nvidia-gpu-kubelet-plugin
NVIDIA_PID=

# NVIDIA's plugin loads libnvidia-ml.so.1 from the driver root: the fake one, as gpu-dra does.
nvidia_fake_nvml() {
    local nvml_in_root
    nvml_in_root=$(find "$NVIDIA_ROOT" -name 'libnvidia-ml.so.*' -type f | head -n 1)
    [[ -n $nvml_in_root ]] || fail "no libnvidia-ml in the simulated driver root"
    cp "$NVIDIA_FAKE_NVML" "$nvml_in_root"
    # The node, for the library's container mode (a pod's nvidia-smi; see e2e/fakenvml/src/lib.rs).
    printf '\n#gpu-dra-fake-nvml-node gpus=%s node=%s\n' "$GPUS" "$NODE" >>"$nvml_in_root"
}

nvidia_node_setup() {
    local minor
    nvidia_fake_nvml
    "$GPU_DRA" sim --gpus "$GPUS" --node-name "$NODE" --sim-state "$NVIDIA_STATE" sysfs "$WORK/sysfs" >/dev/null
    # Its CDI specs name the GPUs' device nodes under its driver root (a device without any is
    # refused); gpu-dra's simulated root has none, its specs name /dev's.
    mkdir -p "$NVIDIA_ROOT/dev/nvidia-caps"
    mknod "$NVIDIA_ROOT/dev/nvidiactl" c 195 255
    mknod "$NVIDIA_ROOT/dev/nvidia-uvm" c 510 0
    mknod "$NVIDIA_ROOT/dev/nvidia-uvm-tools" c 510 1
    for minor in 0 1 2 3 4 5 6 7; do mknod "$NVIDIA_ROOT/dev/nvidia$minor" c 195 "$minor"; done
    # It reads a MIG device's capability minors from the host's /proc/driver/nvidia/capabilities
    # and the nvidia-caps major from /proc/devices (gpu-dra computes them, as the driver lays them
    # out): it runs in a mount namespace of its own where both are the driver's layout for 8 GPUs
    # (every GPU and compute instance id an H100 has).
    # Their device nodes too, under the driver root's /dev (what both drivers' specs name).
    python3 - "$WORK/proc-driver" "$NVIDIA_ROOT/dev/nvidia-caps" <<'PY'
import os, stat, sys
root, caps = sys.argv[1:]
def access(path, minor):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "access"), "w") as f:
        f.write(f"DeviceFileMinor: {minor}\nDeviceFileMode: 256\nDeviceFileModify: 1\n")
    os.mknod(os.path.join(caps, f"nvidia-cap{minor}"), 0o400 | stat.S_IFCHR, os.makedev(511, minor))
for gpu in range(8):
    for gi in range(1, 15):
        base = 3 + 135 * gpu + 9 * gi
        access(f"{root}/nvidia/capabilities/gpu{gpu}/mig/gi{gi}", base)
        for ci in range(8):
            access(f"{root}/nvidia/capabilities/gpu{gpu}/mig/gi{gi}/ci{ci}", base + 1 + ci)
PY
    sed '/^Block devices:/i 511 nvidia-caps' /proc/devices >"$WORK/proc-devices"
    # It runs the driver root's nvidia-smi as a host program (no chroot), which the fake driver
    # root's tools cannot be (they load only chrooted there): in its namespace that path is this
    # stand-in, which sets a GPU's compute mode (`-i UUID -c MODE`) and time-slice
    # (`compute-policy -i UUID --set-timeslice N`) in the simulated state, under its lock, as the
    # real one sets them on the GPU. GPUs by UUID: $WORK/nvidia-smi-uuids ("UUID MINOR" lines,
    # written by nvidia_uuids once the slices are published).
    cat >"$WORK/nvidia-smi-stand-in" <<PY
#!/usr/bin/env python3
import fcntl, json, os, sys
args, state = sys.argv[1:], "$NVIDIA_STATE"
minors = dict(line.split() for line in open("$WORK/nvidia-smi-uuids"))
modes = {"DEFAULT": "Default", "EXCLUSIVE_PROCESS": "ExclusiveProcess", "PROHIBITED": "Prohibited"}
if len(args) == 5 and args[:2] == ["compute-policy", "-i"] and args[3] == "--set-timeslice":
    uuid, field, value = args[2], "timeslice", int(args[4])
elif len(args) == 4 and args[0] == "-i" and args[2] == "-c" and args[3] in modes:
    uuid, field, value = args[1], "compute_mode", modes[args[3]]
else:
    sys.exit(f"nvidia-smi (stand-in): unsupported arguments {args}")
if uuid not in minors:
    sys.exit(f"No devices were found with UUID {uuid}")
with open(state + ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    with open(state) as f:
        doc = json.load(f)
    for gpu in doc["gpus"]:
        if gpu["minor"] == int(minors[uuid]):
            gpu[field] = value
    with open(state + ".stand-in", "w") as f:
        json.dump(doc, f, indent=2)
    os.rename(state + ".stand-in", state)
PY
    chmod 0755 "$WORK/nvidia-smi-stand-in"
    : >"$WORK/nvidia-smi-uuids"
    # PCIe roots and NUMA nodes: the simulated sysfs, also through --host-root.
    mkdir -p "$WORK/host-root"
    ln -s "$WORK/sysfs" "$WORK/host-root/sys"
}

nvidia_uuids() {
    kubectl get resourceslices -o json --field-selector "spec.nodeName=$NODE" |
        jq -r '.items[].spec.devices[]? | select(.name | test("^gpu-[0-9]+$")) | "\(.attributes.uuid.string) \(.name | ltrimstr("gpu-"))"' \
            >"$WORK/nvidia-smi-uuids"
}

# launch_nvidia PLUGINS_DIR REGISTRY_DIR CDI_ROOT LOG [FLAGS...]: its checkpoint and DRA socket
# go to PLUGINS_DIR/gpu.nvidia.com, its registration socket to REGISTRY_DIR.
launch_nvidia() {
    local plugins=$1 registry=$2 cdi=$3 log=$4
    shift 4
    mkdir -p "$plugins/gpu.nvidia.com" "$registry"
    # shellcheck disable=SC2016 # expanded by the namespace's shell
    env NVIDIA_DRA_SYSFS_ROOT="$WORK/sysfs" NVIDIA_BINDS="${NVIDIA_BINDS:-}" unshare -m --propagation private sh -c \
        'mount -t tmpfs none /proc/driver && cp -r "$0"/. /proc/driver/ && mount --bind "$1" /proc/devices &&
         mount --bind "$2" "$3" && for b in $NVIDIA_BINDS; do mount --bind "${b%%:*}" "${b#*:}" || exit 1; done &&
         shift 3 && exec "$@"' \
        "$WORK/proc-driver" "$WORK/proc-devices" "$WORK/nvidia-smi-stand-in" "$NVIDIA_ROOT/usr/bin/nvidia-smi" \
        "$NVIDIA_PLUGIN" --node-name "$NODE" --kubeconfig "$KUBECONFIG" \
        --nvidia-driver-root "$NVIDIA_ROOT" --container-driver-root "$NVIDIA_ROOT" \
        --host-root "$WORK/host-root" --cdi-root "$cdi" \
        --kubelet-plugins-directory-path "$plugins" \
        --kubelet-registrar-directory-path "$registry" \
        --nvidia-cdi-hook-path "$BIN/nvidia-cdi-hook" --image-name gpu-dra-e2e/none:0 \
        ${NVIDIA_GATES:+--feature-gates=$NVIDIA_GATES} "$@" >>"$log" 2>&1 &
    NVIDIA_PID=$!
}

start_nvidia() {
    launch_nvidia "$@"
    wait_for "NVIDIA's plugin registered" 30 kubelet register --timeout 2s
    wait_for "NVIDIA's plugin published GPUs 0-3" 60 bash -c \
        "[[ \$(kubectl get resourceslices -o json | jq '[.items[].spec.devices[]? | select(.name | test(\"^gpu-[0-3]\$\"))] | length') == 4 ]]"
    nvidia_uuids
}

# gpu-dra sets time-slices with the driver root's nvidia-smi, chrooted there: the fake one
# (e2e/fakenvml), as on the other simulated nodes.
fake_nvidia_smi() {
    local fake=${NVIDIA_SMI_FAKE:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/nvidia-smi}
    [[ -x $fake ]] || (cd "$ROOT" && cargo build -p fakenvml --bin nvidia-smi) >&2
    install -m 0755 "$fake" "$NVIDIA_ROOT/usr/bin/nvidia-smi"
}

stop_nvidia() {
    if [[ -n $NVIDIA_PID ]] && kill -0 "$NVIDIA_PID" 2>/dev/null; then
        kill -TERM "$NVIDIA_PID" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$NVIDIA_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$NVIDIA_PID" 2>/dev/null || true
    fi
    [[ -n $NVIDIA_PID ]] && wait "$NVIDIA_PID" 2>/dev/null || true
    NVIDIA_PID=
}
