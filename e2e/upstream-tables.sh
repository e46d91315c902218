#!/usr/bin/env bash
# Kubernetes' own test tables run against gpu-dra's code, from the pinned
# k8s.io/dynamic-resource-allocation module:
#   allocator: structured/internal/allocatortesting (the cases its stable, incubating and
#              experimental allocators must pass, the lexicographical-order ones and the
#              interruption cases), against crates/dra-allocator (its allocate_json example),
#              with `gpu-dra explain` run on every case too (same decision, no failure);
#   cel:       cel/compile_test.go's testcases (compile errors, cost estimates, matches and
#              evaluation errors), against crates/dra-cel (its cel_case example).
# Both tables are internal to their module (an internal package, a test variable), so the
# module is copied to a scratch folder and e2e/upstream-tables/*_gpudra_test.go are placed
# inside the copy; nothing upstream is changed.
#
# Usage: e2e/upstream-tables.sh [allocator|cel] [go test flags, e.g. -run 'TestUpstreamAllocatorTable/NAME' -v]
# ALLOCATE_JSON and CEL_CASE name built examples (e2e/run-tests passes the ones `cargo test`
# built); without them they are built here. ALLOCATE_JSON_DUMP=DIR keeps each allocator call's
# request and answer, for chasing a difference by hand.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
# shellcheck source=versions.env
source "$HERE/versions.env"

tables=(allocator cel)
if [[ ${1:-} == allocator || ${1:-} == cel ]]; then
    tables=("$1")
    shift
fi

example() { # crate example variable
    local bin=${!3:-}
    if [[ -z $bin ]]; then
        cargo build --quiet --locked --manifest-path "$ROOT/Cargo.toml" -p "$1" --example "$2"
        bin="$ROOT/target/debug/examples/$2"
    fi
    [[ -x $bin ]] || { echo "e2e/upstream-tables: $bin is not an executable $2" >&2; exit 1; }
    echo "$bin"
}

module=$(cd "$HERE/harness" && GOTOOLCHAIN=${GOTOOLCHAIN:-local} go list -m -f '{{.Dir}}' "k8s.io/dynamic-resource-allocation")
[[ $module == *"@$K8S_STAGING_VERSION" ]] || {
    echo "e2e/upstream-tables: the harness resolves $module, not $K8S_STAGING_VERSION" >&2
    exit 1
}
work=$(mktemp -d "${TMPDIR:-/tmp}/upstream-tables.XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
cp -r "$module/." "$work/"
chmod -R u+w "$work"

# run TABLE PACKAGE TEST ENV=VALUE -- go test flags: runs one table, prints its count line.
run() {
    local table=$1 package=$2 test=$3 env=$4
    shift 4
    local log="$work/$table.log"
    if ! (cd "$work" && env "$env" GOTOOLCHAIN="${GOTOOLCHAIN:-local}" GOFLAGS=-mod=mod \
        go test -count=1 -v -run "^$test\$" "./$package/" "$@") >"$log" 2>&1; then
        # The failing cases' output (gomega's diffs), without the passing ones' chatter.
        awk '/^=== RUN/ { buf = $0 "\n"; next } { buf = buf $0 "\n" } /--- FAIL/ { printf "%s", buf; buf = "" }' "$log" >&2
        tail -n 5 "$log" >&2
        echo "e2e/upstream-tables: Kubernetes' $table test table fails on gpu-dra (above)" >&2
        exit 1
    fi
    # Cases: the table's leaves (a case's feature combinations count once, with the case).
    local passed skipped line
    passed=$(grep -E -- "^    --- PASS: $test/" "$log" | grep -vc -- "/interrupt (" || true)
    passed=$((passed + $(grep -cE -- "^        --- PASS: $test/interrupt/" "$log" || true)))
    skipped=$({ grep -E -- "^    --- SKIP: $test/" "$log" || true; } | sed -E "s/.*$test\\/([^ ]*).*/\\1/" | paste -sd, -)
    line="upstream $table table (k8s.io/dynamic-resource-allocation $K8S_STAGING_VERSION): $passed cases pass on gpu-dra"
    [[ -n $skipped ]] && line+="; skipped: $skipped"
    echo "$line"
    if [[ -n ${GPU_DRA_TEST_REPORT:-} ]]; then echo "$line" >>"$GPU_DRA_TEST_REPORT"; fi
}

for table in "${tables[@]}"; do
    case $table in
        allocator)
            bin=$(example dra-allocator allocate_json ALLOCATE_JSON)
            [[ -d $work/structured/internal/allocatortesting ]] || {
                echo "e2e/upstream-tables: $module has no structured/internal/allocatortesting" >&2
                exit 1
            }
            mkdir -p "$work/structured/internal/gpudra"
            cp "$HERE/upstream-tables/allocator_gpudra_test.go" "$work/structured/internal/gpudra/gpudra_test.go"
            run allocator structured/internal/gpudra TestUpstreamAllocatorTable "ALLOCATE_JSON=$bin" "$@"
            ;;
        cel)
            bin=$(example dra-cel cel_case CEL_CASE)
            grep -q '^var testcases = ' "$work/cel/compile_test.go" || {
                echo "e2e/upstream-tables: $module's cel/compile_test.go has no testcases table" >&2
                exit 1
            }
            cp "$HERE/upstream-tables/cel_gpudra_test.go" "$work/cel/gpudra_test.go"
            run cel cel TestUpstreamCELTable "CEL_CASE=$bin" "$@"
            ;;
    esac
done
