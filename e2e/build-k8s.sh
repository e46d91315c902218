#!/usr/bin/env bash
# Builds the e2e control plane (kube-apiserver, kube-scheduler, kubectl, etcd) and the real
# node (kubelet, kube-controller-manager, containerd, ctr, containerd-shim-runc-v2) from the Go
# modules pinned in e2e/versions.env, plus our Go test tools (kubelet-sim, cel-oracle,
# alloc-oracle, api-delay from e2e/harness; cdi-inject from e2e/cdi-inject; nvml-mocks from
# e2e/nvml-mocks, NVIDIA's NVML mock servers as JSON, and fake-nvidia-smi beside it;
# gpu-check-compare from e2e/harness) and NVIDIA's nvidia-cdi-hook and nvidia-ctk (the container
# toolkit's module as published), plus static builds for the e2e/gpu-check.sh kit (kit-runc,
# kit-nvidia-cdi-hook), into a cache directory outside the repo:
#
#   ${GPU_DRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-dra}/k8s-${K8S_VERSION}/bin
#
# Usage: e2e/build-k8s.sh [NAME...]     (default: all twenty-one binaries; NVIDIA's
# gpu-kubelet-plugin, compute-domain-kubelet-plugin, compute-domain-controller and Go e2e suite,
# nvidia-gpu-kubelet-plugin, nvidia-compute-domain-kubelet-plugin, nvidia-compute-domain-controller
# and nvidia-e2e-suite, its BATS suite, nvidia-bats-suite, its chart, nvidia-chart, and its
# templates, nvidia-templates (folders: the module's tests/bats, deployments/helm/
# dra-driver-nvidia-gpu and templates as published), only when named: e2e/nvidia-plugin.sh (its
# two plugins and its controller at once, for e2e/vs-nvidia.sh and the other differentials),
# e2e/nvidia-suite.sh, e2e/helm.sh and e2e/compute-domain-vs-nvidia.sh do)
# A binary is skipped when it exists and its stamp matches (pin + Go version for the upstream
# components; additionally a hash of the harness sources for our tools, of e2e/cdi-inject's
# sources for cdi-inject). Progress goes to stderr; the LAST line of stdout is the bin dir, so
# callers can do BIN=$(e2e/build-k8s.sh | tail -1).
set -euo pipefail

E2E_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=versions.env
source "$E2E_DIR/versions.env"

GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
[[ -x $GO ]] || { echo "build-k8s: no Go toolchain (set GO=/path/to/go)" >&2; exit 1; }
# Never let a go directive trigger a toolchain download: the network only reaches registries.
export GOTOOLCHAIN=local

CACHE=${GPU_DRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-dra}
BIN=$CACHE/k8s-$K8S_VERSION/bin
mkdir -p "$BIN"

