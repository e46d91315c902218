#!/usr/bin/env bash
# e2e: gpu-dra converts resource.k8s.io v1beta1 and v1beta2 objects exactly as the API server
# does. The control plane serves v1beta1, v1beta2 and v1 (e2e/cluster's --runtime-config).
#
#   1. tests/fixtures/manifests/{v1beta1,v1beta2,v1}/training.yaml (a Namespace, a ConfigMap, a
#      DeviceClass, two ResourceClaimTemplates, a ResourceClaim, a Deployment, a Job, a CronJob
#      and a Pod) go in with `kubectl apply`; every ResourceClaim, ResourceClaimTemplate and
#      DeviceClass read back as v1 (`kubectl get <resource>.v1.resource.k8s.io`) has the `.spec`
#      that `gpu-dra match --print-v1` gives for the same file;
#      likewise for tests/fixtures/manifests/v1beta1/conversion-cases.yaml (the corners of the
#      v1beta1 conversion, and a v1beta1 ResourceSlice);
#   2. what the API server refuses (an unknown field in v1 and in v1beta1, an invalid count),
#      gpu-dra refuses too, naming the same field.
#
# Usage: e2e/convert.sh   (GPU_DRA=path/to/gpu-dra, default target/debug/gpu-dra)
set -euo pipefail
NAME=convert-e2e
NODE=convert-node-1
GPUS=sim:1xH100-SXM5-80GB
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

FIXTURES=$ROOT/tests/fixtures/manifests
resource_of() {
    case $1 in
    ResourceClaim) echo resourceclaims.v1.resource.k8s.io ;;
    ResourceClaimTemplate) echo resourceclaimtemplates.v1.resource.k8s.io ;;
    DeviceClass) echo deviceclasses.v1.resource.k8s.io ;;
    ResourceSlice) echo resourceslices.v1.resource.k8s.io ;;
    *) fail "unexpected kind $1" ;;
    esac
}

# ---------------------------------------------------------------- 1. same v1 objects
# same_v1 FILE N: kubectl applies FILE; each of its N resource.k8s.io objects, read back as v1,
# has the .spec gpu-dra gives (claims gpu-dra makes for pods carry an ownerReference: skipped).
same_v1() {
    local file=$1 want=$2 ours compared=0 kind namespace name theirs mine ns_args
    kubectl apply -f "$file" >&2 || fail "the API server refused $file"
    ours=$("$GPU_DRA" match --print-v1 -o json -f "$file" 2>"$WORK/notes") || fail "gpu-dra --print-v1 $file: $(cat "$WORK/notes")"
    while IFS=$'\t' read -r kind namespace name; do
        ns_args=()
        [[ $namespace == - ]] || ns_args=(-n "$namespace")
        theirs=$(kubectl get "$(resource_of "$kind")" "$name" "${ns_args[@]}" -o json | jq -S .spec) ||
            fail "cannot read $kind $name back as v1"
        mine=$(jq -S --arg k "$kind" --arg n "$name" '.items[] | select(.kind == $k and .metadata.name == $n) | .spec' <<<"$ours")
        [[ $theirs == "$mine" ]] || fail "${file#"$ROOT"/}: $kind $name: the API server's v1 .spec differs from gpu-dra's:
--- kube-apiserver
$theirs
--- gpu-dra
$mine"
        compared=$((compared + 1))
    done < <(jq -r '.items[] | select(.metadata.ownerReferences == null) | [.kind, (.metadata.namespace // "-"), .metadata.name] | @tsv' <<<"$ours")
    ((compared == want)) || fail "${file#"$ROOT"/}: compared $compared objects, expected $want"
}

for version in v1beta1 v1beta2 v1; do
    file=$FIXTURES/$version/training.yaml
    grep -q "^apiVersion: resource.k8s.io/$version$" "$file" || fail "$file has no $version objects"
    same_v1 "$file" 4
    ok "$version: the class, both templates and the claim read back as v1 equal gpu-dra's conversion"
    # Claim specs are immutable and the next version applies the same names: start afresh.
    kubectl delete -n ml resourceclaims,resourceclaimtemplates --all >&2
    kubectl delete deviceclass h100.example.com >&2
done

same_v1 "$FIXTURES/v1beta1/conversion-cases.yaml" 6
ok "v1beta1 corners (mode All, empty selectors, capacity, tolerations, constraints, config, basic devices) read back as v1 equal gpu-dra's conversion"

# ---------------------------------------------------------------- 2. same refusals
# refused NAME FIELD FILE: kubectl apply (server-side dry run) and gpu-dra both refuse FILE and
# both name FIELD.
refused() {
    local what=$1 field=$2 file=$3 server ours
    server=$(kubectl apply --dry-run=server -f "$file" 2>&1) && fail "the API server took $what: $server"
    grep -qF "$field" <<<"$server" || fail "the API server's error does not name $field: $server"
    ours=$("$GPU_DRA" match --print-v1 -f "$file" 2>&1) && fail "gpu-dra took $what: $ours"
    grep -qF "$field" <<<"$ours" || fail "gpu-dra's error does not name $field: $ours"
    ok "$what: both refuse it, naming $field"
}
claim_doc() { # apiVersion, request body (YAML, indented 6)
    cat <<EOF
apiVersion: resource.k8s.io/$1
kind: ResourceClaim
metadata: {name: bad, namespace: ml}
spec:
  devices:
    requests:
    - name: gpu
$2
EOF
}
claim_doc v1 "      deviceClassName: gpu.nvidia.com" >"$WORK/inline.yaml"
refused "a v1 request with the v1beta1 inline fields" "spec.devices.requests[0].deviceClassName" "$WORK/inline.yaml"
claim_doc v1beta1 "      exactly: {deviceClassName: gpu.nvidia.com}" >"$WORK/exactly.yaml"
refused "a v1beta1 request with v1's exactly" "spec.devices.requests[0].exactly" "$WORK/exactly.yaml"
claim_doc v1beta1 "      deviceClassName: gpu.nvidia.com
      count: -1" >"$WORK/count.yaml"
refused "a v1beta1 request for -1 devices" "spec.devices.requests[0].exactly.count: Invalid value: -1" "$WORK/count.yaml"

echo "$passed passed, 0 failed"
