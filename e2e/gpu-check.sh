#!/usr/bin/env bash
# gpu-check.sh: a read-only check of gpu-dra on a machine with a real NVIDIA GPU and driver, no
# cluster. Two halves:
#
#   e2e/gpu-check.sh kit DIR      here, in the repository: assemble the kit, one folder (≤ 60 MiB)
#                                 to copy to the GPU machine
#   DIR/gpu-check.sh [--out DIR]  there, as root: run the checks (under 5 minutes)
#
# It NEVER changes the GPU (but in step 8, which runs only when asked for): no MIG mode, compute
# mode, clock, persistence or any other setting, no reset, no MIG instance. It runs only: `nvidia-smi -L`, `nvidia-smi -q -x`, `nvidia-smi mig -lgipp`
# (where MIG mode is already on), gpu-dra's read-only commands (`slices`, `health`, `cdi`),
# `nvidia-ctk cdi generate --output` (into the output folder, not /etc/cdi), and a CUDA probe in
# a runc container. Steps:
#
#   1. slices   `gpu-dra slices --gpus nvml`: discovery through the real NVML, validated as the
#               API server would before anything is printed
#   2. compare  those devices against `nvidia-smi -q -x` (+ `mig -lgipp` in MIG mode): names,
#               UUIDs, PCI bus IDs, memory, versions, MIG capability, placements
#               (gpu-check-compare, e2e/harness/cmd/gpu-check-compare)
#   3. health   `gpu-dra health`: the NVML fault event set registered on every GPU, the recovery
#               action read, no fault while it waits
#   4. cdi      `gpu-dra cdi --device gpu-<minor>` for the first GPU not in MIG mode, with the real
#               driver root, loaded by the runtimes' CDI library (cdi-inject)
#   5. probe    cuda-probe (e2e/gpu-check/cuda-probe.c: libcuda.so.1 by soname, cuInit, exactly
#               one device, 1 GiB cuMemAlloc, memset, copy back) in a runc container whose rootfs
#               has none of the driver: only what our CDI spec gives it, applied by the CDI library
#   6. nvidia   the same probe with the spec `nvidia-ctk cdi generate` writes for that GPU
#   7. parity   what a container holding that GPU gets from each of the two specs, entry by entry
#               (env, device nodes, mounts, the links the hook makes followed to where they end,
#               ld cache folders, other hooks): every difference explained by design or a failure
#               (gpu-check-compare --cdi-ours, as tests/cdi_nvidia_ctk.rs on the simulator)
#
#   8. vfio     OPT-IN, never run by default, and the one step that changes the GPU: with
#               GPU_CHECK_VFIO_UNBIND=<PCI address>, `gpu-dra vfio-check` hands that GPU to its
#               VFIO driver and back as a VM claim does (processes and other holders of
#               /dev/nvidiaN waited for and named, persistence mode off and on again, gpu-dra's
#               NVML session closed across the unbind): no unbind may hang in the kernel, and
#               NVML must see the GPU again. Run it only on a GPU nothing else uses.
#
# Steps 5 to 7 are skipped, not failed, when every GPU is in MIG mode.
#
# The kit's binaries are static where they can be (runc, cdi-inject, gpu-check-compare, NVIDIA's
# nvidia-cdi-hook); gpu-dra and nvidia-ctk load the driver's NVML with dlopen, so they run on the
# glibc the kit carries (lib/, through its own loader), not the host's.
#
# Settings (environment): GPU_CHECK_DRIVER_ROOT (default: / when the driver is installed there,
# else /run/nvidia/driver), GPU_CHECK_DEV_ROOT (default /), GPU_CHECK_NVML_LIB (default: found
# in the driver root or the host's ld cache), GPU_CHECK_PROBE_MIB (default 1024).
#
# Exit status: 0 every step passed; 1 a step failed (the summary says which); 2 usage or a broken
# kit; 3 no NVIDIA GPU here: nothing was run.
set -euo pipefail

MAX_KIT_MIB=60

die() { echo "gpu-check: $*" >&2; exit 2; }

