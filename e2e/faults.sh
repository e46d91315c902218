#!/usr/bin/env bash
# Fault injection: the driver is killed with SIGKILL at every step boundary of prepare and
# unprepare (GPU_DRA_FAILPOINT), for whole GPUs and for MIG placements it must carve, then
# restarted; kubelet retries the call as it would. After each run exactly the right CDI files
# exist, the checkpoint agrees, and no simulated GPU/compute instance leaked.
#
# Claims are allocated by writing status.allocation directly (the scheduler is not what is under
# test here), so MIG placements can be used before they are published.
#
# Whole GPUs are also time-sliced (a GpuConfig with TimeSlicing Long) in the first rounds: after
# every crash the GPU's compute mode and time-slice end up as the claim wants them once prepared,
# and exactly as they were before (not merely the defaults) once unprepared.
#
# Two claims carving MIG devices of one GPU in one kubelet call (in flight together) in the first
# round: the driver is killed at every prepare step in whichever claim reaches it first; after the
# restart both are prepared on instances that exist, and nothing leaks.
#
# Two claims sharing a whole GPU (consumable capacity, shareIDs) through its one MPS daemon: the
# joining claim is killed at every prepare step, and the last claim to leave at every unprepare
# step; the daemon and EXCLUSIVE_PROCESS stay exactly as long as a sharer is prepared.
#
# Whole GPUs and carved MIG devices with MPS (a GpuConfig / MigDeviceConfig with strategy MPS) in
# the first rounds: after every crash the claim's MPS daemon runs (one, told its limits) once
# prepared; once unprepared no daemon, shm mount or folder is left and the compute mode is back.
#
# GPUs handed to a virtual machine (gpu-vfio-<index>, --passthrough) in the first rounds, each in
# persistence mode and held by the driver's own NVML session (a kill between closing that session
# and the unbind included): no unbind ever finds the GPU held, and persistence mode is back on
# after unprepare. After every crash the GPU is bound to vfio-pci with its device metadata once
# prepared, and back on nvidia (seen by NVML) with no metadata once unprepared.
#
# ComputeDomain channels (shard 0): a second driver on a GB200 node of its own with
# --compute-domains, killed at each step where its book and IMEX daemon change under the node
# lock; after each run the book, the CDI spec and the daemons agree (see the section below).
#
# Every armed driver must die at its step; after each run the hardware has exactly the instances
# the checkpoint records (compute instances included, MIG mode as before), and the spec of a
# retried prepare names the instance that exists.
#
# The runs are dealt round-robin to FAULT_SHARDS shards (default 2), each its own control plane,
# node and simulated hardware, run side by side: a run mostly waits on a driver starting or dying,
# so two shards take about half the time on CI's two cores. The totals are checked over all shards.
#
# Usage: e2e/faults.sh [ROUNDS]   (default 4 rounds: 123 runs, 65 of them carving MIG devices, 25 with MPS, 14 for VMs; and 6 of ComputeDomain channels)
set -euo pipefail
NAME=faults-e2e
NODE=fault-node-1
GPUS=sim:8xH100-SXM5-80GB
ROUNDS=${1:-4}
SHARDS=${FAULT_SHARDS:-2}
[[ $SHARDS =~ ^[1-9][0-9]*$ ]] || { echo "$NAME: FAULT_SHARDS must be a positive number, not '$SHARDS'" >&2; exit 2; }
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "$NAME: ROUNDS must be a positive number, not '$ROUNDS'" >&2; exit 2; }

# Including the points where the hardware changed and the checkpoint does not know yet.
PREPARE_STEPS=(prepare-started mig-mode-enabled prepare-gi-created-unrecorded prepare-gi-created
    prepare-ci-created-unrecorded prepare-ci-created prepare-sharing-applied prepare-vfio-released prepare-vfio-bound
    prepare-mps-shm-mounted prepare-mps-started prepare-cdi-written prepare-completed)
UNPREPARE_STEPS=(unprepare-started rollback-cdi-removed rollback-vfio-unbound mig-mode-disabled rollback-mig-destroyed)
# The ComputeDomain channel plugin's steps: its book and IMEX daemons change under the node-wide
# lock (gpu_dra::prepare::failpoint::COMPUTE_DOMAIN_STEPS); run by shard 0, CD_ROUNDS times each.
CD_STEPS=(cd-prepare-booked cd-prepare-daemon-started cd-unprepare-unbooked)
CD_ROUNDS=2
# FAULT_KINDS (for working on one kind; the totals below are then not checked).
ALL_KINDS="mig full sliced mps mps-mig mps-shared pair vfio cd"
KINDS=${FAULT_KINDS:-$ALL_KINDS}

