#!/usr/bin/env bash
# Regenerates kubernetes-expressions.jsonl from the pinned modules' test files (see
# e2e/harness/cmd/cel-fixtures). With --check, fails when the committed file differs.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=$(cd "$HERE/../harness" && GOTOOLCHAIN=${GOTOOLCHAIN:-local} go run ./cmd/cel-fixtures)
if [[ ${1:-} == --check ]]; then
    diff <(echo "$out") "$HERE/kubernetes-expressions.jsonl" >/dev/null || {
        echo "e2e/cel-fixtures: kubernetes-expressions.jsonl is not what the pinned modules' tests give; run e2e/cel-fixtures/regenerate.sh" >&2
        exit 1
    }
    echo "e2e/cel-fixtures: $(wc -l <<<"$out") expressions, as the pinned modules' tests give them"
else
    echo "$out" >"$HERE/kubernetes-expressions.jsonl"
    echo "e2e/cel-fixtures: wrote $(wc -l <<<"$out") expressions" >&2
fi
