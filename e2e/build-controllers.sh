#!/usr/bin/env bash
# Builds the workload controllers the e2e scenarios run, pinned (e2e/versions.env), into the
# same cache bin dir as e2e/build-k8s.sh, with a lock of its own (run-tests starts it in the
# background; e2e/kueue.sh and e2e/workloads.sh wait for it):
#
#   kueue, kueue-crds/            Kueue's manager (sigs.k8s.io/kueue/cmd/kueue) and its CRDs
#   mpi-operator, mpi-operator-crds/   the MPI operator (github.com/kubeflow/mpi-operator
#                                 cmd/mpi-operator) and its MPIJob CRD
#   jobset, jobset-config/        JobSet's manager and its config/components (crd, webhook)
#   lws, lws-config/              LeaderWorkerSet's manager and its config (crd, webhook)
#
# The versions are the ones Kueue KUEUE_VERSION itself requires (its integrations are compiled
# against their APIs), so all four share one set of Kubernetes libraries and the Go build cache
# compiles them once: e2e/controllers/go.mod builds Kueue and the MPI operator with exactly the
# module versions Kueue's own go.mod selects (checked below); e2e/controllers/jobset-lws/go.mod
# builds JobSet and LWS with the same versions except controller-runtime, which stays at the
# release both of them require (v0.22: their webhook code does not compile against Kueue's
# v0.23). Nothing of their code changes. Cold on 2 cores: Kueue ~6 minutes, the other three
# ~1 minute more; with Kueue's packages cached, the three take ~10 s.
#
# Usage: e2e/build-controllers.sh   Skipped when built and the stamps match. Progress goes to
# stderr; the LAST line of stdout is the bin dir.
set -euo pipefail

E2E_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=versions.env
source "$E2E_DIR/versions.env"
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
[[ -x $GO ]] || { echo "build-controllers: no Go toolchain (set GO=/path/to/go)" >&2; exit 1; }
export GOTOOLCHAIN=local GOFLAGS=
CACHE=${GPU_DRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-dra}
BIN=$CACHE/k8s-$K8S_VERSION/bin
mkdir -p "$BIN"
MOD=$E2E_DIR/controllers
log() { echo "build-controllers: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# The go.mod files are what the build uses: refuse when they disagree with versions.env.
requires() { # go.mod, module, version
    grep -qE "^\s*$2 $3( |$)" "$1" || die "${1#"$E2E_DIR/../"} does not require $2 $3 (e2e/versions.env)"
}
requires "$MOD/go.mod" sigs.k8s.io/kueue "$KUEUE_VERSION"
requires "$MOD/go.mod" github.com/kubeflow/mpi-operator "$MPI_OPERATOR_VERSION"
requires "$MOD/jobset-lws/go.mod" sigs.k8s.io/kueue "$KUEUE_VERSION"
requires "$MOD/jobset-lws/go.mod" sigs.k8s.io/jobset "$JOBSET_VERSION"
requires "$MOD/jobset-lws/go.mod" sigs.k8s.io/lws "$LWS_VERSION"

exec 7>"$BIN/.controllers.lock"
flock 7

mods_hash=$(cat "$MOD/go.mod" "$MOD/go.sum" "$MOD/jobset-lws/go.mod" "$MOD/jobset-lws/go.sum" | sha256sum | cut -d' ' -f1)
stamp="$KUEUE_VERSION $MPI_OPERATOR_VERSION $JOBSET_VERSION $LWS_VERSION $("$GO" env GOVERSION) $mods_hash"
NAMES=(kueue kueue-crds mpi-operator mpi-operator-crds jobset jobset-config lws lws-config)
current() { [[ -e $BIN/$1 && -f $BIN/.$1.stamp && "$(cat "$BIN/.$1.stamp")" == "$stamp" ]]; }
all_current=1
for name in "${NAMES[@]}"; do current "$name" || all_current=; done
if [[ -n $all_current ]]; then
    log "kueue, mpi-operator, jobset, lws up to date"
    echo "$BIN"
    exit 0
fi

TMP=$(mktemp -d "$BIN/.build-controllers.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
module_dir() { "$GO" mod download -json "$1" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p'; }
kueue_src=$(module_dir "sigs.k8s.io/kueue@$KUEUE_VERSION")
[[ -d $kueue_src ]] || die "the Go module proxy did not serve sigs.k8s.io/kueue@$KUEUE_VERSION"

# Kueue as published: every module its manager compiles from at the version its own go.mod
# selects, in our module as in its own.
deps() { "$GO" list -deps -f '{{with .Module}}{{.Path}}@{{.Version}}{{end}}' "$1" | grep -v '^sigs.k8s.io/kueue@' | sort -u; }
ours=$(cd "$MOD" && deps sigs.k8s.io/kueue/cmd/kueue) || die "go list of Kueue in e2e/controllers failed"
theirs=$(cd "$kueue_src" && deps ./cmd/kueue) || die "go list of Kueue in its own module failed"
[[ $ours == "$theirs" ]] || die "e2e/controllers/go.mod builds Kueue with other versions than its own go.mod:"$'\n'"$(diff <(echo "$theirs") <(echo "$ours"))"

start=$SECONDS
log "building kueue $KUEUE_VERSION and mpi-operator $MPI_OPERATOR_VERSION (cold: ~6 minutes on 2 cores)"
(cd "$MOD" && "$GO" build -trimpath -buildvcs=false -ldflags "-s -w" -o "$TMP/" \
    sigs.k8s.io/kueue/cmd/kueue github.com/kubeflow/mpi-operator/cmd/mpi-operator) || die "building Kueue or the MPI operator failed"
log "building jobset $JOBSET_VERSION and lws $LWS_VERSION"
(cd "$MOD/jobset-lws" && "$GO" build -trimpath -buildvcs=false -ldflags "-s -w" -o "$TMP/jobset" sigs.k8s.io/jobset \
    && "$GO" build -trimpath -buildvcs=false -ldflags "-s -w" -o "$TMP/lws" sigs.k8s.io/lws/cmd) || die "building JobSet or LWS failed"

copy() { # module@version, folder in it, name
    local src
    src=$(module_dir "$1")
    [[ -d $src/$2 ]] || die "the Go module proxy did not serve $1's $2"
    mkdir -p "$TMP/$3"
    cp -r "$src/$2"/. "$TMP/$3/"
}
copy "sigs.k8s.io/kueue@$KUEUE_VERSION" config/components/crd/bases kueue-crds
copy "github.com/kubeflow/mpi-operator@$MPI_OPERATOR_VERSION" manifests/base mpi-operator-crds
find "$TMP/mpi-operator-crds" -type f ! -name 'kubeflow.org_*.yaml' -delete
# kustomize folders, rendered by `kubectl kustomize` where they are applied.
copy "sigs.k8s.io/jobset@$JOBSET_VERSION" config/components jobset-config
copy "sigs.k8s.io/lws@$LWS_VERSION" config lws-config
chmod -R u+w "$TMP"
for name in "${NAMES[@]}"; do
    rm -rf "${BIN:?}/$name"
    mv -f "$TMP/$name" "$BIN/"
    echo "$stamp" >"$BIN/.$name.stamp"
done
log "  took $((SECONDS - start))s"
echo "$BIN"