# check_totals RUNS MIG_RUNS VFIO_RUNS RECOVERY_KILLS PASSED KILLED_FILE: every step killed, the
# suite's size; reports the summary line.
# parent_fail PASSED MESSAGE: the parent's failure report (lib.sh's fail is the shards').
parent_fail() {
    echo "$NAME: FAIL: $2" >&2
    echo "$1 passed, 1 failed"
    exit 1
}
check_totals() {
    local runs=$1 mig_runs=$2 vfio_runs=$3 recovery_kills=$4 passed=$5 killed_file=$6 cd_runs=$7 step summary
    if [[ $KINDS != "$ALL_KINDS" ]]; then
        echo "$NAME: only kinds $KINDS: $runs runs, totals not checked" >&2
        echo "$passed passed, 0 failed"
        exit 0
    fi
    for step in "${PREPARE_STEPS[@]}" "${UNPREPARE_STEPS[@]}" "${CD_STEPS[@]}"; do
        awk -v s="$step" '$1 == s { n += $2 } END { exit !(n > 0) }' "$killed_file" \
            || parent_fail "$passed" "no run was killed at $step"
    done
    echo "$NAME: kills per step: $(awk '{ n[$1] += $2 } END { for (s in n) printf "%s=%s ", s, n[s] }' "$killed_file"); second kills during recovery: $recovery_kills" >&2
    ((recovery_kills > 0)) || parent_fail "$passed" "no run was killed during recovery"
    ((runs >= 50)) || parent_fail "$passed" "only $runs runs"
    ((mig_runs >= 50)) || parent_fail "$passed" "only $mig_runs runs carved MIG devices"
    ((cd_runs >= ${#CD_STEPS[@]})) || parent_fail "$passed" "only $cd_runs ComputeDomain channel runs"
    summary="kill -9: $runs armed runs ($mig_runs carving MIG, $vfio_runs binding GPUs for VMs) and $cd_runs of ComputeDomain channels (book and IMEX daemon under the node lock), every one killed at its fail point and recovered cleanly; $recovery_kills second kills during recovery"
    echo "$NAME: $summary" >&2
    # e2e/run-tests ends with this line beside the differentials' counts.
    [[ -z ${GPU_DRA_TEST_REPORT:-} ]] || echo "$summary" >>"$GPU_DRA_TEST_REPORT"
    echo "$NAME: mode: the driver as a host process (kill -9 at fail points inside prepare needs a process started with GPU_DRA_FAILPOINT armed); the image through the chart runs in e2e/install.sh" >&2
    echo "$passed passed, 0 failed"
    exit 0
}

# The parent: starts the shards, shows each one's log as it ends, and checks the totals.
if [[ -z ${FAULT_SHARD:-} ]]; then
    results=$(mktemp -d "/tmp/gpu-dra-$NAME-shards.XXXXXX")
    declare -A shard_pid=()
    stop_shards() {
        local pid
        for pid in "${shard_pid[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
        for pid in "${shard_pid[@]}"; do wait "$pid" 2>/dev/null || true; done
        rm -rf "$results"
    }
    trap stop_shards EXIT
    for ((i = 0; i < SHARDS; i++)); do
        FAULT_SHARD=$i FAULT_SHARDS=$SHARDS FAULT_RESULT=$results/$i "$0" "$ROUNDS" >"$results/$i.log" 2>&1 &
        shard_pid[$i]=$!
    done
    for ((left = SHARDS; left > 0; left--)); do
        status=0
        wait -n -p done_pid "${shard_pid[@]}" || status=$?
        for i in "${!shard_pid[@]}"; do
            [[ ${shard_pid[$i]} == "$done_pid" ]] || continue
            unset "shard_pid[$i]"
            cat "$results/$i.log" >&2
            ((status == 0)) || parent_fail 0 "shard $i of $SHARDS failed (exit $status)"
        done
    done
    read -r runs mig_runs vfio_runs recovery_kills passed cd_runs < <(cat "$results"/[0-9]*.totals |
        awk '{ for (i = 1; i <= NF; i++) t[i] += $i } END { print t[1], t[2], t[3], t[4], t[5], t[6] + 0 }')
    cat "$results"/[0-9]*.killed >"$results/killed"
    check_totals "$runs" "$mig_runs" "$vfio_runs" "$recovery_kills" "$passed" "$results/killed" "$cd_runs"
fi
[[ $FAULT_SHARD =~ ^[0-9]+$ && $FAULT_SHARD -lt $SHARDS && -n ${FAULT_RESULT:-} ]] ||
    { echo "$NAME: a shard needs FAULT_SHARD below FAULT_SHARDS and FAULT_RESULT (the parent sets them)" >&2; exit 2; }
NAME=faults-e2e-$FAULT_SHARD
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# shellcheck source=mps-folder.sh
source "$(dirname "${BASH_SOURCE[0]}")/mps-folder.sh"

# Prepare steps after which the claim is still unfinished: recovery rolls it back, and in the
# first round a second kill hits that rollback.
UNFINISHED_STEPS=" prepare-started prepare-vfio-released prepare-vfio-bound mig-mode-enabled prepare-gi-created-unrecorded prepare-gi-created prepare-ci-created-unrecorded prepare-ci-created prepare-mps-shm-mounted prepare-mps-started prepare-cdi-written "
# Steps a whole-GPU claim passes (it carves nothing).
FULL_GPU_STEPS=" prepare-cdi-written prepare-completed unprepare-started rollback-cdi-removed "
# Steps a time-sliced whole GPU passes (its settings are recorded first, then changed).
SLICED_STEPS=" prepare-started prepare-sharing-applied prepare-cdi-written prepare-completed unprepare-started rollback-cdi-removed "
SLICED_ROUNDS=2
TIME_SLICED='{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Long"}}}'
# Steps an MPS whole GPU passes, and an MPS MIG device (which also carves).
MPS_STEPS=" prepare-started prepare-sharing-applied prepare-mps-shm-mounted prepare-mps-started prepare-cdi-written prepare-completed unprepare-started rollback-cdi-removed "
MPS_MIG_STEPS=" prepare-started prepare-ci-created prepare-mps-shm-mounted prepare-mps-started prepare-cdi-written prepare-completed unprepare-started rollback-cdi-removed rollback-mig-destroyed "
# Steps a GPU handed to a virtual machine passes (bound to vfio-pci, and back).
VFIO_STEPS=" prepare-started prepare-vfio-released prepare-vfio-bound prepare-cdi-written prepare-completed unprepare-started rollback-cdi-removed rollback-vfio-unbound "
VFIO_ROUNDS=2
# Rounds with MPS runs: the first (each MPS step is killed 3 times: whole, carved and shared
# GPUs; kept short for CI's time).
MPS_ROUNDS=1
MPS_MORE_ROUNDS=1
MPS_SHARED='{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS"}}'
MPS_GPU='{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":30,"defaultPinnedDeviceMemoryLimit":"2Gi"}}}'
MPS_MIG='{"apiVersion":"resource.nvidia.com/v1beta1","kind":"MigDeviceConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":30}}}'

# MPS needs the driver root's nvidia-cuda-mps-control: the fake one, which logs what it is told.
if [[ $DRIVER_BACKEND != nvml ]]; then
    "$GPU_DRA" sim --gpus "$GPUS" --node-name "$NODE" --sim-state "$WORK/hw.json" driver-root "$WORK/driver-root" >/dev/null
    DRIVER_ARGS="${DRIVER_ARGS:-} --nvidia-driver-root $WORK/driver-root"
fi
DRIVER_ARGS="${DRIVER_ARGS:-} --consumable-shares memory --passthrough"
MPS_CONTROL=${FAKE_MPS_CONTROL:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/nvidia-cuda-mps-control}
[[ -x $MPS_CONTROL ]] || (cd "$ROOT" && cargo build -q -p fakenvml --bin nvidia-cuda-mps-control) >&2
install -m 0755 "$MPS_CONTROL" "$WORK/driver-root/usr/bin/nvidia-cuda-mps-control"

declare -A killed=()
runs=0
# This shard's own runs (runs counts every shard's, so each run's GPU and device are the same
# however many shards there are).
mine=0
mig_runs=0
vfio_runs=0

allocate_claim() { # name device [opaque parameters [shared memory]] → prints the UID
    local config= share=
    [[ -n ${3:-} ]] && config=",\"config\":[{\"source\":\"FromClaim\",\"requests\":[\"gpu\"],\"opaque\":{\"driver\":\"gpu.nvidia.com\",\"parameters\":$3}}]"
    [[ -n ${4:-} ]] && share=",\"shareID\":\"$(cat /proc/sys/kernel/random/uuid)\",\"consumedCapacity\":{\"memory\":\"$4\"}"
    kubectl create -f - >/dev/null <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: $1, namespace: default}
spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}]}}
EOF
    kubectl patch resourceclaim "$1" --subresource=status --type=merge -p \
        "{\"status\":{\"allocation\":{\"devices\":{\"results\":[{\"request\":\"gpu\",\"driver\":\"gpu.nvidia.com\",\"pool\":\"$NODE\",\"device\":\"$2\"$share}]$config}}}}" >/dev/null
    kubectl get resourceclaim "$1" -o jsonpath='{.metadata.uid}'
}

