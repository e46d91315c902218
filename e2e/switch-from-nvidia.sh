#!/usr/bin/env bash
# e2e: switching a node from NVIDIA's driver to gpu-dra without draining it (issue 54, item 5).
#
# NVIDIA's gpu-kubelet-plugin v0.5.0 (its DynamicMIG and TimeSlicingSettings gates on) prepares,
# through the kubelet plugin socket (kubelet-sim, the kubelet's own stubs), claims that
# kube-scheduler allocated: a whole GPU, a time-sliced GPU and a MIG device it carves. Then it
# stops, as its chart's uninstall stops its pod, and gpu-dra starts on the same node with the same
# plugin folder (so the same checkpoint path) and CDI root. gpu-dra must:
#
#   1. take the claims over: its checkpoint holds them, NVIDIA's is kept aside, the hardware is
#      as NVIDIA left it (the carved MIG device, the time-slice), the CDI devices the containers
#      were started with still resolve through the runtimes' CDI library (now from gpu-dra's
#      spec; NVIDIA's is gone), and it publishes;
#   2. answer the kubelet's prepare of a taken-over claim with the same CDI devices;
#   3. unprepare them fully: the MIG device destroyed, the GPU's compute mode and time-slice back
#      to the defaults, every CDI spec gone, nothing left in the checkpoint;
#   4. refuse, per claim and with the reason, what it cannot undo: a claim served by NVIDIA's MPS
#      control daemon (added to NVIDIA's checkpoint here as NVIDIA's MPSSupport writes it: its
#      daemon is a Deployment that needs a real kubelet) keeps NVIDIA's spec, stays recorded, and
#      its unprepare answers the reason; every other claim is served.
#
# What this proves less than it seems: both plugins run as host processes (not their images
# through their charts) and kubelet-sim stands in for the kubelet; no container runs. The CDI
# devices are resolved with the runtimes' library (cdi-inject), as containerd would.
#
# Usage: e2e/switch-from-nvidia.sh   (GPU_DRA=path/to/gpu-dra, default target/debug/gpu-dra)
set -euo pipefail
NAME=switch-from-nvidia
NODE=e2e-node-1
GPUS=sim:4xH100-SXM5-80GB
DRIVER_BACKEND=nvml
E2E=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$E2E/lib.sh"
# shellcheck source=nvidia-plugin.sh
source "$E2E/nvidia-plugin.sh"
trap 'stop_nvidia; cleanup' EXIT
nvidia_node_setup
fake_nvidia_smi
CDI_INJECT=${CDI_INJECT:-$BIN/cdi-inject}

# NVIDIA's checkpoint is where gpu-dra's is: both are <kubelet plugins>/gpu.nvidia.com.
mkdir -p "$WORK/nvidia-plugins" "$WORK/state"
ln -s "$WORK/state" "$WORK/nvidia-plugins/gpu.nvidia.com"
kubectl apply -f "$ROOT/deviceclasses/" >&2
NVIDIA_GATES=DynamicMIG=true,TimeSlicingSettings=true \
    start_nvidia "$WORK/nvidia-plugins" "$WORK/registry" "$WORK/cdi" "$WORK/nvidia.log"
uuid_of() { slices_json | jq -r --arg d "$1" '.items[].spec.devices[]? | select(.name == $d) | .attributes.uuid.string'; }
claim_and_pod whole gpu.nvidia.com "device.attributes[\"gpu.nvidia.com\"].uuid == \"$(uuid_of gpu-0)\""
claim_and_pod carved mig.nvidia.com "device.attributes[\"gpu.nvidia.com\"].profile == \"1g.10gb\" && device.attributes[\"gpu.nvidia.com\"].parentUUID == \"$(uuid_of gpu-2)\""
{ timesliced_claim_yaml sliced "device.attributes[\"gpu.nvidia.com\"].uuid == \"$(uuid_of gpu-1)\"" Long; echo ---; pod_using_claim sliced sliced; } |
    kubectl apply -f - >&2
