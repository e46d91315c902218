#!/usr/bin/env bash
# Builds the driver image (what deploy/Dockerfile describes) as an OCI image archive, without a
# registry, a container daemon or a base image: one uncompressed layer holding
#
#   /usr/bin/gpu-dra          the node-profile binary (as the Dockerfile builds it)
#   its shared libraries      exactly what `ldd` resolves, each at its real path, with the
#                             dynamic loader at its PT_INTERP path and the symlinks on the way
#                             (/lib64 -> usr/lib64, ...) as they are here
#   glibc for NVML            libc, libdl, libpthread, libm, librt (and what they need): the driver
#                             dlopens the host's libnvidia-ml.so.1, which links against them
#   /etc/passwd, /etc/group   root, nobody and nonroot (65532), as distroless has them
#   /tmp                      mode 1777
#
# and nothing else (no shell, no package manager). The config carries the Dockerfile's
# ENTRYPOINT, USER and LABELs; e2e/image-recipe.sh checks that the two describe the same image.
# The archive is an oci-layout directory tarred up, the name in the index's
# io.containerd.image.name and org.opencontainers.image.ref.name annotations, for
# `ctr -n k8s.io images import` (same layout as e2e/images/build.sh). Deterministic: the same
# binary and libraries give the same digests.
#
# Usage: e2e/build-image.sh [--tag TAG] [--binary PATH] [--out DIR]
#   --tag TAG      image tag (default: the crate version in Cargo.toml)
#   --binary PATH  use this gpu-dra binary instead of building
#                  `cargo build --profile node --locked --no-default-features --bin gpu-dra`
#   --out DIR      where the archive goes (default: ${OUT:-target/image})
# Prints IMAGE_ARCHIVE=, IMAGE_REF=, IMAGE_SIZE_BYTES= (the uncompressed layer) on stdout;
# progress and the size in MiB go to stderr.
set -euo pipefail
umask 022

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=images/oci.sh
source "$ROOT/e2e/images/oci.sh"
REPOSITORY=ghcr.io/gpu-dra/gpu-dra # deploy/helm/gpu-dra/values.yaml image.repository
# glibc libraries libnvidia-ml.so.1 links against (it is dlopened, so ldd cannot see them).
NVML_GLIBC=(libc.so.6 libdl.so.2 libpthread.so.0 libm.so.6 librt.so.1)

log() { echo "build-image: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

tag="" binary="" out=${OUT:-${CARGO_TARGET_DIR:-$ROOT/target}/image}
while (($#)); do
    case $1 in
        --tag) tag=${2:?--tag needs a value}; shift 2 ;;
        --binary) binary=${2:?--binary needs a path}; shift 2 ;;
        --out) out=${2:?--out needs a directory}; shift 2 ;;
        -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done
for tool in tar jq sha256sum ldd readelf realpath; do
    command -v "$tool" >/dev/null || die "$tool is required"
done

# The [package] version of Cargo.toml.
version=$(awk '/^\[/ { pkg = ($0 == "[package]") } pkg && /^version *=/ { gsub(/.*= *"|".*/, ""); print; exit }' \
    "$ROOT/Cargo.toml")
[[ -n $version ]] || die "no [package] version in Cargo.toml"
tag=${tag:-$version}
ref=$REPOSITORY:$tag

if [[ -z $binary ]]; then
    log "cargo build --profile node --locked --no-default-features --bin gpu-dra"
    (cd "$ROOT" && cargo build --profile node --locked --no-default-features --bin gpu-dra >&2)
    binary=${CARGO_TARGET_DIR:-$ROOT/target}/node/gpu-dra
fi
[[ -f $binary && -x $binary ]] || die "$binary is not an executable file"

# The image's labels: deploy/Dockerfile's LABEL lines say the same (checked by image-recipe.sh).
labels=$(jq -nc --arg v "$version" '{
    "org.opencontainers.image.title": "gpu-dra",
    "org.opencontainers.image.description": "Kubernetes DRA driver for NVIDIA GPUs",
    "org.opencontainers.image.source": "https://github.com/gpu-dra/gpu-dra",
    "org.opencontainers.image.licenses": "Apache-2.0",
    "org.opencontainers.image.version": $v}')