cdi_files() { (cd "$WORK/cdi" 2>/dev/null && ls) | tr '\n' ' '; }
checkpoint_claims() { jq -c '[.claims[] | {uid, state}]' "$WORK/state/checkpoint.json"; }

# call OP CLAIM → fails the test unless the RPC succeeded with no claim error
call() {
    local out
    out=$(kubelet "$1" --claim "$2") || fail "$1 $2: $out"
    [[ $(jq -r '.claims[0].error' <<<"$out") == "" ]] || fail "$1 $2: $(jq -r '.claims[0].error' <<<"$out")"
}

# crash STEP OP CLAIM: runs OP on a driver armed with STEP, which must die there.
crash() { # STEP OP CLAIM... (several claims: one call, prepared side by side)
    local step=$1 op=$2 before reached ref claims=()
    shift 2
    for ref in "$@"; do claims+=(--claim "$ref"); done
    reached="failpoint reached.*step=\"?$step(\"| |$)"
    before=$(grep -cE "$reached" "$WORK/driver.log" 2>/dev/null || true)
    start_driver GPU_DRA_FAILPOINT="$step"
    kubelet "$op" "${claims[@]}" >/dev/null 2>&1 || true
    sleep 0.1
    kill -0 "$DRIVER_PID" 2>/dev/null && fail "armed at $step, the driver survived $op"
    (($(grep -cE "$reached" "$WORK/driver.log" || true) > ${before:-0})) \
        || fail "the driver died during $op without reaching $step"
    killed[$step]=$((${killed[$step]:-0} + 1))
    stop_driver
}

# crash_in_recovery: a second kill, while the restarted driver rolls the unfinished claim back.
crash_in_recovery() {
    launch_driver GPU_DRA_FAILPOINT=rollback-cdi-removed
    local deadline=$((SECONDS + 10))
    while kill -0 "$DRIVER_PID" 2>/dev/null; do
        ((SECONDS < deadline)) || fail "armed at rollback-cdi-removed, the recovering driver survived"
        sleep 0.1
    done
    recovery_kills=$((recovery_kills + 1))
    stop_driver
}
recovery_kills=0

