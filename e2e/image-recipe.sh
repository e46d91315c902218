#!/usr/bin/env bash
# Checks that deploy/Dockerfile (the recipe for users with a builder) and e2e/build-image.sh (the
# image without one) describe the same image. Builds the archive twice with build-image.sh and
# asserts, against the Dockerfile's final stage:
#   - base is distroless cc (glibc), and the build stage's cargo command is the one
#     build-image.sh runs;
#   - same ENTRYPOINT, CMD (none), USER and LABELs; the version label is Cargo.toml's version;
#   - the binary is at the COPY destination; every file ldd names for it (the loader at its
#     PT_INTERP path, each library through its symlinks) and the glibc libraries NVML needs are
#     in the layer, byte for byte the ones here; nothing else but /etc/passwd, /etc/group, /tmp
#     (1777); no shell;
#   - the archive is a valid OCI layout (digests, sizes, diff_id, the ref annotations) and the
#     same inputs give the same digests;
#   - it runs: the layer extracted, `chroot DIR /usr/bin/gpu-dra --version` prints the version.
# With --containerd DIR (a folder holding containerd and ctr, e.g. e2e/build-k8s.sh's), also
# imports the archive into a private containerd (own socket, root and state under a temp folder,
# CRI off) and runs `gpu-dra --version` in a container with runc; /bin/sh must not start.
# Needs root (chroot), tar, jq.
#
# Usage: e2e/image-recipe.sh [--binary PATH] [--containerd DIR]
#   without --binary, build-image.sh builds the node profile binary
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DOCKERFILE=${DOCKERFILE:-$ROOT/deploy/Dockerfile} # overridable, to see the checks fail
NVML_GLIBC=(libc.so.6 libdl.so.2 libpthread.so.0 libm.so.6 librt.so.1)

failures=0
log() { echo "image-recipe: $*" >&2; }
die() { log "FAIL: $*"; exit 1; }
fail() { log "FAIL: $*"; failures=$((failures + 1)); }
ok() { log "ok: $*"; }
# same WHAT EXPECTED ACTUAL
same() {
    if [[ $2 == "$3" ]]; then ok "$1: $2"; else fail "$1: Dockerfile says $2, the image has $3"; fi
}

binary_args=() ctd_bin=""
while (($#)); do
    case $1 in
        --binary) binary_args=(--binary "${2:?--binary needs a path}"); shift 2 ;;
        --containerd) ctd_bin=${2:?--containerd needs a folder}; shift 2 ;;
        *) die "unknown argument $1 (usage: $0 [--binary PATH] [--containerd DIR])" ;;
    esac
done
((EUID == 0)) || die "needs root (chroot)"
for tool in tar jq sha256sum ldd chroot xargs; do
    command -v "$tool" >/dev/null || die "$tool is required"
done

TMP=$(mktemp -d)
ctd_pid=""
cleanup() {
    if [[ -n $ctd_pid ]]; then
        kill "$ctd_pid" 2>/dev/null || true
        wait "$ctd_pid" 2>/dev/null || true
    fi
    rm -rf "$TMP"
}
trap cleanup EXIT

# --- the Dockerfile: logical lines (continuations joined, comments dropped), final stage.
mapfile -t lines < <(sed -e '/^[[:space:]]*#/d' "$DOCKERFILE" | sed -e ':a' -e '/\\$/{N; s/\\\n//; ba' -e '}' |
    sed -e 's/^[[:space:]]*//' -e '/^$/d')
last_from=-1
for i in "${!lines[@]}"; do
    [[ ${lines[i]^^} == FROM\ * ]] && last_from=$i
