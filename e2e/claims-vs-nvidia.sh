#!/usr/bin/env bash
# e2e: the claim differential against NVIDIA's driver (issue 54, item 3).
#
# The same ResourceClaims, allocated once by kube-scheduler, are prepared and unprepared by
# NVIDIA's gpu-kubelet-plugin v0.5.0 and then by gpu-dra with the same settings, each alone on the
# same simulated node (fake libnvidia-ml in the same driver root, 4×H100), through the kubelet
# plugin socket (kubelet-sim, the kubelet's own stubs). Two phases:
#
#   dynamic-mig        NVIDIA's DynamicMIG and TimeSlicingSettings, gpu-dra's defaults: a whole
#                      GPU, a time-sliced GPU (interval Long), two carved MIG devices and a claim
#                      with two MIG devices on two GPUs;
#   consumable-memory  NVIDIA's ConsumableShares with --consumable-shares=memory, gpu-dra's
#                      --mig static --consumable-shares memory: two claims sharing one GPU's
#                      memory (20Gi and 30Gi);
#   consumable-unlimited  the same with --consumable-shares unlimited: two claims on one GPU
#                      asking for no capacity.
#
# For each claim:
#
#   - the kubelet's answer (devices: request, pool, device; CDI device ids),
#   - what a container gets from those CDI ids, computed by the runtimes' own CDI library
#     (cdi-inject): device nodes, mounts, hooks, environment,
#   - what the GPU became (compute mode, time-slice, the MIG device made: profile, placement,
#     compute instance),
#   - what the claim's status.devices says,
#   - and, after the unprepare, what is left (CDI files, MIG instances, GPU settings).
#
# Every field is compared (e2e/claims-vs-nvidia-compare.py); a difference is a mismatch unless
# e2e/claims-vs-nvidia-explained.tsv says why it is by design. The run prints
# `claims vs NVIDIA's driver: N claims, M fields compared, 0 mismatches (K differences explained)`.
#
# Not compared here, with why: MPS (NVIDIA's control daemon is a Deployment, which needs a real
# kubelet and its image), VFIO (NVIDIA's PassthroughSupport binds through sysfs paths of a real
# PCI bus).
#
# What this proves less than it seems: both plugins run as host processes with kubelet-sim, not
# their images through their charts; no container starts (what it would get is the CDI library's
# answer).
#
# Usage: e2e/claims-vs-nvidia.sh   (GPU_DRA=path/to/gpu-dra, default target/debug/gpu-dra)
set -euo pipefail
NAME=claims-vs-nvidia
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
kubectl apply -f "$ROOT/deviceclasses/" >&2

uuid_of() { slices_json | jq -r --arg d "$1" '.items[].spec.devices[]? | select(.name == $d) | .attributes.uuid.string'; }
attr() { echo "device.attributes[\"gpu.nvidia.com\"].$1"; }
uid_of() { kubectl get resourceclaim "$1" -o jsonpath='{.metadata.uid}'; }

# ------------------------------------------------------------------ the claims of each phase
# Each makes its claims (and pods, which kube-scheduler allocates them for) and sets CLAIMS.
mig_and_sliced_claims() {
    claim_and_pod whole gpu.nvidia.com "$(attr uuid) == \"$(uuid_of gpu-0)\""
    claim_and_pod carved mig.nvidia.com "$(attr profile) == \"1g.10gb\" && $(attr parentUUID) == \"$(uuid_of gpu-2)\""
    claim_and_pod carved-big mig.nvidia.com "$(attr profile) == \"3g.40gb\" && $(attr parentUUID) == \"$(uuid_of gpu-3)\""
    # The time-sliced claim, then the heredoc's.
    { timesliced_claim_yaml sliced "$(attr uuid) == \"$(uuid_of gpu-1)\"" Long; echo ---; cat; } <<EOF | kubectl apply -f - >&2
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: two-mig, namespace: default}
spec:
  devices:
    requests:
    - name: small
      exactly:
        deviceClassName: mig.nvidia.com
        selectors:
        - cel: {expression: '$(attr profile) == "1g.10gb" && $(attr parentUUID) == "$(uuid_of gpu-2)"'}
    - name: medium
      exactly:
        deviceClassName: mig.nvidia.com
        selectors:
        - cel: {expression: '$(attr profile) == "2g.20gb" && $(attr parentUUID) == "$(uuid_of gpu-3)"'}
