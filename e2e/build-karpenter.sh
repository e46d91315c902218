#!/usr/bin/env bash
# Builds what e2e/karpenter.sh runs, pinned, into the same cache bin dir as e2e/build-k8s.sh,
# with a lock of its own (run-tests starts it in the background; the scenario waits for it):
#
#   karpenter-gpu   Karpenter KARPENTER_VERSION with its kwok cloud provider, whose instance
#                   types carry gpu-dra's ResourceSlice templates (module e2e/karpenter)
#   kwok            sigs.k8s.io/kwok/cmd/kwok at KWOK_VERSION: the nodes' simulated kubelet
#   karpenter-crds/ the CRDs Karpenter and its kwok provider need, from the module as published
#   kwok-stages.yaml kwok's fast node and pod stages (the bare binary loads none)
#
# Usage: e2e/build-karpenter.sh   Skipped when built and the stamps match. Progress goes to
# stderr; the LAST line of stdout is the bin dir.
set -euo pipefail

E2E_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=versions.env
source "$E2E_DIR/versions.env"
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
[[ -x $GO ]] || { echo "build-karpenter: no Go toolchain (set GO=/path/to/go)" >&2; exit 1; }
export GOTOOLCHAIN=local GOFLAGS=
CACHE=${GPU_DRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-dra}
BIN=$CACHE/k8s-$K8S_VERSION/bin
mkdir -p "$BIN"
MOD=$E2E_DIR/karpenter
log() { echo "build-karpenter: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

grep -qE "^require sigs\.k8s\.io/karpenter ${KARPENTER_VERSION}$" "$MOD/go.mod" \
    || grep -qE "^\s+sigs\.k8s\.io/karpenter ${KARPENTER_VERSION}$" "$MOD/go.mod" \
    || die "e2e/karpenter/go.mod does not require sigs.k8s.io/karpenter $KARPENTER_VERSION (versions.env)"

exec 7>"$BIN/.karpenter.lock"
flock 7

GOVERSION=$("$GO" env GOVERSION)
sources=$(cd "$MOD" && cat go.mod go.sum ./*.go | sha256sum | cut -d' ' -f1)
stamp_karpenter="$KARPENTER_VERSION $GOVERSION $sources"
stamp_kwok="$KWOK_VERSION $GOVERSION"
current() { [[ -e $BIN/$1 && -f $BIN/.$1.stamp && "$(cat "$BIN/.$1.stamp")" == "$2" ]]; }

TMP=$(mktemp -d "$BIN/.build-karpenter.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
module_dir() { "$GO" mod download -json "$1" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p'; }

if current karpenter-gpu "$stamp_karpenter" && current karpenter-crds "$stamp_karpenter"; then
    log "karpenter-gpu up to date"
else
    log "building karpenter-gpu (Karpenter $KARPENTER_VERSION, kwok provider; cold: minutes on 2 cores)"
    start=$SECONDS
    (cd "$MOD" && "$GO" build -trimpath -buildvcs=false -ldflags "-s -w" -o "$TMP/karpenter-gpu" .)
    src=$(module_dir "sigs.k8s.io/karpenter@$KARPENTER_VERSION")
    [[ -d $src ]] || die "the Go module proxy did not serve sigs.k8s.io/karpenter@$KARPENTER_VERSION"
    mkdir -p "$TMP/karpenter-crds"
    cp "$src/pkg/apis/crds/karpenter.sh_nodepools.yaml" "$src/pkg/apis/crds/karpenter.sh_nodeclaims.yaml" \
        "$src/pkg/apis/crds/karpenter.sh_nodeoverlays.yaml" \
        "$src/kwok/apis/crds/karpenter.kwok.sh_kwoknodeclasses.yaml" "$TMP/karpenter-crds/"
    chmod -R u+w "$TMP/karpenter-crds"
    rm -rf "${BIN:?}/karpenter-crds"
    mv -f "$TMP/karpenter-gpu" "$TMP/karpenter-crds" "$BIN/"
    echo "$stamp_karpenter" >"$BIN/.karpenter-gpu.stamp"
    echo "$stamp_karpenter" >"$BIN/.karpenter-crds.stamp"
    log "  took $((SECONDS - start))s"
fi

if current kwok "$stamp_kwok" && current kwok-stages.yaml "$stamp_kwok"; then
    log "kwok up to date"
else
    log "building kwok $KWOK_VERSION"
    start=$SECONDS
    GOBIN=$TMP "$GO" install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
    src=$(module_dir "sigs.k8s.io/kwok@$KWOK_VERSION")
    [[ -d $src ]] || die "the Go module proxy did not serve sigs.k8s.io/kwok@$KWOK_VERSION"
    for stage in node/fast/node-initialize pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
        cat "$src/kustomize/stage/$stage.yaml"
        echo "---"
    done >"$TMP/kwok-stages.yaml"
    mv -f "$TMP/kwok" "$TMP/kwok-stages.yaml" "$BIN/"
    echo "$stamp_kwok" >"$BIN/.kwok.stamp"
    echo "$stamp_kwok" >"$BIN/.kwok-stages.yaml.stamp"
    log "  took $((SECONDS - start))s"
fi
echo "$BIN"
