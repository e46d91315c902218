#!/usr/bin/env bash
# Builds the two local images of the e2e real node (e2e/cluster up --real-node) as OCI image
# archives, without a registry or a container engine:
#
#   busybox  gpu-dra.local/e2e/busybox:e2e  Debian's /bin/busybox (busybox-static) with its
#            applet symlinks (sh, env, ls, cat, sleep, ...); the image pods run.
#   pause    gpu-dra.local/e2e/pause:e2e    our pause.c, gcc -static; the pod sandbox image.
#
# Each archive is an oci-layout directory tarred up (oci-layout, index.json, blobs/sha256/...),
# one uncompressed layer, the name in the index's io.containerd.image.name and
# org.opencontainers.image.ref.name annotations, for `ctr -n k8s.io images import`.
#
# Usage: e2e/images/build.sh    prints KEY=VALUE lines (BUSYBOX_ARCHIVE, BUSYBOX_IMAGE,
#                               PAUSE_ARCHIVE, PAUSE_IMAGE); progress goes to stderr.
# Archives are cached under ${GPU_DRA_CACHE:-~/.cache/gpu-dra}/images/<hash of the inputs>.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUSYBOX=${BUSYBOX:-/bin/busybox}
BUSYBOX_IMAGE=gpu-dra.local/e2e/busybox:e2e
PAUSE_IMAGE=gpu-dra.local/e2e/pause:e2e

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
key=$(cat "${BASH_SOURCE[0]}" "$HERE/pause.c" "$BUSYBOX" | sha256sum | cut -c1-16)
OUT=$CACHE/images/$key

emit() {
    printf 'BUSYBOX_ARCHIVE=%s\nBUSYBOX_IMAGE=%s\nPAUSE_ARCHIVE=%s\nPAUSE_IMAGE=%s\n' \
        "$OUT/busybox.oci.tar" "$BUSYBOX_IMAGE" "$OUT/pause.oci.tar" "$PAUSE_IMAGE"
}
if [[ -f $OUT/busybox.oci.tar && -f $OUT/pause.oci.tar ]]; then
    emit
    exit 0
fi

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# Reproducible tar: fixed order, owner and times, so the digests only change with the content.
det_tar() { # OUT DIR
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --format=posix \
        --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime -C "$2" -cf "$1" .
}

# blob FILE MEDIATYPE: moves FILE into the layout's blob store, prints its descriptor.
blob() {
    local digest size
    digest=$(sha256sum "$1" | cut -d' ' -f1)
    size=$(stat -c %s "$1")
    mv "$1" "$layout/blobs/sha256/$digest"
    jq -nc --arg m "$2" --arg d "sha256:$digest" --argjson s "$size" '{mediaType: $m, digest: $d, size: $s}'
}

# oci_archive NAME REF ROOTFS CONFIG_JSON: writes $OUT/NAME.oci.tar with ROOTFS as one layer.
oci_archive() {
    local name=$1 ref=$2 rootfs=$3 config=$4
    layout=$TMP/$name-layout
    mkdir -p "$layout/blobs/sha256"
    det_tar "$TMP/layer.tar" "$rootfs"
    local diff_id layer cfg manifest
    diff_id=sha256:$(sha256sum "$TMP/layer.tar" | cut -d' ' -f1)
    layer=$(blob "$TMP/layer.tar" application/vnd.oci.image.layer.v1.tar)
    jq -n --argjson c "$config" --arg d "$diff_id" \
        '{architecture: "amd64", os: "linux", config: $c, rootfs: {type: "layers", diff_ids: [$d]},
          history: [{created_by: "gpu-dra e2e/images/build.sh"}]}' >"$TMP/config.json"
    cfg=$(blob "$TMP/config.json" application/vnd.oci.image.config.v1+json)
    jq -n --argjson c "$cfg" --argjson l "$layer" \
        '{schemaVersion: 2, mediaType: "application/vnd.oci.image.manifest.v1+json", config: $c, layers: [$l]}' \
        >"$TMP/manifest.json"
    manifest=$(blob "$TMP/manifest.json" application/vnd.oci.image.manifest.v1+json)
    jq -n --argjson m "$manifest" --arg r "$ref" \
        '{schemaVersion: 2, mediaType: "application/vnd.oci.image.index.v1+json",
          manifests: [$m + {platform: {architecture: "amd64", os: "linux"},
                             annotations: {"io.containerd.image.name": $r, "org.opencontainers.image.ref.name": $r}}]}' \
        >"$layout/index.json"
    echo '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
    det_tar "$OUT.tmp/$name.oci.tar" "$layout"
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
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"
oci_archive busybox "$BUSYBOX_IMAGE" "$rootfs" \
    '{"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], "Cmd": ["sh"]}'

log "building $PAUSE_IMAGE from pause.c"
rootfs=$TMP/pause-root
mkdir -p "$rootfs"
gcc -static -Os -o "$rootfs/pause" "$HERE/pause.c"
strip "$rootfs/pause" 2>/dev/null || true
oci_archive pause "$PAUSE_IMAGE" "$rootfs" '{"Entrypoint": ["/pause"], "User": "65535:65535"}'

rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
emit
