#!/usr/bin/env bash
# e2e: the user scenarios NVIDIA documents for its DRA driver, on a real node (kubelet,
# containerd, runc) with gpu-dra on simulated GPUs (2×H100 dynamic MIG + 1×T4). The driver is
# what users install: the image (e2e/build-image.sh) through the Helm chart (e2e/chart.sh: the
# chart's defaults, plus the node's driver root, dev root and folders, and shorter garbage
# collection, resync and probe intervals through `extraEnv`); a driver restart is `kubectl
# delete pod` of the driver pod. Manifests are in e2e/pods/, written as a user would write them
# (only the image is filled in).
#
#   1. two pods from one ResourceClaimTemplate, each with its own GPU;
#   2. one pod, two containers sharing one claim;
#   3. one time-sliced ResourceClaim shared by two pods;
#   4. a Deployment whose pod gets four 1g.10gb MIG devices of one GPU (matchAttribute);
#   5. a Job (claim deleted after the pod finishes);
#   6. a pod asking for `nvidia.com/gpu: 1` only (extended resource backed by DRA);
#   7. kubelet restart while a MIG pod runs;
#   8. driver restart while pods run;
#   9. a crash-looping container with a MIG claim (prepared once; runs alongside 1-3, 5, 6);
#  10. MPS: a whole GPU shared by two pods through one daemon (kept across a driver restart), and
#      MPS on a carved 2g.20gb MIG device (deploy/examples/gpu-mps.yaml, mig-2g-mps.yaml);
#  11. a GPU falls off the bus (XID 79) under a running pod: its device is tainted NoExecute and
#      kube-controller-manager's device-taint eviction evicts the pod; a GPU reset untaints it;
#  12. a GPU for a virtual machine (chart value passthrough): while another process holds the
#      GPUs open the claim is refused naming it and no unbind is written; once it ends, a pod
#      standing in for KubeVirt's virt-launcher gets the VFIO nodes, the device metadata with the
#      PCI address and no NVIDIA device, the GPU leaves nvidia (persistence off, the driver's NVML
#      session closed first); a CUDA pod for the same GPU waits until the VM's pod is gone.
# After every workload is deleted: the driver unprepared (CDI spec removed, MIG instances
# destroyed) and the controller deleted the generated claims. At the end: every claim was
# prepared exactly once and unprepared exactly once (driver log).
set -euo pipefail
E2E=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$E2E")
cd "$ROOT"
# shellcheck source=mps-folder.sh
source "$E2E/mps-folder.sh"
NAME=pods-e2e
WORK=$(mktemp -d /tmp/gpu-dra-pods.XXXXXX)
# shellcheck source=chart.sh
source "$E2E/chart.sh"
# shellcheck source=metrics-sample.sh
source "$E2E/metrics-sample.sh"
export GPU_DRA_CLUSTER_DIR=$WORK/cluster
passed=0
T0=$SECONDS

