#!/usr/bin/env bash
# Kubernetes' own test tables run against gpu-dra's code, from the pinned
# k8s.io/dynamic-resource-allocation module:
#   allocator: structured/internal/allocatortesting (the cases its stable, incubating and
#              experimental allocators must pass, the lexicographical-order ones and the
#              interruption cases), against crates/dra-allocator (its allocate_json example),
#              with `gpu-dra explain` run on every case too (same decision, no failure);
#   cel:       cel/compile_test.go's testcases (compile errors, cost estimates, matches and
#              evaluation errors), against crates/dra-cel (its cel_case example);
# and from the pinned k8s.io/kubernetes module:
#   validation: pkg/apis/resource/validation's create-time tables for ResourceClaims,
#              ResourceClaimTemplates, DeviceClasses, DeviceTaintRules and ResourceSlices
#              (TestValidateClaim, TestValidateClaimTemplate, TestValidateClass,
#              TestValidateDeviceTaint, TestValidateResourceSlice, and TestValidateDeviceCapacity,
#              each case's capacity on a device of a ResourceSlice), against `gpu-dra match
#              --print-v1`: it must accept what kube-apiserver accepts and refuse what it
#              refuses, naming a field it names; run with the default gates and again with
#              DRADerivedAttributes on (requests' derivedAttributes are dropped without it);
#              with them, 1,000 valid objects changed at random, compared the same way
#              (e2e/upstream-tables/validation_fuzz_gpudra_test.go).
# The tables are internal to their module (an internal package, a test variable, a function's
# local table), so the package is copied to a scratch folder and
# e2e/upstream-tables/*_gpudra_test.go are placed inside the copy. For the validation table the
# copy's five create validators are renamed upstream* so that the adapter's, under their
# names, see every case (it still returns upstream's errors, so the table keeps checking
# upstream too), and TestValidateDeviceCapacity's one call of the capacity helper is pointed at
# the adapter's gpudraValidateDeviceCapacity (which calls the helper too); nothing else is
# changed.
#
# Usage: e2e/upstream-tables.sh [allocator|cel|validation] [go test flags, e.g. -run 'TestUpstreamAllocatorTable/NAME' -v]
# ALLOCATE_JSON, CEL_CASE and GPU_DRA name built binaries (e2e/run-tests passes the ones
# `cargo test` built); without them they are built here. ALLOCATE_JSON_DUMP=DIR keeps each
# allocator call's request and answer, for chasing a difference by hand;
# GPU_DRA_VALIDATION_LOG=1 prints each object the validation adapter gives gpu-dra.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
# shellcheck source=versions.env
source "$HERE/versions.env"

tables=(allocator cel validation)
if [[ ${1:-} == allocator || ${1:-} == cel || ${1:-} == validation ]]; then
    tables=("$1")
    shift
fi

example() { # crate example variable
    local bin=${!3:-}
    if [[ -z $bin ]]; then
        cargo build --quiet --locked --manifest-path "$ROOT/Cargo.toml" -p "$1" --example "$2"
        bin="${CARGO_TARGET_DIR:-$ROOT/target}/debug/examples/$2"
    fi
    [[ -x $bin ]] || { echo "e2e/upstream-tables: $bin is not an executable $2" >&2; exit 1; }
    echo "$bin"
}

gpu_dra() {
    local bin=${GPU_DRA:-}
    if [[ -z $bin ]]; then
        cargo build --quiet --locked --manifest-path "$ROOT/Cargo.toml" --bin gpu-dra
        bin="${CARGO_TARGET_DIR:-$ROOT/target}/debug/gpu-dra"
    fi
    [[ -x $bin ]] || { echo "e2e/upstream-tables: $bin is not an executable gpu-dra" >&2; exit 1; }
    echo "$bin"
}

