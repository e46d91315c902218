#!/usr/bin/env bash
# Builds the chart tests' tools from their Go modules, each as published, into the same cache bin
# dir as e2e/build-k8s.sh, with a lock of its own (a long Kubernetes build must not hold them up,
# nor they it):
#
#   helm      helm.sh/helm/v4 at HELM_VERSION (e2e/versions.env)
#   promtool  github.com/prometheus/prometheus at PROMETHEUS_VERSION (e2e/alerts.sh)
#
#   ${GPU_DRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-dra}/k8s-${K8S_VERSION}/bin/NAME
#
# Usage: e2e/build-helm.sh [helm|promtool]   (default helm)
# Skipped when the binary exists and its stamp matches (pin + Go version + ldflags). Progress
# goes to stderr; the LAST line of stdout is the bin dir: BIN=$(e2e/build-helm.sh | tail -1).
set -euo pipefail

E2E_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=versions.env
source "$E2E_DIR/versions.env"
TOOL=${1:-helm}
case $TOOL in
    helm) VERSION=${HELM_VERSION:-} PACKAGE=helm.sh/helm/v4/cmd/helm ;;
    promtool) VERSION=${PROMETHEUS_VERSION:-} PACKAGE=github.com/prometheus/prometheus/cmd/promtool ;;
    *) echo "build-helm: unknown tool '$TOOL' (helm or promtool)" >&2; exit 1 ;;
esac
[[ -n $VERSION ]] || { echo "build-helm: no version for $TOOL in e2e/versions.env" >&2; exit 1; }

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

LDFLAGS="-s -w"
# What Helm's Makefile sets, so `helm version` reports the pin instead of a bare "v4.x".
[[ $TOOL != helm ]] || LDFLAGS+=" -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
# promtool's service discovery plugins (the cloud providers' SDKs: most of its build) serve no
# rule check or rule test; Prometheus' own build tag leaves them out.
TAGS=
[[ $TOOL != promtool ]] || TAGS=remove_all_sd
STAMP="$VERSION $("$GO" env GOVERSION) $LDFLAGS${TAGS:+ tags $TAGS}"

exec 8>"$BIN/.$TOOL.lock"
flock 8

if [[ -x $BIN/$TOOL && -f $BIN/.$TOOL.stamp && "$(cat "$BIN/.$TOOL.stamp")" == "$STAMP" ]]; then
    log "$TOOL up to date"
else
    # Build into a temp dir and move into place, so an interrupted build never leaves a binary
    # that looks current.
    TMP=$(mktemp -d "$BIN/.build-$TOOL.XXXXXX")
    trap 'rm -rf "$TMP"' EXIT
    log "building $TOOL $VERSION (cold: minutes on 2 cores)"
    start=$SECONDS
    # Outside any module: the pin alone selects what is built. Both are pure Go.
    (cd "$TMP" && GOBIN=$TMP CGO_ENABLED=0 "$GO" install -trimpath -buildvcs=false -tags "$TAGS" -ldflags "$LDFLAGS" \
        "$PACKAGE@$VERSION")
    log "  took $((SECONDS - start))s"
    mv -f "$TMP/$TOOL" "$BIN/$TOOL"
    echo "$STAMP" >"$BIN/.$TOOL.stamp"
fi

echo "$BIN"