# gpu_sharing MINOR → "<compute mode>/<time-slice>" of the simulated GPU
gpu_sharing() {
    "$GPU_DRA" sim --gpus "$GPUS" --node-name "$NODE" --sim-state "$WORK/hw.json" show \
        | jq -r ".gpus[] | select(.minor == $1) | \"\(.compute_mode)/\(.timeslice)\""
}

# set_gpu_sharing MINOR MODE SLICE: what an admin left on the GPU (the driver is stopped)
set_gpu_sharing() {
    jq ".gpus |= map(if .minor == $1 then .compute_mode = \"$2\" | .timeslice = $3 else . end)" \
        "$WORK/hw.json" >"$WORK/hw.json.new" && mv "$WORK/hw.json.new" "$WORK/hw.json"
}

expect_sharing() { # minor, expected, when
    [[ $(gpu_sharing "$1") == "$2" ]] || fail "GPU $1 $3: compute mode/time-slice $(gpu_sharing "$1"), expected $2"
}

hw() { "$GPU_DRA" sim --gpus "$GPUS" --node-name "$NODE" --sim-state "$WORK/hw.json" show; }

expect_prepared() { # uid, instances
    local state
    [[ $(cdi_files) == "k8s.gpu.nvidia.com-claim_$1.json " ]] || fail "CDI files after restart: '$(cdi_files)'"
    [[ $(checkpoint_claims) == "[{\"uid\":\"$1\",\"state\":\"PrepareCompleted\"}]" ]] || fail "checkpoint: $(checkpoint_claims)"
    state=$(hw)
    [[ $(jq '[.gpus[].gpu_instances[]] | length' <<<"$state") == "$2" ]] || fail "expected $2 GPU instances: $state"
    [[ $(jq '[.gpus[].gpu_instances[].compute_instances[]] | length' <<<"$state") == "$2" ]] || fail "expected $2 compute instances: $state"
    if (($2 > 0)); then
        # The retried prepare's spec names the instance that really exists.
        local spec_uuid hw_uuid
        spec_uuid=$(jq -r '.devices[0].containerEdits.env[] | select(startswith("NVIDIA_VISIBLE_DEVICES=")) | sub("NVIDIA_VISIBLE_DEVICES="; "")' "$WORK/cdi/k8s.gpu.nvidia.com-claim_$1.json")
        hw_uuid=$(jq -r '[.gpus[].gpu_instances[].compute_instances[].uuid] | join(",")' <<<"$state")
        [[ $spec_uuid == "$hw_uuid" ]] || fail "the CDI spec names $spec_uuid, the hardware has $hw_uuid"
    fi
}

# expect_mps UID: the claim's one daemon runs and was told its thread share
expect_mps() {
    local dir log
    dir=$(mps_folder "$WORK/state" "$1")
    log=$dir/log/control.log
    [[ $(mps_daemons_of "$dir" | wc -l) == 1 ]] \
        || fail "claim $1: want one MPS daemon, have: $(mps_pids | tr '\n' ' ')"
    grep -q 'cmd: set_default_active_thread_percentage 30$' "$log" || fail "claim $1: MPS daemon not told its limits: $(cat "$log")"
    awk -v m="$dir/shm" '$5 == m { found = 1 } END { exit !found }' /proc/self/mountinfo \
        || fail "claim $1: no shm mount for its MPS daemon"
}

# expect_vm_gpu MINOR: bound to vfio-pci (NVML no longer sees it), its metadata written
expect_vm_gpu() {
    [[ $(hw | jq -r --argjson g "$1" '.gpus[] | select(.minor == $g) | .driver') == vfio-pci ]] \
        || fail "GPU $1 is not bound to vfio-pci: $(hw | jq -c --argjson g "$1" '.gpus[] | select(.minor == $g) | {minor, driver}')"
    [[ -n $(find "$WORK/state/dra-device-metadata" -name metadata.json 2>/dev/null) ]] || fail "no device metadata for the VM's GPU"
}

expect_clean() {
    local state
    [[ -z $(cdi_files) ]] || fail "CDI files left: $(cdi_files)"
    [[ -z $(ls "$WORK/state/dra-device-metadata" 2>/dev/null) ]] || fail "device metadata left: $(ls "$WORK/state/dra-device-metadata")"
    [[ -z $(mps_all_pids) ]] || fail "MPS processes left: $(mps_all_pids | tr '\n' ' ')"
    [[ -z $(mps_mounts) ]] || fail "mounts left: $(mps_mounts | tr '\n' ' ')"
    [[ -z $(ls "$WORK/state/mps" 2>/dev/null) ]] || fail "MPS folders left: $(ls "$WORK/state/mps")"
    [[ $(checkpoint_claims) == "[]" ]] || fail "checkpoint not empty: $(checkpoint_claims)"
    state=$(hw)
    [[ $(jq '[.gpus[].gpu_instances[]] | length' <<<"$state") == 0 ]] || fail "leaked GPU instances: $state"
    # Every GPU was out of MIG mode before its claim; so it must be again.
    [[ $(jq '[.gpus[] | select(.mig_current or .mig_pending)] | length' <<<"$state") == 0 ]] \
        || fail "MIG mode left on: $(jq -c '[.gpus[] | {minor, mig_current, mig_pending}]' <<<"$state")"
    [[ $(jq '[.gpus[] | select(.driver == "vfio-pci")] | length' <<<"$state") == 0 ]] \
        || fail "GPUs left on vfio-pci: $(jq -c '[.gpus[] | select(.driver == "vfio-pci") | .minor]' <<<"$state")"
    # No unbind ever found a GPU held open (the kernel would have waited for it forever).
    [[ $(jq -c '.stuck_unbinds // []' <<<"$state") == "[]" ]] || fail "unbinds of held GPUs: $(jq -c '.stuck_unbinds' <<<"$state")"
}