done
((last_from >= 0)) || die "no FROM in $DOCKERFILE"
final=("${lines[@]:last_from}")
build=("${lines[@]:0:last_from}")
instr() { # INSTRUCTION: the arguments of its last occurrence in the final stage
    local l out=""
    for l in "${final[@]}"; do
        [[ ${l%%[[:space:]]*} == "$1" ]] && out=${l#"$1"} && out=${out#"${out%%[![:space:]]*}"}
    done
    printf '%s' "$out"
}

base=$(instr FROM)
[[ $base == gcr.io/distroless/cc* ]] && ok "final stage FROM $base (glibc)" ||
    fail "final stage FROM $base: expected gcr.io/distroless/cc* (glibc, for NVML)"
cargo_cmd=$(printf '%s\n' "${build[@]}" | sed -n 's/^RUN \(cargo build .*\)/\1/p' | tail -1)
[[ -n $cargo_cmd ]] || die "no RUN cargo build in the Dockerfile's build stage"
grep -qF "$cargo_cmd" "$ROOT/e2e/build-image.sh" && ok "build-image.sh builds with: $cargo_cmd" ||
    fail "build-image.sh does not run the Dockerfile's build command: $cargo_cmd"

df_entrypoint=$(instr ENTRYPOINT)
jq -e 'type == "array"' >/dev/null 2>&1 <<<"$df_entrypoint" || die "ENTRYPOINT is not in JSON (exec) form: $df_entrypoint"
df_entrypoint=$(jq -c . <<<"$df_entrypoint")
df_cmd=$(instr CMD)
if [[ -n $df_cmd ]]; then df_cmd=$(jq -c . <<<"$df_cmd"); else df_cmd=null; fi
df_user=$(instr USER)
[[ -n $df_user ]] || die "the Dockerfile's final stage has no USER line"
df_labels='{}'
for l in "${final[@]}"; do
    [[ ${l%%[[:space:]]*} == LABEL ]] || continue
    # xargs splits KEY="VALUE" pairs as the Dockerfile quotes them.
    while IFS= read -r pair; do
        [[ $pair == *=* ]] || die "LABEL without =: $pair"
        df_labels=$(jq -c --arg k "${pair%%=*}" --arg v "${pair#*=}" '. + {($k): $v}' <<<"$df_labels")
    done < <(xargs printf '%s\n' <<<"${l#LABEL}")
done
df_copy=$(printf '%s\n' "${final[@]}" | grep -E '^COPY .*/gpu-dra[[:space:]]' | tail -1)
[[ -n $df_copy ]] || die "no COPY of the gpu-dra binary in the final stage"
df_bin=${df_copy##*[[:space:]]}
[[ $df_copy == *" /src/target/node/gpu-dra "* ]] && ok "the Dockerfile copies the node profile binary" ||
    fail "the Dockerfile does not copy target/node/gpu-dra: $df_copy"
[[ $(printf '%s\n' "${final[@]}" | grep -c '^ENV ') == 0 ]] ||
    fail "the Dockerfile sets ENV in the final stage: build-image.sh sets only PATH (update both)"
version=$(awk '/^\[/ { pkg = ($0 == "[package]") } pkg && /^version *=/ { gsub(/.*= *"|".*/, ""); print; exit }' \
    "$ROOT/Cargo.toml")

# --- the image, built twice.
"$ROOT/e2e/build-image.sh" "${binary_args[@]}" --out "$TMP/a" >"$TMP/a.env"
"$ROOT/e2e/build-image.sh" "${binary_args[@]}" --out "$TMP/b" >"$TMP/b.env" 2>/dev/null
# shellcheck disable=SC1091
source "$TMP/a.env"
[[ $IMAGE_ARCHIVE == "$TMP/a/gpu-dra-$version.oci.tar" ]] || fail "IMAGE_ARCHIVE=$IMAGE_ARCHIVE"
[[ $IMAGE_REF == "ghcr.io/gpu-dra/gpu-dra:$version" ]] || fail "IMAGE_REF=$IMAGE_REF"
cmp -s "$IMAGE_ARCHIVE" "$TMP/b/gpu-dra-$version.oci.tar" && ok "deterministic: two builds give the same archive" ||
    fail "two builds from the same inputs differ"

layout=$TMP/layout
mkdir -p "$layout"
tar -xf "$IMAGE_ARCHIVE" -C "$layout"
blob() { echo "$layout/blobs/sha256/${1#sha256:}"; }
check_blob() { # DESCRIPTOR
    local d s f
    d=$(jq -r .digest <<<"$1") s=$(jq -r .size <<<"$1") f=$(blob "$d")
    [[ -f $f ]] || die "blob $d missing"
    [[ sha256:$(sha256sum "$f" | cut -d' ' -f1) == "$d" ]] || die "blob $d: wrong digest"
    [[ $(stat -c %s "$f") == "$s" ]] || die "blob $d: size is not $s"
}
jq -e '.imageLayoutVersion == "1.0.0"' "$layout/oci-layout" >/dev/null || die "bad oci-layout"
[[ $(jq '.manifests | length' "$layout/index.json") == 1 ]] || die "index.json: expected one manifest"
mdesc=$(jq -c '.manifests[0]' "$layout/index.json")
jq -e --arg r "$IMAGE_REF" '.annotations["io.containerd.image.name"] == $r and
    .annotations["org.opencontainers.image.ref.name"] == $r and
    .platform == {architecture: "amd64", os: "linux"}' >/dev/null <<<"$mdesc" ||
    die "index.json: annotations/platform wrong: $mdesc"
check_blob "$mdesc"
manifest=$(cat "$(blob "$(jq -r .digest <<<"$mdesc")")")
[[ $(jq '.layers | length' <<<"$manifest") == 1 ]] || die "expected one layer"
check_blob "$(jq -c .config <<<"$manifest")"
check_blob "$(jq -c '.layers[0]' <<<"$manifest")"
config=$(cat "$(blob "$(jq -r .config.digest <<<"$manifest")")")
layer=$(blob "$(jq -r '.layers[0].digest' <<<"$manifest")")
[[ $(jq -r '.rootfs.diff_ids[0]' <<<"$config") == "$(jq -r '.layers[0].digest' <<<"$manifest")" ]] ||
    die "config diff_id is not the (uncompressed) layer's digest"
jq -e '.architecture == "amd64" and .os == "linux"' >/dev/null <<<"$config" || fail "config is not linux/amd64"
[[ $IMAGE_SIZE_BYTES == "$(stat -c %s "$layer")" ]] || fail "IMAGE_SIZE_BYTES=$IMAGE_SIZE_BYTES is not the layer size"
ok "OCI layout valid, layer $IMAGE_SIZE_BYTES bytes"

# --- config against the Dockerfile.
same ENTRYPOINT "$df_entrypoint" "$(jq -c '.config.Entrypoint' <<<"$config")"
same CMD "$df_cmd" "$(jq -c '.config.Cmd' <<<"$config")"
same USER "$df_user" "$(jq -r '.config.User' <<<"$config")"
same LABELs "$(jq -cS . <<<"$df_labels")" "$(jq -cS '.config.Labels' <<<"$config")"
same "version label" "$version" "$(jq -r '.["org.opencontainers.image.version"]' <<<"$df_labels")"

# --- the files.
rootfs=$TMP/rootfs
mkdir -p "$rootfs"
tar -xf "$layer" -C "$rootfs"
# in_root PATH: PATH resolved inside the rootfs (absolute symlinks stay inside), or nothing.
in_root() {
    local path=$1 hops=0 prefix comp target
    while :; do
        prefix="" && local -a parts && IFS=/ read -ra parts <<<"${path#/}"
        local i restart=0
        for ((i = 0; i < ${#parts[@]}; i++)); do
            comp=${parts[i]}
            [[ -z $comp || $comp == . ]] && continue
            if [[ $comp == .. ]]; then prefix=${prefix%/*}; continue; fi
            if [[ -L $rootfs$prefix/$comp ]]; then
                ((++hops < 40)) || return 0
                target=$(readlink "$rootfs$prefix/$comp")
                [[ $target == /* ]] || target=$prefix/$target
                path=$target$(IFS=/; r="${parts[*]:i+1}"; echo "${r:+/$r}")
                restart=1
                break
            fi
            prefix=$prefix/$comp
            [[ -e $rootfs$prefix ]] || return 0
        done
        ((restart)) || break
    done
    echo "$rootfs$prefix"
}
bin=$(in_root "$df_bin")
[[ -n $bin && -f $bin && -x $bin ]] && ok "binary at the COPY destination $df_bin" ||
    fail "no executable at the Dockerfile's COPY destination $df_bin"
[[ -n $bin ]] || die "cannot go on without the binary"
interp=$(LC_ALL=C readelf -l "$bin" | sed -n 's/.*\[Requesting program interpreter: \(.*\)\]/\1/p')
needed=("$interp")
ldd_out=$(LC_ALL=C ldd "$bin")
while read -r p; do needed+=("$p"); done < <(awk '$2 == "=>" && $3 ~ /^\// { print $3; next } $1 ~ /^\// { print $1 }' <<<"$ldd_out")
libc_dir=$(dirname "$(awk '$1 == "libc.so.6" { print $3 }' <<<"$ldd_out")")
for lib in "${NVML_GLIBC[@]}"; do needed+=("$libc_dir/$lib"); done
mapfile -t needed < <(printf '%s\n' "${needed[@]}" | awk '!seen[$0]++')
for p in "${needed[@]}"; do
    f=$(in_root "$p")
    if [[ -z $f || ! -f $f ]]; then
        fail "$p (needed per ldd/NVML) is not in the image"
    elif ! cmp -s "$f" "$(realpath "$p")"; then
        fail "$p in the image differs from $(realpath "$p") here"
    else
        ok "$p -> ${f#"$rootfs"}"
    fi
done
for sh in /bin/sh /usr/bin/sh /bin/bash /usr/bin/bash /bin/busybox; do
    [[ -e $rootfs$sh || -L $rootfs$sh ]] && fail "the image has a shell: $sh"
done
[[ $(find "$rootfs" -name 'sh' -o -name 'bash' -o -name 'busybox' | wc -l) == 0 ]] || fail "a shell somewhere in the image"
while read -r f; do
    case $f in
        "$df_bin" | /etc/passwd | /etc/group | */ld-linux*.so* | */lib*.so*) ;;
        # A folder alias on the loader's paths (/lib -> usr/lib, merged /usr).
        *) [[ -L $rootfs$f && -d $rootfs$f ]] || fail "unexpected file in the image: $f" ;;
    esac
done < <(cd "$rootfs" && find . ! -type d | sed 's/^\.//')
[[ $(stat -c %a "$rootfs/tmp") == 1777 ]] && ok "/tmp is 1777" || fail "/tmp is not 1777"
grep -q '^root:x:0:0:' "$rootfs/etc/passwd" && grep -q '^nonroot:x:65532:65532:' "$rootfs/etc/passwd" &&
    grep -q '^root:x:0:' "$rootfs/etc/group" && ok "/etc/passwd, /etc/group: root, nonroot" ||
    fail "/etc/passwd or /etc/group lacks root or nonroot"

# --- it runs, with nothing from the host.
if out=$(env -i "$(command -v chroot)" "$rootfs" /usr/bin/gpu-dra --version 2>&1) && [[ $out == "gpu-dra $version" ]]; then
    ok "chroot $df_bin --version: $out"
else
    fail "chroot $df_bin --version printed: $out"
fi

# --- optional: containerd imports and runs it.
if [[ -n $ctd_bin ]]; then
    for tool in containerd ctr; do [[ -x $ctd_bin/$tool ]] || die "$ctd_bin/$tool missing"; done
    command -v runc >/dev/null || die "runc is required for --containerd"
    ctd=$TMP/containerd
    mkdir -p "$ctd"
    printf '%s\n' 'version = 3' "root = \"$ctd/root\"" "state = \"$ctd/state\"" \
        'disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.images", "io.containerd.cri.v1.runtime"]' \
        '[grpc]' "address = \"$ctd/sock\"" '[ttrpc]' "address = \"$ctd/sock.ttrpc\"" >"$ctd/config.toml"
    "$ctd_bin/containerd" --config "$ctd/config.toml" >"$ctd/log" 2>&1 &
    ctd_pid=$!
    for _ in $(seq 50); do [[ -S $ctd/sock ]] && break; sleep 0.2; done
    [[ -S $ctd/sock ]] || die "containerd did not start: $(tail -5 "$ctd/log")"
    ctr=("$ctd_bin/ctr" -a "$ctd/sock" -n k8s.io)
    "${ctr[@]}" images import "$IMAGE_ARCHIVE" >/dev/null 2>"$TMP/ctr.err" || die "ctr import: $(cat "$TMP/ctr.err")"
    got=$("${ctr[@]}" images ls -q 2>/dev/null)
    [[ $got == "$IMAGE_REF" ]] && ok "ctr images import: $got" || fail "ctr images import gave: $got"
    if out=$(timeout 120 "${ctr[@]}" run --rm "$IMAGE_REF" recipe-run /usr/bin/gpu-dra --version 2>/dev/null) &&
        [[ $out == "gpu-dra $version" ]]; then
        ok "ctr run $df_bin --version: $out"
    else
        fail "ctr run $df_bin --version printed: $out"
    fi
    if timeout 120 "${ctr[@]}" run --rm "$IMAGE_REF" recipe-sh /bin/sh -c true >/dev/null 2>&1; then
        fail "ctr run /bin/sh worked: the image has a shell"
    else
        ok "ctr run /bin/sh fails (no shell)"
    fi
fi

if ((failures)); then
    log "$failures check(s) FAILED: deploy/Dockerfile and e2e/build-image.sh disagree"
    exit 1
fi
log "PASS: deploy/Dockerfile and e2e/build-image.sh describe the same image ($IMAGE_SIZE_BYTES bytes)"
