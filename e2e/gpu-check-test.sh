#!/usr/bin/env bash
# gpu-check-test.sh: e2e/gpu-check.sh tested without a GPU. It builds the kit (and checks its
# size), checks that the kit refuses to run on this machine and changes nothing, then runs every
# step of the kit against the simulator's fakes:
#
#   - NVML: the fake libnvidia-ml (e2e/fakenvml) in a driver root `gpu-dra sim driver-root` wrote
#   - nvidia-smi: fake-nvidia-smi (e2e/nvml-mocks/fake-nvidia-smi), which answers -q -x and
#     mig -lgipp from that NVML through NVIDIA's go-nvml (a second client of the same state)
#   - libcuda.so.1: e2e/gpu-check/fake-libcuda.c, which like the real one needs the device nodes
#     a CDI spec gives the container
#   - device nodes: real character devices with the driver's numbers in a fake dev root
#   - /proc/driver/nvidia-caps: a fake one bind-mounted in a private mount namespace
#
# What this proves: the kit's plumbing (the bundled loader, the static runc and hook, both CDI
# specs applied by the CDI library and run by runc, NVIDIA's update-ldcache hook building the
# container's ld cache, both comparisons and their parsing: the devices against nvidia-smi, our
# spec against nvidia-ctk's). What it cannot: that the real NVML, nvidia-smi, libcuda and driver
# files agree, which only a run on a GPU shows (docs/tasks/check-a-real-gpu.md).
#
# Needs root, gcc, and the workspace built (cargo build --workspace: gpu-dra and the fake NVML).
# Reports TAP-like lines ending with "N passed, N failed".
set -euo pipefail

