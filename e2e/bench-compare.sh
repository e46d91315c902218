#!/usr/bin/env bash
# Go against Rust on identical inputs, side by side:
#   CEL: e2e/harness/celbench (k8s.io/dynamic-resource-allocation/cel, DeviceMatches per pair)
#        against crates/dra-cel/benches/cel.rs (criterion, cel/standard-set/all-pairs), ns per evaluation;
#   allocation: e2e/alloc-fixtures/bench/compare.sh (Go structured allocator against
#        benches/alloc.rs), when it exists.
# Prints ns/op for both sides and the ratio Go/Rust (higher = Rust faster).
# MEASURE_SECONDS (default 5) is passed to the allocation comparison; SKIP_ALLOC=1 runs CEL only.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$ROOT"

echo "== CEL: Go celbench" >&2
(cd e2e/harness && GOTOOLCHAIN=local GOFLAGS=-mod=mod GOPROXY=${GOPROXY:-off} \
    go test ./celbench -run '^$' -bench 'BenchmarkEvaluate$' -benchtime "${GO_BENCHTIME:-3s}") \
    >"$WORK/go-cel.txt" 2>&1 || { cat "$WORK/go-cel.txt" >&2; exit 1; }
# The benchmark prints `ns_per_eval=N` once per run; the last run is the measured one.
go_cel=$(awk -F= '/^ns_per_eval=/ { v = $2 } END { print v }' "$WORK/go-cel.txt")

echo "== CEL: Rust criterion" >&2
cargo bench -p dra-cel --bench cel -- 'cel/standard-set/all-pairs' >"$WORK/rust-cel.txt" 2>&1 ||
    { cat "$WORK/rust-cel.txt" >&2; exit 1; }
# Criterion's `thrpt: [low mid high] Kelem/s` counts (selector, device) pairs.
# Only the first `thrpt:` line: criterion's change report repeats the label with percentages.
rust_cel=$(awk '/thrpt:/ && !done {
        done = 1
        for (i = 1; i <= NF; i++) if ($i ~ /^\[/) { v = $(i + 2); u = $(i + 3) }
        f = (u == "elem/s") ? 1 : (u == "Kelem/s") ? 1e3 : (u == "Melem/s") ? 1e6 : 1e9
        printf "%.1f\n", 1e9 / (v * f)
    }' "$WORK/rust-cel.txt")

printf '\n%-22s %14s %14s %8s\n' case go rust go/rust
awk -v g="$go_cel" -v r="$rust_cel" 'BEGIN {
    printf "%-22s %11.1f ns %11.1f ns %7.1fx\n", "cel ns/eval", g, r, g / r }'

if [ "${SKIP_ALLOC:-0}" = 1 ]; then
    :
elif [ -x e2e/alloc-fixtures/bench/compare.sh ]; then
    echo >&2
    echo "== allocation: e2e/alloc-fixtures/bench/compare.sh" >&2
    e2e/alloc-fixtures/bench/compare.sh
else
    echo "allocation: e2e/alloc-fixtures/bench/compare.sh not present, skipped" >&2
fi