# ---------------------------------------------------------------------------------------------
# kit DIR: assemble the folder (in the repository).
# ---------------------------------------------------------------------------------------------
build_kit() {
    local dir=$1 here repo bin
    here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
    repo=$(dirname "$here")
    [[ -e $dir ]] && [[ -n $(ls -A "$dir" 2>/dev/null) ]] && die "kit $dir: exists and is not empty"
    mkdir -p "$dir"/{bin,dyn,lib,probe}
    dir=$(cd "$dir" && pwd)
    "$here/build-k8s.sh" cdi-inject nvidia-ctk kit-nvidia-cdi-hook kit-runc gpu-check-compare >&2
    # shellcheck source=versions.env
    source "$here/versions.env"
    bin=${GPU_DRA_K8S_BIN:-$HOME/.cache/gpu-dra/k8s-$K8S_VERSION/bin}
    if [[ -z ${IMAGE_BINARY:-} ]]; then
        (cd "$repo" && cargo build --profile node --locked --no-default-features --bin gpu-dra >&2)
        IMAGE_BINARY=${CARGO_TARGET_DIR:-$repo/target}/node/gpu-dra
    fi
    install -m 0755 "$IMAGE_BINARY" "$dir/dyn/gpu-dra"
    install -m 0755 "$bin/nvidia-ctk" "$dir/dyn/nvidia-ctk"
    install -m 0755 "$bin/cdi-inject" "$dir/bin/cdi-inject"
    install -m 0755 "$bin/gpu-check-compare" "$dir/bin/gpu-check-compare"
    install -m 0755 "$bin/kit-nvidia-cdi-hook" "$dir/bin/nvidia-cdi-hook"
    install -m 0755 "$bin/kit-runc" "$dir/bin/runc"
    strip "$dir/dyn/gpu-dra"
    gcc -O2 -Wall -Wextra -Werror -o "$dir/probe/cuda-probe" "$here/gpu-check/cuda-probe.c" -ldl
    # NVIDIA's update-ldcache hook runs the container's own ldconfig: a static one.
    [[ -x /sbin/ldconfig && $(LC_ALL=C readelf -l /sbin/ldconfig) != *INTERP* ]] \
        || die "/sbin/ldconfig is dynamically linked: the probe's rootfs needs a static ldconfig (Debian's libc-bin has one)"
    install -m 0755 /sbin/ldconfig "$dir/probe/ldconfig"
    # This machine's glibc, for gpu-dra, nvidia-ctk and the probe's rootfs. libdl, libpthread and
    # librt: a real libcuda still links them (glibc 2.34+ keeps them as stubs).
    local lib
    for lib in $( (ldd "$dir/dyn/gpu-dra"; ldd "$dir/dyn/nvidia-ctk"; ldd "$dir/probe/cuda-probe") \
        | awk '$3 ~ /^\// { print $3 } $1 ~ /^\/.*ld-linux/ { print $1 }' | sort -u); do
        cp -L "$lib" "$dir/lib/"
    done
    for lib in libdl.so.2 libpthread.so.0 librt.so.1; do
        cp -L "$(dirname "$(ldd "$dir/probe/cuda-probe" | awk '/libc.so.6/ { print $3 }')")/$lib" "$dir/lib/"
    done
    [[ -x $dir/lib/ld-linux-x86-64.so.2 ]] || die "no ld-linux-x86-64.so.2 among the libraries"
    install -m 0755 "${BASH_SOURCE[0]}" "$dir/gpu-check.sh"
    {
        echo "gpu-dra $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)"
        echo "nvidia-ctk, nvidia-cdi-hook $NVIDIA_CTK_VERSION (github.com/NVIDIA/nvidia-container-toolkit)"
        echo "runc $("$dir/bin/runc" --version | head -1 | awk '{ print $3 }') (static, no seccomp)"
        echo "glibc $(ldd --version | head -1 | awk '{ print $NF }') (lib/)"
    } >"$dir/VERSIONS"
    local mib
    mib=$(du -sm "$dir" | cut -f1)
    echo "gpu-check: kit $dir: ${mib} MiB" >&2
    ((mib <= MAX_KIT_MIB)) || die "kit $dir is ${mib} MiB, over ${MAX_KIT_MIB} MiB"
}