E2E=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$E2E")
WORK=$(mktemp -d /tmp/gpu-dra-gpu-check.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
passed=0
log() { echo "gpu-check-test: $*" >&2; }
fail() { log "FAIL: $*"; echo "$passed passed, 1 failed"; exit 1; }
ok() { passed=$((passed + 1)); log "ok - $*"; }

BIN=$("$E2E/build-k8s.sh" fake-nvidia-smi | tail -1)
GPU_DRA=${GPU_DRA:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/gpu-dra}
FAKE_NVML=${CARGO_TARGET_DIR:-$ROOT/target}/debug/libnvidia_ml.so
[[ -x $GPU_DRA && -f $FAKE_NVML ]] || fail "build the workspace first (cargo build --workspace): no $GPU_DRA or $FAKE_NVML"

# 1. The kit, and its size.
KIT=$WORK/kit
"$E2E/gpu-check.sh" kit "$KIT" || fail "the kit did not build (or is over 60 MiB)"
mib=$(du -sm "$KIT" | cut -f1)
((mib <= 60)) || fail "kit is $mib MiB"
ok "kit built: $mib MiB (limit 60)"

# 2. No GPU here: it refuses before running anything, and writes nothing.
set +e
env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$KIT/gpu-check.sh" --out "$WORK/refused" >"$WORK/refused.out" 2>&1
rc=$?
set -e
[[ $rc -eq 3 ]] || { cat "$WORK/refused.out" >&2; fail "without a GPU: exit $rc, want 3"; }
grep -q 'no NVIDIA GPU here: no /dev/nvidiactl' "$WORK/refused.out" || { cat "$WORK/refused.out" >&2; fail "refusal message"; }
[[ ! -e $WORK/refused ]] || fail "the refused run created its output folder"
ok "no GPU: refused with exit 3 ($(cat "$WORK/refused.out")), nothing written"

# 3. The fakes.
GPUS=sim:1xH100-SXM5-80GB,1xA100-SXM4-40GB
STATE=$WORK/hw.json
sim() { "$GPU_DRA" sim --gpus "$GPUS" --node-name n1 --sim-state "$STATE" "$@" >/dev/null; }
# The H100 in MIG mode with no MIG device: the placements comparison runs on it, and the probes
# take the A100 (the first GPU not in MIG mode).
sim mig-mode --gpu 0 --enabled true
DRIVER_ROOT=$WORK/root
version=$("$GPU_DRA" sim --gpus "$GPUS" --node-name n1 --sim-state "$STATE" driver-root "$DRIVER_ROOT" | awk '{ print $NF }')
libdir=$DRIVER_ROOT/usr/lib/x86_64-linux-gnu
cp "$FAKE_NVML" "$libdir/libnvidia-ml.so.$version"
gcc -O2 -Wall -Wextra -Werror -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$libdir/libcuda.so.$version" \
    "$E2E/gpu-check/fake-libcuda.c"
chmod 0755 "$DRIVER_ROOT"/usr/bin/*
DEV_ROOT=$WORK/devroot
mkdir -p "$DEV_ROOT/dev"
while read -r name major minor; do
    mknod "$DEV_ROOT/dev/$name" c "$major" "$minor"
done <<'NODES'
nvidiactl 195 255
nvidia-modeset 195 254
nvidia-uvm 509 0
nvidia-uvm-tools 509 1
nvidia0 195 0
nvidia1 195 1
NODES
PROC_DRIVER=$WORK/proc-driver
mkdir -p "$PROC_DRIVER/nvidia-caps"
printf 'config 1\nmonitor 2\n' >"$PROC_DRIVER/nvidia-caps/mig-minors"
mkdir -p "$WORK/fakebin"
cp "$BIN/fake-nvidia-smi" "$WORK/fakebin/nvidia-smi"
fake_env=(PATH="$WORK/fakebin:/usr/sbin:/usr/bin:/sbin:/bin"
    FAKE_NVML_GPUS="$GPUS" FAKE_NVML_NODE=n1 FAKE_NVML_STATE="$STATE" FAKE_NVIDIA_SMI_NVML="$libdir/libnvidia-ml.so.1")

# A GPU's device nodes but no nvidia-smi: still refused.
set +e
env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin GPU_CHECK_DEV_ROOT="$DEV_ROOT" GPU_CHECK_DRIVER_ROOT="$WORK/empty" \
    "$KIT/gpu-check.sh" >"$WORK/refused2.out" 2>&1
rc=$?
set -e
[[ $rc -eq 3 ]] && grep -q 'no nvidia-smi' "$WORK/refused2.out" || { cat "$WORK/refused2.out" >&2; fail "no nvidia-smi: exit $rc, want 3"; }
ok "device nodes without nvidia-smi: refused with exit 3"

# run_on_fakes OUT LOG: the kit against the fakes (with the fake /proc/driver), output in OUT;
# sets rc.
run_on_fakes() {
    set +e
    unshare -m --propagation private sh -c 'mount --bind "$0" /proc/driver && exec "$@"' "$PROC_DRIVER" \
        env -i "${fake_env[@]}" GPU_CHECK_DRIVER_ROOT="$DRIVER_ROOT" GPU_CHECK_DEV_ROOT="$DEV_ROOT" GPU_CHECK_PROBE_MIB=64 \
        "$KIT/gpu-check.sh" --out "$1" >"$2" 2>&1
    rc=$?
    set -e
}

# Every step on the fakes.
OUT=$WORK/out
run_on_fakes "$OUT" "$WORK/run.out"
cat "$WORK/run.out" >&2
[[ $rc -eq 0 ]] || fail "the kit on the fakes: exit $rc"
grep -q 'gpu-check: all 7 steps passed' "$WORK/run.out" || fail "not all seven steps passed"
! grep -q '== 8. vfio' "$WORK/run.out" || fail "the opt-in VFIO step ran without GPU_CHECK_VFIO_UNBIND"
ok "all seven steps passed on the fakes; the opt-in VFIO step (which changes the GPU) did not run"
grep -q '^ok *gpu-0 MIG placements (profile id:start): 0:0 5:0 9:0 9:4 14:0 14:2 14:4 15:0 15:2 15:4 15:6 19:0' "$WORK/run.out" \
    || fail "the H100's MIG placements were not compared with mig -lgipp"
grep -q '^2 GPUs compared, 0 mismatches' "$WORK/run.out" || fail "comparison count line"
ok "slices match fake-nvidia-smi on both GPUs, MIG placements included"
[[ $(grep -c '^probe ok: fake libcuda' "$WORK/run.out") -eq 2 ]] || fail "want two probe runs on the fake libcuda"
for spec in ours nvidia; do
    grep -q "libcuda from /usr/lib/x86_64-linux-gnu/libcuda.so.1" "$OUT/$spec-probe.log" \
        || fail "$spec: libcuda not loaded by soname through the ld cache: $(cat "$OUT/$spec-probe.log")"
done
a100=$(jq -r '.items[].spec.devices[]? | select(.name == "gpu-1") | .attributes.uuid.string' "$OUT/slices.json")
grep -q "NVIDIA_VISIBLE_DEVICES=$a100" "$OUT/ours-probe.log" \
    || fail "our probe did not get the A100 (the first GPU not in MIG mode, $a100): $(cat "$OUT/ours-probe.log")"
grep -q 'nvidia.com/gpu=1' "$WORK/run.out" || fail "nvidia-ctk's device is not the A100's index 1"
ok "the probe ran in runc with our spec and with nvidia-ctk's on the first GPU not in MIG mode, libcuda.so.1 found through the ld cache"
grep -q '"faultEvents": "registered"' "$OUT/health.json" && grep -q '"recoveryAction": "None"' "$OUT/health.json" \
    || fail "health report: $(cat "$OUT/health.json")"
ok "health: events registered, recovery action read"
grep -q '^   PASS  7 parity' "$WORK/run.out" \
    && grep -q '^CDI vs nvidia-ctk: [0-9]* entries compared, [0-9]* differences explained, 0 mismatches$' "$OUT/parity.txt" \
    && grep -q '^explained only nvidia: env NVIDIA_VISIBLE_DEVICES=void ' "$OUT/parity.txt" \
    || fail "parity of our spec and nvidia-ctk's: $(cat "$OUT/parity.txt" 2>/dev/null)"
ok "parity: $(tail -1 "$OUT/parity.txt")"

# Every GPU in MIG mode: the probes and the parity check are skipped, not failed (CUDA runs only
# in MIG devices).
sim mig-mode --gpu 1 --enabled true
sim reset --gpu 1
run_on_fakes "$WORK/out-mig" "$WORK/run-mig.out"
[[ $rc -eq 0 ]] && grep -q 'gpu-check: no step failed; 3 skipped' "$WORK/run-mig.out" \
    && grep -q '^   SKIP  5 probe' "$WORK/run-mig.out" && grep -q '^   SKIP  7 parity' "$WORK/run-mig.out" \
    || { cat "$WORK/run-mig.out" >&2; fail "every GPU in MIG mode: exit $rc, want 0 with both probes and parity skipped"; }
ok "every GPU in MIG mode: both probes and the parity check skipped with the reason, nothing failed"

# A difference is caught, not waved through.
sed 's/<uuid>GPU-/<uuid>GPU-0/' "$OUT/smi.xml" >"$WORK/smi-changed.xml"
set +e
"$KIT/bin/gpu-check-compare" --slices "$OUT/slices.json" --smi "$WORK/smi-changed.xml" --lgipp "$OUT/lgipp.txt" >"$WORK/changed.out"
rc=$?
set -e
[[ $rc -eq 1 ]] && grep -q '^MISMATCH  gpu-0 uuid' "$WORK/changed.out" && grep -q '2 mismatches' "$WORK/changed.out" \
    || { cat "$WORK/changed.out" >&2; fail "a changed UUID: exit $rc, want 1 with two mismatches"; }
ok "a UUID nvidia-smi reports differently is a mismatch (exit 1)"
mkdir "$WORK/cdi-changed"
jq '.devices[0].containerEdits.mounts += [{"hostPath": "/extra", "containerPath": "/extra", "options": ["ro", "bind"]}]' \
    "$OUT/cdi-ours/k8s.gpu.nvidia.com-gpu-check.json" >"$WORK/cdi-changed/ours.json"
set +e
"$KIT/bin/gpu-check-compare" --cdi-ours "$WORK/cdi-changed/ours.json" \
    --cdi-ours-device "$(jq -r '.devices[0].name' "$WORK/cdi-changed/ours.json")" \
    --cdi-nvidia "$OUT/cdi-nvidia/nvidia.json" --cdi-nvidia-device 1 >"$WORK/cdi-changed.out"
rc=$?
set -e
[[ $rc -eq 1 ]] && grep -q '^MISMATCH  only ours: mount /extra /extra bind,ro$' "$WORK/cdi-changed.out" \
    && grep -q ', 1 mismatches$' "$WORK/cdi-changed.out" \
    || { cat "$WORK/cdi-changed.out" >&2; fail "an extra mount in our spec: exit $rc, want 1 with one mismatch"; }
ok "a mount only our spec has is a mismatch (exit 1)"

# Nothing of the runs is left behind: no container, no mount.
[[ -z $(ls "$OUT/runc-state" 2>/dev/null) ]] || fail "runc containers left: $(ls "$OUT/runc-state")"
! grep -q "$WORK" /proc/self/mountinfo || fail "mounts left under $WORK"
ok "no runc container or mount left"

echo "$passed passed, 0 failed"