log() { echo "build-k8s: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

HARNESS=$E2E_DIR/harness
ETCD_MOD=$E2E_DIR/etcd
CONTAINERD_MOD=$E2E_DIR/containerd
CDI_INJECT_MOD=$E2E_DIR/cdi-inject
NVML_MOCKS_MOD=$E2E_DIR/nvml-mocks
# NVIDIA's DRA driver, built from its module with the reviewed local changes in this patch.
NVIDIA_DRA_PATCH=$E2E_DIR/nvidia-driver/$NVIDIA_DRA_VERSION.patch
GOVERSION=$("$GO" env GOVERSION)

# The go.mod files are what the build really uses; refuse to build when they disagree with
# versions.env, so the pins cannot silently drift apart.
check_pins() {
    grep -qE "^\s*k8s\.io/kubernetes ${K8S_VERSION}( |$)" "$HARNESS/go.mod" \
        || die "e2e/harness/go.mod does not require k8s.io/kubernetes $K8S_VERSION (versions.env)"
    local bad
    bad=$(grep -E '^\s*k8s\.io/[a-z0-9-]+ => k8s\.io/' "$HARNESS/go.mod" | grep -v " ${K8S_STAGING_VERSION}\$" || true)
    [[ -z $bad ]] || die "staging replaces not at $K8S_STAGING_VERSION in e2e/harness/go.mod:"$'\n'"$bad"
    grep -qE "^\s*go\.etcd\.io/etcd/server/v3 ${ETCD_VERSION}( |$)" "$ETCD_MOD/go.mod" \
        || die "e2e/etcd/go.mod does not require go.etcd.io/etcd/server/v3 $ETCD_VERSION (versions.env)"
    grep -qE "^\s*github\.com/containerd/containerd/v2 ${CONTAINERD_VERSION}( |$)" "$CONTAINERD_MOD/go.mod" \
        || die "e2e/containerd/go.mod does not require github.com/containerd/containerd/v2 $CONTAINERD_VERSION (versions.env)"
    grep -qE "^require github\.com/NVIDIA/go-nvml ${GO_NVML_VERSION}$" "$NVML_MOCKS_MOD/go.mod" \
        || die "e2e/nvml-mocks/go.mod does not require github.com/NVIDIA/go-nvml $GO_NVML_VERSION (versions.env)"
    # cdi-inject must see our CDI specs through the CDI library our containerd is built with.
    local mod ours theirs
    for mod in tags.cncf.io/container-device-interface tags.cncf.io/container-device-interface/specs-go \
        github.com/opencontainers/runtime-spec; do
        ours=$(awk -v m="$mod" '$1 == m { print $2 }' "$CDI_INJECT_MOD/go.mod")
        theirs=$(awk -v m="$mod" '$1 == m { print $2 }' "$CONTAINERD_MOD/go.mod")
        [[ -n $ours && $ours == "$theirs" ]] \
            || die "e2e/cdi-inject/go.mod has $mod '${ours:-none}', e2e/containerd/go.mod '${theirs:-none}'"
    done
}
check_pins

minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
# Same variables hack/lib/version.sh sets, so `--version` and the emulation/compatibility
# version defaults match a release build.
K8S_LDFLAGS="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    K8S_LDFLAGS+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    K8S_LDFLAGS+=" -X $pkg.gitTreeState=clean"
done

sources_hash() {
    # Every input of a module's tools: its module files, all its non-test Go sources and the
    # files they embed (*.tsv).
    (cd "$1" && find . \( -name '*.go' ! -name '*_test.go' -o -name '*.tsv' \) -print0 | LC_ALL=C sort -z \
        | xargs -0 sha256sum; sha256sum go.mod go.sum) | sha256sum | cut -d' ' -f1
}
tools_hash() { sources_hash "$HARNESS"; }

stamp_for() {
    case $1 in
        kube-apiserver | kube-scheduler | kubectl | kubelet | kube-controller-manager) echo "$K8S_VERSION $GOVERSION $K8S_LDFLAGS" ;;
        etcd) echo "$ETCD_VERSION $GOVERSION" ;;
        containerd | containerd-shim-runc-v2 | ctr) echo "$CONTAINERD_VERSION $GOVERSION" ;;
        kubelet-sim | cel-oracle | alloc-oracle | api-delay | gpu-check-compare) echo "$K8S_VERSION $GOVERSION $(tools_hash)" ;;
        cdi-inject) echo "$GOVERSION $(sources_hash "$CDI_INJECT_MOD")" ;;
        nvidia-cdi-hook | nvidia-ctk) echo "$NVIDIA_CTK_VERSION $GOVERSION" ;;
        nvml-mocks | fake-nvidia-smi) echo "$GOVERSION $(sources_hash "$NVML_MOCKS_MOD")" ;;
        kit-nvidia-cdi-hook) echo "$NVIDIA_CTK_VERSION $GOVERSION static" ;;
        kit-runc) echo "$RUNC_VERSION $GOVERSION static" ;;
        nvidia-gpu-kubelet-plugin | nvidia-compute-domain-kubelet-plugin | nvidia-compute-domain-controller | nvidia-e2e-suite)
            echo "$NVIDIA_DRA_VERSION $K8S_VERSION $GOVERSION $(sha256sum <"$NVIDIA_DRA_PATCH" | cut -d' ' -f1)" ;;
        nvidia-bats-suite | nvidia-chart | nvidia-templates) echo "$NVIDIA_DRA_VERSION" ;;
        *) die "unknown binary '$1'" ;;
    esac
}

up_to_date() { [[ -x $BIN/$1 && -f $BIN/.$1.stamp && "$(cat "$BIN/.$1.stamp")" == "$2" ]]; }

# Serialize concurrent callers (parallel test jobs) on the same cache.
exec 9>"$BIN/.lock"
flock 9

