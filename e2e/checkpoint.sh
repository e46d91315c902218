#!/usr/bin/env bash
# e2e: the driver fails closed on a checkpoint it cannot trust (a downgrade below the version
# that wrote it, or a corrupt file), on a real control plane with kubelet-sim as the kubelet.
#
#   1. a claim is allocated by kube-scheduler and prepared;
#   2. the checkpoint is rewritten as a newer gpu-dra would (schema 99) and the driver
#      restarted, i.e. downgraded: it registers, but refuses every prepare and unprepare with the
#      reason, leaves the checkpoint and the CDI spec untouched, reports checkpoint_unusable 1
#      and a Warning event on the Node;
#   3. the same for a corrupt file, and for a missing one while the claim's CDI spec is there;
#   4. NVIDIA's driver's checkpoint that cannot be read: refused with the reason (one it can read
#      is taken over: e2e/switch-from-nvidia.sh);
#   5. upgraded again (the original file back), it unprepares the claim as usual;
#   6. NVIDIA's checkpoint as its uninstall leaves it (no claims): kept aside and replaced.
#
# Usage: e2e/checkpoint.sh   (GPU_DRA=path/to/gpu-dra, default target/debug/gpu-dra)
set -euo pipefail
NAME=checkpoint-e2e
NODE=e2e-node-1
GPUS=sim:2xH100-SXM5-80GB
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PORT=$(metrics_port)
DRIVER_ARGS="--metrics-addr 127.0.0.1:$PORT"

kubectl apply -f "$ROOT/deviceclasses/" >&2
start_driver
kubectl apply -f - >&2 <<'EOF'
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: slice, namespace: default}
spec:
  devices:
    requests:
    - name: mig
      exactly:
        deviceClassName: mig.nvidia.com
        selectors:
        - cel: {expression: "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"}
---
apiVersion: v1
kind: Pod
metadata: {name: user, namespace: default}
spec:
  containers:
  - name: c
    image: registry.k8s.io/pause:3.10
    resources: {claims: [{name: mig}]}
  resourceClaims:
  - {name: mig, resourceClaimName: slice}
EOF
wait_for "claim allocated" 60 bash -c "kubectl get resourceclaim slice -o json | jq -e '.status.allocation.devices.results[0].device'"
uid=$(kubectl get resourceclaim slice -o jsonpath='{.metadata.uid}')
out=$(kubelet prepare --register --claim "default/slice/$uid") || fail "prepare: $out"
[[ $(jq -r '.claims[0].error' <<<"$out") == "" ]] || fail "prepare: $out"
spec=$WORK/cdi/k8s.gpu.nvidia.com-claim_$uid.json
[[ -f $spec && $(gpu_instances) == 1 ]] || fail "prepare made no spec or MIG instance"
ok "claim prepared (1 MIG instance, CDI spec)"

checkpoint=$WORK/state/checkpoint.json
cp "$checkpoint" "$WORK/checkpoint.good"

checkpoint_digest() { if [[ -f $checkpoint ]]; then sha256sum <"$checkpoint"; else echo missing; fi; }

# refuses REASON: the driver runs, registers, and fails every call with REASON, touching nothing.
refuses() {
    local reason=$1 before spec_before out
    before=$(checkpoint_digest)
    spec_before=$(sha256sum <"$spec")
    stop_driver
    start_driver
    out=$(kubelet prepare --register --claim "default/slice/$uid") || true
    grep -q "$reason" <<<"$out" || fail "prepare should fail with '$reason': $out"
    out=$(kubelet unprepare --claim "default/slice/$uid") || true
    grep -q "$reason" <<<"$out" || fail "unprepare should fail with '$reason': $out"
    [[ $(checkpoint_digest) == "$before" ]] \
        || fail "the checkpoint was changed (or written where there was none)"
    [[ -f $spec && $(sha256sum <"$spec") == "$spec_before" ]] || fail "the CDI spec was touched"
    [[ $(gpu_instances) == 1 ]] || fail "the MIG instance was destroyed"
    curl -sf "http://127.0.0.1:$PORT/metrics" | grep -q '^gpu_dra_checkpoint_unusable 1' \
        || fail "checkpoint_unusable metric not 1"
    save_metrics_sample checkpoint-unusable "http://127.0.0.1:$PORT/metrics"
    ! curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null || fail "a refusing driver reports ready"
    wait_for "a CheckpointUnusable event on the Node" 20 bash -c \
        "kubectl get events.events.k8s.io -A -o json | jq -e '[.items[] | select(.reason == \"CheckpointUnusable\" and .regarding.name == \"$NODE\")] | length > 0'"
}

