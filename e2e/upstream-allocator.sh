#!/usr/bin/env bash
# Kubernetes' own allocator test table (k8s.io/dynamic-resource-allocation/structured,
# internal/allocatortesting: the cases every Go allocator variant must pass) run against
# gpu-dra's allocator. The table is internal to its module, so the pinned module is copied to
# a scratch folder and e2e/upstream-allocator/gpudra_test.go is placed inside the copy; the
# Rust side is the allocate_json example of crates/dra-allocator.
#
# Usage: e2e/upstream-allocator.sh [go test flags, e.g. -run 'TestUpstreamAllocatorTable/foo' -v]
# ALLOCATE_JSON names a built allocate_json (e2e/run-tests passes the one `cargo test` built);
# without it the example is built here. ALLOCATE_JSON_DUMP=DIR keeps each call's request and
# answer, for chasing a difference by hand.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
# shellcheck source=versions.env
source "$HERE/versions.env"

bin=${ALLOCATE_JSON:-}
if [[ -z $bin ]]; then
    cargo build --quiet --locked --manifest-path "$ROOT/Cargo.toml" -p dra-allocator --example allocate_json
    bin="$ROOT/target/debug/examples/allocate_json"
fi
[[ -x $bin ]] || { echo "e2e/upstream-allocator: $bin is not an executable allocate_json" >&2; exit 1; }

module=$(cd "$HERE/harness" && GOTOOLCHAIN=${GOTOOLCHAIN:-local} go list -m -f '{{.Dir}}' "k8s.io/dynamic-resource-allocation")
[[ -d $module/structured/internal/allocatortesting ]] || {
    echo "e2e/upstream-allocator: $module has no structured/internal/allocatortesting" >&2
    exit 1
}
[[ $module == *"@$K8S_STAGING_VERSION" ]] || {
    echo "e2e/upstream-allocator: the harness resolves $module, not $K8S_STAGING_VERSION" >&2
    exit 1
}
work=$(mktemp -d "${TMPDIR:-/tmp}/upstream-allocator.XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
cp -r "$module/." "$work/"
chmod -R u+w "$work"
mkdir -p "$work/structured/internal/gpudra"
cp "$HERE/upstream-allocator/gpudra_test.go" "$work/structured/internal/gpudra/"
log="$work/go-test.log"
if ! (cd "$work" && ALLOCATE_JSON=$bin GOTOOLCHAIN=${GOTOOLCHAIN:-local} GOFLAGS=-mod=mod \
    go test -count=1 -v ./structured/internal/gpudra/ "$@") >"$log" 2>&1; then
    # The failing cases' output (gomega's diffs), without the passing ones' chatter.
    awk '/^=== RUN/ { buf = $0 "\n"; next } { buf = buf $0 "\n" } /--- FAIL/ { printf "%s", buf; buf = "" }' "$log" >&2
    tail -n 5 "$log" >&2
    echo "e2e/upstream-allocator: Kubernetes' allocator test table fails on gpu-dra's allocator (above)" >&2
    exit 1
fi
# Leaf cases only (the table's parent test and the "interrupt" group are not cases).
passed=$(grep -E -- '--- PASS: TestUpstreamAllocatorTable/' "$log" | grep -vc -- '/interrupt (' || true)
skipped=$(grep -E -- '--- SKIP: TestUpstreamAllocatorTable/' "$log" | sed -E 's/.*TestUpstreamAllocatorTable\/([^ ]*).*/\1/' | paste -sd, -)
line="upstream allocator table (k8s.io/dynamic-resource-allocation $K8S_STAGING_VERSION, search counts included): $passed cases pass on gpu-dra's allocator; skipped, as for Go allocators without derived attributes: ${skipped:-none}"
echo "$line"
[[ -n ${GPU_DRA_TEST_REPORT:-} ]] && echo "$line" >>"$GPU_DRA_TEST_REPORT"
exit 0