claims=()
for c in whole sliced carved; do
    wait_for "claim $c allocated" 60 bash -c "[[ -n \$(kubectl get resourceclaim $c -o jsonpath='{.status.allocation}') ]]"
    claims+=(--claim "default/$c/$(kubectl get resourceclaim "$c" -o jsonpath='{.metadata.uid}')")
done
uid_of() { kubectl get resourceclaim "$1" -o jsonpath='{.metadata.uid}'; }

# ------------------------------------------------------------------ NVIDIA's driver prepares
out=$(kubelet prepare "${claims[@]}") || { tail -n 20 "$WORK/nvidia.log" >&2; fail "NVIDIA's prepare: $out"; }
[[ $(jq '[.claims[] | select(.error != "")] | length' <<<"$out") == 0 ]] || fail "NVIDIA's prepare: $out"
jq -S '[.claims[] | {uid, devices}]' <<<"$out" >"$WORK/nvidia-prepared.json"
gpu_state() { jq -c --argjson m "$1" '.gpus[] | select(.minor == $m) | {compute_mode, timeslice, instances: (.gpu_instances | length)}' "$WORK/hw.json"; }
[[ $(gpu_state 2 | jq .instances) == 1 ]] || fail "NVIDIA's driver did not carve: $(gpu_state 2)"
[[ $(gpu_state 1 | jq .timeslice) == 3 ]] || fail "NVIDIA's driver did not set the time-slice: $(gpu_state 1)"
for c in whole sliced carved; do
    [[ -f $WORK/cdi/k8s.gpu.nvidia.com-claim_$(uid_of "$c").yaml ]] || fail "no NVIDIA spec for $c"
done
ok "NVIDIA's driver prepared a whole GPU, a time-sliced GPU (interval Long) and a MIG device it carved"

# A claim NVIDIA's MPSSupport prepared, as its checkpoint records it (its control daemon is a
# Deployment, which needs a real kubelet): gpu-3, daemon <uid>-<hash>.
mps_uid=00000000-0000-4000-8000-0000000000a3
checkpoint=$WORK/state/checkpoint.json
jq --arg uid "$mps_uid" --arg gpu "$(uuid_of gpu-3)" '.v2.preparedClaims[$uid] = {
    checkpointState: "PrepareCompleted", status: {},
    preparedDevices: [{devices: [{gpu: {info: {uuid: $gpu}, device: {Requests: ["gpu"], PoolName: "'"$NODE"'",
        DeviceName: "gpu-3", CDIDeviceIDs: ["k8s.gpu.nvidia.com/claim=\($uid)-gpu-3"]}}, mig: null}],
      configState: {mpsControlDaemonID: "\($uid)-e5a9c"}}]}' "$checkpoint" >"$WORK/with-mps.json"
cp "$WORK/cdi/k8s.gpu.nvidia.com-claim_$(uid_of whole).yaml" "$WORK/cdi/k8s.gpu.nvidia.com-claim_$mps_uid.yaml"
sed -i "s/$(uid_of whole)-gpu-0/$mps_uid-gpu-3/" "$WORK/cdi/k8s.gpu.nvidia.com-claim_$mps_uid.yaml"

# ------------------------------------------------------------------ the switch
stop_nvidia
cp "$WORK/with-mps.json" "$checkpoint"
nvidia_checkpoint=$(sha256sum <"$checkpoint")
start_driver
cp "$checkpoint" "$WORK/taken-over.json"
jq -e '.schemaVersion == 1 and (.claims | length) == 4 and ([.claims[] | select(.takenOver)] | length) == 4' "$checkpoint" >/dev/null ||
    fail "the claims were not taken over: $(cat "$checkpoint")"
[[ $(sha256sum <"$WORK/state/checkpoint.json.dra-driver-nvidia-gpu") == "$nvidia_checkpoint" ]] || fail "NVIDIA's checkpoint not kept aside"
grep -q "taken over" "$WORK/driver.log" || fail "the driver did not say what it took over"
[[ $(gpu_state 2 | jq .instances) == 1 && $(gpu_state 1 | jq .timeslice) == 3 ]] ||
    fail "the switch changed the hardware: $(gpu_state 1) $(gpu_state 2)"