ALL=(kube-apiserver kube-scheduler kubectl etcd kubelet-sim cel-oracle alloc-oracle api-delay cdi-inject
    kubelet kube-controller-manager containerd containerd-shim-runc-v2 ctr nvidia-cdi-hook nvidia-ctk nvml-mocks
    fake-nvidia-smi gpu-check-compare kit-nvidia-cdi-hook kit-runc)
WANT=("$@")
[[ ${#WANT[@]} -gt 0 ]] || WANT=("${ALL[@]}")

declare -A STAMP
k8s_pkgs=() tool_pkgs=() containerd_pkgs=() need_etcd= need_cdi_inject= ctk_pkgs=() need_nvml_mocks=
need_fake_smi= static_pkgs=() need_nvidia_dra= nvidia_dra_bins=() nvidia_folders=()
for name in "${WANT[@]}"; do
    STAMP[$name]=$(stamp_for "$name")
    if up_to_date "$name" "${STAMP[$name]}"; then
        log "$name up to date"
        continue
    fi
    case $name in
        kube-apiserver | kube-scheduler | kubectl | kubelet | kube-controller-manager) k8s_pkgs+=("k8s.io/kubernetes/cmd/$name") ;;
        etcd) need_etcd=1 ;;
        containerd | containerd-shim-runc-v2 | ctr) containerd_pkgs+=("github.com/containerd/containerd/v2/cmd/$name") ;;
        cdi-inject) need_cdi_inject=1 ;;
        nvidia-cdi-hook | nvidia-ctk) ctk_pkgs+=("github.com/NVIDIA/nvidia-container-toolkit/cmd/$name@$NVIDIA_CTK_VERSION") ;;
        nvml-mocks) need_nvml_mocks=1 ;;
        fake-nvidia-smi) need_fake_smi=1 ;;
        kit-nvidia-cdi-hook) static_pkgs+=("github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook@$NVIDIA_CTK_VERSION") ;;
        kit-runc) static_pkgs+=("github.com/opencontainers/runc@$RUNC_VERSION") ;;
        nvidia-gpu-kubelet-plugin | nvidia-compute-domain-kubelet-plugin | nvidia-compute-domain-controller | nvidia-e2e-suite)
            need_nvidia_dra=1 nvidia_dra_bins+=("$name") ;;
        nvidia-bats-suite | nvidia-chart | nvidia-templates) nvidia_folders+=("$name") ;;
        *) tool_pkgs+=("./cmd/$name") ;;
    esac
done