EOF
    pod_using_claim sliced sliced | kubectl apply -f - >&2
    pod_using_claim two-mig two-mig | kubectl apply -f - >&2
    CLAIMS+=(whole sliced carved carved-big two-mig)
}
shared_claims() { # two claims sharing gpu-0's memory (consumable capacity); SHARES: NAME:MEMORY...
    local name memory capacity
    for name in ${SHARES:-share-a:20Gi share-b:30Gi}; do
        memory=${name#*:} name=${name%%:*} capacity=
        [[ $memory == none ]] || capacity="capacity: {requests: {memory: $memory}}"
        kubectl apply -f - >&2 <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: $name, namespace: default}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
        selectors:
        - cel: {expression: '$(attr uuid) == "$(uuid_of gpu-0)"'}
        $capacity
EOF
        pod_using_claim "$name" "$name" | kubectl apply -f - >&2
        CLAIMS+=("$name")
    done
}
unlimited_claims() { # two claims on gpu-0, no capacity asked (consumable shares, unlimited)
    SHARES="share-c:none share-d:none" shared_claims
}

# allocated: waits for kube-scheduler's allocation of every claim; sets refs.
allocated() {
    local c
    refs=()
    for c in "${CLAIMS[@]}"; do
        wait_for "claim $c allocated" 60 bash -c "[[ -n \$(kubectl get resourceclaim $c -o jsonpath='{.status.allocation}') ]]"
        refs+=(--claim "default/$c/$(uid_of "$c")")
    done
    log "allocated: $(kubectl get resourceclaims -o json | jq -c '[.items[] | {(.metadata.name): [.status.allocation.devices.results[] | .device + (if .shareID then " (shared)" else "" end)]}] | add')"
}
clear_slices() {
    kubectl delete resourceslices --field-selector "spec.nodeName=$NODE" --wait=true >/dev/null 2>&1 || true
}

# hardware: each GPU's settings and the MIG devices on it
hardware() {
    jq -S '[.gpus[] | {minor, compute_mode, timeslice, mig: [.gpu_instances[] | {profile_id, placement,
        compute_instances: [.compute_instances[] | .profile_id]}]}]' "$WORK/hw.json"
}

# record SIDE CDI_DIR: prepare every claim in one call, what each got, then unprepare and what
# is left; $WORK/SIDE.json.
record() {
    local side=$1 cdi=$2 out c uid ids
    out=$(kubelet prepare "${refs[@]}") || fail "$side: prepare: $out"
    [[ $(jq '[.claims[] | select(.error != "")] | length' <<<"$out") == 0 ]] || fail "$side: prepare: $out"
    hardware >"$WORK/$side-hw-prepared.json"
    cp -r "$cdi" "$WORK/$side-cdi-prepared"
    for c in "${CLAIMS[@]}"; do
        uid=$(uid_of "$c")
        ids=$(jq -r --arg uid "$uid" '.claims[] | select(.uid == $uid) | [.devices[].cdi_device_ids[]] | join(",")' <<<"$out")
        "$CDI_INJECT" --spec-dir "$cdi" --device "$ids" >"$WORK/$side-inject-$c.json" ||
            fail "$side: $c's CDI devices do not resolve through the CDI library: $(cat "$WORK/$side-inject-$c.json")"
        kubectl get resourceclaim "$c" -o json | jq '.status.devices // []' >"$WORK/$side-status-$c.json"
    done
    jq '[.claims[] | {uid, devices}]' <<<"$out" >"$WORK/$side-answer.json"
    # One call for all, as the kubelet sends them; what failed is kept (a field of its own) and
    # retried, as the kubelet retries, until nothing fails.
    out=$(kubelet unprepare "${refs[@]}") || fail "$side: unprepare: $out"
    jq '[.claims[] | select(.error != "") | {(.name): .error}] | add // {}' <<<"$out" >"$WORK/$side-unprepare-errors.json"
    local retry failed
    for retry in 1 2 3; do
        failed=$(jq -r '[.claims[] | select(.error != "") | "--claim", "default/\(.name)/\(.uid)"] | join(" ")' <<<"$out")
        [[ -n $failed ]] || break
        # shellcheck disable=SC2086 # one argument per word
        out=$(kubelet unprepare $failed) || fail "$side: unprepare retry $retry: $out"
    done
    [[ $(jq '[.claims[] | select(.error != "")] | length' <<<"$out") == 0 ]] || fail "$side: unprepare after 3 retries: $out"
    hardware >"$WORK/$side-hw-unprepared.json"
    (cd "$cdi" && find . -type f | sort) >"$WORK/$side-cdi-left.txt"
    python3 - "$WORK" "$side" "$(printf '%s,' "${CLAIMS[@]}")" <<'PY'
import json, sys
work, side, claims = sys.argv[1], sys.argv[2], [c for c in sys.argv[3].split(",") if c]
uids = {}
answer = json.load(open(f"{work}/{side}-answer.json"))
doc = {"answer": {}, "inject": {}, "status": {}, "hardware": {}, "left": {}}
import subprocess
for c in claims:
    uid = subprocess.run(["kubectl", "get", "resourceclaim", c, "-o", "jsonpath={.metadata.uid}"],
                         capture_output=True, text=True, check=True).stdout
    uids[c] = uid
    doc["answer"][c] = next(a["devices"] for a in answer if a["uid"] == uid)
    doc["inject"][c] = json.load(open(f"{work}/{side}-inject-{c}.json"))
    doc["status"][c] = json.load(open(f"{work}/{side}-status-{c}.json"))
doc["uids"] = uids
doc["hardware"]["prepared"] = json.load(open(f"{work}/{side}-hw-prepared.json"))
doc["hardware"]["unprepared"] = json.load(open(f"{work}/{side}-hw-unprepared.json"))
doc["left"]["cdi"] = [l for l in open(f"{work}/{side}-cdi-left.txt").read().split("\n") if l]
doc["unprepare_errors"] = json.load(open(f"{work}/{side}-unprepare-errors.json"))
json.dump(doc, open(f"{work}/{side}.json", "w"), indent=1, sort_keys=True)
PY
}

