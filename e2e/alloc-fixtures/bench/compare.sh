#!/usr/bin/env bash
# Allocation speed, Rust (benches/alloc.rs) against Kubernetes' Go allocator (gobench/) on
# identical inputs: 8 simulated H100s as `gpu-dra slices` publishes them, deviceclasses/,
# claims-1.json and claims-100.json. Prints both times and the ratio Go/Rust.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

(cd "$ROOT/e2e/alloc-fixtures/bench/gobench" &&
    GOTOOLCHAIN=local GOFLAGS=-mod=mod GOPROXY=${GOPROXY:-off} go build -o "$WORK/gobench" .)
cd "$ROOT"
ALLOC_BENCH_DUMP="$WORK/inputs" cargo bench --bench alloc -- \
    --warm-up-time 1 --measurement-time "${MEASURE_SECONDS:-5}" 'alloc/(1-claim|100-claims)$' \
    2>&1 | tee "$WORK/rust.txt" | grep -E 'alloc bench|time:' >&2
"$WORK/gobench" "$WORK/inputs" >"$WORK/go.txt"

# Criterion prints `alloc/NAME  time: [low mid high]` with units; take the middle, in ns.
rust_ns() {
    awk -v name="alloc/$1" '
        $1 == name && /time:/ {
            for (i = 1; i <= NF; i++) if ($i ~ /^\[/) { v = $(i + 2); u = $(i + 3) }
            f = (u == "ns") ? 1 : (u == "µs" || u == "us") ? 1e3 : (u == "ms") ? 1e6 : 1e9
            printf "%.0f\n", v * f
        }' "$WORK/rust.txt"
}
go_ns() { awk -v f="$1" '$1 == f { print $2 }' "$WORK/go.txt"; }

printf '%-12s %14s %14s %8s\n' case go rust go/rust
for c in 1-claim 100-claims; do
    r=$(rust_ns "$c")
    g=$(go_ns "claims-${c%%-*}.json")
    awk -v c="$c" -v g="$g" -v r="$r" 'BEGIN {
        printf "%-12s %11.1f µs %11.1f µs %7.1fx\n", c, g / 1e3, r / 1e3, g / r }'
done