# Build into a temp dir and move into place, so an interrupted build never leaves a binary
# that looks current.
TMP=$(mktemp -d "$BIN/.build.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

install_bins() {
    local name
    for name in "$@"; do
        # A folder (nvidia-bats-suite, nvidia-chart) replaces the old one, not goes inside it.
        [[ -d $BIN/$name ]] && rm -rf "${BIN:?}/$name"
        mv -f "$TMP/$name" "$BIN/$name"
        echo "${STAMP[$name]}" >"$BIN/.$name.stamp"
    done
}

timed() {
    local start=$SECONDS
    "$@"
    log "  took $((SECONDS - start))s"
}

if [[ ${#k8s_pkgs[@]} -gt 0 ]]; then
    log "building ${k8s_pkgs[*]##*/} $K8S_VERSION (cold: tens of minutes on 2 cores)"
    (cd "$HARNESS" && timed "$GO" build -trimpath -buildvcs=false -ldflags "$K8S_LDFLAGS" -o "$TMP/" "${k8s_pkgs[@]}")
    install_bins "${k8s_pkgs[@]##*/}"
fi

if [[ -n $need_etcd ]]; then
    log "building etcd $ETCD_VERSION"
    (cd "$ETCD_MOD" && timed "$GO" build -trimpath -buildvcs=false -ldflags "-s -w" -o "$TMP/etcd" go.etcd.io/etcd/server/v3)
    install_bins etcd
fi

if [[ ${#containerd_pkgs[@]} -gt 0 ]]; then
    log "building ${containerd_pkgs[*]##*/} $CONTAINERD_VERSION"
    # Static, as containerd's release builds are; the shim must not depend on the host's libc.
    (cd "$CONTAINERD_MOD" && CGO_ENABLED=0 timed "$GO" build -trimpath -buildvcs=false \
        -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
        -o "$TMP/" "${containerd_pkgs[@]}")
    install_bins "${containerd_pkgs[@]##*/}"
fi

if [[ ${#tool_pkgs[@]} -gt 0 ]]; then
    log "building ${tool_pkgs[*]##*/}"
    (cd "$HARNESS" && timed "$GO" build -trimpath -buildvcs=false -ldflags "-s -w" -o "$TMP/" "${tool_pkgs[@]}")
    install_bins "${tool_pkgs[@]##*/}"
fi

if [[ -n $need_cdi_inject ]]; then
    log "building cdi-inject"
    (cd "$CDI_INJECT_MOD" && timed "$GO" build -trimpath -buildvcs=false -ldflags "-s -w" -o "$TMP/cdi-inject" .)
    install_bins cdi-inject
fi

if [[ -n $need_nvml_mocks ]]; then
    log "building nvml-mocks"
    # cgo: go-nvml's package has NVML's header; its deprecation warnings are noise.
    (cd "$NVML_MOCKS_MOD" && timed "$GO" build -trimpath -buildvcs=false -ldflags "-s -w" -o "$TMP/nvml-mocks" . 2>&1 \
        | grep -v -e 'is deprecated' -e '^cgo-gcc-prolog' -e 'declared here' -e '^ *[0-9]* |' -e '^ *|' \
            -e '^# github.com/NVIDIA/go-nvml' -e '^In file included from' >&2 || true)
    [[ -x $TMP/nvml-mocks ]] || die "nvml-mocks did not build"
    install_bins nvml-mocks
fi

if [[ -n $need_fake_smi ]]; then
    log "building fake-nvidia-smi"
    (cd "$NVML_MOCKS_MOD" && timed "$GO" build -trimpath -buildvcs=false -ldflags "-s -w" -o "$TMP/fake-nvidia-smi" ./fake-nvidia-smi 2>&1 \
        | grep -v -e 'is deprecated' -e '^cgo-gcc-prolog' -e 'declared here' -e '^ *[0-9]* |' -e '^ *|' \
            -e '^# github.com/NVIDIA/go-nvml' -e '^In file included from' >&2 || true)
    [[ -x $TMP/fake-nvidia-smi ]] || die "fake-nvidia-smi did not build"
    install_bins fake-nvidia-smi
fi

if [[ ${#static_pkgs[@]} -gt 0 ]]; then
    # For the e2e/gpu-check.sh kit, copied to machines whose glibc may be older than ours: linked
    # statically (cgo against static glibc; runc without seccomp, the hook's NVML dlopen unused
    # by the hooks the kit runs).
    for pkg in "${static_pkgs[@]}"; do
        name=${pkg%@*}; name=kit-${name##*/}
        log "building $name (static)"
        mkdir -p "$TMP/$name.d"
        (cd "$TMP/$name.d" && GOFLAGS= GOBIN=$TMP/$name.d CGO_ENABLED=1 timed "$GO" install -trimpath -buildvcs=false \
            -tags "netgo osusergo" -ldflags "-s -w -linkmode external -extldflags -static" "$pkg" 2>&1 \
            | grep -v -e 'is deprecated' -e '^cgo-gcc-prolog' -e 'declared here' -e '^ *[0-9]* |' -e '^ *|' \
                -e '^# github.com/NVIDIA/go-nvml' -e '^In file included from' -e 'statically linked applications' \
                -e 'in function' -e '^# github.com/' >&2 || true)
        built=$(find "$TMP/$name.d" -maxdepth 1 -type f -perm -u+x | head -1)
        [[ -n $built && $(LC_ALL=C readelf -l "$built") != *INTERP* ]] || die "$name did not build statically"
        mv "$built" "$TMP/$name"
        install_bins "$name"
    done
fi

if [[ ${#ctk_pkgs[@]} -gt 0 ]]; then
    log "building ${ctk_pkgs[*]##*/}"
    # Outside any module: the pin alone selects what is built. cgo, as NVIDIA ships them: they
    # dlopen the driver root's libnvidia-ml.so.1. NVML's deprecation warnings are noise.
    (cd "$TMP" && GOFLAGS= GOBIN=$TMP timed "$GO" install -trimpath -buildvcs=false -ldflags "-s -w" "${ctk_pkgs[@]}" 2>&1 \
        | grep -v -e 'is deprecated' -e '^cgo-gcc-prolog' -e 'declared here' -e '^ *[0-9]* |' -e '^ *|' \
            -e '^# github.com/NVIDIA/go-nvml' -e '^In file included from' >&2 || true)
    names=("${ctk_pkgs[@]##*/}")
    names=("${names[@]%@*}")
    for name in "${names[@]}"; do
        [[ -x $TMP/$name ]] || die "$name $NVIDIA_CTK_VERSION did not build"
    done
    install_bins "${names[@]}"
fi

if [[ -n $need_nvidia_dra ]]; then
    log "building NVIDIA's ${nvidia_dra_bins[*]} $NVIDIA_DRA_VERSION (with e2e/nvidia-driver/$NVIDIA_DRA_VERSION.patch)"
    src=$("$GO" mod download -json "sigs.k8s.io/dra-driver-nvidia-gpu@$NVIDIA_DRA_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
    [[ -d $src ]] || die "the Go module proxy did not serve sigs.k8s.io/dra-driver-nvidia-gpu@$NVIDIA_DRA_VERSION"
    cp -r "$src" "$TMP/nvidia-dra"
    chmod -R u+w "$TMP/nvidia-dra"
    # -E: the patch removes a file.
    (cd "$TMP/nvidia-dra" && patch -p1 -s -E <"$NVIDIA_DRA_PATCH") || die "e2e/nvidia-driver/$NVIDIA_DRA_VERSION.patch does not apply"
    # cgo (go-nvml dlopens libnvidia-ml.so.1, as NVIDIA ships it); NVML's deprecation warnings are noise.
    (cd "$TMP/nvidia-dra" && GOFLAGS=-mod=mod "$GO" mod tidy >/dev/null 2>&1) || die "go mod tidy of NVIDIA's driver failed"
    for name in "${nvidia_dra_bins[@]}"; do
        case $name in
            # One checkout, one go.mod, one Go build cache: after the gpu plugin the compute-domain
            # binaries compile little of their own (2 cores, empty Go cache: gpu plugin ~2 min,
            # then ~40 s for both, nearly all the controller's; packages cached: ~6 s, linking).
            nvidia-gpu-kubelet-plugin | nvidia-compute-domain-kubelet-plugin | nvidia-compute-domain-controller)
                build=(build -o "$TMP/$name" "./cmd/${name#nvidia-}") ;;
            # Its Go e2e suite (Ginkgo), as `go test -c -tags=e2e` makes it.
            nvidia-e2e-suite) build=(test -c -tags=e2e -o "$TMP/$name" ./test/e2e) ;;
        esac
        (cd "$TMP/nvidia-dra" && timed "$GO" "${build[0]}" -trimpath -buildvcs=false -ldflags "-s -w" "${build[@]:1}" 2>&1 \
            | grep -v -e 'is deprecated' -e '^cgo-gcc-prolog' -e 'declared here' -e '^ *[0-9]* |' -e '^ *|' \
                -e '^# github.com/NVIDIA/go-nvml' -e '^In file included from' >&2 || true)
        [[ -x $TMP/$name ]] || die "NVIDIA's $name $NVIDIA_DRA_VERSION did not build"
        install_bins "$name"
    done
fi

if ((${#nvidia_folders[@]})); then
    # NVIDIA's BATS suite, chart and templates, unchanged (e2e/nvidia-suite.sh copies the suite
    # and names its adapters; e2e/helm.sh renders the chart; e2e/compute-domain-vs-nvidia.sh
    # installs its ComputeDomainClique CRD and gives its controller the templates).
    src=$("$GO" mod download -json "sigs.k8s.io/dra-driver-nvidia-gpu@$NVIDIA_DRA_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
    for name in "${nvidia_folders[@]}"; do
        case $name in
            nvidia-bats-suite) from=tests/bats ;;
            nvidia-chart) from=deployments/helm/dra-driver-nvidia-gpu ;;
            # What its image has at /templates (its compute-domain-controller reads them there).
            nvidia-templates) from=templates ;;
        esac
        [[ -d $src/$from ]] || die "the Go module proxy did not serve sigs.k8s.io/dra-driver-nvidia-gpu@$NVIDIA_DRA_VERSION's $from"
        cp -r "$src/$from" "$TMP/$name"
        chmod -R u+w "$TMP/$name"
        install_bins "$name"
    done
fi

echo "$BIN"