log() { echo "$NAME: $*" >&2; }
ok() { passed=$((passed + 1)); log "ok - $* ($((SECONDS - T0))s)"; }
fail() {
    log "FAIL: $*"
    if [[ -n ${KUBECONFIG:-} ]]; then
        log "pods and claims:"
        kubectl get pods,resourceclaims -o wide 2>&1 | sed 's/^/    /' >&2 || true
    fi
    if [[ -n ${E2E_POD_LOGS:-} ]]; then
        log "driver pods' logs (tail):"
        driver_logs | cut -d' ' -f4- | grep -v '^\s' | tail -n 25 | cut -c1-400 | sed 's/^/    /' >&2
        driver_logs >"$GPU_DRA_CLUSTER_DIR/logs/driver-pods.log" 2>/dev/null || true
    fi
    local c
    for c in kubelet; do
        [[ -f $GPU_DRA_CLUSTER_DIR/logs/$c.log ]] || continue
        log "$c log (tail):"
        grep -v '^\s' "$GPU_DRA_CLUSTER_DIR/logs/$c.log" | tail -n 25 | cut -c1-400 | sed 's/^/    /' >&2
    done
    if [[ -d $GPU_DRA_CLUSTER_DIR/logs ]]; then
        local keep=${TMPDIR:-/tmp}/gpu-dra-pods-logs.$$
        cp -r "$GPU_DRA_CLUSTER_DIR/logs" "$keep" && log "all component logs kept in $keep"
        cp "$WORK"/claims.watch* "$keep/" 2>/dev/null || true
    fi
    echo "$passed passed, 1 failed"
    exit 1
}
WATCH_PID=
holders=()
cleanup() {
    [[ -z $WATCH_PID ]] || kill "$WATCH_PID" 2>/dev/null || true
    ((${#holders[@]} == 0)) || kill "${holders[@]}" 2>/dev/null || true
    "$E2E/cluster" down >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
# Loud on anything unexpected, not only on the checks' own fail calls.
set -E
trap 'fail "line $LINENO: unexpected failure of: $BASH_COMMAND"' ERR

export GPU_DRA=${GPU_DRA:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/gpu-dra}
[[ -x $GPU_DRA ]] || (cd "$ROOT" && cargo build --bin gpu-dra) >&2
BIN=${GPU_DRA_K8S_BIN:-$("$E2E/build-k8s.sh" | tail -n 1)}
export GPU_DRA_K8S_BIN=$BIN PATH="$BIN:$PATH"

chart_build_images

chart_cluster_up
eval "$("$E2E/cluster" env)"
LOGS=$GPU_DRA_CLUSTER_DIR/logs
log "cluster up ($((SECONDS - T0))s)"
chart_import_images
# NoExecute taints for GPUs that reset or fall off the bus (scenario 11), as an admin sets them;
# the intervals are shorter than the defaults so the run stays short.
chart_install "$FIRST_REF" --set usageInterval=2s --set passthrough=true --set-json 'healthTaintEffects="reset=NoExecute,lost=NoExecute"' \
    --set-json 'extraEnv=[{"name":"GPU_DRA_GC_INTERVAL","value":"2s"},{"name":"GPU_DRA_RESYNC_INTERVAL","value":"5s"},{"name":"GPU_DRA_HEALTH_PROBE_INTERVAL","value":"1s"}]'
DRIVER_POD=$(driver_ready) || fail "no ready driver pod after helm install"
# The chart's driver keeps its state in its plugin folder.
GPU_DRA_STATE_DIR=$E2E_KUBELET_ROOT/plugins/gpu.nvidia.com
log "driver image $FIRST_REF installed by the chart: pod $DRIVER_POD ($((SECONDS - T0))s)"
# The chart's default metrics.auth=kubernetes: every tenant's claims are in /metrics, so only a
# token the API server allows `get` on /metrics reads it; the kubelet's probes stay open.
driver_ip=$(kubectl get pod -n "$CHART_NAMESPACE" "$DRIVER_POD" -o jsonpath='{.status.podIP}')
http_code() { curl -s -o /dev/null -w '%{http_code}' "$@"; }
[[ $(http_code "http://$driver_ip:9400/metrics") == 401 ]] || fail "an anonymous scrape of /metrics was not refused 401"
kubectl create serviceaccount e2e-nobody >/dev/null
[[ $(http_code -H "Authorization: Bearer $(kubectl create token e2e-nobody)" "http://$driver_ip:9400/metrics") == 403 ]] ||
    fail "a token not allowed /metrics was not refused 403"
chart_scrape | grep -q '^gpu_dra_' || fail "a token allowed /metrics could not scrape it"
[[ $(http_code "http://$driver_ip:9400/healthz") == 200 ]] || fail "/healthz is not open"
ok "/metrics (chart default metrics.auth=kubernetes): 401 without a token, 403 for a token not allowed it, served to one allowed nonResourceURLs /metrics; /healthz open"
# Every claim that ever exists (some live only a second, e.g. a Job's): name -> UID.
kubectl get resourceclaims -A --watch --output-watch-events -o json >"$WORK/claims.watch" 2>"$WORK/claims.watch.err" &
WATCH_PID=$!

# ---------------------------------------------------------------- helpers
# apply FILE [POD_NAME [CLAIM [BUS_ID]]]: the manifest with the local image (and ${NAME},
# ${CLAIM}, ${BUS_ID}) filled in. FILE is under e2e/pods/, or a path (deploy/examples/ manifests,
# applied as users would).
apply() {
    local file=$E2E/pods/$1
    [[ $1 == */* ]] && file=$1
    sed -e "s|\${E2E_IMAGE}|$E2E_IMAGE|g" -e "s|\${NAME}|${2:-}|g" -e "s|\${CLAIM}|${3:-}|g" \
        -e "s|\${BUS_ID}|${4:-}|g" "$file" | kubectl apply -f - >&2
}
phase() { [[ $(kubectl get pod "$1" -o jsonpath='{.status.phase}') == "$2" ]]; }
# device_info UID: the driver's gpu_dra_prepared_device_info series of one claim, scraped from the
# driver pod's /metrics (the chart's metrics port) as Prometheus would.
device_info() {
    chart_scrape | grep "^gpu_dra_prepared_device_info{.*claim_uid=\"$1\"" || true
}
# has_info UID LABEL...: the claim has info series, and each LABEL is in them.
has_info() {
    local info label
    info=$(device_info "$1")
    shift
    [[ -n $info ]] || return 1
    for label in "$@"; do [[ $info == *"$label"* ]] || return 1; done
}
no_info() { [[ -z $(device_info "$1") ]]; }
# info_count UID PATTERN N: N of the claim's info series match PATTERN.
info_count() { [[ $(device_info "$1" | grep -c "$2") == "$3" ]]; }
pod_running() { # every container running and ready
    [[ $(kubectl get pod "$1" -o json | jq '.status.phase == "Running" and ([.status.containerStatuses[]?.ready] | length > 0 and all)') == true ]]
}
# The kubelet fetches a pod's claims as soon as it sees the pod bound; the API server's node
# authorizer may not know the pod yet ("forbidden ... no relationship found between node ..."),
# and the kubelet then retries only at its next periodic sync (up to a minute later). Any update
# of the pod makes it sync again at once: an annotation. Counted and reported at the end.
NUDGES=0
nudge_if_forbidden() { # pod
    local n
    n=$(kubectl get events -o json --field-selector "involvedObject.name=$1,reason=FailedPrepareDynamicResources" |
        jq '[.items[] | select(.message | contains("no relationship found between node"))] | length')
    ((n > 0)) || return 0
    [[ $(kubectl get pod "$1" -o jsonpath='{.metadata.annotations.e2e-nudged}') == "$n" ]] && return 0
    log "pod $1: the kubelet's claim lookup was refused by the node authorizer ($n x); nudging the kubelet"
    kubectl annotate pod "$1" --overwrite "e2e-nudged=$n" >/dev/null
    NUDGES=$((NUDGES + 1))
}
wait_started() { # pod phase-predicate...: polls, nudging the kubelet if needed
    local pod=$1 deadline=$((SECONDS + 60))
    shift
    until "$@" "$pod" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || fail "timed out after 60s waiting for pod $pod to start"
        nudge_if_forbidden "$pod"
        sleep 0.3
    done
}
wait_running() { local p; for p in "$@"; do wait_started "$p" pod_running; done; }
pod_done() { phase "$1" Succeeded; }
delete_pods() { kubectl delete pod "$@" --timeout=60s >&2 || fail "deleting pods $*"; }
gone() { ! kubectl get "$@" >/dev/null 2>&1; }
# The log file of a container's first run (kubectl logs needs node addresses).
ctr_log() { # pod container [restart]
    local uid
    uid=$(kubectl get pod "$1" -o jsonpath='{.metadata.uid}')
    echo "$E2E_POD_LOGS/default_$1_$uid/$2/${3:-0}.log"
}
# What a container printed (CRI log lines without timestamp/stream/tag), once it printed "ready".
ctr_out() { # pod container
    local f
    f=$(ctr_log "$1" "$2")
    wait_for "$1/$2 printed ready" 30 grep -q ' ready$' "$f"
    cut -d' ' -f4- "$f"
}
claim_of() { # pod [podClaimName]: the ResourceClaim's name
    local n
    # a template's claim is named in the status, a claim named by the pod only in its spec
    n=$(kubectl get pod "$1" -o json | jq -r --arg c "${2:-gpu}" '
        ([.status.resourceClaimStatuses[]? | select(.name == $c) | .resourceClaimName]
         + [.spec.resourceClaims[]? | select(.name == $c) | .resourceClaimName // empty])[0] // empty')
    [[ -n $n ]] || fail "pod $1 has no claim ${2:-gpu} in its status"
    echo "$n"
}
claim_json() { kubectl get resourceclaim "$1" -o json; }
claim_uid() { kubectl get resourceclaim "$1" -o jsonpath='{.metadata.uid}'; }
allocated() { claim_json "$1" | jq -r '.status.allocation.devices.results[].device'; }
spec_of() { echo "$GPU_DRA_CDI_ROOT/k8s.gpu.nvidia.com-claim_$1.json"; }
slices() { kubectl get resourceslices -o json --field-selector "spec.nodeName=$E2E_NODE"; }
attr() { # device attribute
    slices | jq -r --arg d "$1" --arg a "$2" '.items[].spec.devices[]? | select(.name == $d) | .attributes[$a] | .string // .int // .bool // .version'
}
hw() { "$E2E_GPU_DRA" sim --gpus "$E2E_GPUS" --node-name "$E2E_NODE" --sim-state "$GPU_DRA_SIM_STATE" show; }
mig_instances() { hw | jq '[.gpus[].gpu_instances[]] | length'; }
# gpu instances as "minor:gi:placement" lines, to see they were not recreated
mig_layout() { hw | jq -r '.gpus[] | .minor as $m | .gpu_instances[] | "\($m):\(.id):\(.placement.start):\(.compute_instances[0].uuid)"' | sort; }
count_mig() { [[ $(mig_instances) == "$1" ]]; }
file_id() { stat -c '%i:%Y.%y' "$1"; }
n_prepared() { driver_logs | grep -c "INFO gpu_dra::prepare::state: prepared claim .*claimUID=$1" || true; }
n_unprepared() { driver_logs | grep -c "INFO gpu_dra::prepare::state: unprepared claim .*claimUID=$1" || true; }
registrations() { grep -c 'Registered DRA plugin.*gpu.nvidia.com' "$LOGS/kubelet.log" || true; }
watched_uid() { jq -r --arg n "$1" 'select(.object.metadata.name == $n) | .object.metadata.uid' "$WORK/claims.watch" | head -n 1; }
# Claims that were ever allocated (kube-controller-manager sometimes creates a claim for a Job's
# finished pod and deletes it at once, unallocated: no driver ever sees those).
watched_uids() { jq -r 'select(.object.status.allocation != null) | .object.metadata.uid' "$WORK/claims.watch" | sort -u; }
watched_name() { jq -r --arg u "$1" 'select(.object.metadata.uid == $u) | .object.metadata.name' "$WORK/claims.watch" | head -n 1; }

# check_gpu POD CONTAINER CLAIM: the container sees exactly the claim's one whole GPU: one
# /dev/nvidia<minor> (the allocated gpu-<minor>), its UUID in NVIDIA_VISIBLE_DEVICES and in the
# claim's status.devices, and NVML in the container lists it alone as GPU 0 (`nvidia-smi -L`: the
# driver root's, through the libnvidia-ml the CDI spec mounted; the fake library's container
# mode, which sees the GPUs whose device nodes the container has). Prints the minor.
# check_driver_files WHERE OUTPUT: the container got the driver's files from the node's driver
# root (a fake one: minimal ELF libraries): libraries and their links, nvidia-smi, GSP firmware;
# without the toolkit's hook on this node, each link is the library bound at the link's path.
check_driver_files() {
    local want f
    for want in /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/lib/x86_64-linux-gnu/libcuda.so.$E2E_DRIVER_VERSION \
        /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 /usr/bin/nvidia-smi /lib/firmware/nvidia/$E2E_DRIVER_VERSION/gsp_ga10x.bin; do
        grep -qx "file=$want" <<<"$2" || fail "$1: no $want from the driver root; it has: $(grep '^file=' <<<"$2" | tr '\n' ' ')"
    done
    # This node has no nvidia-cdi-hook (e2e/install.sh's has NVIDIA's): the library itself is
    # bound at its link's path, so no link exists (only pods that print links are checked).
    ! grep -q '^link=/usr/lib/x86_64-linux-gnu/libcuda.so.1->' <<<"$2" ||
        fail "$1: libcuda.so.1 is a link on a node without the hook: $(grep '^link=' <<<"$2")"
}

check_gpu() {
    local pod=$1 ctr=$2 claim=$3 out dev minor nodes uuid vis smi status_uuid
    out=$(ctr_out "$pod" "$ctr")
    dev=$(allocated "$claim")
    [[ $dev =~ ^gpu-([0-9]+)$ ]] || fail "$pod: claim $claim allocated '$dev', not one whole GPU"
    minor=${BASH_REMATCH[1]}
    nodes=$(grep -E '^dev=nvidia[0-9]+$' <<<"$out" | sed 's/^dev=//' | tr '\n' ' ')
    [[ $nodes == "nvidia$minor " ]] || fail "$pod/$ctr: GPU device nodes '$nodes', want only nvidia$minor"
    grep -q '^dev=nvidiactl$' <<<"$out" || fail "$pod/$ctr: no /dev/nvidiactl"
    check_driver_files "$pod/$ctr" "$out"
    uuid=$(attr "$dev" uuid)
    vis=$(sed -n 's/^NVIDIA_VISIBLE_DEVICES=//p' <<<"$out")
    [[ $vis == GPU-* && $vis == "$uuid" ]] || fail "$pod/$ctr: NVIDIA_VISIBLE_DEVICES='$vis', want $dev's $uuid"
    smi=$(grep '^smi=' <<<"$out" || true)
    [[ $smi == "smi=GPU 0: $(attr "$dev" productName) (UUID: $uuid)" ]] || fail "$pod/$ctr: nvidia-smi -L printed '$smi', want $dev ($uuid) alone"
    # Reported after the driver answers the kubelet: it may trail the container's start.
    for _ in $(seq 20); do
        status_uuid=$(claim_json "$claim" | jq -r --arg d "$dev" '.status.devices[]? | select(.device == $d) | .data.uuid')
        [[ $status_uuid == "$uuid" ]] && break
        sleep 0.5
    done
    [[ $status_uuid == "$uuid" ]] || fail "claim $claim status.devices reports '$status_uuid' for $dev, want $uuid"
    echo "$minor"
}
# unprepared UID...: the CDI specs are gone (the driver unprepared)
unprepared() { local u; for u in "$@"; do [[ ! -e $(spec_of "$u") ]] || return 1; done; }
wait_unprepared() { wait_for "CDI specs of claims $* removed" 30 unprepared "$@"; }
claims_gone() { local c; for c in "$@"; do gone resourceclaim "$c" || return 1; done; }
wait_claims_gone() { wait_for "claims $* deleted by the controller" 30 claims_gone "$@"; }

[[ $(mig_instances) == 0 ]] || fail "MIG instances exist before any claim"

# ---------------------------------------------------------------- 9a. crash loop, started first
# (the kubelet's back-off makes restarts slow: it runs while scenarios 1-3, 6 and 5 do)
apply crash-loop.yaml
wait_for "crash-loop claim prepared" 60 bash -c "[[ -n \$(kubectl get pod crash-loop -o json | jq -r '.status.resourceClaimStatuses[]?.resourceClaimName') ]]"
crash_claim=$(claim_of crash-loop mig)
crash_uid=$(claim_uid "$crash_claim")
crash_spec=$(spec_of "$crash_uid")
exited_once() { kubectl get pod "$1" -o json | jq -e '.status.containerStatuses[0] | .restartCount > 0 or .state.terminated != null' >/dev/null; }
wait_started crash-loop exited_once
[[ -f $crash_spec ]] || fail "crash-loop: no CDI spec $crash_spec"
crash_spec_id=$(file_id "$crash_spec")
crash_layout=$(mig_layout)
[[ $(wc -l <<<"$crash_layout") == 1 ]] || fail "crash-loop: want 1 MIG instance, have: $crash_layout"
ok "crash-loop pod: MIG claim $(allocated "$crash_claim") prepared, container exits 1 (checked again later)"
BASE=1 # MIG instances while crash-loop lives

# ---------------------------------------------------------------- 1. a GPU per pod
apply gpu-per-pod.yaml
wait_running pod-a pod-b
ca=$(claim_of pod-a)
cb=$(claim_of pod-b)
[[ $ca != "$cb" ]] || fail "pod-a and pod-b share claim $ca"
ma=$(check_gpu pod-a ctr "$ca")
mb=$(check_gpu pod-b ctr "$cb")
[[ $ma != "$mb" ]] || fail "pod-a and pod-b both see /dev/nvidia$ma"
ua=$(claim_uid "$ca")
ub=$(claim_uid "$cb")
[[ -f $(spec_of "$ua") && -f $(spec_of "$ub") ]] || fail "CDI specs missing for $ca/$cb"
ok "1. two pods from one template: each Running with its own GPU (nvidia$ma, nvidia$mb), UUIDs match the claims"
wait_for "the info series of pod-a's claim" 15 has_info "$ua" 'namespace="default"' 'pods="default/pod-a"' \
    "dra_device=\"gpu-$ma\"" "UUID=\"$(attr "gpu-$ma" uuid)\"" 'GPU_I_ID=""' 'sharing="exclusive"'
ok "1. /metrics: gpu_dra_prepared_device_info names pod-a, its claim and gpu-$ma with DCGM's UUID label"
delete_pods pod-a pod-b
wait_unprepared "$ua" "$ub"
wait_for "the info series gone with the claims" 15 no_info "$ua"
no_info "$ub" || fail "pod-b's claim still has info series: $(device_info "$ub")"
wait_claims_gone "$ca" "$cb"
count_mig "$BASE" || fail "MIG instances changed by whole-GPU pods: $(mig_layout)"
ok "1. pods deleted: CDI specs removed, generated claims deleted"

# ---------------------------------------------------------------- 2. two containers, one claim
apply two-containers.yaml
wait_running two-containers
c2=$(claim_of two-containers shared-gpu)
m0=$(check_gpu two-containers ctr0 "$c2")
m1=$(check_gpu two-containers ctr1 "$c2")
[[ $m0 == "$m1" ]] || fail "the two containers see different GPUs: nvidia$m0, nvidia$m1"
u2=$(claim_uid "$c2")
ok "2. two containers sharing one claim both see GPU nvidia$m0"
delete_pods two-containers
wait_unprepared "$u2"
wait_claims_gone "$c2"
ok "2. pod deleted: CDI spec removed, claim deleted"

# ---------------------------------------------------------------- 3. one ResourceClaim, two pods
apply shared-claim.yaml
wait_running shared-1 shared-2
[[ $(claim_of shared-1) == shared-gpu && $(claim_of shared-2) == shared-gpu ]] || fail "pods do not use claim shared-gpu"
s1=$(check_gpu shared-1 ctr shared-gpu)
s2=$(check_gpu shared-2 ctr shared-gpu)
[[ $s1 == "$s2" ]] || fail "shared claim: pods see nvidia$s1 and nvidia$s2"
reserved=$(claim_json shared-gpu | jq -r '[.status.reservedFor[]?.name] | sort | join(",")')
[[ $reserved == shared-1,shared-2 ]] || fail "shared-gpu reservedFor: '$reserved'"
u3=$(claim_uid shared-gpu)
sliced=$(hw | jq -r ".gpus[] | select(.minor == $s1) | \"\\(.compute_mode)/\\(.timeslice)\"")
[[ $sliced == Default/3 ]] || fail "shared claim: GPU $s1 compute mode/time-slice $sliced, expected Default/3 (TimeSlicing Long)"
ok "3. one time-sliced ResourceClaim shared by two pods: both Running on nvidia$s1 (time-slice Long applied), reservedFor lists both"
wait_for "the shared claim's info series names both pods" 15 has_info "$u3" 'default/shared-1' 'default/shared-2' \
    'sharing="time-slicing"'
ok "3. /metrics: the shared claim's series names both pods, sharing time-slicing"
delete_pods shared-1
sleep 1 # the claim must stay prepared while shared-2 uses it
[[ -f $(spec_of "$u3") ]] || fail "shared claim unprepared while shared-2 still runs"
pod_running shared-2 || fail "shared-2 stopped when shared-1 was deleted"
wait_for "reservedFor lists only shared-2" 30 bash -c "[[ \$(kubectl get resourceclaim shared-gpu -o json | jq -r '[.status.reservedFor[]?.name] | join(\",\")') == shared-2 ]]"
delete_pods shared-2
wait_unprepared "$u3"
# Kubernetes' resourceclaim controller: a claim without consumers is no longer reserved and,
# not being generated from a template, stays; its allocation is removed (deallocated), and
# then its finalizer.
wait_for "shared-gpu not reserved and deallocated" 30 bash -c "kubectl get resourceclaim shared-gpu -o json | jq -e '(.status.reservedFor // []) == [] and .status.allocation == null' "
gone resourceclaim shared-gpu && fail "the standalone claim was deleted"
sliced=$(hw | jq -r ".gpus[] | select(.minor == $s1) | \"\\(.compute_mode)/\\(.timeslice)\"")
[[ $sliced == Default/0 ]] || fail "after unprepare GPU $s1 compute mode/time-slice $sliced, expected Default/0 again"
ok "3. both pods deleted: CDI spec removed, time-slice restored; the claim stays, reservedFor empty, deallocated"
kubectl delete resourceclaim shared-gpu --timeout=30s >&2

# ---------------------------------------------------------------- 6. extended resource nvidia.com/gpu
apply extended-resource.yaml
wait_running ext-gpu
c6=$(kubectl get pod ext-gpu -o jsonpath='{.status.extendedResourceClaimStatus.resourceClaimName}')
[[ -n $c6 ]] || fail "ext-gpu: no extendedResourceClaimStatus: $(kubectl get pod ext-gpu -o json | jq -c .status)"
m6=$(check_gpu ext-gpu ctr "$c6")
u6=$(claim_uid "$c6")
ok "6. nvidia.com/gpu: 1 without a claim: Running with nvidia$m6 (claim $c6 made by the scheduler)"
delete_pods ext-gpu
wait_unprepared "$u6"
wait_claims_gone "$c6"
ok "6. pod deleted: CDI spec removed, its claim deleted"

# ---------------------------------------------------------------- 5. a Job
apply job.yaml
wait_for "job gpu-job pod" 60 bash -c "[[ -n \$(kubectl get pods -l batch.kubernetes.io/job-name=gpu-job -o name) ]]"
jp=$(kubectl get pods -l batch.kubernetes.io/job-name=gpu-job -o jsonpath='{.items[0].metadata.name}')
wait_started "$jp" pod_done
wait_for "job gpu-job complete" 60 bash -c "[[ \$(kubectl get job gpu-job -o jsonpath='{.status.succeeded}') == 1 ]]"
phase "$jp" Succeeded || fail "job pod $jp not Succeeded"
c5=$(claim_of "$jp")
out=$(ctr_out "$jp" ctr)
[[ $(grep -cE '^dev=nvidia[0-9]+$' <<<"$out") == 1 ]] || fail "job: GPU device nodes: $(grep '^dev=nvidia' <<<"$out")"
[[ $(sed -n 's/^NVIDIA_VISIBLE_DEVICES=//p' <<<"$out") == GPU-* ]] || fail "job: no GPU in NVIDIA_VISIBLE_DEVICES"
# The claim goes while the finished pod still exists.
wait_claims_gone "$c5"
gone pod "$jp" && fail "job pod $jp went away"
u5=$(watched_uid "$c5")
[[ -n $u5 ]] || fail "job claim $c5 never seen"
wait_unprepared "$u5"
[[ -z $(ls "$GPU_DRA_CDI_ROOT" | grep -v "$crash_uid") ]] || fail "CDI specs left: $(ls "$GPU_DRA_CDI_ROOT")"
ok "5. Job completed with one GPU; its claim deleted by the controller while the pod remains; CDI spec removed"
kubectl delete job gpu-job --cascade=foreground --timeout=60s >&2

# ---------------------------------------------------------------- 9b. the crash loop
wait_for "crash-loop restartCount >= 2" 90 bash -c "[[ \$(kubectl get pod crash-loop -o jsonpath='{.status.containerStatuses[0].restartCount}') -ge 2 ]]"
restarts=$(kubectl get pod crash-loop -o jsonpath='{.status.containerStatuses[0].restartCount}')
[[ $(mig_layout) == "$crash_layout" ]] || fail "crash-loop: MIG instances changed: was $crash_layout, now $(mig_layout)"
[[ $(file_id "$crash_spec") == "$crash_spec_id" ]] || fail "crash-loop: CDI spec rewritten ($crash_spec_id -> $(file_id "$crash_spec"))"
[[ $(n_prepared "$crash_uid") == 1 ]] || fail "crash-loop: claim prepared $(n_prepared "$crash_uid") times"
[[ $(n_unprepared "$crash_uid") == 0 ]] || fail "crash-loop: claim unprepared while the pod lives"
ok "9. crash loop: after $restarts restarts the claim was prepared once (1 prepare log line, same GPU instance, CDI spec untouched)"
delete_pods crash-loop
wait_unprepared "$crash_uid"
wait_claims_gone "$crash_claim"
wait_for "MIG instance destroyed" 30 count_mig 0
ok "9. crash-loop pod deleted: MIG instance destroyed, CDI spec removed, claim deleted"
BASE=0

# ---------------------------------------------------------------- 4. Deployment with 4 MIG devices
apply mig-deployment.yaml
wait_for "mig-deployment pod" 60 bash -c "[[ -n \$(kubectl get pods -l app=mig-deployment -o name) ]]"
dp=$(kubectl get pods -l app=mig-deployment -o jsonpath='{.items[0].metadata.name}')
wait_running "$dp"
c4=$(claim_of "$dp" mig)
u4=$(claim_uid "$c4")
mapfile -t devs < <(allocated "$c4")
[[ ${#devs[@]} == 4 ]] || fail "mig-deployment: ${#devs[@]} devices allocated: ${devs[*]}"
parents=$(for d in "${devs[@]}"; do
    [[ $d == gpu-*-mig-1g10gb-* ]] || fail "mig-deployment: unexpected device $d"
    attr "$d" parentUUID
done | sort -u)
[[ $(wc -l <<<"$parents") == 1 && $parents == GPU-* ]] || fail "mig-deployment: parents '$parents'"
out=$(ctr_out "$dp" ctr)
vis=$(sed -n 's/^NVIDIA_VISIBLE_DEVICES=//p' <<<"$out")
mapfile -t migs < <(tr ',' '\n' <<<"$vis" | sort)
[[ ${#migs[@]} == 4 && $(printf '%s\n' "${migs[@]}" | grep -c '^MIG-') == 4 ]] || fail "mig-deployment: NVIDIA_VISIBLE_DEVICES=$vis"
caps=$(sed -n 's/^cap=//p' <<<"$out" | sort | tr '\n' ' ')
spec_caps=$(jq -r '.devices[].containerEdits.deviceNodes[]?.path | select(startswith("/dev/nvidia-caps/")) | sub("/dev/nvidia-caps/"; "")' "$(spec_of "$u4")" | sort -u | tr '\n' ' ')
[[ -n $caps && $caps == "$spec_caps" ]] || fail "mig-deployment: /dev/nvidia-caps has '$caps', CDI spec '$spec_caps'"
check_driver_files "mig-deployment" "$out"
[[ $(grep -cE '^dev=nvidia[0-9]+$' <<<"$out") == 1 ]] || fail "mig-deployment: parent GPU nodes: $(grep '^dev=nvidia' <<<"$out")"
layout=$(mig_layout)
[[ $(wc -l <<<"$layout") == 4 ]] || fail "simulator: want 4 MIG instances, have: $layout"
[[ $(cut -d: -f1 <<<"$layout" | sort -u | wc -l) == 1 ]] || fail "simulator: MIG instances on several GPUs: $layout"
minor=$(cut -d: -f1 <<<"$layout" | head -n 1)
[[ $(attr "gpu-$minor" uuid) == "$parents" ]] || fail "simulator: instances on gpu-$minor, claim's parent $parents"
[[ $(cut -d: -f4 <<<"$layout" | sort) == "$(printf '%s\n' "${migs[@]}")" ]] || fail "container's MIG UUIDs ($vis) are not the simulator's: $layout"
grep -q "^dev=nvidia$minor$" <<<"$out" || fail "mig-deployment: no /dev/nvidia$minor for the parent GPU"
ok "4. Deployment: 4 × 1g.10gb on gpu-$minor ($(echo "${devs[@]}")); container sees the 4 MIG UUIDs and ${caps// /,} caps"
wait_for "4 MIG info series" 15 info_count "$u4" 'GPU_I_PROFILE="1g.10gb"' 4
info4=$(device_info "$u4")
[[ $(grep -o 'GPU_I_ID="[0-9]*"' <<<"$info4" | sort -u | wc -l) == 4 && $(grep -c "UUID=\"$parents\"" <<<"$info4") == 4 ]] \
    || fail "the MIG claim's info series: $info4"
for m in "${migs[@]}"; do grep -q "mig_uuid=\"$m\"" <<<"$info4" || fail "no info series with mig_uuid $m: $info4"; done
ok "4. /metrics: 4 series, one per carved MIG device, with the parent's UUID, each GPU_I_ID and the MIG UUIDs"
# The pod's container process as a compute process on one of its MIG devices (the simulated
# hardware's): its memory is the claim's device's use within --usage-interval (2s here), and
# the pod's (the driver finds the pod from the process's cgroup), gone again when it ends.
gi4=$(grep -o 'GPU_I_ID="[0-9]*"' <<<"$info4" | head -n 1 | grep -o '[0-9]*')
dp_uid=$(kubectl get pod "$dp" -o jsonpath='{.metadata.uid}')
dp_pid=$(grep -l -e "pod$dp_uid" -e "pod${dp_uid//-/_}" /proc/[0-9]*/cgroup 2>/dev/null | head -n 1 | cut -d/ -f3)
[[ -n $dp_pid ]] || fail "no process of pod $dp ($dp_uid) on the node"
sim_process() { "$E2E_GPU_DRA" sim --gpus "$E2E_GPUS" --node-name "$E2E_NODE" --sim-state "$GPU_DRA_SIM_STATE" process --gpu "$minor" --pid "$dp_pid" "$@" >/dev/null; }
metric_of() { # NAME: the sample of the claim's series on GPU instance $gi4
    chart_scrape | grep "^$1{.*claim_uid=\"$u4\".*GPU_I_ID=\"$gi4\"" | awk '{print $NF}'
}
memory_is() { [[ $(metric_of gpu_dra_claim_device_memory_used_bytes) == "$1" ]]; }
sim_process --gpu-instance "$gi4" --memory-mib 2048 --sm-percent 60
wait_for "the MIG device's memory in use" 20 memory_is 2147483648
[[ $(metric_of gpu_dra_claim_device_processes) == 1 ]] || fail "the MIG device's process count: $(metric_of gpu_dra_claim_device_processes)"
pod_memory_is() {
    [[ $(chart_scrape | grep "^gpu_dra_pod_device_memory_used_bytes{namespace=\"default\",pod=\"$dp\",.*GPU_I_ID=\"$gi4\"" | awk '{print $NF}') == "$1" ]]
}
wait_for "the pod's memory on the MIG device" 20 pod_memory_is 2147483648
sim_process --end
wait_for "the ended process's memory gone" 20 memory_is 0
ok "4. /metrics: the pod's process on MIG device GPU_I_ID=$gi4 shows as the claim's and pod $dp's 2 GiB in use (then 0 when it ends)"
# The picture (docs/tasks/monitor.md) of "which pod holds which GPU slice" (e2e/alerts.sh prints it).
# The chart's metrics need a token: the sample is scraped with one.
if [[ -n ${GPU_DRA_METRICS_SAMPLES:-} ]]; then
    mkdir -p "$GPU_DRA_METRICS_SAMPLES"
    chart_scrape >"$GPU_DRA_METRICS_SAMPLES/real-node.prom" || fail "cannot scrape the driver pod's /metrics for the metrics sample real-node"
fi
kubectl delete deployment mig-deployment --timeout=60s >&2
wait_for "deployment pod gone" 60 gone pod "$dp"
wait_unprepared "$u4"
wait_claims_gone "$c4"
wait_for "MIG instances destroyed" 30 count_mig 0
ok "4. Deployment deleted: 4 MIG instances destroyed, CDI spec removed, claim deleted"

# ---------------------------------------------------------------- 7. kubelet restart
apply mig-pod.yaml survivor
wait_running survivor
c7=$(claim_of survivor mig)
u7=$(claim_uid "$c7")
ctr_out survivor ctr >/dev/null
spec7=$(file_id "$(spec_of "$u7")")
layout7=$(mig_layout)
dev7=$(allocated "$c7")
cid7=$(kubectl get pod survivor -o jsonpath='{.status.containerStatuses[0].containerID}')
regs=$(registrations)
"$E2E/cluster" stop kubelet >&2
"$E2E/cluster" start kubelet >&2 || fail "the kubelet did not restart"
wait_for "kubelet re-registered the plugin" 30 bash -c "(( \$(grep -c 'Registered DRA plugin.*gpu.nvidia.com' '$LOGS/kubelet.log') > $regs ))"
# A new pod proves preparing still works, and gives the kubelet time to resync survivor.
apply mig-pod.yaml after-kubelet
wait_running after-kubelet
c7b=$(claim_of after-kubelet mig)
u7b=$(claim_uid "$c7b")
ctr_out after-kubelet ctr | grep -q '^NVIDIA_VISIBLE_DEVICES=MIG-' || fail "after-kubelet: no MIG device"
pod_running survivor || fail "survivor not running after the kubelet restart"
[[ $(kubectl get pod survivor -o jsonpath='{.status.containerStatuses[0].containerID}') == "$cid7" ]] || fail "survivor's container was recreated"
[[ $(kubectl get pod survivor -o jsonpath='{.status.containerStatuses[0].restartCount}') == 0 ]] || fail "survivor restarted"
[[ $(file_id "$(spec_of "$u7")") == "$spec7" ]] || fail "survivor's CDI spec was rewritten"
[[ $(allocated "$c7") == "$dev7" ]] || fail "survivor's claim changed device"
[[ $(mig_layout | grep -Fx -f <(echo "$layout7") | wc -l) == 1 && $(mig_instances) == 2 ]] ||
    fail "MIG instances: before $layout7, now $(mig_layout) (want the same one + one for after-kubelet)"
[[ $(n_prepared "$u7") == 1 ]] || fail "survivor's claim prepared $(n_prepared "$u7") times"
ok "7. kubelet restart: plugin re-registered, survivor kept running on $dev7 (same container, CDI spec, GPU instance, 1 prepare); a new pod was prepared"
delete_pods survivor after-kubelet
wait_unprepared "$u7" "$u7b"
wait_claims_gone "$c7" "$c7b"
wait_for "MIG instances destroyed" 30 count_mig 0
ok "7. pods deleted: MIG instances destroyed, CDI specs removed, claims deleted"

# ---------------------------------------------------------------- 8. driver restart
apply mig-pod.yaml drv-mig
apply gpu-pod.yaml drv-gpu
wait_running drv-mig drv-gpu
c8m=$(claim_of drv-mig mig)
c8g=$(claim_of drv-gpu)
u8m=$(claim_uid "$c8m")
u8g=$(claim_uid "$c8g")
check_gpu drv-gpu ctr "$c8g" >/dev/null
layout8=$(mig_layout)
regs=$(registrations)
old_driver=$DRIVER_POD
driver_stop
pod_running drv-mig && pod_running drv-gpu || fail "pods stopped with the driver"
[[ -f $(spec_of "$u8m") && -f $(spec_of "$u8g") ]] || fail "CDI specs removed when the driver stopped"
driver_wait_ready
[[ $DRIVER_POD != "$old_driver" ]] || fail "the driver pod was not replaced"
wait_for "kubelet re-registered the plugin" 30 bash -c "(( \$(grep -c 'Registered DRA plugin.*gpu.nvidia.com' '$LOGS/kubelet.log') > $regs ))"
driver_log "$DRIVER_POD" | grep 'recovered prepared state' | tail -n 1 | grep -q 'checkpoint loaded' || fail "the driver did not load its checkpoint"
pod_running drv-mig && pod_running drv-gpu || fail "pods stopped after the driver restart"
[[ -f $(spec_of "$u8m") && -f $(spec_of "$u8g") ]] || fail "CDI specs removed after the driver restart"
[[ $(mig_layout) == "$layout8" ]] || fail "MIG instances changed across the restart: $layout8 -> $(mig_layout)"
ok "8. driver restart (pod $old_driver deleted, $DRIVER_POD started by the DaemonSet): pods kept running, CDI specs and GPU instance kept, checkpoint loaded"
delete_pods drv-mig drv-gpu
wait_unprepared "$u8m" "$u8g"
wait_claims_gone "$c8m" "$c8g"
wait_for "MIG instance destroyed" 30 count_mig 0
ok "8. pods deleted after the restart: unprepared (MIG instance destroyed, CDI specs removed)"
apply gpu-pod.yaml after-driver
wait_running after-driver
c8n=$(claim_of after-driver)
check_gpu after-driver ctr "$c8n" >/dev/null
u8n=$(claim_uid "$c8n")
delete_pods after-driver
wait_unprepared "$u8n"
ok "8. a new pod after the driver restart was prepared (and unprepared)"

# ---------------------------------------------------------------- 10. MPS
# deploy/examples/gpu-mps.yaml as a user applies it: one MPS daemon for the claim, told the
# claim's limits; both pods get its pipe folder and shm; the daemon outlives a driver restart;
# unprepare stops it, removes its folder and mount and restores the compute mode.
mps_dir() { mps_folder "$GPU_DRA_STATE_DIR" "$1"; }
mps_daemons() { # UID: MPS control daemons of the claim's daemon folder
    mps_daemons_of "$(mps_dir "$1")" | wc -l
}
mps_gone() { [[ ! -e $(mps_dir "$1") && $(mps_processes "$(mps_dir "$1")" | wc -l) == 0 ]] && ! grep -q " $(mps_dir "$1")/shm " /proc/self/mountinfo; }
check_mps_pod() { # pod claim-uid: prints the container's output
    local out
    out=$(ctr_out "$1" ctr)
    grep -qx 'CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps' <<<"$out" || fail "$1: no CUDA_MPS_PIPE_DIRECTORY: $out"
    grep -qx 'pipe=control' <<<"$out" || fail "$1: /tmp/nvidia-mps is not the daemon's pipe folder: $(grep '^pipe=' <<<"$out")"
    grep -qx 'shm=written' <<<"$out" || fail "$1: cannot write /dev/shm"
    [[ -f $(mps_dir "$2")/shm/from-$1 ]] || fail "$1: its /dev/shm is not the claim's MPS shm ($(ls "$(mps_dir "$2")/shm"))"
    check_driver_files "$1" "$out"
}
apply "$ROOT/deploy/examples/gpu-mps.yaml"
apply mps-pod.yaml mps-1 mps-gpu
apply mps-pod.yaml mps-2 mps-gpu
wait_running mps-1 mps-2
u10=$(claim_uid mps-gpu)
d10=$(allocated mps-gpu)
[[ $d10 =~ ^gpu-([0-9]+)$ ]] || fail "mps-gpu allocated '$d10', not one whole GPU"
m10=${BASH_REMATCH[1]}
uuid10=$(attr "$d10" uuid)
check_mps_pod mps-1 "$u10"
check_mps_pod mps-2 "$u10"
log10=$(cat "$(mps_dir "$u10")/log/control.log")
grep -q "CUDA_VISIBLE_DEVICES=$uuid10 " <<<"$log10" || fail "MPS daemon not limited to $uuid10: $log10"
grep -q "cmd: set_default_active_thread_percentage 50$" <<<"$log10" || fail "MPS daemon not told the thread share: $log10"
grep -q "cmd: set_default_device_pinned_mem_limit $uuid10 10240M$" <<<"$log10" || fail "MPS daemon not told the pinned-memory limit: $log10"
[[ $(mps_daemons "$u10") == 1 ]] || fail "want one MPS daemon for claim mps-gpu, have $(mps_daemons "$u10")"
hw | jq -e --arg u "$uuid10" '.mps_daemons | length == 1 and .[0].devices == [$u] and .[0].active_thread_percentage == "50"' >/dev/null ||
    fail "the simulated hardware does not know the MPS daemon: $(hw | jq -c '.mps_daemons')"
mode10=$(hw | jq -r ".gpus[] | select(.minor == $m10) | .compute_mode")
[[ $mode10 == ExclusiveProcess ]] || fail "MPS GPU $m10 compute mode $mode10, want ExclusiveProcess"
ok "10. MPS claim shared by two pods: one daemon on $d10 (50% threads, 10240M pinned, EXCLUSIVE_PROCESS); both pods got its pipe and shm"
wait_for "the MPS claim's info series" 15 has_info "$u10" 'sharing="mps"' 'default/mps-1' 'default/mps-2' "UUID=\"$uuid10\""
ok "10. /metrics: the MPS claim's series says mps and names both pods"
regs=$(registrations)
driver_restart
wait_for "kubelet re-registered the plugin" 30 bash -c "(( \$(grep -c 'Registered DRA plugin.*gpu.nvidia.com' '$LOGS/kubelet.log') > $regs ))"
[[ $(grep -c 'Control daemon started' "$(mps_dir "$u10")/log/control.log") == 1 && $(mps_daemons "$u10") == 1 ]] ||
    fail "the MPS daemon did not outlive the driver restart: $(cat "$(mps_dir "$u10")/log/control.log")"
pod_running mps-1 && pod_running mps-2 || fail "MPS pods stopped across the driver restart"
ok "10. driver pod deleted and replaced: the same MPS daemon kept serving (not restarted, not told again)"
delete_pods mps-1 mps-2
wait_unprepared "$u10"
wait_for "MPS daemon of mps-gpu stopped, folder and mount removed" 30 mps_gone "$u10"
mode10=$(hw | jq -r ".gpus[] | select(.minor == $m10) | .compute_mode")
[[ $mode10 == Default ]] || fail "after unprepare GPU $m10 compute mode $mode10, want Default again"
[[ $(hw | jq '.mps_daemons // [] | length') == 0 ]] || fail "MPS daemons left in the simulated hardware: $(hw | jq -c '.mps_daemons')"
kubectl delete resourceclaim mps-gpu --timeout=30s >&2
ok "10. pods deleted: daemon stopped, shm unmounted, folder removed, compute mode Default again"

# MPS on a MIG device carved for the claim (deploy/examples/mig-2g-mps.yaml): the daemon starts
# after the carve and stops before the destroy.
apply "$ROOT/deploy/examples/mig-2g-mps.yaml"
apply mps-pod.yaml mps-mig mig-2g-mps
wait_running mps-mig
u10m=$(claim_uid mig-2g-mps)
check_mps_pod mps-mig "$u10m"
mig10=$(hw | jq -r '.gpus[].gpu_instances[].compute_instances[].uuid' | head -n 1)
log10m=$(cat "$(mps_dir "$u10m")/log/control.log")
grep -q "CUDA_VISIBLE_DEVICES=$mig10 " <<<"$log10m" || fail "MIG MPS daemon not limited to the carved $mig10: $log10m"
grep -q "cmd: set_default_device_pinned_mem_limit $mig10 8192M$" <<<"$log10m" || fail "MIG MPS daemon not told the per-device limit: $log10m"
ok "10. MPS on a carved 2g.20gb MIG device ($mig10): daemon limited to it, 40% threads, 8192M pinned"
delete_pods mps-mig
wait_unprepared "$u10m"
wait_for "MIG MPS daemon stopped" 30 mps_gone "$u10m"
wait_for "MIG instance destroyed" 30 count_mig 0
kubectl delete resourceclaim mig-2g-mps --timeout=30s >&2
ok "10. MIG MPS pod deleted: daemon stopped before the MIG device was destroyed; nothing left"

# ---------------------------------------------------------------- 11. a GPU falls off the bus
apply gpu-pod.yaml evicted
wait_running evicted
c11=$(claim_of evicted)
u11=$(claim_uid "$c11")
d11=$(allocated "$c11")
device_taints() { kubectl get resourceslices -o json | jq -c --arg d "$1" '[.items[].spec.devices[]? | select(.name == $d) | .taints // [] | .[] | {key, effect}]'; }
"$E2E_GPU_DRA" sim --gpus "$E2E_GPUS" --node-name "$E2E_NODE" --sim-state "$GPU_DRA_SIM_STATE" inject --gpu "${d11#gpu-}" --xid 79 >/dev/null
wait_for "$d11 tainted NoExecute" 10 bash -c "[[ \$(kubectl get resourceslices -o json | jq -c '[.items[].spec.devices[]? | select(.name == \"$d11\") | .taints[]?.effect]') == *NoExecute* ]]"
pod_gone() { ! kubectl get pod "$1" >/dev/null 2>&1; }
wait_for "pod evicted by kube-controller-manager's device-taint eviction" 60 pod_gone evicted
wait_unprepared "$u11"
wait_claims_gone "$c11"
"$E2E_GPU_DRA" sim --gpus "$E2E_GPUS" --node-name "$E2E_NODE" --sim-state "$GPU_DRA_SIM_STATE" inject --gpu "${d11#gpu-}" --reset >/dev/null
wait_for "$d11 untainted after the reset" 15 bash -c "[[ \$(kubectl get resourceslices -o json | jq -c '[.items[].spec.devices[]? | select(.name == \"$d11\") | .taints // [] | length] | add') == 0 ]]"
ok "11. XID 79 on $d11 while a pod used it: tainted NoExecute, the pod evicted by the device-taint eviction controller, its claim unprepared and deleted; untainted after the GPU reset ($(device_taints "$d11"))"

# ---------------------------------------------------------------- 12. a GPU for a virtual machine
# Every GPU is in persistence mode and held open by another process (a DCGM stand-in, `gpu-dra
# sim hold`), as on a production node. The kernel's unbind from nvidia sleeps, forever and
# holding the claim's locks, while anything has the GPU open; the simulated kernel records each
# such unbind (stuck_unbinds) instead. So the driver must turn persistence off, refuse the claim
# naming the holder while it lives, and close its own NVML session before it unbinds.
sim() { "$E2E_GPU_DRA" sim --gpus "$E2E_GPUS" --node-name "$E2E_NODE" --sim-state "$GPU_DRA_SIM_STATE" "$@"; }
prepare_error() {
    kubectl get events -o json --field-selector "involvedObject.name=$1,reason=FailedPrepareDynamicResources" |
        jq -r '.items[-1].message // empty'
}
stuck_unbinds() { hw | jq -c '.stuck_unbinds // []'; }
session_held=$(hw | jq '[.gpus[] | select(.driver == null) | select(any(.holders[]?; .name == "gpu-dra (NVML session)"))] | length')
((session_held > 0)) || fail "the driver's NVML session holds no GPU in the simulated kernel: $(hw | jq -c '[.gpus[] | {minor, holders}]')"
for g in $(hw | jq -r '.gpus[] | select(.driver == null) | .minor'); do
    sim persistence --gpu "$g" --enabled true
    # A plain command, not the function: $! is then the holding process itself.
    "$E2E_GPU_DRA" sim --gpus "$E2E_GPUS" --node-name "$E2E_NODE" --sim-state "$GPU_DRA_SIM_STATE" \
        hold --gpu "$g" --name e2e-dcgm >"$WORK/hold-$g.out" &
    holders+=("$!")
done
dcgm_holds() { [[ $(hw | jq '[.gpus[].holders[]? | select(.name == "e2e-dcgm")] | length') == "${#holders[@]}" ]]; }
wait_for "the holders registered" 10 dcgm_holds
apply vm-launcher.yaml
held_named() { prepare_error virt-launcher-vm | grep -q 'is held open by pid [0-9]* (e2e-dcgm)'; }
wait_for "the VM claim refused, naming the process that holds its GPU" 90 held_named
[[ $(stuck_unbinds) == "[]" ]] || fail "an unbind was written while the GPU was held open: $(stuck_unbinds)"
[[ $(hw | jq '[.gpus[] | select(.driver != null)] | length') == 0 ]] || fail "a GPU left nvidia while held open: $(hw | jq -c '[.gpus[] | {minor, driver}]')"
ok "12. VM claim on held GPUs refused with the holder named ($(prepare_error virt-launcher-vm | grep -o 'GPU [0-9]* ([^)]*) is held open by pid [0-9]* (e2e-dcgm)' | head -n 1)); no unbind written, every GPU still on nvidia"
kill "${holders[@]}"
wait "${holders[@]}" 2>/dev/null || true
holders=()
# The kubelet retries a failed prepare at its next sync of the pod (up to its one-minute resync);
# an update of the pod makes that now.
kubectl annotate pod virt-launcher-vm --overwrite e2e-holder-gone=true >/dev/null
wait_running virt-launcher-vm
c12=$(claim_of virt-launcher-vm dra-gpu-claim)
u12=$(claim_uid "$c12")
d12=$(allocated "$c12")
[[ $d12 =~ ^gpu-vfio-([0-9]+)$ ]] || fail "virt-launcher-vm: claim $c12 allocated '$d12', not a GPU for a VM"
i12=${BASH_REMATCH[1]}
bus12=$(attr "$d12" resource.kubernetes.io/pciBusID)
out12=$(ctr_out virt-launcher-vm compute)
# The simulator's IOMMU groups are 40 + index; its GPUs' PCI index is their minor.
for want in vfio=vfio "vfio=$((40 + i12))" NVIDIA_VISIBLE_DEVICES=void; do
    grep -qx "$want" <<<"$out12" || fail "virt-launcher-vm: no $want in: $out12"
done
! grep -q '^dev=nvidia' <<<"$out12" || fail "virt-launcher-vm got NVIDIA devices: $(grep '^dev=' <<<"$out12" | tr '\n' ' ')"
grep -q "\"resource.kubernetes.io/pciBusID\":{\"string\":\"$bus12\"}" <<<"$out12" ||
    fail "virt-launcher-vm: the device metadata does not give $d12's PCI address $bus12: $(grep '^metadata=' <<<"$out12")"
for version in v1beta1 v1alpha1; do
    grep -q "\"apiVersion\":\"metadata.resource.k8s.io/$version\"" <<<"$out12" || fail "virt-launcher-vm: no $version metadata: $out12"
done
[[ $(hw | jq -r --argjson g "$i12" '.gpus[] | select(.minor == $g) | .driver') == vfio-pci ]] ||
    fail "GPU $i12 is not bound to vfio-pci while the VM's pod runs: $(hw | jq -c '[.gpus[] | {minor, driver}]')"
[[ $(stuck_unbinds) == "[]" ]] || fail "the unbind found GPU $i12 held open (the driver's own session or persistence): $(stuck_unbinds)"
[[ $(hw | jq --argjson g "$i12" '.gpus[] | select(.minor == $g) | .persistence // false') == false ]] || fail "GPU $i12 still in persistence mode on vfio-pci"
ok "12. virt-launcher stand-in: $d12 ($bus12) bound to vfio-pci once its holder ended (persistence off, the driver's NVML session closed first: no unbind waited); the pod sees /dev/vfio/vfio and /dev/vfio/$((40 + i12)), the metadata with its PCI address, NVIDIA_VISIBLE_DEVICES=void and no NVIDIA device"
# A CUDA claim for the same GPU (by PCI address) waits: the counters keep the scheduler off it.
apply same-gpu-pod.yaml "" "" "$bus12"
unschedulable() { kubectl get events -o json --field-selector involvedObject.name=cuda-same-gpu,reason=FailedScheduling | jq -e '.items | length > 0' >/dev/null; }
wait_for "the CUDA pod for the VM's GPU refused by the scheduler" 30 unschedulable
phase cuda-same-gpu Pending || fail "cuda-same-gpu is $(kubectl get pod cuda-same-gpu -o jsonpath='{.status.phase}') while the VM holds its GPU"
[[ -z $(kubectl get resourceclaim same-gpu -o jsonpath='{.status.allocation}') ]] || fail "same-gpu allocated while the VM holds the GPU: $(allocated same-gpu)"
ok "12. a CUDA pod for the same GPU ($bus12) stays Pending, its claim unallocated, while the VM's pod holds it"
delete_pods virt-launcher-vm
wait_unprepared "$u12"
[[ $(hw | jq -r --argjson g "$i12" '.gpus[] | select(.minor == $g) | .driver') == null ]] ||
    fail "GPU $i12 not back on nvidia after unprepare: $(hw | jq -c '[.gpus[] | {minor, driver}]')"
[[ $(hw | jq --argjson g "$i12" '.gpus[] | select(.minor == $g) | .persistence // false') == true ]] || fail "GPU $i12 back on nvidia without its persistence mode"
wait_running cuda-same-gpu
[[ $(check_gpu cuda-same-gpu ctr same-gpu) == "$i12" ]] || fail "cuda-same-gpu does not have GPU $i12"
ok "12. VM pod deleted: GPU $i12 back on nvidia in persistence mode again, seen by the driver's new NVML session; the waiting CUDA pod runs on it"
delete_pods cuda-same-gpu
kubectl delete resourceclaim same-gpu --timeout=30s >&2
wait_claims_gone "$c12" same-gpu

# ---------------------------------------------------------------- every claim: once each way
kill "$WATCH_PID" 2>/dev/null || true
wait "$WATCH_PID" 2>/dev/null || true
WATCH_PID=
mapfile -t all_claims < <(watched_uids)
((${#all_claims[@]} >= 10)) || fail "only ${#all_claims[@]} allocated claims seen by the watch: $(cat "$WORK/claims.watch.err")"
bad=()
for u in "${all_claims[@]}"; do
    p=$(n_prepared "$u")
    n=$(n_unprepared "$u")
    [[ $p == 1 && $n == 1 ]] || bad+=("$(watched_name "$u") ($u): prepared $p, unprepared $n;")
done
((${#bad[@]} == 0)) || fail "claims not prepared/unprepared exactly once: ${bad[*]}"
[[ -z $(ls "$GPU_DRA_CDI_ROOT") ]] || fail "CDI specs left: $(ls "$GPU_DRA_CDI_ROOT")"
[[ -z $(kubectl get resourceclaims -o name) ]] || fail "claims left: $(kubectl get resourceclaims -o name)"
gc=$(driver_logs | grep -c 'unprepared a claim that no longer exists' || true)
ok "all ${#all_claims[@]} claims prepared once and unprepared once ($gc by the driver's garbage collection, the rest by the kubelet); no spec, claim or MIG instance left"

log "total $((SECONDS - T0))s; kubelet nudged after a node-authorizer refusal: $NUDGES time(s)"
report_mode "the driver image installed by the Helm chart (restarts: kubectl delete pod of the driver pod); the driver container's kill -9, an MPS server's memory and helm upgrade under live MPS clients run in e2e/install.sh"
echo "$passed passed, 0 failed"