# phase NAME NVIDIA_GATES NVIDIA_FLAGS OURS_FLAGS MAKE_CLAIMS: NVIDIA's plugin with its gates
# and flags, the claims made and allocated against what it publishes, prepared and unprepared by
# it, then by gpu-dra with the same settings; the two records compared.
total_claims=0 total_fields=0 total_explained=0
phase() {
    local name=$1 gates=$2 nvidia_flags=$3 ours_flags=$4 make=$5 out claims fields explained
    clear_slices
    # shellcheck disable=SC2086 # flags split on purpose
    NVIDIA_GATES=$gates start_nvidia "$WORK/nvidia-plugins" "$WORK/registry" "$WORK/nvidia-cdi" "$WORK/nvidia-$name.log" $nvidia_flags
    CLAIMS=()
    "$make"
    allocated
    hardware >"$WORK/hw-before.json"
    record "nvidia-$name" "$WORK/nvidia-cdi"
    stop_nvidia
    [[ $(hardware) == "$(cat "$WORK/hw-before.json")" ]] || fail "$name: NVIDIA's driver left the hardware changed: $(hardware)"
    # The same container toolkit hook NVIDIA's plugin was given.
    DRIVER_ARGS="--nvidia-cdi-hook-path $BIN/nvidia-cdi-hook $ours_flags" start_driver
    record "ours-$name" "$WORK/cdi"
    stop_driver
    # KEEP=DIR keeps each side's record and the CDI specs it wrote, for a look at a difference.
    [[ -z ${KEEP:-} ]] || { mkdir -p "$KEEP" && cp -r "$WORK"/nvidia-"$name"* "$WORK"/ours-"$name"* "$KEEP"/; }
    out=$(python3 "$E2E/claims-vs-nvidia-compare.py" --explained "$E2E/claims-vs-nvidia-explained.tsv" \
        --driver-root "$WORK/driver-root" --work "$WORK" "$WORK/nvidia-$name.json" "$WORK/ours-$name.json") ||
        fail "$name: mismatches against NVIDIA's driver: $out"
    echo "$out" | sed '$d' >&2
    read -r claims fields explained <<<"$(tail -n 1 <<<"$out")"
    total_claims=$((total_claims + claims)) total_fields=$((total_fields + fields)) total_explained=$((total_explained + explained))
    ok "$name: ${CLAIMS[*]} prepared and unprepared by each driver: $claims claims, $fields fields compared, 0 mismatches ($explained differences explained)"
    # Gone before the next phase allocates (no kubelet here finishes the pods' deletion, so the
    # claims' delete protection is taken off by hand).
    kubectl delete pods --all --grace-period=0 --force >/dev/null 2>&1 || true
    kubectl delete resourceclaims --all --wait=false >/dev/null
    local c
    for c in "${CLAIMS[@]}"; do
        kubectl patch resourceclaim "$c" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
    done
    wait_for "$name's claims gone" 30 bash -c "[[ -z \$(kubectl get resourceclaims -o name) ]]"
}

phase dynamic-mig DynamicMIG=true,TimeSlicingSettings=true "" "" mig_and_sliced_claims
phase consumable-memory ConsumableShares=true --consumable-shares=memory "--mig static --consumable-shares memory" shared_claims
phase consumable-unlimited ConsumableShares=true --consumable-shares=unlimited "--mig static --consumable-shares unlimited" unlimited_claims

line="claims vs NVIDIA's driver: $total_claims claims, $total_fields fields compared, 0 mismatches ($total_explained differences explained)"
log "$line"
[[ -z ${GPU_DRA_TEST_REPORT:-} ]] || echo "$line" >>"$GPU_DRA_TEST_REPORT"
echo "$passed passed, 0 failed"
