# OCI image archives without a registry or a container engine, for `ctr images import`: an
# oci-layout directory (oci-layout, index.json, blobs/sha256/...) tarred up, one uncompressed
# layer, the name in the index's io.containerd.image.name and org.opencontainers.image.ref.name
# annotations. Sourced by e2e/images/build.sh and e2e/build-image.sh.
# shellcheck shell=bash

# Reproducible tar: fixed order, owner and times, so the digests only change with the content.
det_tar() { # OUT DIR
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --format=posix \
        --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime -C "$2" -cf "$1" .
}

# oci_blob LAYOUT FILE MEDIATYPE: moves FILE into the layout's blob store, prints its descriptor.
oci_blob() {
    local digest size
    digest=$(sha256sum "$2" | cut -d' ' -f1)
    size=$(stat -c %s "$2")
    mv "$2" "$1/blobs/sha256/$digest"
    jq -nc --arg m "$3" --arg d "sha256:$digest" --argjson s "$size" '{mediaType: $m, digest: $d, size: $s}'
}

# oci_archive ARCHIVE REF ROOTFS CONFIG_JSON CREATED_BY WORKDIR: writes ARCHIVE with ROOTFS as
# its one layer and CONFIG_JSON as the image config's `config`. Sets OCI_LAYER_SIZE (bytes,
# uncompressed) and OCI_MANIFEST_DIGEST.
oci_archive() {
    local archive=$1 ref=$2 rootfs=$3 config=$4 created_by=$5 work=$6
    local layout=$work/layout diff_id layer cfg manifest
    rm -rf "$layout"
    mkdir -p "$layout/blobs/sha256"
    det_tar "$work/layer.tar" "$rootfs"
    OCI_LAYER_SIZE=$(stat -c %s "$work/layer.tar")
    diff_id=sha256:$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
    layer=$(oci_blob "$layout" "$work/layer.tar" application/vnd.oci.image.layer.v1.tar)
    jq -n --argjson c "$config" --arg d "$diff_id" --arg by "$created_by" \
        '{architecture: "amd64", os: "linux", config: $c, rootfs: {type: "layers", diff_ids: [$d]},
          history: [{created_by: $by}]}' >"$work/config.json"
    cfg=$(oci_blob "$layout" "$work/config.json" application/vnd.oci.image.config.v1+json)
    jq -n --argjson c "$cfg" --argjson l "$layer" \
        '{schemaVersion: 2, mediaType: "application/vnd.oci.image.manifest.v1+json", config: $c, layers: [$l]}' \
        >"$work/manifest.json"
    manifest=$(oci_blob "$layout" "$work/manifest.json" application/vnd.oci.image.manifest.v1+json)
    OCI_MANIFEST_DIGEST=$(jq -r .digest <<<"$manifest")
    jq -n --argjson m "$manifest" --arg r "$ref" \
        '{schemaVersion: 2, mediaType: "application/vnd.oci.image.index.v1+json",
          manifests: [$m + {platform: {architecture: "amd64", os: "linux"},
                             annotations: {"io.containerd.image.name": $r, "org.opencontainers.image.ref.name": $r}}]}' \
        >"$layout/index.json"
    echo '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
    det_tar "$archive" "$layout"
}
