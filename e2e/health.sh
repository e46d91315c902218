#!/usr/bin/env bash
# e2e: GPU faults on the real control plane, raised in the simulated hardware with
# `gpu-dra sim inject` and seen by the driver through its event source and probe:
#
#   1. an XID 79 on gpu-0 appears as a `gpu.nvidia.com/xid=79` taint on gpu-0 within 2 s, and the
#      health stream (kubelet-sim on the upstream stubs) says Unhealthy;
#   2. a new claim for that product is allocated the other GPU by the real kube-scheduler;
#   3. an ignored XID (31, the application's) changes nothing;
#   4. after `--reset` the taint is gone and gpu-0 is allocatable again; the stream went
#      Healthy → Unhealthy → Healthy;
#   5. a double-bit ECC error taints with the effect configured for its class (NoExecute), and
#      the taint survives a driver restart until the GPU is reset;
#   6. a MIG device an admin makes in static mode is published without restarting the driver, at
#      its MIG-config-change event (the periodic rescan is an hour away here);
#   7. a compute process on that MIG device under a prepared claim is the claim's use in
#      /metrics (with DRIVER_BACKEND=nvml read through the fake libnvidia-ml's memory and process
#      calls); when the admin destroys the device, the stream reports it Unhealthy and the claim
#      stays in the checkpoint until kubelet unprepares it.
#
# Usage: e2e/health.sh   (GPU_DRA=path/to/gpu-dra, default target/debug/gpu-dra)
set -euo pipefail
NAME=health-e2e
NODE=health-node-1
GPUS=sim:3xH100-SXM5-80GB
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

sim() { "$GPU_DRA" sim --gpus "$GPUS" --node-name "$NODE" --sim-state "$WORK/hw.json" "$@"; }
taints() { slices_json | jq -c --arg d "$1" '[.items[].spec.devices[]? | select(.name == $d) | .taints // [] | .[] | {key, value, effect}]'; }
device_names() { slices_json | jq -r '[.items[].spec.devices[]?.name] | sort | join(" ")'; }
# The last health the stream reported for a device.
stream_health() { jq -r --arg d "$1" '.devices[] | select(.device == $d) | .health' "$WORK/watch.jsonl" 2>/dev/null | tail -n 1; }

# GPU 2 is in MIG mode with no MIG devices yet: under --mig static it offers nothing until an
# admin makes one.
sim mig-mode --gpu 2 --enabled true >/dev/null
kubectl apply -f "$ROOT/deviceclasses/" >&2
PORT=$(metrics_port)
METRICS=http://127.0.0.1:$PORT/metrics
ARGS="--mig static --health-probe-interval 500ms --rescan-interval 1h --health-taint-effects reset=NoExecute --metrics-addr 127.0.0.1:$PORT --usage-interval 1s"
DRIVER_ARGS=$ARGS start_driver
wait_for "gpu-0 and gpu-1 published" 30 bash -c "[[ \$(kubectl get resourceslices -o json | jq -r '[.items[].spec.devices[]?.name] | sort | join(\" \")') == 'gpu-0 gpu-1' ]]"
kubelet watch --duration 120s >"$WORK/watch.jsonl" 2>"$WORK/watch.log" &
WATCH_PID=$!
wait_for "the health stream reports gpu-0 Healthy" 10 bash -c "[[ \$(jq -r '.devices[] | select(.device == \"gpu-0\") | .health' '$WORK/watch.jsonl' | tail -n 1) == Healthy ]]"

# ---------------------------------------------------------------- 1. XID 79
save_metrics_sample healthy "$METRICS"
started=$(date +%s%N)
sim inject --gpu 0 --xid 79 >/dev/null
until [[ $(taints gpu-0) != "[]" ]]; do
    (($(date +%s%N) - started < 10000000000)) || fail "no taint on gpu-0 10 s after XID 79"
    sleep 0.1
done
elapsed_ms=$((($(date +%s%N) - started) / 1000000))
first=$(taints gpu-0)
jq -e 'index({"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoExecute"}) != null' <<<"$first" >/dev/null ||
    fail "gpu-0 taints: $first (want xid=79 with the reset class's NoExecute)"