# expect_shared UID...: exactly these claims prepared, sharing one daemon on GPU $1's UUID
expect_shared() {
    local gpu=$1 want u
    shift
    want=$(for u in "$@"; do echo "k8s.gpu.nvidia.com-claim_$u.json"; done | sort | tr '\n' ' ')
    [[ $(cdi_files) == "$want" ]] || fail "CDI files: '$(cdi_files)', want '$want'"
    [[ $(jq -c '[.claims[] | select(.state == "PrepareCompleted")] | length' "$WORK/state/checkpoint.json") == "$#" ]] \
        || fail "checkpoint: $(checkpoint_claims), want $* completed"
    [[ $(mps_pids | wc -l) == 1 ]] || fail "want one shared MPS daemon, have: $(mps_pids | tr '\n' ' ')"
    [[ -d $(mps_folder "$WORK/state" "shared-$(slices_json | jq -r --arg d "gpu-$gpu" '.items[].spec.devices[]? | select(.name == $d) | .attributes.uuid.string')") ]] \
        || fail "no shared daemon folder for gpu-$gpu: $(ls "$WORK/state/mps")"
    expect_sharing "$gpu" ExclusiveProcess/2 "shared through MPS"
}

# pair_run STEP GPU: two claims carving MIG devices of one GPU, prepared in one call (side by
# side, the GPU taking them in turn); the driver dies at STEP in whichever reaches it first. After
# the restart both are prepared on the instances that exist, then both unprepared.
pair_run() {
    local step=$1 gpu=$2 a b ua ub want state
    a=fi-$runs-a
    b=fi-$runs-b
    ua=$(allocate_claim "$a" "gpu-$gpu-mig-3g40gb-9-0")
    ub=$(allocate_claim "$b" "gpu-$gpu-mig-3g40gb-9-4")
    mig_runs=$((mig_runs + 1))
    crash "$step" prepare "default/$a/$ua" "default/$b/$ub"
    start_driver
    out=$(kubelet prepare --claim "default/$a/$ua" --claim "default/$b/$ub") || fail "prepare the pair: $out"
    [[ $(jq -r '[.claims[].error] | join("")' <<<"$out") == "" ]] || fail "prepare the pair: $out"
    want=$(for u in "$ua" "$ub"; do echo "k8s.gpu.nvidia.com-claim_$u.json"; done | sort | tr '\n' ' ')
    [[ $(cdi_files) == "$want" ]] || fail "CDI files: '$(cdi_files)', want '$want'"
    state=$(hw)
    [[ $(jq --argjson g "$gpu" '[.gpus[] | select(.minor == $g) | .gpu_instances[].compute_instances[]] | length' <<<"$state") == 2 ]] \
        || fail "want the pair's 2 MIG devices on GPU $gpu: $(jq -c --argjson g "$gpu" '.gpus[] | select(.minor == $g)' <<<"$state")"
    for u in "$ua" "$ub"; do
        # Each spec names an instance that exists, and the two differ.
        jq -r '.devices[0].containerEdits.env[] | select(startswith("NVIDIA_VISIBLE_DEVICES="))' "$WORK/cdi/k8s.gpu.nvidia.com-claim_$u.json"
    done | sort -u | wc -l | grep -qx 2 || fail "the pair's specs do not name two MIG devices"
    out=$(kubelet unprepare --claim "default/$a/$ua" --claim "default/$b/$ub") || fail "unprepare the pair: $out"
    expect_clean
    stop_driver
    kubectl delete resourceclaim "$a" "$b" --wait=false >/dev/null
    ok "run $runs: two claims carving on gpu-$gpu in one call, killed at $step: both recovered"
}

# shared_run STEP GPU: claim A and claim B share the GPU; B is killed joining (prepare steps), or
# is the last to leave and is killed leaving (unprepare steps).
shared_run() {
    local step=$1 gpu=$2 a b ua ub
    set_gpu_sharing "$gpu" Prohibited 2
    a=fi-$runs-a
    b=fi-$runs-b
    ua=$(allocate_claim "$a" "gpu-$gpu" "$MPS_SHARED" 20Gi)
    ub=$(allocate_claim "$b" "gpu-$gpu" "$MPS_SHARED" 30Gi)
    start_driver
    call prepare "default/$a/$ua"
    if [[ " ${PREPARE_STEPS[*]} " == *" $step "* ]]; then
        stop_driver
        crash "$step" prepare "default/$b/$ub"
        if ((round == 1)) && [[ $UNFINISHED_STEPS == *" $step "* ]]; then
            crash_in_recovery
        fi
        start_driver
        call prepare "default/$b/$ub"
        expect_shared "$gpu" "$ua" "$ub"
        call unprepare "default/$b/$ub"
        expect_shared "$gpu" "$ua"
        call unprepare "default/$a/$ua"
    else
        call prepare "default/$b/$ub"
        expect_shared "$gpu" "$ua" "$ub"
        call unprepare "default/$a/$ua"
        expect_shared "$gpu" "$ub"
        stop_driver
        crash "$step" unprepare "default/$b/$ub"
        start_driver
        call unprepare "default/$b/$ub"
    fi
    expect_clean
    expect_sharing "$gpu" Prohibited/2 "after the last sharer left"
    stop_driver
    kubectl delete resourceclaim "$a" "$b" --wait=false >/dev/null
    ok "run $runs: two claims sharing gpu-$gpu through MPS, killed at $step: recovered cleanly"
}