# Root: the chart's DaemonSet is privileged and writes the kubelet plugin folders, /var/run/cdi
# and MIG state (deploy/Dockerfile's USER line says the same).
config=$(jq -nc --argjson l "$labels" '{
    User: "0",
    Entrypoint: ["/usr/bin/gpu-dra"],
    Env: ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
    Labels: $l}')

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
rootfs=$TMP/rootfs
mkdir -p "$rootfs"/{usr/bin,etc,tmp}
chmod 1777 "$rootfs/tmp"
install -m 0755 "$binary" "$rootfs/usr/bin/gpu-dra"
printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' 'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' \
    'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$rootfs/etc/passwd"
printf '%s\n' 'root:x:0:' 'nobody:x:65534:' 'nonroot:x:65532:' >"$rootfs/etc/group"

# copy_path P: puts the absolute host path P into the rootfs as the loader will look it up:
# every symlink on the way is recreated as it is here (same target) and followed, the file at
# the end copied with its mode.
copy_path() {
    local path prefix="" comp target rest
    path=$(realpath -sm "$1")
    local -a parts
    IFS=/ read -ra parts <<<"${path#/}"
    local i
    for ((i = 0; i < ${#parts[@]}; i++)); do
        comp=${parts[i]}
        [[ -n $comp ]] || continue
        if [[ -L $prefix/$comp ]]; then
            target=$(readlink "$prefix/$comp")
            [[ -L $rootfs$prefix/$comp ]] || ln -s "$target" "$rootfs$prefix/$comp"
            rest=$(IFS=/; echo "${parts[*]:i+1}")
            [[ $target == /* ]] || target=$prefix/$target
            copy_path "$target${rest:+/$rest}"
            return
        fi
        prefix=$prefix/$comp
        if ((i < ${#parts[@]} - 1)); then
            [[ -d $prefix ]] || die "$prefix is not a directory"
            mkdir -p "$rootfs$prefix"
        fi
    done
    [[ -f $prefix ]] || die "$1: not a file"
    [[ -e $rootfs$prefix ]] || cp "$prefix" "$rootfs$prefix"
    chmod "$(stat -c %a "$prefix")" "$rootfs$prefix"
}

# needed FILE: the absolute paths the loader maps for FILE (ldd), one a line; the vDSO has none.
needed() {
    local out
    out=$(LC_ALL=C ldd "$1" 2>&1) || die "ldd $1: $out"
    grep -q 'not found' <<<"$out" && die "ldd $1: $(grep 'not found' <<<"$out")"
    awk '$2 == "=>" && $3 ~ /^\// { print $3; next } $1 ~ /^\// { print $1 }' <<<"$out"
}

interp=$(LC_ALL=C readelf -l "$binary" | sed -n 's/.*\[Requesting program interpreter: \(.*\)\]/\1/p')
[[ -n $interp ]] || die "$binary has no PT_INTERP: the driver must link glibc dynamically to dlopen NVML"
copy_path "$interp"
deps=$(needed "$binary")
mapfile -t libs <<<"$deps"
libc=$(printf '%s\n' "${libs[@]}" | grep '/libc\.so\.6$' | head -1) || true
[[ -n $libc ]] || die "$binary does not link libc.so.6"
for lib in "${NVML_GLIBC[@]}"; do
    [[ -e $(dirname "$libc")/$lib ]] || die "$lib not found next to $libc"
    deps=$(needed "$(dirname "$libc")/$lib")
    mapfile -t -O "${#libs[@]}" libs <<<"$(dirname "$libc")/$lib
$deps"
done
for lib in $(printf '%s\n' "${libs[@]}" | sort -u); do
    copy_path "$lib"
done
log "files: $(cd "$rootfs" && find . ! -type d | sed 's/^\.//' | sort | tr '\n' ' ')"

archive=$(realpath -m "$out/gpu-dra-$tag.oci.tar")
mkdir -p "$out"
oci_archive "$archive.tmp" "$ref" "$rootfs" "$config" "gpu-dra e2e/build-image.sh" "$TMP"
mv "$archive.tmp" "$archive"
size=$OCI_LAYER_SIZE

log "$ref: $(awk -v s="$size" 'BEGIN { printf "%.1f MiB", s / 1048576 }') uncompressed ($size bytes), manifest $OCI_MANIFEST_DIGEST"
printf 'IMAGE_ARCHIVE=%s\nIMAGE_REF=%s\nIMAGE_SIZE_BYTES=%s\n' "$archive" "$ref" "$size"