for c in whole sliced carved; do
    uid=$(uid_of "$c")
    [[ -f $WORK/cdi/k8s.gpu.nvidia.com-claim_$uid.json ]] || fail "no gpu-dra spec for $c"
    [[ ! -e $WORK/cdi/k8s.gpu.nvidia.com-claim_$uid.yaml ]] || fail "NVIDIA's spec for $c is still there"
    ids=$(jq -r --arg uid "$uid" '.[] | select(.uid == $uid) | [.devices[].cdi_device_ids[]] | join(",")' "$WORK/nvidia-prepared.json")
    "$CDI_INJECT" --spec-dir "$WORK/cdi" --device "$ids" >"$WORK/inject-$c.json" ||
        fail "the CDI devices $c's containers were started with do not resolve: $ids"
done
grep -q '"/dev/nvidia0"' "$WORK/inject-whole.json" || fail "whole: no /dev/nvidia0 injected"
grep -q '/dev/nvidia-caps/nvidia-cap' "$WORK/inject-carved.json" || fail "carved: no MIG capability injected"
[[ -f $WORK/cdi/k8s.gpu.nvidia.com-claim_$mps_uid.yaml && ! -e $WORK/cdi/k8s.gpu.nvidia.com-claim_$mps_uid.json ]] ||
    fail "the refused MPS claim's spec was not left as NVIDIA wrote it"
wait_for "gpu-dra publishes the node" 30 bash -c "[[ \$(kubectl get resourceslices -o json | jq '[.items[].spec.devices[]? | select(.name | test(\"^gpu-[0-3]\$\"))] | length') == 4 ]]"
ok "switched: 4 claims taken over, NVIDIA's checkpoint kept aside, hardware untouched, the containers' CDI devices resolve (runtimes' CDI library) from gpu-dra's specs, NVIDIA's removed"

out=$(kubelet prepare "${claims[@]}") || fail "prepare after the switch: $out"
[[ $(jq -S '[.claims[] | {uid, devices}]' <<<"$out") == "$(cat "$WORK/nvidia-prepared.json")" ]] ||
    fail "gpu-dra answers a taken-over claim with other devices: $out vs $(cat "$WORK/nvidia-prepared.json")"
ok "the kubelet's prepare of a taken-over claim gets the same devices and CDI ids NVIDIA's driver gave"

# ------------------------------------------------------------------ unprepare
out=$(kubelet unprepare --claim "default/mps/$mps_uid") || true
grep -q "MPS control daemon $mps_uid-e5a9c" <<<"$out" || fail "the MPS claim's unprepare should give the reason: $out"
out=$(kubelet unprepare "${claims[@]}") || fail "unprepare: $out"
[[ $(jq '[.claims[] | select(.error != "")] | length' <<<"$out") == 0 ]] || fail "unprepare: $out"
[[ $(gpu_state 2 | jq .instances) == 0 ]] || fail "the MIG device NVIDIA carved is left: $(gpu_state 2); taken over as $(jq -c '.claims[].devices[].mig' "$WORK/taken-over.json")"
[[ $(gpu_state 1) == "$(gpu_state 0)" && $(gpu_state 1 | jq .timeslice) == 0 ]] || fail "GPU 1 not set back: $(gpu_state 1)"
for c in whole sliced carved; do
    uid=$(uid_of "$c")
    [[ ! -e $WORK/cdi/k8s.gpu.nvidia.com-claim_$uid.json && ! -e $WORK/cdi/k8s.gpu.nvidia.com-claim_$uid.yaml ]] || fail "a spec of $c is left"
done
jq -e --arg uid "$mps_uid" '(.claims | keys) == [$uid]' "$checkpoint" >/dev/null || fail "checkpoint after unprepare: $(cat "$checkpoint")"
ok "unprepared fully: the MIG device destroyed, compute mode and time-slice back to the defaults, every spec gone; the MPS claim refused with its reason, still held"
line="switch from NVIDIA's driver: 3 claims taken over and unprepared fully, 1 refused with its reason (MPS), 0 leaks"
log "$line"
[[ -z ${GPU_DRA_TEST_REPORT:-} ]] || echo "$line" >>"$GPU_DRA_TEST_REPORT"
echo "$passed passed, 0 failed"
