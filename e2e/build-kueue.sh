#!/usr/bin/env bash
# Builds what e2e/kueue.sh runs, pinned, into the same cache bin dir as e2e/build-k8s.sh, with a
# lock of its own (run-tests starts it in the background; the scenario waits for it):
#
#   kueue        Kueue's manager (sigs.k8s.io/kueue/cmd/kueue at KUEUE_VERSION), as its module is
#                published (its own go.mod and go.sum; no local changes)
#   kueue-crds/  its CRDs (config/components/crd/bases in the module)
#
# Usage: e2e/build-kueue.sh   Skipped when built and the stamps match. Progress goes to stderr;
# the LAST line of stdout is the bin dir.
set -euo pipefail

E2E_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=versions.env
source "$E2E_DIR/versions.env"
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
[[ -x $GO ]] || { echo "build-kueue: no Go toolchain (set GO=/path/to/go)" >&2; exit 1; }
export GOTOOLCHAIN=local GOFLAGS=
CACHE=${GPU_DRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-dra}
BIN=$CACHE/k8s-$K8S_VERSION/bin
mkdir -p "$BIN"
log() { echo "build-kueue: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

exec 7>"$BIN/.kueue.lock"
flock 7

stamp="$KUEUE_VERSION $("$GO" env GOVERSION)"
current() { [[ -e $BIN/$1 && -f $BIN/.$1.stamp && "$(cat "$BIN/.$1.stamp")" == "$stamp" ]]; }
if current kueue && current kueue-crds; then
    log "kueue up to date"
    echo "$BIN"
    exit 0
fi

TMP=$(mktemp -d "$BIN/.build-kueue.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
log "building kueue (Kueue $KUEUE_VERSION manager; cold: ~6 minutes on 2 cores)"
start=$SECONDS
src=$("$GO" mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
[[ -d $src ]] || die "the Go module proxy did not serve sigs.k8s.io/kueue@$KUEUE_VERSION"
# `go install pkg@version` builds the module as published: its go.mod and go.sum, no replace.
GOBIN=$TMP "$GO" install -trimpath -ldflags "-s -w" "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
mkdir -p "$TMP/kueue-crds"
cp "$src"/config/components/crd/bases/*.yaml "$TMP/kueue-crds/"
chmod -R u+w "$TMP/kueue-crds"
rm -rf "${BIN:?}/kueue-crds"
mv -f "$TMP/kueue" "$TMP/kueue-crds" "$BIN/"
echo "$stamp" >"$BIN/.kueue.stamp"
echo "$stamp" >"$BIN/.kueue-crds.stamp"
log "  took $((SECONDS - start))s"
echo "$BIN"
