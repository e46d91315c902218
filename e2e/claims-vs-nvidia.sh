#!/usr/bin/env bash
# e2e: the claim differential against NVIDIA's driver (issue 54, item 3).
#
# The same ResourceClaims, allocated once by kube-scheduler, are prepared and unprepared by
# NVIDIA's gpu-kubelet-plugin v0.5.0 and then by gpu-dra with the same settings, each alone on the
# same simulated node (fake libnvidia-ml in the same driver root, 4×H100), through the kubelet
# plugin socket (kubelet-sim, the kubelet's own stubs). Phases:
#
#   dynamic-mig        NVIDIA's DynamicMIG and TimeSlicingSettings, gpu-dra's defaults: a whole
#                      GPU, a time-sliced GPU (interval Long), two carved MIG devices and a claim
#                      with two MIG devices on two GPUs;
#   consumable-memory  NVIDIA's ConsumableShares with --consumable-shares=memory, gpu-dra's
#                      --mig static --consumable-shares memory: two claims sharing one GPU's
#                      memory (20Gi and 30Gi);
#   consumable-unlimited  the same with --consumable-shares unlimited: two claims on one GPU
#                      asking for no capacity;
#   mps                NVIDIA's MPSSupport, gpu-dra's defaults: a GPU shared through MPS (its
#                      GpuConfig: 30 % of the threads, 2Gi pinned per client). NVIDIA's control
#                      daemon is a Deployment (sharing.go, MpsControlDaemon.Start) whose readiness
#                      its prepare waits for (AssertReady): the script plays the Deployment
#                      controller, the kubelet (its pod running and ready; no container runs, the
#                      image is NVIDIA's) and the garbage collector (its foreground delete at
#                      unprepare). What that daemon is told (CUDA_VISIBLE_DEVICES, -M, the
#                      set_default_* commands of the pod's script) is compared with what gpu-dra's
#                      own daemon (the driver root's fake nvidia-cuda-mps-control) was told;
#   vfio               NVIDIA's PassthroughSupport and DeviceMetadata, gpu-dra's --passthrough:
#                      a GPU for a virtual machine (vfio.gpu.nvidia.com, NVIDIA's default
#                      VfioDeviceConfig), bound to vfio-pci at prepare and back to nvidia at
#                      unprepare through the simulated sysfs, whose kernel side (a write to
#                      drivers_probe or a driver's bind acted on before it returns,
#                      /dev/vfio/<group> made) is e2e/sim-pci-kernel.py's.
#
# For each claim:
#
#   - the kubelet's answer (devices: request, pool, device; CDI device ids),
#   - what a container gets from those CDI ids, computed by the runtimes' own CDI library
#     (cdi-inject): device nodes, mounts, hooks, environment,
#   - what the GPU became (compute mode, time-slice, persistence mode, the MIG device made:
#     profile, placement, compute instance), each PCI function's driver and driver_override, the
#     VFIO nodes in /dev,
#   - the device metadata files the container gets (KEP-5304), by API version,
#   - the MPS control daemons serving claims and their settings,
#   - what the claim's status.devices says,
#   - and, after the unprepare, what is left (CDI files, MIG instances, GPU settings, PCI
#     bindings).
#
# Every field is compared (e2e/claims-vs-nvidia-compare.py); a difference is a mismatch unless
# e2e/claims-vs-nvidia-explained.tsv says why it is by design. The run prints
# `claims vs NVIDIA's driver: N claims, M fields compared, 0 mismatches (K differences explained)`.
#
# What this proves less than it seems: both plugins run as host processes with kubelet-sim, not
# their images through their charts; no container starts (what it would get is the CDI library's
# answer); NVIDIA's MPS daemon does not run (its Deployment's pod is made ready by the script, so
# what its script would do in NVIDIA's image is read from the script, not seen); the kernel's side
# of a VFIO binding is a model (e2e/sim-pci-kernel.py), not the kernel.
#
# Usage: e2e/claims-vs-nvidia.sh   (GPU_DRA=path/to/gpu-dra, default target/debug/gpu-dra;
#        CLAIMS_VS_NVIDIA_ONLY=PHASE runs one phase; KEEP=DIR keeps the records and logs)
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
KERNEL_PID='' MADE_LIB_MODULES='' MADE_VAR_RUN_CDI='' MADE_TEMPLATES='' PHASE_PIDS=()
# KEEP=DIR also gets the logs (the plugins', the simulated kernel's), whatever the outcome.
trap 'stop_nvidia; [[ -z $KERNEL_PID ]] || kill "$KERNEL_PID" 2>/dev/null || true
      [[ ${#PHASE_PIDS[@]} == 0 ]] || kill "${PHASE_PIDS[@]}" 2>/dev/null || true
      [[ -z $MADE_LIB_MODULES ]] || rmdir /lib/modules || true
      [[ -z $MADE_VAR_RUN_CDI ]] || rmdir /var/run/cdi || true
      [[ -z $MADE_TEMPLATES ]] || rmdir /templates || true
      [[ -z ${KEEP:-} ]] || { mkdir -p "$KEEP" && cp "$WORK"/*.log "$KEEP"/; } 2>/dev/null || true; cleanup' EXIT
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
vfio_claims() { # gpu-1 for a virtual machine (its VFIO device, NVIDIA's default VfioDeviceConfig)
    claim_and_pod vm vfio.gpu.nvidia.com "device.attributes[\"resource.kubernetes.io\"].pciBusID == \"$(pci_bus_id_of gpu-1)\""
    CLAIMS+=(vm)
}
mps_claims() { # gpu-2 shared through MPS (30 % of its threads, 2Gi pinned per client)
    shared_claim_yaml mps "$(attr uuid) == \"$(uuid_of gpu-2)\"" \
        "{strategy: MPS, mpsConfig: {defaultActiveThreadPercentage: 30, defaultPinnedDeviceMemoryLimit: 2Gi}}" | kubectl apply -f - >&2
    pod_using_claim mps mps | kubectl apply -f - >&2
    CLAIMS+=(mps)
    mps_deployments &
    PHASE_PIDS+=("$!")
}
# mps_deployments: what a node's kubelet and the control plane's controllers do with the MPS
# control daemon Deployments NVIDIA's plugin creates (sharing.go, MpsControlDaemon.Start), which
# its prepare waits for (AssertReady: readyReplicas 1 and its one pod's container ready, ~15 s of
# retries): the pod (the Deployment controller's), running and ready (the kubelet's: no container
# runs here, its image is NVIDIA's own), and at the foreground delete of its Stop the pod gone and
# the Deployment with it (the garbage collector's). Its script (nvidia-cuda-mps-control -d and the
# set_default_* commands, chrooted in the driver root) does not run: each Deployment is kept in
# $WORK/mps-deployments, where mps_daemons reads what the daemon would be told.
mps_deployments() {
    local d name deleting ready
    while sleep 0.3; do
        for d in $(kubectl get deployments -o json | jq -r '.items[] | select(.metadata.name | startswith("mps-control-daemon")) |
            "\(.metadata.name),\(.metadata.deletionTimestamp != null),\(.status.readyReplicas // 0)"'); do
            IFS=, read -r name deleting ready <<<"$d"
            if [[ $deleting == true ]]; then
                kubectl delete pod "$name-sim" --grace-period=0 --force >/dev/null 2>&1 || true
                kubectl patch deployment "$name" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
            elif [[ $ready == 0 ]]; then
                mkdir -p "$WORK/mps-deployments"
                kubectl get deployment "$name" -o json >"$WORK/mps-deployments/$name.json" || continue
                jq '{apiVersion: "v1", kind: "Pod",
                    metadata: {name: (.metadata.name + "-sim"), namespace: .metadata.namespace, labels: .spec.template.metadata.labels},
                    spec: .spec.template.spec}' "$WORK/mps-deployments/$name.json" | kubectl create -f - >/dev/null 2>&1 || true
                kubectl patch pod "$name-sim" --subresource=status --type=merge -p '{"status": {"phase": "Running",
                    "conditions": [{"type": "Ready", "status": "True"}], "containerStatuses": [{"name": "mps-control-daemon",
                    "ready": true, "restartCount": 0, "image": "gpu-dra-e2e/none:0", "imageID": "", "state": {"running": {}}}]}}' >/dev/null || true
                kubectl patch deployment "$name" --subresource=status --type=merge \
                    -p '{"status": {"replicas": 1, "readyReplicas": 1, "availableReplicas": 1, "updatedReplicas": 1}}' >/dev/null || true
            fi
        done
    done
}
pci_bus_id_of() { slices_json | jq -r --arg d "$1" '.items[].spec.devices[]? | select(.name == $d) | .attributes["resource.kubernetes.io/pciBusID"].string'; }

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

# hardware: each GPU's settings (persistence mode included) and the MIG devices on it
hardware() {
    jq -S '[.gpus[] | {minor, compute_mode, timeslice, persistence: (.persistence // false), mig: [.gpu_instances[] | {profile_id, placement,
        compute_instances: [.compute_instances[] | .profile_id]}]}]' "$WORK/hw.json"
}

# pci: each GPU's PCI function (the driver bound, driver_override as the kernel shows it) and the
# VFIO nodes in the node's /dev (the driver root's here, where sim-pci-kernel.py makes them).
pci() {
    local function override nodes=()
    for function in "$WORK"/sysfs/bus/pci/devices/*; do
        override=$(tr -d '\n' <"$function/driver_override")
        jq -n --arg f "${function##*/}" --arg d "$(basename "$(readlink "$function/driver" || echo none)")" \
            --arg o "${override:-(null)}" '{($f): {driver: $d, driver_override: $o}}'
    done | jq -s 'add'
    [[ ! -d $NVIDIA_ROOT/dev/vfio ]] || mapfile -t nodes < <(ls "$NVIDIA_ROOT/dev/vfio")
    printf '%s\n' "${nodes[@]}" | jq -R . | jq -s '{"dev-vfio": map(select(. != ""))}'
}
# mps_daemons: the MPS control daemons serving claims and what each was told: those running
# under this run's folder (gpu-dra's, chrooted in the driver root: the fake
# nvidia-cuda-mps-control's control.log, in the daemon's log folder, has its CUDA_VISIBLE_DEVICES,
# -M and each command), and the ones NVIDIA's Deployments would start (mps_deployments keeps
# each: CUDA_VISIBLE_DEVICES, and the set_default_* commands and -M of its container's script).
mps_daemons() {
    python3 - "$WORK" "$WORK/mps-deployments" <<'PY'
import glob, json, os, re, sys
work, deployments = sys.argv[1:]
daemons = []
logs = [os.path.join(d, "control.log") for d, _, files in os.walk(work)
        if os.path.basename(d) == "log" and "control.log" in files]
for path in sorted(logs):
    log = open(path).read()
    started = re.findall(r"Control daemon started: pid=\d+ CUDA_VISIBLE_DEVICES=(\S*) multiUser=(\w+)", log)
    if not started or "Control daemon stopped" in log.split("Control daemon started")[-1]:
        continue
    commands = log.split("Control daemon started")[-1]
    percentage = re.findall(r"cmd: set_default_active_thread_percentage (\S+)", commands)
    daemons.append({"devices": sorted(d for d in started[-1][0].split(",") if d),
                    "multi_user": started[-1][1] == "true",
                    "active_thread_percentage": percentage[-1] if percentage else None,
                    "pinned_device_memory_limits": dict(re.findall(r"cmd: set_default_device_pinned_mem_limit (\S+) (\S+)", commands))})
for path in sorted(glob.glob(f"{deployments}/*.json")):
    container = json.load(open(path))["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value", "") for e in container.get("env", [])}
    script = "\n".join(container.get("args", []))
    percentage = re.search(r"set_default_active_thread_percentage (\S+) \|", script)
    daemons.append({"devices": sorted(d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d),
                    "multi_user": bool(re.search(r"nvidia-cuda-mps-control -d -M", script)),
                    "active_thread_percentage": percentage.group(1) if percentage else None,
                    "pinned_device_memory_limits": dict(re.findall(r"set_default_device_pinned_mem_limit (\S+) (\S+) \|", script))})
json.dump(sorted(daemons, key=lambda d: d["devices"]), sys.stdout)
PY
}
# inject ARGS...: the CDI library's answer (cdi-inject); with INJECT_DEV=DIR, DIR is /dev for it
# (where a spec names a device node by its /dev path only, the library reads it there).
inject() {
    if [[ -n ${INJECT_DEV:-} ]]; then
        # shellcheck disable=SC2016 # expanded by the namespace's shell
        unshare -m --propagation private sh -c 'mount --bind "$0" /dev && exec "$@"' "$INJECT_DEV" "$CDI_INJECT" "$@"
    else
        "$CDI_INJECT" "$@"
    fi
}

# record SIDE CDI_DIR: prepare every claim in one call, what each got, then unprepare and what
# is left; $WORK/SIDE.json.
record() {
    local side=$1 cdi=$2 out c uid ids
    out=$(kubelet prepare "${refs[@]}") || fail "$side: prepare: $out"
    [[ $(jq '[.claims[] | select(.error != "")] | length' <<<"$out") == 0 ]] || fail "$side: prepare: $out"
    hardware >"$WORK/$side-hw-prepared.json"
    pci | jq -s 'add' >"$WORK/$side-pci-prepared.json"
    mps_daemons >"$WORK/$side-mps-prepared.json"
    cp -r "$cdi" "$WORK/$side-cdi-prepared"
    for c in "${CLAIMS[@]}"; do
        uid=$(uid_of "$c")
        ids=$(jq -r --arg uid "$uid" '.claims[] | select(.uid == $uid) | [.devices[].cdi_device_ids[]] | join(",")' <<<"$out")
        inject --spec-dir "$cdi" --device "$ids" >"$WORK/$side-inject-$c.json" ||
            fail "$side: $c's CDI devices do not resolve through the CDI library: $(cat "$WORK/$side-inject-$c.json")"
        kubectl get resourceclaim "$c" -o json | jq '.status.devices // []' >"$WORK/$side-status-$c.json"
        # The device metadata files the container gets (KEP-5304), by where it gets them.
        # A file is a stream of JSON documents (one per API version written).
        python3 -c 'import json, sys
def docs(text):
    out, at, decoder = [], 0, json.JSONDecoder()
    while text[at:].strip():
        at += len(text[at:]) - len(text[at:].lstrip())
        doc, at = decoder.raw_decode(text, at)
        out.append(doc)
    return out
mounts = json.load(open(sys.argv[1])).get("mounts") or []
json.dump({m["destination"]: docs(open(m["source"]).read()) for m in mounts
           if m["destination"].startswith("/var/run/kubernetes.io/dra-device-attributes/")}, sys.stdout)' \
            "$WORK/$side-inject-$c.json" >"$WORK/$side-metadata-$c.json"
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
    pci | jq -s 'add' >"$WORK/$side-pci-unprepared.json"
    rm -rf "$WORK/mps-deployments"
    mps_daemons >"$WORK/$side-mps-unprepared.json"
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
    doc.setdefault("metadata", {})[c] = json.load(open(f"{work}/{side}-metadata-{c}.json"))
doc["uids"] = uids
doc["hardware"]["prepared"] = json.load(open(f"{work}/{side}-hw-prepared.json"))
doc["hardware"]["unprepared"] = json.load(open(f"{work}/{side}-hw-unprepared.json"))
doc["mps"] = {when: json.load(open(f"{work}/{side}-mps-{when}.json")) for when in ("prepared", "unprepared")}
doc["pci"] = {when: json.load(open(f"{work}/{side}-pci-{when}.json")) for when in ("prepared", "unprepared")}
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
    PHASE_PIDS=()
    # CLAIMS_VS_NVIDIA_ONLY=NAME: that phase alone (for a look at it; the totals are then partial).
    [[ -z ${CLAIMS_VS_NVIDIA_ONLY:-} || $name == "$CLAIMS_VS_NVIDIA_ONLY" ]] || return 0
    clear_slices
    # shellcheck disable=SC2086 # flags split on purpose
    NVIDIA_GATES=$gates start_nvidia "$WORK/nvidia-plugins" "$WORK/registry" "$WORK/nvidia-cdi" "$WORK/nvidia-$name.log" $nvidia_flags
    echo "$NVIDIA_PID" >"$WORK/kernel-pids"
    CLAIMS=()
    "$make"
    allocated
    hardware >"$WORK/hw-before.json"
    record "nvidia-$name" "$WORK/nvidia-cdi"
    stop_nvidia
    # Persistence mode NVIDIA's driver turned on (its unprepare of a VFIO device does, whatever it
    # was: the record shows it) is put back before gpu-dra's turn; anything else left is a failure.
    local minor
    for minor in $(jq -r --slurpfile before "$WORK/hw-before.json" \
        '.[] | . as $g | select(.persistence != ($before[0][] | select(.minor == $g.minor) | .persistence)) | .minor' <<<"$(hardware)"); do
        "$GPU_DRA" sim --gpus "$GPUS" --node-name "$NODE" --sim-state "$NVIDIA_STATE" persistence --gpu "$minor" \
            --enabled "$(jq -r --argjson m "$minor" '.[] | select(.minor == $m) | .persistence' "$WORK/hw-before.json")" >/dev/null
    done
    [[ $(hardware) == "$(cat "$WORK/hw-before.json")" ]] || fail "$name: NVIDIA's driver left the hardware changed: $(hardware)"
    # The same container toolkit hook NVIDIA's plugin was given.
    DRIVER_ARGS="--nvidia-cdi-hook-path $BIN/nvidia-cdi-hook $ours_flags" start_driver
    echo "$DRIVER_PID" >"$WORK/kernel-pids"
    record "ours-$name" "$WORK/cdi"
    stop_driver
    [[ ${#PHASE_PIDS[@]} == 0 ]] || kill "${PHASE_PIDS[@]}" 2>/dev/null || true
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

# MPS: NVIDIA's plugin reads its control daemon's Deployment template from /templates (sharing.go,
# MpsControlDaemonTemplatePath; its image has it): there in its namespace, from its module (the
# one e2e/build-k8s.sh builds the plugin from; a machine without /templates gets an empty mount
# point for the run). gpu-dra starts the daemon itself, the driver root's
# nvidia-cuda-mps-control: the fake one.
mps_node_setup() {
    local module control=${FAKE_MPS_CONTROL:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/nvidia-cuda-mps-control}
    local go=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
    module=$(cd "$ROOT" && GOTOOLCHAIN=local "$go" mod download -json sigs.k8s.io/dra-driver-nvidia-gpu@v0.5.0 | jq -r .Dir)
    [[ -f $module/templates/mps-control-daemon.tmpl.yaml ]] || fail "NVIDIA's module has no MPS daemon template at $module/templates"
    mkdir -p "$WORK/templates"
    cp "$module/templates/mps-control-daemon.tmpl.yaml" "$WORK/templates/"
    if [[ ! -e /templates ]]; then
        mkdir /templates
        MADE_TEMPLATES=1
    fi
    [[ -x $control ]] || (cd "$ROOT" && cargo build -q -p fakenvml --bin nvidia-cuda-mps-control) >&2
    install -m 0755 "$control" "$NVIDIA_ROOT/usr/bin/nvidia-cuda-mps-control"
}
mps_node_setup
NVIDIA_BINDS="$WORK/templates:/templates" phase mps MPSSupport=true "" "--mig static" mps_claims

# VFIO: both bind through the simulated sysfs as through /sys, NVIDIA's in a mount namespace where
# /sys is it (go-nvlib's PCI scan and binding are rooted at /sys), gpu-dra with --sysfs-root; the
# kernel's part is sim-pci-kernel.py's. The node: the vfio_pci module loaded (sysfs
# module/vfio_pci), the kernel's modules.alias for it (as e2e/vs-nvidia.sh makes it), and the
# host's fuser, which NVIDIA's plugin runs chrooted in --host-root before it unbinds a GPU from
# nvidia (vfio-device.go, WaitForGPUFree): a stand-in that finds no process holding the GPU, true
# of the simulated ones (nothing opens their device files).
vfio_node_setup() {
    local modules lib
    mkdir -p "$WORK/sysfs/module/vfio_pci"
    # No nvidia-persistenced on this node (persistence mode is off on the simulated GPUs): with
    # its socket in the driver root NVIDIA's plugin would turn persistence off through the driver
    # root's nvidia-smi, chrooted (nvlib.go, disableGPUPersistenceMode), which the fake one does
    # not do. The last phase: the other phases' containers keep getting the socket.
    rm -f "$NVIDIA_ROOT/run/nvidia-persistenced/socket"
    if [[ ! -e /lib/modules ]]; then
        mkdir /lib/modules
        MADE_LIB_MODULES=1
    fi
    # NVIDIA's plugin writes the device metadata's CDI spec (KEP-5304, its DeviceMetadata gate)
    # to /var/run/cdi whatever its --cdi-root (driver.go gives kubeletplugin.Start no
    # CDIDirectoryPath): in its namespace that is its CDI root.
    if [[ ! -e /var/run/cdi ]]; then
        mkdir -p /var/run/cdi
        MADE_VAR_RUN_CDI=1
    fi
    mkdir -p "$WORK/nvidia-cdi"
    modules=$WORK/modules/$(uname -r)
    mkdir -p "$modules" "$WORK/host-root/usr/bin"
    echo "alias vfio_pci:v*d*sv*sd*bc*sc*i* vfio_pci" >"$modules/modules.alias"
    # fuser's exit status for "no process uses it": /bin/false, with the libraries it loads.
    cp /bin/false "$WORK/host-root/usr/bin/fuser"
    for lib in $(ldd /bin/false | grep -o '/[^ ]*'); do
        mkdir -p "$WORK/host-root$(dirname "$lib")"
        cp -L "$lib" "$WORK/host-root$lib"
    done
    python3 "$E2E/sim-pci-kernel.py" "$WORK/sysfs" "$NVIDIA_ROOT/dev" "$WORK/kernel-pids" "$GPU_DRA" -- \
        --gpus "$GPUS" --node-name "$NODE" --sim-state "$NVIDIA_STATE" 2>>"$WORK/sim-pci-kernel.log" &
    KERNEL_PID=$!
}
vfio_node_setup
NVIDIA_BINDS="$WORK/sysfs:/sys $WORK/modules:/lib/modules $WORK/nvidia-cdi:/var/run/cdi" INJECT_DEV=$NVIDIA_ROOT/dev \
    phase vfio PassthroughSupport=true,DeviceMetadata=true "" \
    "--mig static --passthrough --sysfs-root $WORK/sysfs --modules-root $WORK/modules" vfio_claims

line="claims vs NVIDIA's driver: $total_claims claims, $total_fields fields compared, 0 mismatches ($total_explained differences explained)"
log "$line"
[[ -z ${GPU_DRA_TEST_REPORT:-} ]] || echo "$line" >>"$GPU_DRA_TEST_REPORT"
echo "$passed passed, 0 failed"
