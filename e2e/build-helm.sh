#!/usr/bin/env bash
# Builds Helm from the helm.sh/helm/v4 Go module at HELM_VERSION (e2e/versions.env) into the
# same cache bin dir as e2e/build-k8s.sh:
#
#   ${GPU_DRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-dra}/k8s-${K8S_VERSION}/bin/helm
#
# Usage: e2e/build-helm.sh
# Skipped when the binary exists and its stamp matches (pin + Go version + ldflags). Progress
# goes to stderr; the LAST line of stdout is the bin dir: BIN=$(e2e/build-helm.sh | tail -1).
set -euo pipefail

E2E_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=versions.env
source "$E2E_DIR/versions.env"
[[ -n ${HELM_VERSION:-} ]] || { echo "build-helm: HELM_VERSION is not set in e2e/versions.env" >&2; exit 1; }

GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
[[ -x $GO ]] || { echo "build-helm: no Go toolchain (set GO=/path/to/go)" >&2; exit 1; }
# Never let a go directive trigger a toolchain download: the network only reaches registries.
export GOTOOLCHAIN=local
# `go install pkg@version` builds the module as published; inherited flags (-mod=vendor, ...)
# would break it.
export GOFLAGS=

CACHE=${GPU_DRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-dra}
BIN=$CACHE/k8s-$K8S_VERSION/bin
mkdir -p "$BIN"

log() { echo "build-helm: $*" >&2; }

# What Helm's Makefile sets, so `helm version` reports the pin instead of a bare "v4.x".
LDFLAGS="-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION"
LDFLAGS+=" -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
STAMP="$HELM_VERSION $("$GO" env GOVERSION) $LDFLAGS"

# Own lock: a long Kubernetes build in the same dir must not hold Helm up.
exec 8>"$BIN/.helm.lock"
flock 8

if [[ -x $BIN/helm && -f $BIN/.helm.stamp && "$(cat "$BIN/.helm.stamp")" == "$STAMP" ]]; then
    log "helm up to date"
else
    # Build into a temp dir and move into place, so an interrupted build never leaves a binary
    # that looks current.
    TMP=$(mktemp -d "$BIN/.build-helm.XXXXXX")
    trap 'rm -rf "$TMP"' EXIT
    log "building helm $HELM_VERSION (cold: a few minutes on 2 cores)"
    start=$SECONDS
    # Outside any module: the pin alone selects what is built.
    (cd "$TMP" && GOBIN=$TMP "$GO" install -trimpath -buildvcs=false -ldflags "$LDFLAGS" \
        "helm.sh/helm/v4/cmd/helm@$HELM_VERSION")
    log "  took $((SECONDS - start))s"
    mv -f "$TMP/helm" "$BIN/helm"
    echo "$STAMP" >"$BIN/.helm.stamp"
fi

echo "$BIN"