# The simulated hardware's state file, as the first driver on the node writes it (a shard's first
# run may set up a GPU's sharing before any driver ran).
start_driver
stop_driver

for round in $(seq "$ROUNDS"); do
    for step in "${PREPARE_STEPS[@]}" "${UNPREPARE_STEPS[@]}"; do
        for kind in $KINDS; do
            [[ $kind == cd ]] && continue # below
            [[ $kind == full && $FULL_GPU_STEPS != *" $step "* ]] && continue
            [[ $kind == sliced && ($SLICED_STEPS != *" $step "* || $round -gt $SLICED_ROUNDS) ]] && continue
            [[ $kind == mps && ($MPS_STEPS != *" $step "* || $round -gt $MPS_ROUNDS) ]] && continue
            [[ $kind == mps-mig && ($MPS_MIG_STEPS != *" $step "* || $round -gt $MPS_MORE_ROUNDS) ]] && continue
            [[ $kind == mps-shared && ($MPS_STEPS != *" $step "* || $round -gt $MPS_MORE_ROUNDS) ]] && continue
            [[ $kind == vfio && ($VFIO_STEPS != *" $step "* || $round -gt $VFIO_ROUNDS) ]] && continue
            [[ $kind != vfio && $step == *vfio* ]] && continue
            [[ $kind == pair && ($round -gt 1 || " ${PREPARE_STEPS[*]} " != *" $step "* || $step == prepare-sharing-applied || $step == prepare-mps-*) ]] && continue
            [[ $kind == mig && ($step == prepare-sharing-applied || $step == prepare-mps-*) ]] && continue
            [[ $kind == sliced || $kind == full ]] && [[ $step == *mig-mode* || $step == *unrecorded* || $step == prepare-mps-* ]] && continue
            runs=$((runs + 1))
            ((runs % SHARDS == FAULT_SHARD)) || continue
            mine=$((mine + 1))
            gpu=$((runs % 8))
            [[ $kind == vfio ]] && vfio_runs=$((vfio_runs + 1))
            if [[ $kind == mps-mig ]]; then
                device=gpu-$gpu-mig-2g20gb-14-$((2 * (runs % 3)))
                instances=1
                mig_runs=$((mig_runs + 1))
            elif [[ $kind == mig ]]; then
                # Alternate profiles and placements so different GI ids are exercised.
                case $((runs % 3)) in
                    0) device=gpu-$gpu-mig-3g40gb-9-4 ;;
                    1) device=gpu-$gpu-mig-1g10gb-19-$((runs % 7)) ;;
                    *) device=gpu-$gpu-mig-7g80gb-0-0 ;;
                esac
                instances=1
                mig_runs=$((mig_runs + 1))
            elif [[ $kind == vfio ]]; then
                # A simulated GPU's PCI index is its minor.
                device=gpu-vfio-$gpu
                instances=0
            else
                device=gpu-$gpu
                instances=0
            fi
            config=
            if [[ $kind == sliced ]]; then
                config=$TIME_SLICED
                set_gpu_sharing "$gpu" ExclusiveProcess 1
            elif [[ $kind == mps ]]; then
                config=$MPS_GPU
                set_gpu_sharing "$gpu" Prohibited 2
            elif [[ $kind == mps-mig ]]; then
                config=$MPS_MIG
            elif [[ $kind == vfio ]]; then
                # In persistence mode, which the driver turns off before the unbind and on again
                # when the GPU comes back, whatever the kill.
                "$GPU_DRA" sim --gpus "$GPUS" --node-name "$NODE" --sim-state "$WORK/hw.json" persistence --gpu "$gpu" --enabled true
            fi
            claim=fi-$runs
            if [[ $kind == mps-shared ]]; then
                shared_run "$step" "$gpu"
                continue
            fi
            if [[ $kind == pair ]]; then
                pair_run "$step" "$gpu"
                continue
            fi
            uid=$(allocate_claim "$claim" "$device" "$config")
            ref=default/$claim/$uid
            if [[ " ${PREPARE_STEPS[*]} " == *" $step "* ]]; then
                crash "$step" prepare "$ref"
                if ((round == 1)) && [[ ($kind == mig || $kind == mps* || $kind == vfio) && $UNFINISHED_STEPS == *" $step "* ]]; then
                    crash_in_recovery
                fi
                start_driver
                call prepare "$ref"
                expect_prepared "$uid" "$instances"
                [[ $kind == sliced ]] && expect_sharing "$gpu" Default/3 "prepared"
                [[ $kind == mps ]] && expect_sharing "$gpu" ExclusiveProcess/2 "prepared"
                [[ $kind == mps* ]] && expect_mps "$uid"
                [[ $kind == vfio ]] && expect_vm_gpu "$gpu"
                call unprepare "$ref"
                expect_clean
            else
                start_driver
                call prepare "$ref"
                stop_driver
                crash "$step" unprepare "$ref"
                start_driver
                # After the restart the claim is either already rolled back or still prepared;
                # kubelet's retry must finish the job either way.
                call unprepare "$ref"
                expect_clean
            fi
            if [[ $kind == vfio ]]; then
                [[ $(hw | jq --argjson g "$gpu" '.gpus[] | select(.minor == $g) | .persistence // false') == true ]] \
                    || fail "GPU $gpu back on nvidia without its persistence mode after a kill at $step"
            fi
            [[ $kind == sliced ]] && expect_sharing "$gpu" ExclusiveProcess/1 "unprepared"
            [[ $kind == mps ]] && expect_sharing "$gpu" Prohibited/2 "unprepared"
            stop_driver
            kubectl delete resourceclaim "$claim" --wait=false >/dev/null
            ok "run $runs: $kind $device, killed at $step: recovered cleanly"
        done
    done
