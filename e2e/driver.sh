#!/usr/bin/env bash
# e2e: the node driver on a real control plane (etcd + kube-apiserver + kube-scheduler built
# from the pinned Kubernetes modules), with kubelet-sim playing the kubelet over the upstream
# gRPC stubs.
#
#   1. `gpu-dra run --gpus sim:8xH100-SXM5-80GB` registers with kubelet-sim (v1 chosen) and
#      publishes slices the API server accepts;
#   2. a claim for a GPU with ≥ 40Gi memory and a pod using it are allocated and bound by the
#      real kube-scheduler;
#   3. kubelet-sim prepares over v1 and over v1beta1; the CDI file and status.devices are checked;
#      unprepare removes the spec;
#   4. a driver restart writes nothing to the API server;
#   5. the API server is killed for E2E_OUTAGE_SECONDS (default 30) and restarted: the driver
#      survives, and repairs a slice deleted afterwards;
#   6. a prepared claim deleted behind the driver's back is garbage-collected.
#
# Usage: e2e/driver.sh   (GPU_DRA=path/to/gpu-dra, default target/debug/gpu-dra, built if missing)
set -euo pipefail
NAME=driver-e2e
NODE=e2e-node-1
GPUS=sim:8xH100-SXM5-80GB
OUTAGE=${E2E_OUTAGE_SECONDS:-30}
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# ---------------------------------------------------------------- 1. register and publish
kubectl apply -f "$ROOT/deviceclasses/" >&2
start_driver
# Hopper GPUs are dynamic by default: 8 whole GPUs and 8 × 25 MIG placements, with counters.
DEVICES=208
wait_for "$DEVICES devices published" 30 bash -c "[[ \$(kubectl get resourceslices -o json | jq '[.items[].spec.devices[]?] | length') == $DEVICES ]]"
[[ $(slices_json | jq '[.items[].spec.sharedCounters[]?] | length') == 8 ]] || fail "expected 8 counter sets"
[[ $(slices_json | jq -r '.items[0].metadata.ownerReferences[0].kind') == Node ]] || fail "slice not owned by the Node"
ok "slices for 8 GPUs (208 devices, 8 counter sets) accepted by the API server, owned by the Node"

reg=$(kubelet register) || fail "registration: $reg"
[[ $(jq -r .version <<<"$reg") == v1.DRAPlugin ]] || fail "kubelet-sim chose $(jq -r .version <<<"$reg")"
ok "kubelet-sim registered the plugin and chose v1.DRAPlugin"

# ---------------------------------------------------------------- 2. schedule
kubectl apply -f - >&2 <<'EOF'
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: big-gpu, namespace: default}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
        selectors:
        - cel:
            expression: "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0"
---
apiVersion: v1
kind: Pod
metadata: {name: trainer, namespace: default}
spec:
  containers:
  - name: c
    image: registry.k8s.io/pause:3.10
    resources:
      claims: [{name: gpu}]
  resourceClaims:
  - name: gpu
    resourceClaimName: big-gpu
EOF
wait_for "claim allocated" 60 bash -c "kubectl get resourceclaim big-gpu -o json | jq -e '.status.allocation.devices.results[0].device'"
wait_for "pod bound" 60 bash -c "[[ \$(kubectl get pod trainer -o jsonpath='{.spec.nodeName}') == $NODE ]]"
claim=$(kubectl get resourceclaim big-gpu -o json)
uid=$(jq -r .metadata.uid <<<"$claim")
device=$(jq -r '.status.allocation.devices.results[0].device' <<<"$claim")
[[ $device == gpu-0 ]] || fail "expected gpu-0 (first matching device), got $device"
ok "kube-scheduler allocated $device and bound the pod to $NODE"