harness_module() { # MODULE VERSION: the folder of the module the harness resolves
    local dir
    dir=$(cd "$HERE/harness" && GOTOOLCHAIN=${GOTOOLCHAIN:-local} go list -m -f '{{.Dir}}' "$1")
    [[ $dir == *"@$2" ]] || {
        echo "e2e/upstream-tables: the harness resolves $dir, not $1@$2" >&2
        exit 1
    }
    echo "$dir"
}
module=$(harness_module k8s.io/dynamic-resource-allocation "$K8S_STAGING_VERSION")
work=$(mktemp -d "${TMPDIR:-/tmp}/upstream-tables.XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
cp -r "$module/." "$work/"
chmod -R u+w "$work"

# run TABLE LABEL DIR PACKAGE TESTS ENV=VALUE... -- go test flags: runs one table (TESTS: a
# regexp alternation of test names) in the module at DIR, prints its count line.
run() {
    local table=$1 label=$2 dir=$3 package=$4 test=$5
    shift 5
    local envs=()
    while [[ $# -gt 0 && $1 != -- ]]; do envs+=("$1"); shift; done
    [[ ${1:-} == -- ]] && shift
    local log="$work/$table.log"
    if ! (cd "$dir" && env "${envs[@]}" GOTOOLCHAIN="${GOTOOLCHAIN:-local}" GOFLAGS=-mod=mod \
        go test -count=1 -v -run "^($test)\$" "./$package/" "$@") >"$log" 2>&1; then
        # The failing cases' output (gomega's and cmp's diffs), without the passing ones' chatter.
        awk '/^=== RUN/ { buf = $0 "\n"; next } { buf = buf $0 "\n" } /--- FAIL/ { printf "%s", buf; buf = "" }' "$log" >&2
        tail -n 5 "$log" >&2
        echo "e2e/upstream-tables: Kubernetes' $table test table fails on gpu-dra (above)" >&2
        exit 1
    fi
    # Cases: the table's leaves (a case's feature combinations count once, with the case).
    local passed skipped line
    passed=$(grep -E -- "^    --- PASS: ($test)/" "$log" | grep -vc -- "/interrupt (" || true)
    passed=$((passed + $(grep -cE -- "^        --- PASS: ($test)/interrupt/" "$log" || true)))
    skipped=$({ grep -E -- "^    --- SKIP: ($test)/" "$log" || true; } | sed -E "s/.*--- SKIP: ([^ ]*).*/\1/" | paste -sd, -)
    grep -o 'validation fuzz (.*' "$log" || true
    line="upstream $label: $passed cases pass on gpu-dra"
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
            run allocator "allocator table (k8s.io/dynamic-resource-allocation $K8S_STAGING_VERSION)" \
                "$work" structured/internal/gpudra TestUpstreamAllocatorTable "ALLOCATE_JSON=$bin" -- "$@"
            ;;
        cel)
            bin=$(example dra-cel cel_case CEL_CASE)
            grep -q '^var testcases = ' "$work/cel/compile_test.go" || {
                echo "e2e/upstream-tables: $module's cel/compile_test.go has no testcases table" >&2
                exit 1
            }
            cp "$HERE/upstream-tables/cel_gpudra_test.go" "$work/cel/gpudra_test.go"
            run cel "cel table (k8s.io/dynamic-resource-allocation $K8S_STAGING_VERSION)" \
                "$work" cel TestUpstreamCELTable "CEL_CASE=$bin" -- "$@"
            ;;
        validation)
            bin=$(gpu_dra)
            kubernetes=$(harness_module k8s.io/kubernetes "$K8S_VERSION")
            upstream=$kubernetes/pkg/apis/resource/validation
            # A module of its own on the harness's requirements (it requires k8s.io/kubernetes).
            scratch="$work/validation-module"
            mkdir -p "$scratch/resourcevalidation"
            cp "$HERE/harness/go.mod" "$HERE/harness/go.sum" "$scratch/"
            cp "$upstream"/*.go "$scratch/resourcevalidation/"
            chmod -R u+w "$scratch"
            validators='ValidateResourceClaim|ValidateResourceClaimTemplate|ValidateDeviceClass|ValidateDeviceTaintRule|ValidateResourceSlice'
            [[ $(grep -cE "^func ($validators)\(" "$scratch/resourcevalidation/validation.go") == 5 ]] || {
                echo "e2e/upstream-tables: $upstream/validation.go does not define $validators as expected" >&2
                exit 1
            }
            sed -i -E "s/^func ($validators)\(/func upstream\1(/" "$scratch/resourcevalidation/validation.go"
            # TestValidateDeviceCapacity calls the capacity helper itself: its one call goes
            # through the adapter instead.
            capacity_test="$scratch/resourcevalidation/validation_device_capacity_test.go"
            [[ $(grep -c 'errs := validateMultiAllocatableDeviceCapacity(' "$capacity_test") == 1 ]] || {
                echo "e2e/upstream-tables: $capacity_test does not call validateMultiAllocatableDeviceCapacity as expected" >&2
                exit 1
            }
            sed -i 's/errs := validateMultiAllocatableDeviceCapacity(/errs := gpudraValidateDeviceCapacity(/' "$capacity_test"
            cp "$HERE/upstream-tables/validation_gpudra_test.go" "$scratch/resourcevalidation/gpudra_test.go"
            cp "$HERE/upstream-tables/validation_fuzz_gpudra_test.go" "$scratch/resourcevalidation/gpudra_fuzz_test.go"
            # The fuzz test (no subtests) is not counted as a case; it prints its own line.
            tests='TestValidateClaim|TestValidateClaimTemplate|TestValidateClass|TestValidateDeviceTaint|TestValidateResourceSlice|TestValidateDeviceCapacity|TestGpuDRAValidationFuzz'
            run validation "validation table (k8s.io/kubernetes $K8S_VERSION)" \
                "$scratch" resourcevalidation "$tests" "GPU_DRA=$bin" -- "$@"
            run validation "validation table, cluster gates and DRADerivedAttributes (k8s.io/kubernetes $K8S_VERSION)" \
                "$scratch" resourcevalidation "$tests" "GPU_DRA=$bin" \
                "GPU_DRA_VALIDATION_GATES=$K8S_FEATURE_GATES,DRADerivedAttributes=true" -- "$@"
            ;;
    esac
done
