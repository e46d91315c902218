#!/usr/bin/env bash
# Builds the two local images of the e2e real node (e2e/cluster up --real-node) as OCI image
# archives, without a registry or a container engine:
#
#   busybox  gpu-dra.local/e2e/busybox:e2e  Debian's /bin/busybox (busybox-static) with its
#            applet symlinks (sh, env, ls, cat, sleep, ...) and the machine's static
#            /sbin/ldconfig (NVIDIA's update-ldcache hook runs it), bin/bash: busybox's sh
#            under bash's name (bash.c), for NVIDIA's specs' `bash -c`, and a C library, as
#            CUDA's and Ubuntu's images have one: this machine's loader and libraries under the
#            paths the fake driver root's tools are linked to (gpu_dra::prepare::driver_files::
#            FAKE_LOADER, FAKE_LIBC_DIR), so the driver root's nvidia-smi that a claim's CDI
#            spec mounts runs in the container and reads the GPUs it was given through the
#            mounted libnvidia-ml; the image pods run.
#   pause    gpu-dra.local/e2e/pause:e2e    our pause.c, gcc -static; the pod sandbox image.
#   cuda-standin  gpu-dra.local/e2e/cuda-standin:e2e  busybox's image under its own name:
#            e2e/nvidia-suite.sh tags it under the images NVIDIA's suites pull.
#
# Each archive is an oci-layout directory tarred up (oci-layout, index.json, blobs/sha256/...),
# one uncompressed layer, the name in the index's io.containerd.image.name and
# org.opencontainers.image.ref.name annotations, for `ctr -n k8s.io images import`.
#
# Usage: e2e/images/build.sh    prints KEY=VALUE lines (BUSYBOX_ARCHIVE, BUSYBOX_IMAGE,
#                               PAUSE_ARCHIVE, PAUSE_IMAGE, CUDA_STANDIN_ARCHIVE,
#                               CUDA_STANDIN_IMAGE); progress goes to stderr.
# Archives are cached under ${GPU_DRA_CACHE:-~/.cache/gpu-dra}/images/<hash of the inputs>.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=oci.sh
source "$HERE/oci.sh"
BUSYBOX=${BUSYBOX:-/bin/busybox}
BUSYBOX_IMAGE=gpu-dra.local/e2e/busybox:e2e
PAUSE_IMAGE=gpu-dra.local/e2e/pause:e2e
CUDA_STANDIN_IMAGE=gpu-dra.local/e2e/cuda-standin:e2e