((elapsed_ms < 2000)) || fail "the taint took ${elapsed_ms} ms (want < 2 s)"
[[ $(taints gpu-1) == "[]" ]] || fail "gpu-1 tainted too: $(taints gpu-1)"
wait_for "the health stream reports gpu-0 Unhealthy" 10 bash -c "[[ \$(jq -r '.devices[] | select(.device == \"gpu-0\") | .health' '$WORK/watch.jsonl' | tail -n 1) == Unhealthy ]]"
message=$(jq -r '.devices[] | select(.device == "gpu-0") | .message' "$WORK/watch.jsonl" | tail -n 1)
[[ $message == *"XID 79"* ]] || fail "health message for gpu-0: '$message'"
wait_for "the GPU loss seen by the probe" 10 bash -c "[[ \$(kubectl get resourceslices -o json | jq -c '[.items[].spec.devices[]? | select(.name == \"gpu-0\") | .taints[]?.key]') == *gpu-lost* ]]"
curl -sf "$METRICS" | grep -q '^gpu_dra_device_taint{.*key="gpu.nvidia.com/gpu-lost"' || fail "no gpu_dra_device_taint series for gpu-lost"
save_metrics_sample xid-79 "$METRICS"
ok "XID 79 on gpu-0: tainted xid=79 in ${elapsed_ms} ms, then gpu-lost; the health stream says Unhealthy ($message); gpu_dra_device_taint says so"

# ---------------------------------------------------------------- 2. schedule around it
H100='device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"'
allocated() { kubectl get resourceclaim "$1" -o jsonpath='{.status.allocation.devices.results[0].device}'; }
claim_and_pod h100-a gpu.nvidia.com "$H100"
wait_for "h100-a allocated" 60 bash -c "[[ -n \$(kubectl get resourceclaim h100-a -o jsonpath='{.status.allocation.devices.results[0].device}') ]]"
[[ $(allocated h100-a) == gpu-1 ]] || fail "h100-a got $(allocated h100-a), not the healthy gpu-1"
ok "a new claim for an H100 is allocated the healthy gpu-1"

# ---------------------------------------------------------------- 3. ignored XID
generation=$(slices_json | jq -r '.items[0].spec.pool.generation')
sim inject --gpu 1 --xid 31 >/dev/null
sleep 2
[[ $(taints gpu-1) == "[]" ]] || fail "XID 31 (the application's) tainted gpu-1: $(taints gpu-1)"
[[ $(slices_json | jq -r '.items[0].spec.pool.generation') == "$generation" ]] || fail "XID 31 changed the pool"
[[ $(stream_health gpu-1) == Healthy ]] || fail "XID 31 made gpu-1 $(stream_health gpu-1)"
ok "XID 31 (ignored by default) changes nothing"

# ---------------------------------------------------------------- 4. reset
sim inject --gpu 0 --reset >/dev/null
wait_for "gpu-0 untainted after the reset" 10 bash -c "[[ \$(kubectl get resourceslices -o json | jq -c '[.items[].spec.devices[]? | select(.name == \"gpu-0\") | .taints // [] | length] | add') == 0 ]]"
claim_and_pod h100-b gpu.nvidia.com "$H100"
wait_for "h100-b allocated" 60 bash -c "[[ -n \$(kubectl get resourceclaim h100-b -o jsonpath='{.status.allocation.devices.results[0].device}') ]]"
[[ $(allocated h100-b) == gpu-0 ]] || fail "h100-b got $(allocated h100-b), not gpu-0 back in service"
wait_for "the health stream reports gpu-0 Healthy again" 10 bash -c "[[ \$(jq -r '.devices[] | select(.device == \"gpu-0\") | .health' '$WORK/watch.jsonl' | tail -n 1) == Healthy ]]"
sequence=$(jq -r '.devices[] | select(.device == "gpu-0") | .health' "$WORK/watch.jsonl" | uniq | tr '\n' ' ')
[[ $sequence == "Healthy Unhealthy Healthy " ]] || fail "gpu-0 through the health stream: $sequence"
kubectl get events --field-selector involvedObject.kind=Node,reason=GpuUnhealthy -o json | jq -e '.items | length > 0' >/dev/null ||
    fail "no GpuUnhealthy event on the Node"
ok "after a reset gpu-0 is untainted and allocated again; the stream went $sequence; Node events recorded"

# ---------------------------------------------------------------- 5. ECC, class effect, restart
sim inject --gpu 0 --ecc-dbe >/dev/null
wait_for "gpu-0 tainted for the ECC error" 10 bash -c "[[ \$(kubectl get resourceslices -o json | jq -c '[.items[].spec.devices[]? | select(.name == \"gpu-0\") | .taints[]? | {key, effect}]') == *ecc-dbe*NoExecute* ]]"
before=$(taints gpu-0)
stop_driver
DRIVER_ARGS=$ARGS start_driver
wait_for "the restarted driver taking the faults over" 30 grep -q "devices still unhealthy from before the restart" "$WORK/driver.log"
sleep 3 # several of its probe rounds (500 ms): a wrong one would have untainted by now
[[ $(taints gpu-0) == "$before" ]] || fail "the restart changed gpu-0's taints: $(taints gpu-0) (was $before)"
sim inject --gpu 0 --reset >/dev/null
wait_for "gpu-0 untainted after the second reset" 10 bash -c "[[ \$(kubectl get resourceslices -o json | jq -c '[.items[].spec.devices[]? | select(.name == \"gpu-0\") | .taints // [] | length] | add') == 0 ]]"
ok "a double-bit ECC error taints gpu-0 NoExecute (its class's effect); the taint outlives a driver restart and clears at reset"