done

# ---------------------------------------------------------------- ComputeDomain channels
# A second driver, on a GB200 node of its own with `--compute-domains` and the fake nvidia-imex
# in its driver root, beside the controller (a host process: it makes the domain's channel
# template and IMEX credentials). A channel claim of a one-node domain is prepared and unprepared,
# the driver killed at each step where the book and the daemon change under the node lock; after
# the restart kubelet's retry finishes, and the book, the CDI spec and the daemon agree: one
# daemon while the claim is prepared, none (and an empty book) once unprepared.
cd_runs=0
if [[ " $KINDS " == *" cd "* ]] && ((FAULT_SHARD == 0)); then
    CD=$WORK/cd CD_NODE=fault-cd-1 CD_GPUS=sim:4xGB200-186GB CD_PID= CD_CONTROLLER_PID=
    mkdir -p "$CD"
    "$GPU_DRA" sim --gpus "$CD_GPUS" --node-name "$CD_NODE" --sim-state "$CD/hw.json" driver-root "$CD/driver-root" >/dev/null
    IMEX=${FAKE_IMEX:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/nvidia-imex}
    [[ -x $IMEX ]] || (cd "$ROOT" && cargo build -q -p fakenvml --bin nvidia-imex) >&2
    install -m 0755 "$IMEX" "$CD/driver-root/usr/bin/nvidia-imex"
    install -m 0755 "$IMEX" "$CD/driver-root/usr/bin/nvidia-imex-ctl"
    cd_daemons() { # the fake IMEX daemons chrooted into this node's driver root
        local p
        for p in $(pgrep -f "nvidia-imex -c" || true); do
            [[ $(readlink "/proc/$p/root" 2>/dev/null) == "$CD/driver-root" ]] && echo "$p"
        done
        return 0
    }
    no_cd_daemons() { [[ -z $(cd_daemons) ]]; }
    cd_cleanup() {
        [[ -z $CD_PID ]] || kill -KILL "$CD_PID" 2>/dev/null || true
        [[ -z $CD_CONTROLLER_PID ]] || kill -KILL "$CD_CONTROLLER_PID" 2>/dev/null || true
        local p
        for p in $(cd_daemons); do kill -KILL "$p" 2>/dev/null || true; done
    }
    trap 'cd_cleanup; cleanup' EXIT
    cd_kubelet() { kubelet-sim --registration-socket "$CD/registry/compute-domain.nvidia.com-reg.sock" --expect-name compute-domain.nvidia.com --timeout 45s "$@"; }
    cd_start() { # [ENV=VALUE ...]
        env RUST_LOG=info "$@" "$GPU_DRA" run --node-name "$CD_NODE" --gpus "$CD_GPUS" --sim-state "$CD/hw.json" \
            --nvidia-driver-root "$CD/driver-root" --kubeconfig "$KUBECONFIG" \
            --registrar-dir "$CD/registry" --plugin-dir "$CD/plugin" --kubelet-plugins-directory-path "$CD/plugins" \
            --cdi-root "$CD/cdi" --state-dir "$CD/state" --compute-domains --node-ip 127.0.0.31 \
            --imex-credentials-namespace default --compute-domain-ready-timeout 20s \
            --gc-interval 2s --resync-interval 2s >>"$CD/driver.log" 2>&1 &
        CD_PID=$!
        for _ in $(seq 100); do
            kill -0 "$CD_PID" 2>/dev/null || fail "the ComputeDomain driver exited at start"
            [[ -S $CD/registry/compute-domain.nvidia.com-reg.sock ]] && cd_kubelet register --timeout 2s >/dev/null 2>&1 && return 0
            sleep 0.1
        done
        fail "the ComputeDomain plugin did not register"
    }
    cd_stop() { kill -TERM "$CD_PID" 2>/dev/null || true; wait "$CD_PID" 2>/dev/null || true; CD_PID=; }
    cd_call() { # OP REF: kubelet's call, which must succeed
        local out
        out=$(cd_kubelet "$1" --claim "$2") || fail "$1 $2: $out"
        [[ -z $(jq -r '.claims[0].error // empty' <<<"$out") ]] || fail "$1 $2: $out"
    }
    cd_book() { jq -c '[.claims | keys[]]' "$CD/state/compute-domains/book.json" 2>/dev/null || echo '[]'; }
    kubectl apply --server-side -f "$ROOT/deploy/helm/gpu-dra/crds/resource.nvidia.com_computedomains.yaml" >/dev/null
    kubectl create -f - >/dev/null <<EOF