jq '.schemaVersion = 99 | .writtenByTheFuture = true' "$WORK/checkpoint.good" >"$checkpoint"
refuses "written by a newer gpu-dra"
ok "downgraded below the checkpoint's schema: refuses with the reason, touches nothing, metric and Node event"

printf '{"schemaVersion": 1, "claims": {' >"$checkpoint"
refuses "not a JSON document"
ok "corrupt checkpoint: refuses with the reason, touches nothing"

rm "$checkpoint"
refuses "it is missing, but this driver prepared claims on this node since it booted"
ok "missing checkpoint with this boot's CDI spec on the node: refuses with the reason, touches nothing"

# NVIDIA's driver's checkpoint (same driver name, same path), as its MarshalCheckpoint writes it.
boot=$(jq -r .nodeBootID "$WORK/checkpoint.good")
nvidia_checkpoint() { # CLAIMS-JSON
    jq -n --arg boot "$boot" --argjson claims "$1" \
        '{checksum: 1, v1: {preparedClaims: {}}, v2: {checksum: 2, preparedClaims: $claims, nodeBootID: $boot}}'
}
# Its claims are taken over (e2e/switch-from-nvidia.sh); one of its shape that cannot be read is
# refused as any unreadable checkpoint is.
nvidia_checkpoint '7' >"$checkpoint"
refuses "NVIDIA's driver's checkpoint cannot be read"
ok "NVIDIA's driver's checkpoint that cannot be read: refuses with the reason, touches nothing"

cp "$WORK/checkpoint.good" "$checkpoint"
stop_driver
start_driver
out=$(kubelet unprepare --register --claim "default/slice/$uid") || fail "unprepare: $out"
[[ $(jq -r '.claims[0].error' <<<"$out") == "" ]] || fail "unprepare: $out"
[[ ! -e $spec && $(gpu_instances) == 0 ]] || fail "unprepare left the spec or the MIG instance"
ok "upgraded again: the claim unprepares as usual"

# What NVIDIA's uninstall leaves on the node (no claims): replaced, kept aside, and the driver
# serves as usual.
nvidia_checkpoint '{}' >"$checkpoint"
left=$(sha256sum <"$checkpoint")
stop_driver
start_driver
out=$(kubelet prepare --register --claim "default/slice/$uid") || fail "prepare after NVIDIA's checkpoint: $out"
[[ $(jq -r '.claims[0].error' <<<"$out") == "" ]] || fail "prepare after NVIDIA's checkpoint: $out"
[[ $(sha256sum <"$WORK/state/checkpoint.json.dra-driver-nvidia-gpu") == "$left" ]] || fail "NVIDIA's checkpoint not kept aside"
jq -e '.schemaVersion == 1 and (.claims | length) == 1' "$checkpoint" >/dev/null || fail "not replaced: $(cat "$checkpoint")"
curl -sf "http://127.0.0.1:$PORT/metrics" | grep -q '^gpu_dra_checkpoint_unusable 0' || fail "checkpoint_unusable not 0"
out=$(kubelet unprepare --claim "default/slice/$uid") || fail "unprepare: $out"
ok "NVIDIA's driver's checkpoint left by its uninstall: kept aside as checkpoint.json.dra-driver-nvidia-gpu, replaced, claims prepare as usual"

echo "$passed passed, 0 failed"