# ---------------------------------------------------------------- 6. MIG made by an admin
sim create --gpu 2 --profile 1g.10gb >/dev/null
wait_for "the admin-made MIG device published" 5 bash -c "kubectl get resourceslices -o json | jq -e '[.items[].spec.devices[]?.name] | index(\"gpu-2-mig-1g10gb-19-0\")'"
ok "a MIG device made by an admin in static mode is published at its MIG-config-change event, without a restart or a periodic rescan ($(device_names))"

# ---------------------------------------------------------------- 7. vanished while prepared
mig=gpu-2-mig-1g10gb-19-0
kubectl apply -f - >&2 <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: mig-a, namespace: default}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: mig.nvidia.com
---
$(pod_using_claim mig-a mig-a)
EOF
wait_for "mig-a allocated" 60 bash -c "[[ \$(kubectl get resourceclaim mig-a -o jsonpath='{.status.allocation.devices.results[0].device}') == $mig ]]"
uid=$(kubectl get resourceclaim mig-a -o jsonpath='{.metadata.uid}')
out=$(kubelet prepare --claim "default/mig-a/$uid") || fail "prepare mig-a: $out"
[[ $(jq -r '.claims[0].error' <<<"$out") == "" ]] || fail "prepare mig-a: $out"
gi=$(sim show | jq '.gpus[2].gpu_instances[0].id')
sim process --gpu 2 --gpu-instance "$gi" --pid 4343 --memory-mib 1024 >/dev/null
mig_a_memory() { curl -sf "$METRICS" | grep "^gpu_dra_claim_device_memory_used_bytes{.*claim=\"mig-a\".*GPU_I_ID=\"$gi\"" | awk '{print $NF}'; }
mig_a_uses() { [[ $(mig_a_memory) == "$1" ]]; }
wait_for "mig-a's memory in use in /metrics" 15 mig_a_uses 1073741824
# The admin's (static) MIG device is labelled as DCGM labels it: the parent's UUID, its GPU_I_ID.
parent=$(slices_json | jq -r --arg d "$mig" '.items[].spec.devices[]? | select(.name == $d) | .attributes.parentUUID.string')
curl -sf "$METRICS" | grep -q "^gpu_dra_prepared_device_info{.*claim=\"mig-a\".*UUID=\"$parent\",GPU_I_ID=\"$gi\"" ||
    fail "mig-a's info series lacks the parent's UUID $parent and GPU_I_ID $gi: $(curl -sf "$METRICS" | grep 'claim="mig-a"')"
ok "a process on $mig (GPU instance $gi) under the prepared claim mig-a: /metrics says the claim's device uses 1 GiB ($(mig_a_memory) bytes); its info series has the parent's UUID and GPU_I_ID"

# NVML refuses to destroy a GPU instance processes run in: the process ends first.
sim process --gpu 2 --pid 4343 --end >/dev/null
sim destroy --gpu 2 --gpu-instance "$gi" >/dev/null
kubelet watch --until "$mig=Unhealthy" --duration 20s >"$WORK/watch2.jsonl" 2>"$WORK/watch2.log" ||
    fail "the health stream did not report the vanished $mig Unhealthy: $(tail -n 2 "$WORK/watch2.log")"
message=$(jq -r --arg d "$mig" '.devices[] | select(.device == $d) | .message' "$WORK/watch2.jsonl" | tail -n 1)
[[ $message == *"no longer on the node"* ]] || fail "message for the vanished $mig: '$message'"
jq -e --arg u "$uid" '.claims[$u].devices[0].device' "$WORK/state/checkpoint.json" >/dev/null ||
    fail "the vanished device's claim left the checkpoint"
out=$(kubelet unprepare --claim "default/mig-a/$uid") || fail "unprepare mig-a: $out"
[[ $(jq -r '.claims[0].error' <<<"$out") == "" ]] || fail "unprepare mig-a: $out"
ok "an admin destroyed $mig under a prepared claim: the stream says Unhealthy ($message), the checkpoint keeps the claim until unprepared"

kill "$WATCH_PID" 2>/dev/null || true
echo "$passed passed, 0 failed"