log() { echo "images: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ -x $BUSYBOX ]] || die "$BUSYBOX missing (apt-get install busybox-static)"
# A dynamically linked busybox would not run in an image without libc.
file_out=$(LC_ALL=C readelf -l "$BUSYBOX" 2>/dev/null || true)
grep -q 'INTERP' <<<"$file_out" && die "$BUSYBOX is dynamically linked (install busybox-static)"
for tool in gcc tar jq sha256sum; do
    command -v "$tool" >/dev/null || die "$tool is required"
done

CACHE=${GPU_DRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-dra}
# The C library the images carry, as write_fake_c_library gives a fake driver root.
C_LOADER=$(for f in /lib64/ld-linux-x86-64.so.2 /lib/ld-linux-aarch64.so.1; do [[ -e $f ]] && echo "$f" && break; done)
[[ -n $C_LOADER ]] || die "no C library loader on this machine"
C_LIBS=()
for name in libc.so.6 libgcc_s.so.1 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1; do
    for dir in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /lib/aarch64-linux-gnu /usr/lib/aarch64-linux-gnu /lib64 /usr/lib64; do
        [[ -e $dir/$name ]] && C_LIBS+=("$dir/$name") && break
    done
done
key=$(cat "${BASH_SOURCE[0]}" "$HERE/oci.sh" "$HERE/pause.c" "$HERE/bash.c" "$BUSYBOX" "${LDCONFIG:-/sbin/ldconfig}" "$C_LOADER" "${C_LIBS[@]}" | sha256sum | cut -c1-16)
OUT=$CACHE/images/$key

emit() {
    printf 'BUSYBOX_ARCHIVE=%s\nBUSYBOX_IMAGE=%s\nPAUSE_ARCHIVE=%s\nPAUSE_IMAGE=%s\nCUDA_STANDIN_ARCHIVE=%s\nCUDA_STANDIN_IMAGE=%s\n' \
        "$OUT/busybox.oci.tar" "$BUSYBOX_IMAGE" "$OUT/pause.oci.tar" "$PAUSE_IMAGE" \
        "$OUT/cuda-standin.oci.tar" "$CUDA_STANDIN_IMAGE"
}
if [[ -f $OUT/busybox.oci.tar && -f $OUT/pause.oci.tar && -f $OUT/cuda-standin.oci.tar ]]; then
    emit
    exit 0
fi

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# image_archive NAME REF ROOTFS CONFIG_JSON: writes $OUT.tmp/NAME.oci.tar with ROOTFS as one layer.
image_archive() {
    mkdir -p "$TMP/$1"
    oci_archive "$OUT.tmp/$1.oci.tar" "$2" "$3" "$4" "gpu-dra e2e/images/build.sh" "$TMP/$1"
}

rm -rf "$OUT.tmp"
mkdir -p "$OUT.tmp"

log "building $BUSYBOX_IMAGE from $BUSYBOX"
rootfs=$TMP/busybox-root
mkdir -p "$rootfs"/{bin,sbin,usr/bin,usr/sbin,etc,tmp,proc,sys,dev,root}
chmod 1777 "$rootfs/tmp"
cp "$BUSYBOX" "$rootfs/bin/busybox"
# --list-full gives each applet's install path (bin/sh, usr/bin/env, ...).
while read -r applet; do
    [[ $applet == bin/busybox || -e $rootfs/$applet ]] && continue
    mkdir -p "$rootfs/$(dirname "$applet")"
    ln -s /bin/busybox "$rootfs/$applet"
done < <("$BUSYBOX" --list-full)
# NVIDIA's update-ldcache hook runs the container's own ldconfig: this machine's glibc one, which
# Debian links statically (it needs no C library in the image).
LDCONFIG=${LDCONFIG:-/sbin/ldconfig}
[[ -x $LDCONFIG ]] && ! LC_ALL=C readelf -l "$LDCONFIG" 2>/dev/null | grep -c INTERP >/dev/null ||
    die "$LDCONFIG is missing or dynamically linked: the image needs a static ldconfig (Debian's libc-bin has one)"
cp "$LDCONFIG" "$rootfs/sbin/ldconfig"
# NVIDIA's specs run `bash -c` with POSIX commands: busybox's sh under that name (bash.c).
gcc -static -Os -o "$rootfs/bin/bash" "$HERE/bash.c"
strip "$rootfs/bin/bash" 2>/dev/null || true
# A C library, as CUDA's and Ubuntu's images have one, under the paths the fake driver root's
# tools are linked to: the driver root's nvidia-smi that a claim's CDI spec mounts runs here.
mkdir -p "$rootfs/lib/gpu-dra-driver-root"
cp "$C_LOADER" "$rootfs/lib/ld-gpu-dra-driver-root.so"
# Each under its soname (cp follows the soname's link to the file).
for lib in "${C_LIBS[@]}"; do cp "$lib" "$rootfs/lib/gpu-dra-driver-root/"; done
[[ -f $rootfs/lib/gpu-dra-driver-root/libc.so.6 ]] || die "no libc.so.6 for $BUSYBOX_IMAGE"
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"
image_archive busybox "$BUSYBOX_IMAGE" "$rootfs" \
    '{"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], "Cmd": ["sh"]}'

log "building $CUDA_STANDIN_IMAGE: $BUSYBOX_IMAGE under another name"
image_archive cuda-standin "$CUDA_STANDIN_IMAGE" "$rootfs" \
    '{"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], "Cmd": ["sh"]}'

log "building $PAUSE_IMAGE from pause.c"
rootfs=$TMP/pause-root
mkdir -p "$rootfs"
gcc -static -Os -o "$rootfs/pause" "$HERE/pause.c"
strip "$rootfs/pause" 2>/dev/null || true
image_archive pause "$PAUSE_IMAGE" "$rootfs" '{"Entrypoint": ["/pause"], "User": "65535:65535"}'

rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
emit