apiVersion: v1
kind: Node
metadata: {name: $CD_NODE}
---
apiVersion: resource.nvidia.com/v1beta1
kind: ComputeDomain
metadata: {name: fault-domain, namespace: default}
spec: {numNodes: 1, channel: {resourceClaimTemplate: {name: fault-domain-channel}}}
EOF
    "$GPU_DRA" compute-domain-controller --kubeconfig "$KUBECONFIG" --resync-interval 2s \
        --imex-credentials-namespace default >>"$CD/controller.log" 2>&1 &
    CD_CONTROLLER_PID=$!
    wait_for "the domain's channel template" 30 kubectl get resourceclaimtemplate fault-domain-channel
    domain_uid=$(kubectl get computedomain fault-domain -o jsonpath='{.metadata.uid}')
    wait_for "the domain's IMEX credentials" 30 kubectl get secret "gpu-dra-imex-$domain_uid"
    kubectl get resourceclaimtemplate fault-domain-channel -o json >"$CD/template.json"
    for round in $(seq "$CD_ROUNDS"); do
        for step in "${CD_STEPS[@]}"; do
            cd_runs=$((cd_runs + 1))
            claim=fi-cd-$cd_runs
            jq --arg n "$claim" '{apiVersion: "resource.k8s.io/v1", kind: "ResourceClaim",
                metadata: {name: $n, namespace: "default"}, spec: .spec.spec}' "$CD/template.json" | kubectl create -f - >/dev/null
            kubectl patch resourceclaim "$claim" --subresource=status --type=merge -p "$(jq -c --arg pool "$CD_NODE" '{status: {allocation: {devices: {
                results: [{request: "channel", driver: "compute-domain.nvidia.com", pool: $pool, device: "channel-0"}],
                config: [.spec.spec.devices.config[] | {source: "FromClaim"} + .]}}}}' "$CD/template.json")" >/dev/null
            uid=$(kubectl get resourceclaim "$claim" -o jsonpath='{.metadata.uid}')
            ref=default/$claim/$uid
            spec=$CD/cdi/k8s.compute-domain.nvidia.com-claim_$uid.json
            op=prepare
            if [[ $step == cd-unprepare-* ]]; then
                cd_start
                cd_call prepare "$ref"
                cd_stop
                op=unprepare
            fi
            reached="failpoint reached.*step=\"?$step(\"| |$)"
            before=$(grep -cE "$reached" "$CD/driver.log" 2>/dev/null || true)
            cd_start GPU_DRA_FAILPOINT="$step"
            cd_kubelet "$op" --claim "$ref" >/dev/null 2>&1 || true
            sleep 0.1
            kill -0 "$CD_PID" 2>/dev/null && fail "armed at $step, the ComputeDomain driver survived $op"
            (($(grep -cE "$reached" "$CD/driver.log" || true) > ${before:-0})) || fail "the ComputeDomain driver died during $op without reaching $step"
            wait "$CD_PID" 2>/dev/null || true
            killed[$step]=$((${killed[$step]:-0} + 1))
            cd_start
            if [[ $op == prepare ]]; then
                cd_call prepare "$ref"
                [[ -f $spec ]] || fail "after a kill at $step and the retried prepare: no CDI spec $spec"
                [[ $(cd_book) == "[\"$uid\"]" ]] || fail "after a kill at $step and the retried prepare: the book holds $(cd_book)"
                [[ $(cd_daemons | wc -l) == 1 ]] || fail "after a kill at $step and the retried prepare: $(cd_daemons | wc -l) IMEX daemons, want 1"
            fi
            cd_call unprepare "$ref"
            [[ ! -e $spec ]] || fail "after a kill at $step: the unprepared claim's CDI spec is left"
            [[ $(cd_book) == "[]" ]] || fail "after a kill at $step: the book still holds $(cd_book)"
            # A kill between the book and the daemon leaves a daemon no claim needs: the
            # restarted plugin's round stops it.
            wait_for "no IMEX daemon after a kill at $step" 20 no_cd_daemons
            cd_stop
            kubectl delete resourceclaim "$claim" --wait=false >/dev/null
            ok "ComputeDomain run $cd_runs: a channel claim, killed at $step during $op: recovered cleanly (book, CDI spec and IMEX daemon agree)"
        done
    done
    kubectl delete computedomain fault-domain --wait=true --timeout 30s >/dev/null || fail "the ComputeDomain was not deleted"
    kubectl get secret "gpu-dra-imex-$domain_uid" >/dev/null 2>&1 && fail "the domain's IMEX credentials outlived it"
    cd_cleanup
    CD_CONTROLLER_PID=
    trap cleanup EXIT
fi

# For the parent: this shard's counts (runs, MIG runs, VM runs, second kills, checks passed,
# ComputeDomain runs) and its kills per step.
echo "$mine $mig_runs $vfio_runs $recovery_kills $passed $cd_runs" >"$FAULT_RESULT.totals"
for step in "${!killed[@]}"; do echo "$step ${killed[$step]}"; done >"$FAULT_RESULT.killed"
log "shard $FAULT_SHARD of $SHARDS: $mine runs, every one killed at its fail point and recovered cleanly"
echo "$passed passed, 0 failed"