# ---------------------------------------------------------------------------------------------
# Run (on the GPU machine, from the kit folder).
# ---------------------------------------------------------------------------------------------
KIT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# The PATH a container gets by default (the probe's; nvidia-ctk's, step 6).
DEFAULT_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# Through the kit's own loader and glibc (they dlopen the driver's NVML).
dyn() { "$KIT/lib/ld-linux-x86-64.so.2" --library-path "$KIT/lib" "$KIT/dyn/$1" "${@:2}"; }

step_names=() step_results=()
record() { step_names+=("$1"); step_results+=("$2"); echo "== $1: $2"; }

# The first libnvidia-ml.so.1 under the driver root, else the host's ld cache's.
find_nvml() {
    local root=$1 dir
    for dir in usr/lib/x86_64-linux-gnu usr/lib64 usr/lib lib/x86_64-linux-gnu lib64; do
        [[ -e $root/$dir/libnvidia-ml.so.1 ]] && { echo "$root/$dir/libnvidia-ml.so.1"; return; }
    done
    [[ $root == / ]] && ldconfig -p 2>/dev/null | awk '$1 == "libnvidia-ml.so.1" && /x86-64/ { print $NF; exit }'
    return 0
}

# A runc bundle whose rootfs has the probe, a libc and a static ldconfig, nothing of the driver.
make_bundle() {
    local bundle=$1 rootfs=$1/rootfs
    mkdir -p "$rootfs"/{lib64,lib/x86_64-linux-gnu,usr/lib/x86_64-linux-gnu,usr/lib64,sbin,etc/ld.so.conf.d,dev,proc,sys,tmp,run}
    cp "$KIT"/lib/* "$rootfs/lib/x86_64-linux-gnu/"
    mv "$rootfs/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" "$rootfs/lib64/"
    cp "$KIT/probe/cuda-probe" "$rootfs/cuda-probe"
    cp "$KIT/probe/ldconfig" "$rootfs/sbin/ldconfig"
    echo 'include /etc/ld.so.conf.d/*.conf' >"$rootfs/etc/ld.so.conf"
    "$rootfs/sbin/ldconfig" -r "$rootfs" 2>/dev/null || true
    cat >"$bundle/config.json" <<EOF
{
  "ociVersion": "1.2.0",
  "process": {
    "terminal": false,
    "user": {"uid": 0, "gid": 0},
    "args": ["/cuda-probe", "$PROBE_MIB"],
    "env": ["PATH=$DEFAULT_PATH"],
    "cwd": "/",
    "capabilities": {
      "bounding": ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"],
      "effective": ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"],
      "permitted": ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]
    },
    "noNewPrivileges": true
  },
  "root": {"path": "rootfs", "readonly": false},
  "hostname": "gpu-check",
  "mounts": [
    {"destination": "/proc", "type": "proc", "source": "proc"},
    {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
    {"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
    {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
    {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]}
  ],
  "linux": {
    "resources": {"devices": [{"allow": false, "access": "rwm"}]},
    "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, {"type": "network"}],
    "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
    "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
  }
}
EOF
}

# probe NAME SPEC_DIR DEVICE: inject DEVICE from SPEC_DIR into a fresh bundle and run the probe.
probe() {
    local name=$1 spec_dir=$2 device=$3 bundle=$OUT/bundle-$1 id
    id=gpu-check-$1-$$
    rm -rf "$bundle"
    make_bundle "$bundle"
    if ! "$KIT/bin/cdi-inject" --spec-dir "$spec_dir" --device "$device" \
        --oci-spec "$bundle/config.json" --write-spec "$bundle/config.json" >"$OUT/$name-inject.json"; then
        echo "the CDI library could not inject $device (see $OUT/$name-inject.json)"
        return 1
    fi
    local rc=0
    timeout 120 "$KIT/bin/runc" --root "$OUT/runc-state" run --bundle "$bundle" "$id" \
        >"$OUT/$name-probe.log" 2>&1 </dev/null || rc=$?
    "$KIT/bin/runc" --root "$OUT/runc-state" delete --force "$id" >/dev/null 2>&1 || true
    cat "$OUT/$name-probe.log"
    [[ $rc -eq 0 ]] && grep -q '^probe ok:' "$OUT/$name-probe.log"
}

run_checks() {
    local out=
    while [[ $# -gt 0 ]]; do
        case $1 in
            --out) out=${2:?--out needs a folder}; shift 2 ;;
            -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
            *) die "unknown argument $1 (see --help)" ;;
        esac
    done
    [[ -x $KIT/dyn/gpu-dra && -x $KIT/bin/runc && -x $KIT/lib/ld-linux-x86-64.so.2 ]] \
        || die "$KIT is not a kit (build one with: e2e/gpu-check.sh kit DIR)"

    # Without a GPU nothing runs at all.
    DEV_ROOT=${GPU_CHECK_DEV_ROOT:-/}
    local smi
    smi=$(command -v nvidia-smi || true)
    if [[ -z ${GPU_CHECK_DRIVER_ROOT:-} ]]; then
        if [[ -n $smi || -n $(find_nvml /) ]]; then DRIVER_ROOT=/
        elif [[ -d /run/nvidia/driver ]]; then DRIVER_ROOT=/run/nvidia/driver
        else DRIVER_ROOT=/; fi
    else
        DRIVER_ROOT=$GPU_CHECK_DRIVER_ROOT
    fi
    [[ -z $smi && -x $DRIVER_ROOT/usr/bin/nvidia-smi ]] && smi=$DRIVER_ROOT/usr/bin/nvidia-smi
    local why=
    if [[ ! -c ${DEV_ROOT%/}/dev/nvidiactl ]]; then
        why="no ${DEV_ROOT%/}/dev/nvidiactl (the NVIDIA kernel driver is not loaded)"
    elif [[ -z $smi ]]; then
        why="no nvidia-smi in PATH or under the driver root $DRIVER_ROOT"
    elif ! grep -q '^GPU ' <<<"$("$smi" -L 2>/dev/null)"; then
        why="nvidia-smi -L lists no GPU"
    fi
    if [[ -n $why ]]; then
        echo "gpu-check: no NVIDIA GPU here: $why. This kit only reads a real GPU; nothing was run." >&2
        exit 3
    fi
    [[ $(id -u) -eq 0 ]] || die "run as root (runc and the GPU's device nodes need it)"

    OUT=${out:-$(mktemp -d /tmp/gpu-check.XXXXXX)}
    mkdir -p "$OUT"
    OUT=$(cd "$OUT" && pwd)
    PROBE_MIB=${GPU_CHECK_PROBE_MIB:-1024}
    local nvml=${GPU_CHECK_NVML_LIB:-$(find_nvml "$DRIVER_ROOT")}
    local nvml_args=()
    [[ -n $nvml ]] && nvml_args=(--nvml-lib "$nvml")
    local dev_args=()
    [[ $DEV_ROOT != / ]] && dev_args=(--dev-root "$DEV_ROOT")
    local start=$SECONDS
    echo "gpu-check: $(cat "$KIT/VERSIONS" | paste -sd ';' -)"
    echo "gpu-check: driver root $DRIVER_ROOT, dev root $DEV_ROOT, NVML ${nvml:-(ld cache)}, nvidia-smi $smi, output $OUT"
    "$smi" -L

    echo "== 1. slices: gpu-dra slices --gpus nvml"
    if dyn gpu-dra slices --gpus nvml ${nvml_args[@]+"${nvml_args[@]}"} --node-name gpu-check -o json >"$OUT/slices.json" 2>"$OUT/slices.err"; then
        echo "$(grep -c '"name": "gpu-' "$OUT/slices.json") devices published"
        record "1 slices" PASS
    else
        cat "$OUT/slices.err"
        record "1 slices" FAIL
    fi

    echo "== 2. compare: the published devices against nvidia-smi -q -x"
    local compare=(--slices "$OUT/slices.json" --smi "$OUT/smi.xml")
    if "$smi" -q -x >"$OUT/smi.xml"; then
        if grep -q '<current_mig>Enabled</current_mig>' "$OUT/smi.xml"; then
            "$smi" mig -lgipp >"$OUT/lgipp.txt"
            compare+=(--lgipp "$OUT/lgipp.txt")
        fi
        if [[ -s $OUT/slices.json ]] && "$KIT/bin/gpu-check-compare" "${compare[@]}"; then
            record "2 compare" PASS
        else
            record "2 compare" FAIL
        fi
    else
        record "2 compare" FAIL
    fi

    echo "== 3. health: NVML fault events registered, recovery action read"
    if dyn gpu-dra health --gpus nvml ${nvml_args[@]+"${nvml_args[@]}"} --node-name gpu-check --wait 3s >"$OUT/health.json" 2>"$OUT/health.err"; then
        cat "$OUT/health.json"
        record "3 health" PASS
    else
        cat "$OUT/health.json" "$OUT/health.err"
        record "3 health" FAIL
    fi

    # The probe's GPU: the first one not in MIG mode (a GPU in MIG mode runs CUDA only in its MIG
    # devices). nvidia-smi's order is NVML's, which nvidia-ctk's index names follow.
    local probe_index= probe_minor=
    read -r probe_index probe_minor < <(awk '
        /<gpu id=/ { index_ = n++; mode = ""; minor = "" }
        /<current_mig>/ { gsub(/.*<current_mig>|<\/current_mig>.*/, ""); mode = $0 }
        /<minor_number>/ { gsub(/.*<minor_number>|<\/minor_number>.*/, ""); minor = $0 }
        /<\/gpu>/ && mode != "Enabled" && !found { print index_, minor; found = 1 }
    ' "$OUT/smi.xml" 2>/dev/null) || true
    local gpu=gpu-${probe_minor:-0}
    echo "== 4. cdi: gpu-dra cdi --device $gpu with the driver root $DRIVER_ROOT"
    mkdir -p "$OUT/cdi-ours" "$OUT/cdi-nvidia"
    local ours_device=
    if dyn gpu-dra cdi --gpus nvml ${nvml_args[@]+"${nvml_args[@]}"} --node-name gpu-check --device "$gpu" \
        --nvidia-driver-root "$DRIVER_ROOT" --nvidia-cdi-hook-path "$KIT/bin/nvidia-cdi-hook" ${dev_args[@]+"${dev_args[@]}"} \
        >"$OUT/cdi-ours/k8s.gpu.nvidia.com-gpu-check.json" 2>"$OUT/cdi.err" \
        && "$KIT/bin/cdi-inject" --spec-dir "$OUT/cdi-ours" >"$OUT/cdi-ours.json"; then
        ours_device=$(sed -n '/"devices": \[/,/\]/ s/^ *"\(k8s\.[^"]*\)",\{0,1\}$/\1/p' "$OUT/cdi-ours.json" | head -1)
        echo "CDI device $ours_device: $(grep -c '"hostPath"' "$OUT/cdi-ours/k8s.gpu.nvidia.com-gpu-check.json") host paths"
        [[ -n $ours_device ]] && record "4 cdi" PASS || record "4 cdi" FAIL
    else
        cat "$OUT/cdi.err" "$OUT/cdi-ours.json" 2>/dev/null || true
        record "4 cdi" FAIL
    fi

    echo "== 5. probe: CUDA in a runc container with our CDI spec alone ($gpu)"
    if [[ -z $probe_index ]]; then
        echo "every GPU is in MIG mode: CUDA runs only in MIG devices, and this kit creates none"
        record "5 probe (our spec)" SKIP
    elif [[ -n $ours_device ]] && probe ours "$OUT/cdi-ours" "$ours_device"; then
        record "5 probe (our spec)" PASS
    else
        record "5 probe (our spec)" FAIL
    fi

    echo "== 6. nvidia: the same probe with nvidia-ctk's spec (nvidia.com/gpu=${probe_index:-?})"
    # nvidia-ctk with the default PATH: NVIDIA's DRA driver runs nvcdi in a container whose PATH
    # is the default one, so it looks for the driver's binaries only in the toolkit's default
    # folders under the driver root (and the same folders at /). Here on the host, a PATH with
    # more (/usr/local/nvidia/bin on some images) would make it find binaries NVIDIA's driver
    # would not. The assignment before the function call is exported to what dyn runs, for this
    # call only (bash).
    local nvidia_spec=
    if [[ -z $probe_index ]]; then
        record "6 probe (nvidia-ctk's spec)" SKIP
    else
        if PATH=$DEFAULT_PATH dyn nvidia-ctk cdi generate --mode nvml --format json --device-name-strategy index \
            --driver-root "$DRIVER_ROOT" --dev-root "$DEV_ROOT" --nvidia-cdi-hook-path "$KIT/bin/nvidia-cdi-hook" \
            --output "$OUT/cdi-nvidia/nvidia.json" >"$OUT/nvidia-ctk.log" 2>&1; then
            nvidia_spec=$OUT/cdi-nvidia/nvidia.json
        fi
        if [[ -n $nvidia_spec ]] && probe nvidia "$OUT/cdi-nvidia" "nvidia.com/gpu=$probe_index"; then
            record "6 probe (nvidia-ctk's spec)" PASS
        else
            tail -n 20 "$OUT/nvidia-ctk.log"
            record "6 probe (nvidia-ctk's spec)" FAIL
        fi
    fi

    # Our device by its name in the spec (the CDI name without its kind), nvidia-ctk's by index.
    echo "== 7. parity: what a container holding that GPU gets from our spec and from nvidia-ctk's"
    if [[ -z $probe_index ]]; then
        echo "every GPU is in MIG mode: there is no spec of a whole GPU to compare"
        record "7 parity" SKIP
    elif [[ -z $ours_device || -z $nvidia_spec ]]; then
        [[ -n $ours_device ]] || echo "no spec of ours to compare (step 4 failed)"
        [[ -n $nvidia_spec ]] || echo "no spec of nvidia-ctk's to compare (nvidia-ctk failed in step 6)"
        record "7 parity" FAIL
    elif "$KIT/bin/gpu-check-compare" --cdi-ours "$OUT/cdi-ours/k8s.gpu.nvidia.com-gpu-check.json" \
        --cdi-ours-device "${ours_device#*=}" --cdi-nvidia "$nvidia_spec" --cdi-nvidia-device "$probe_index" \
        2>&1 | tee "$OUT/parity.txt"; then
        record "7 parity" PASS
    else
        record "7 parity" FAIL
    fi

    # Opt-in only, never by default: it changes the GPU's kernel binding (and persistence mode,
    # restored). The only way to prove on hardware that the unbind finds nothing holding the GPU.
    if [[ -n ${GPU_CHECK_VFIO_UNBIND:-} ]]; then
        echo "== 8. vfio: GPU $GPU_CHECK_VFIO_UNBIND to its VFIO driver and back (GPU_CHECK_VFIO_UNBIND; CHANGES its binding)"
        if timeout 180 dyn gpu-dra vfio-check --gpus nvml ${nvml_args[@]+"${nvml_args[@]}"} --passthrough \
            --bus-id "$GPU_CHECK_VFIO_UNBIND" --unbind "$GPU_CHECK_VFIO_UNBIND" --dev-root "$DEV_ROOT" \
            >"$OUT/vfio.json" 2>"$OUT/vfio.err"; then
            cat "$OUT/vfio.json"
            record "8 vfio" PASS
        else
            cat "$OUT/vfio.json" "$OUT/vfio.err"
            record "8 vfio" FAIL
        fi
    fi

    local failed=0 i
    echo "== summary ($((SECONDS - start)) s; everything is in $OUT)"
    for i in "${!step_names[@]}"; do
        echo "   ${step_results[$i]}  ${step_names[$i]}"
        if [[ ${step_results[$i]} == FAIL ]]; then failed=$((failed + 1)); fi
    done
    if ((failed > 0)); then
        echo "gpu-check: $failed of ${#step_names[@]} steps failed"
        exit 1
    fi
    local skipped
    skipped=$(printf '%s\n' "${step_results[@]}" | grep -c '^SKIP$' || true)
    if ((skipped > 0)); then
        echo "gpu-check: no step failed; $skipped skipped (see above)"
    else
        echo "gpu-check: all ${#step_names[@]} steps passed"
    fi
}

case ${1:-} in
    kit) build_kit "${2:?kit needs a folder}" ;;
    *) run_checks "$@" ;;
esac