# ---------------------------------------------------------------- 3. prepare / unprepare
spec=$WORK/cdi/k8s.gpu.nvidia.com-claim_$uid.json
for api in v1 v1beta1; do
    out=$(kubelet prepare --api "$api" --claim "default/big-gpu/$uid") || fail "prepare over $api: $out"
    [[ $(jq -r '.claims[0].error' <<<"$out") == "" ]] || fail "prepare over $api: $(jq -r '.claims[0].error' <<<"$out")"
    [[ $(jq -r '.claims[0].devices[0].cdi_device_ids[0]' <<<"$out") == "k8s.gpu.nvidia.com/claim=$uid-gpu-0" ]] \
        || fail "unexpected CDI id: $out"
    [[ -f $spec ]] || fail "no CDI spec at $spec"
    jq -e --arg n "$uid-gpu-0" '.kind == "k8s.gpu.nvidia.com/claim" and .devices[0].name == $n
        and (.devices[0].containerEdits.deviceNodes[0].path == "/dev/nvidia0")
        and (.devices[0].containerEdits.env[0] | startswith("NVIDIA_VISIBLE_DEVICES=GPU-"))' "$spec" >/dev/null \
        || fail "CDI spec content: $(cat "$spec")"
    wait_for "status.devices reported" 20 bash -c \
        "kubectl get resourceclaim big-gpu -o json | jq -e '.status.devices[0].data.uuid | startswith(\"GPU-\")'"
    again=$(kubelet prepare --api "$api" --claim "default/big-gpu/$uid")
    [[ "$(jq -c '.claims[0].devices' <<<"$again")" == "$(jq -c '.claims[0].devices' <<<"$out")" ]] \
        || fail "repeated prepare differs: $again vs $out"
    out=$(kubelet unprepare --api "$api" --claim "default/big-gpu/$uid") || fail "unprepare over $api: $out"
    [[ $(jq -r '.claims[0].error' <<<"$out") == "" ]] || fail "unprepare over $api: $out"
    [[ ! -e $spec ]] || fail "CDI spec still there after unprepare over $api"
    ok "prepare/unprepare over $api: CDI spec written with /dev/nvidia0 and removed; status.devices has the UUID"
done
bad=$(kubelet prepare --claim "default/no-such-claim/0000" --claim "default/big-gpu/$uid")
[[ $(jq -r '.claims[0].error' <<<"$bad") == *"not found"* && $(jq -r '.claims[1].error' <<<"$bad") == "" ]] \
    || fail "a bad claim must fail alone: $bad"
ok "a missing claim gets its own error, the other claim is prepared"

# ---------------------------------------------------------------- 4. restart writes nothing
before=$(slices_json | jq -c '[.items[] | {name: .metadata.name, rv: .metadata.resourceVersion}]')
stop_driver
start_driver
sleep 3
after=$(slices_json | jq -c '[.items[] | {name: .metadata.name, rv: .metadata.resourceVersion}]')
[[ $before == "$after" ]] || fail "restart rewrote slices: $before -> $after"
[[ -f $spec ]] || fail "the prepared claim's CDI spec did not survive the restart"
ok "driver restart: no slice writes, prepared claim kept"

# ---------------------------------------------------------------- 5. API server outage
"$E2E/cluster" stop kube-apiserver >&2
log "API server down for ${OUTAGE}s"
sleep "$OUTAGE"
kill -0 "$DRIVER_PID" 2>/dev/null || fail "the driver died during the API server outage"
# Garbage collection cannot tell "gone" from "unreachable": a prepared claim must stay prepared.
[[ -f $spec ]] || fail "the prepared claim was unprepared during the API server outage"
"$E2E/cluster" start kube-apiserver >&2 || fail "the API server did not come back"
wait_for "API server back" 90 kubectl get --raw /readyz
sleep 3 # a garbage-collection round (2 s) with the server back
[[ -f $spec ]] || fail "the prepared claim was unprepared after the API server outage"
kubectl delete resourceslices --field-selector "spec.nodeName=$NODE" >&2
wait_for "slices repaired" 30 bash -c "[[ \$(kubectl get resourceslices -o json | jq '[.items[].spec.devices[]?] | length') == $DEVICES ]]"
ok "survived a ${OUTAGE}s API server outage (prepared claim kept) and repaired deleted slices"

# ---------------------------------------------------------------- 6. garbage collection
kubectl delete pod trainer --wait=false >&2
kubectl patch resourceclaim big-gpu --type=merge -p '{"metadata":{"finalizers":null}}' >&2 || true
kubectl delete resourceclaim big-gpu --wait=false >&2
wait_for "claim gone" 30 bash -c "! kubectl get resourceclaim big-gpu"
wait_for "orphaned claim unprepared" 30 test ! -e "$spec"
ok "a claim deleted while prepared was garbage-collected (CDI spec removed)"

echo "$passed passed, 0 failed"
