#!/usr/bin/env bash
# e2e: what users install is what runs. The driver image (e2e/build-image.sh, an OCI archive of
# the node binary and its libraries) and the Helm chart (deploy/helm/gpu-dra), installed as a
# user would on the real node (kubelet + containerd + runc, e2e/cluster up --real-node), with
# pods reaching the API server through the kubernetes Service with their ServiceAccount token:
#
#   1. the image is imported into containerd; `helm install` with that image
#      (imagePullPolicy Never), simulated GPUs whose state lives on a hostPath, and the node's
#      fake driver root; the chart's DeviceClasses replace the cluster's;
#   2. the DaemonSet pod becomes Ready through its own probes, registers with the real kubelet
#      and publishes the node's slices with nothing but the chart's ServiceAccount (RBAC and
#      the admission policy in force: no authorization errors in its log);
#   3. a user pod with a claim runs with its GPU (device node, NVIDIA_VISIBLE_DEVICES), and
#      NVIDIA's nvidia-cdi-hook (in the driver root, run by runc from our CDI spec) made its
#      library links and its ld cache (the image's static ldconfig) finds libcuda.so.1;
#      MPS (deploy/examples' whole-GPU and carved-MIG claims) with clients attached to their
#      servers, which keep their servers through (a) the driver pod deleted, (b) the driver
#      container's PID 1 killed, (d) a server holding more memory than the driver's whole limit
#      and (c) the upgrade of step 4; the daemons run chrooted into the
#      driver root in cgroups of their own; a time-sliced claim's interval is set through the
#      driver root's nvidia-smi (the fake tools load only with the driver root's C library);
#   4. `helm upgrade` to a new image tag rolls the DaemonSet (new pod beside the old, seamless
#      registration): the running pod keeps running, no prepare fails, and a pod started after
#      the upgrade is prepared by the new driver, and the first pod's claim unprepared by it;
#      The upgraded driver unprepares the MPS claims: daemons, servers, folders, cgroups and
#      mounts all gone.
#   5. `helm uninstall`: the running pod and its prepared device (CDI spec) are left alone, and
#      no socket of the driver is left on the node.
#
# Usage: e2e/install.sh   (GPU_DRA: the debug binary for the node's fake driver root, default
#                          target/debug/gpu-dra; the image is built from the node profile
#                          unless IMAGE_BINARY names another gpu-dra binary)
set -euo pipefail
E2E=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=mps-folder.sh
source "$E2E/mps-folder.sh"
ROOT=$(dirname "$E2E")
cd "$ROOT"
NAME=install-e2e
WORK=$(mktemp -d /tmp/gpu-dra-install.XXXXXX)
# shellcheck source=chart.sh
source "$E2E/chart.sh"
NAMESPACE=$CHART_NAMESPACE
RELEASE=$CHART_RELEASE
# A long kubelet folder (as microk8s' is): the seamless-upgrade socket names, a pod UID each,
# must still fit a unix socket path's 107 bytes.
export GPU_DRA_CLUSTER_DIR=$WORK/cluster
passed=0
T0=$SECONDS

log() { echo "$NAME: $*" >&2; }
ok() { passed=$((passed + 1)); log "ok - $* ($((SECONDS - T0))s)"; }
fail() {
    log "FAIL: $*"
    if [[ -n ${KUBECONFIG:-} ]]; then
        kubectl get pods -A -o wide 2>&1 | sed 's/^/    /' >&2 || true
        kubectl -n "$NAMESPACE" get events --sort-by=.lastTimestamp 2>&1 | tail -n 15 | sed 's/^/    /' >&2 || true
        local f
        for f in "$E2E_POD_LOGS"/"$NAMESPACE"_*/driver/*.log; do
            [[ -f $f ]] || continue
            log "driver container log $f (tail):"
            tail -n 20 "$f" | cut -c1-400 | sed 's/^/    /' >&2
        done
    fi
    if [[ -f $GPU_DRA_CLUSTER_DIR/logs/kubelet.log ]]; then
        log "kubelet log (tail):"
        grep -v '^\s' "$GPU_DRA_CLUSTER_DIR/logs/kubelet.log" | tail -n 20 | cut -c1-400 | sed 's/^/    /' >&2
    fi
    echo "$passed passed, 1 failed"
    exit 1
}
cleanup() {
    "$E2E/cluster" down >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

wait_for() { # description, timeout seconds, command...
    local what=$1 timeout=$2
    shift 2
    local deadline=$((SECONDS + timeout))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || fail "timed out after ${timeout}s waiting for: $what"
        sleep 0.5
    done
}

# ---------------------------------------------------------------- 0. image, helm, cluster
BIN=${GPU_DRA_K8S_BIN:-$("$E2E/build-k8s.sh" | tail -n 1)}
export PATH="$BIN:$PATH"
GPU_DRA=${GPU_DRA:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/gpu-dra}
[[ -x $GPU_DRA ]] || cargo build --bin gpu-dra >&2
export GPU_DRA

# Two tags of the same build: the upgrade rolls the DaemonSet to the second.
chart_build_images
log "image $FIRST_REF: $((IMAGE_SIZE_BYTES / 1024)) KiB"

# Four GPUs: three H100s (one carved for an MPS MIG device) and a T4, for the plain, MPS,
# time-sliced and after-upgrade claims that live at once.
# NVIDIA's own nvidia-cdi-hook in the node's driver root, as the container toolkit installs it:
# containerd's runc runs it from the driver's CDI specs for every GPU container here (e2e/pods.sh
# runs without it: each library also bound at its links' paths).
export E2E_CDI_HOOK=${NVIDIA_CDI_HOOK:?NVIDIA_CDI_HOOK is not set: e2e/build-k8s.sh builds nvidia-cdi-hook (e2e/run-tests sets it)}
"$E2E/cluster" up --real-node --no-driver --service-network --gpus sim:3xH100-SXM5-80GB,1xT4 >/dev/null ||
    fail "the real node did not start"
eval "$("$E2E/cluster" env)"
LOGS=$GPU_DRA_CLUSTER_DIR/logs
chart_import_images
ok "images $FIRST_REF and $SECOND_REF imported into the node's containerd"

# ---------------------------------------------------------------- 1-2. helm install
chart_install "$FIRST_REF"
DRIVER_POD=$(driver_pods | jq -r '.items[0].metadata.name')
ready=$(driver_pods | jq -r '.items[0].status.conditions[] | select(.type == "Ready") | .status')
[[ $ready == True ]] || fail "driver pod $DRIVER_POD is not Ready"
image=$(driver_pods | jq -r '.items[0].spec.containers[0].image')
[[ $image == "$FIRST_REF" ]] || fail "driver pod runs $image, not $FIRST_REF"
ok "helm install: DaemonSet pod $DRIVER_POD Ready through its probes, image $image"

wait_for "the kubelet registered the plugin" 30 grep -q 'Registered DRA plugin.*gpu.nvidia.com' "$LOGS/kubelet.log"
slices() { kubectl get resourceslices -o json --field-selector "spec.nodeName=$E2E_NODE"; }
wait_for "slices of $E2E_NODE" 30 bash -c "[[ \$(kubectl get resourceslices --field-selector spec.nodeName=$E2E_NODE -o name | wc -l) -gt 0 ]]"
devices=$(slices | jq '[.items[].spec.devices[]?] | length')
((devices > 0)) || fail "no devices published"
kubectl get validatingadmissionpolicybinding "$RELEASE-resourceslices" >/dev/null 2>&1 ||
    fail "the chart's ResourceSlice admission policy is not in force"
# The container's only credentials are its projected ServiceAccount token.
token_user=$(kubectl -n "$NAMESPACE" get pod "$DRIVER_POD" -o json | jq -r '.spec.serviceAccountName')
[[ $token_user == "$RELEASE" ]] || fail "driver pod runs as ServiceAccount $token_user"
if driver_log "$DRIVER_POD" | grep -qiE 'forbidden|unauthorized|denied request'; then
    fail "the driver hit an authorization error: $(driver_log "$DRIVER_POD" | grep -iE 'forbidden|unauthorized|denied request' | head -n 2)"
fi
ok "registered with the real kubelet; $devices devices published with the chart's ServiceAccount (RBAC + admission policy), no authorization error"

# ---------------------------------------------------------------- 3. a user pod with a GPU
user_pod() { # NAME
    sed -e "s|\${E2E_IMAGE}|$E2E_IMAGE|g" -e "s|\${NAME}|$1|g" "$E2E/pods/gpu-pod.yaml" | kubectl apply -f - >&2
}
pod_running() { [[ $(kubectl get pod "$1" -o jsonpath='{.status.phase}') == Running ]]; }
ctr_out() { # pod: what its container printed, once it printed "ready"
    local uid f
    uid=$(kubectl get pod "$1" -o jsonpath='{.metadata.uid}')
    f=$E2E_POD_LOGS/default_$1_$uid/ctr/0.log
    wait_for "$1 printed ready" 60 grep -q ' ready$' "$f"
    cut -d' ' -f4- "$f"
}
claim_of() { kubectl get pod "$1" -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}'; }
check_gpu() { # pod: one /dev/nvidiaN and the allocated GPU's UUID in NVIDIA_VISIBLE_DEVICES
    local out claim dev uuid
    out=$(ctr_out "$1")
    claim=$(claim_of "$1")
    dev=$(kubectl get resourceclaim "$claim" -o jsonpath='{.status.allocation.devices.results[0].device}')
    [[ $dev =~ ^gpu-([0-9]+)$ ]] || fail "$1: claim $claim allocated '$dev'"
    grep -qx "dev=nvidia${BASH_REMATCH[1]}" <<<"$out" || fail "$1: no /dev/nvidia${BASH_REMATCH[1]} in the container"
    uuid=$(slices | jq -r --arg d "$dev" '.items[].spec.devices[]? | select(.name == $d) | .attributes.uuid.string')
    grep -qx "NVIDIA_VISIBLE_DEVICES=$uuid" <<<"$out" || fail "$1: NVIDIA_VISIBLE_DEVICES is not $uuid"
    echo "$claim"
}
user_pod before-upgrade
wait_for "pod before-upgrade Running" 90 pod_running before-upgrade
FIRST_CLAIM=$(check_gpu before-upgrade)
FIRST_UID=$(kubectl get resourceclaim "$FIRST_CLAIM" -o jsonpath='{.metadata.uid}')
[[ -f $GPU_DRA_CDI_ROOT/k8s.gpu.nvidia.com-claim_$FIRST_UID.json ]] || fail "no CDI spec for claim $FIRST_CLAIM"
# NVIDIA's hook ran in the container: the library links it made, and the container's ld cache
# (rebuilt by its own ldconfig) finds libcuda.so.1.
out=$(ctr_out before-upgrade)
spec=$GPU_DRA_CDI_ROOT/k8s.gpu.nvidia.com-claim_$FIRST_UID.json
jq -e --arg h "$E2E_DRIVER_ROOT/usr/bin/nvidia-cdi-hook" '[.containerEdits.hooks[] | select(.path == $h) | .args[1]] | index("create-symlinks") != null and index("update-ldcache") != null' "$spec" >/dev/null ||
    fail "the CDI spec does not run the driver root's nvidia-cdi-hook: $(jq -c '.containerEdits.hooks' "$spec")"
grep -qx "link=/usr/lib/x86_64-linux-gnu/libcuda.so.1->/usr/lib/x86_64-linux-gnu/libcuda.so.$E2E_DRIVER_VERSION" <<<"$out" ||
    fail "before-upgrade: libcuda.so.1 is not the hook's link: $(grep '^link=' <<<"$out")"
grep -qx "ldcache=libcuda.so.1" <<<"$out" || fail "before-upgrade: the container's ld cache has no libcuda.so.1"
ok "user pod runs with its GPU, prepared by the installed driver; NVIDIA's nvidia-cdi-hook (run by runc) made its library links and ld cache"

# ---------------------------------------------------------------- 3b. MPS clients that outlive driver restarts
# deploy/examples' MPS claims as users apply them: a carved 2g.20gb MIG device and a whole GPU,
# each with a pod whose client stays attached to the claim's MPS server (e2e/pods/mps-client.yaml).
# The daemons run chrooted into the driver root in cgroups of their own, outside the driver pod's:
# the driver pod deleted, its container's PID 1 killed and (below) `helm upgrade` must not stop
# them, and each client must never lose its server.
hw() { "$GPU_DRA" sim --gpus "$E2E_GPUS" --node-name "$E2E_NODE" --sim-state "$GPU_DRA_SIM_STATE" show; }
mps_client() { # NAME CLAIM
    sed -e "s|\${E2E_IMAGE}|$E2E_IMAGE|g" -e "s|\${NAME}|$1|g" -e "s|\${CLAIM}|$2|g" \
        "$E2E/pods/mps-client.yaml" | kubectl apply -f - >&2
}
client_log() { # pod: what its container printed
    local uid
    uid=$(kubectl get pod "$1" -o jsonpath='{.metadata.uid}')
    cut -d' ' -f4- "$E2E_POD_LOGS/default_$1_$uid/ctr/0.log" 2>/dev/null
}
client_beats() { client_log "$1" | grep -c '^alive ' || true; }
claim_uid() { kubectl get resourceclaim "$1" -o jsonpath='{.metadata.uid}'; }
daemon_of() { # claim: the PID of its MPS control daemon
    mps_daemons_of "$(mps_folder "$E2E_KUBELET_ROOT/plugins/gpu.nvidia.com" "$(claim_uid "$1")")"
}
DRIVER_POD_UID=$(kubectl -n "$NAMESPACE" get pod "$DRIVER_POD" -o jsonpath='{.metadata.uid}')
kubectl apply -f deploy/examples/mig-2g-mps.yaml >&2
mps_client mps-mig mig-2g-mps
wait_for "pod mps-mig Running" 90 pod_running mps-mig
kubectl apply -f deploy/examples/gpu-mps.yaml >&2
mps_client mps-gpu mps-gpu
wait_for "pod mps-gpu Running" 90 pod_running mps-gpu
declare -A SERVER DAEMON
for pod in mps-mig mps-gpu; do
    wait_for "$pod attached to its MPS server" 30 bash -c "grep -q ' attached server=' $E2E_POD_LOGS/default_${pod}_*/ctr/0.log"
    SERVER[$pod]=$(client_log "$pod" | sed -n 's/^attached server=//p' | head -n 1)
done
for claim in mig-2g-mps mps-gpu; do
    DAEMON[$claim]=$(daemon_of "$claim")
    [[ ${DAEMON[$claim]} =~ ^[0-9]+$ ]] || fail "claim $claim: want one MPS control daemon, have '${DAEMON[$claim]}'"
    # Its own cgroup in every hierarchy: not the driver pod's, so the runtime does not kill it.
    cgroups=$(cut -d: -f3 "/proc/${DAEMON[$claim]}/cgroup" | sort -u)
    if grep -v '^/gpu-dra-mps/' <<<"$cgroups" | grep -q .; then
        fail "claim $claim: its MPS daemon runs in $(tr '\n' ' ' <<<"$cgroups")"
    fi
    grep -q "$DRIVER_POD_UID" "/proc/${DAEMON[$claim]}/cgroup" && fail "claim $claim: its MPS daemon is in the driver pod's cgroup"
    # Chrooted into the driver root: it runs with the driver root's own loader and C library.
    [[ $(readlink "/proc/${DAEMON[$claim]}/root") == "$E2E_DRIVER_ROOT" ]] ||
        fail "claim $claim: its MPS daemon's root is $(readlink "/proc/${DAEMON[$claim]}/root"), not the driver root"
done
ok "MPS claims (carved 2g.20gb and whole GPU) prepared by the chart's driver; clients attached to servers ${SERVER[*]}; daemons ${DAEMON[*]} chrooted into the driver root, in cgroups of their own"
# This node's MPS cgroups (other tests on the machine may have their own under gpu-dra-mps).
MPS_CGROUPS=$(mps_cgroups "$E2E_KUBELET_ROOT/")
[[ -n $MPS_CGROUPS ]] || fail "no cgroup found for the MPS daemons"

clients_kept_their_servers() { # EVENT: each client still attached to the same server and hearing from it
    local pod claim beats
    for pod in mps-mig mps-gpu; do
        beats=$(client_beats "$pod")
        wait_for "$pod hears from its server after $1" 15 bash -c "(( \$(cut -d' ' -f4- $E2E_POD_LOGS/default_${pod}_*/ctr/0.log | grep -c '^alive ') > $beats ))"
        client_log "$pod" | grep -q 'lost its MPS server' && fail "$pod lost its MPS server at $1"
        [[ $(client_log "$pod" | grep -c '^attached server=') == 1 ]] || fail "$pod attached again after $1"
        [[ $(kubectl get pod "$pod" -o jsonpath='{.status.containerStatuses[0].restartCount}') == 0 ]] ||
            fail "$pod restarted at $1"
    done
    for claim in mig-2g-mps mps-gpu; do
        [[ $(daemon_of "$claim") == "${DAEMON[$claim]}" ]] || fail "claim $claim: MPS daemon ${DAEMON[$claim]} replaced by '$(daemon_of "$claim")' at $1"
    done
}

# (a) the driver pod deleted: the DaemonSet starts another.
driver_restart
clients_kept_their_servers "the driver pod's deletion"
ok "(a) driver pod deleted, $DRIVER_POD took over: both clients kept their servers (same daemons, no restart)"

# (b) the driver container's PID 1 killed (a crash, an OOM kill): the kubelet restarts it.
DRIVER_POD_UID=$(kubectl -n "$NAMESPACE" get pod "$DRIVER_POD" -o jsonpath='{.metadata.uid}')
driver_pid=
for pid in $(pgrep -x gpu-dra); do
    grep -q "$DRIVER_POD_UID" "/proc/$pid/cgroup" 2>/dev/null && driver_pid=$pid
done
[[ -n $driver_pid ]] || fail "no gpu-dra process in driver pod $DRIVER_POD's cgroup"
kill -KILL "$driver_pid"
wait_for "the driver container restarted" 60 bash -c "(( \$(kubectl -n $NAMESPACE get pod $DRIVER_POD -o jsonpath='{.status.containerStatuses[0].restartCount}') >= 1 ))"
wait_for "the restarted driver Ready" 90 driver_ready
clients_kept_their_servers "the driver container's kill -9"
ok "(b) the driver container's PID 1 ($driver_pid) killed and restarted: both clients kept their servers"

# (d) OOM-sized memory on the MPS side: the whole GPU's server holds 320 MiB for its client, more
# than the driver container's whole limit (256Mi). In the driver's cgroup that would end in an
# OOM kill there; in the daemon's own cgroup the driver does not notice.
memory_cgroup_usage() { # PID: bytes its memory cgroup uses (cgroup v1, else v2)
    local path
    path=$(awk -F: '$2 == "memory" { print $3 }' "/proc/$1/cgroup")
    if [[ -n $path && -f /sys/fs/cgroup/memory$path/memory.usage_in_bytes ]]; then
        cat "/sys/fs/cgroup/memory$path/memory.usage_in_bytes"
    else
        path=$(awk -F: '$1 == "0" { print $3 }' "/proc/$1/cgroup")
        cat "/sys/fs/cgroup$path/memory.current" 2>/dev/null || cat "/sys/fs/cgroup/unified$path/memory.current"
    fi
}
restarts_before=$(kubectl -n "$NAMESPACE" get pod "$DRIVER_POD" -o jsonpath='{.status.containerStatuses[0].restartCount}')
server=${SERVER[mps-gpu]}
echo 320 >"$(mps_folder "$E2E_KUBELET_ROOT/plugins/gpu.nvidia.com" "$(claim_uid mps-gpu)")/pipe/clients/mps-gpu.mem"
wait_for "MPS server $server holding 320 MiB" 30 bash -c "(( \$(awk '/^VmRSS:/ { print \$2 }' /proc/$server/status) > 320 * 1024 ))"
server_cgroup_bytes=$(memory_cgroup_usage "$server")
((server_cgroup_bytes > 320 * 1024 * 1024)) || fail "the MPS server's cgroup shows $server_cgroup_bytes bytes, not its 320 MiB"
for pid in $(pgrep -x gpu-dra); do
    grep -q "$DRIVER_POD_UID" "/proc/$pid/cgroup" 2>/dev/null && driver_pid=$pid
done
driver_cgroup_bytes=$(memory_cgroup_usage "$driver_pid")
((driver_cgroup_bytes < 256 * 1024 * 1024)) || fail "the driver container's cgroup uses $driver_cgroup_bytes bytes"
sleep 2
[[ $(kubectl -n "$NAMESPACE" get pod "$DRIVER_POD" -o jsonpath='{.status.containerStatuses[0].restartCount}') == "$restarts_before" ]] ||
    fail "the driver container restarted while the MPS server held 320 MiB"
clients_kept_their_servers "the MPS server's 320 MiB"
ok "(d) the MPS server holds 320 MiB (its cgroup: $((server_cgroup_bytes >> 20)) MiB) beyond the driver's 256Mi limit: the driver's cgroup has $((driver_cgroup_bytes >> 20)) MiB, no OOM kill, the clients kept their servers"

# ---------------------------------------------------------------- 3c. time-slicing through the driver root's nvidia-smi
kubectl apply -f deploy/examples/gpu-timesliced.yaml >&2
mps_pod_plain() { sed -e "s|\${E2E_IMAGE}|$E2E_IMAGE|g" -e "s|\${NAME}|$1|g" -e "s|\${CLAIM}|$2|g" "$E2E/pods/mps-pod.yaml" | kubectl apply -f - >&2; }
mps_pod_plain time-sliced time-sliced-gpu
wait_for "pod time-sliced Running" 90 pod_running time-sliced
ts_dev=$(kubectl get resourceclaim time-sliced-gpu -o jsonpath='{.status.allocation.devices.results[0].device}')
ts_minor=${ts_dev#gpu-}
[[ $(hw | jq --argjson m "$ts_minor" '.gpus[] | select(.minor == $m) | .timeslice') == 3 ]] ||
    fail "time-sliced-gpu on $ts_dev: the GPU's time-slice is not Long (3): $(hw | jq -c --argjson m "$ts_minor" '.gpus[] | select(.minor == $m)')"
kubectl delete pod time-sliced --grace-period=1 --timeout 60s >&2
kubectl delete resourceclaim time-sliced-gpu --timeout 60s >&2
wait_for "time-slice of $ts_dev back to the default" 60 bash -c "[[ \$('$GPU_DRA' sim --gpus '$E2E_GPUS' --node-name '$E2E_NODE' --sim-state '$GPU_DRA_SIM_STATE' show | jq --argjson m $ts_minor '.gpus[] | select(.minor == \$m) | .timeslice') == 0 ]]"
ok "time-sliced claim: the interval set and reset through the driver root's nvidia-smi (chrooted; it loads only with the driver root's C library)"

# ---------------------------------------------------------------- 4. helm upgrade
# Pods keep arriving while the DaemonSet rolls (a 1g.10gb MIG device each, carved at prepare):
# the kubelet must always have a driver to prepare them.
mig_pod() { sed -e "s|\${E2E_IMAGE}|$E2E_IMAGE|g" -e "s|\${NAME}|$1|g" "$E2E/pods/mig-pod.yaml" | kubectl apply -f - >&2; }
(for i in 1 2 3 4; do mig_pod "during-upgrade-$i"; sleep 2; done) &
ARRIVALS=$!
chart_upgrade "$SECOND_REF"
wait "$ARRIVALS" || fail "creating pods during the upgrade"
for i in 1 2 3 4; do
    wait_for "pod during-upgrade-$i Running" 90 pod_running "during-upgrade-$i"
done
kubectl -n "$NAMESPACE" rollout status "daemonset/$RELEASE" --timeout 120s >&2 || fail "the DaemonSet did not roll"
NEW_POD=$(driver_pods | jq -r --arg img "$SECOND_REF" '[.items[] | select(.spec.containers[0].image == $img and .metadata.deletionTimestamp == null)][0].metadata.name')
[[ -n $NEW_POD && $NEW_POD != null && $NEW_POD != "$DRIVER_POD" ]] || fail "no driver pod runs $SECOND_REF after the upgrade"
wait_for "the old driver pod $DRIVER_POD gone" 60 bash -c "! kubectl -n $NAMESPACE get pod $DRIVER_POD"
pod_running before-upgrade || fail "pod before-upgrade stopped running during the upgrade"
failed_prepares=$(grep -c 'NodePrepareResources.*failed\|PrepareDynamicResources failed\|FailedPrepareDynamicResources' "$LOGS/kubelet.log" || true)
((failed_prepares == 0)) || fail "$failed_prepares failed prepares in the kubelet log during the upgrade"
user_pod after-upgrade
wait_for "pod after-upgrade Running" 90 pod_running after-upgrade
SECOND_CLAIM=$(check_gpu after-upgrade)
SECOND_UID=$(kubectl get resourceclaim "$SECOND_CLAIM" -o jsonpath='{.metadata.uid}')
driver_log "$NEW_POD" | grep -q "prepared claim .*$SECOND_UID" || fail "the new driver pod did not prepare $SECOND_CLAIM"
kubectl delete pod before-upgrade during-upgrade-1 during-upgrade-2 during-upgrade-3 during-upgrade-4 --timeout 60s >&2 ||
    fail "deleting pods before-upgrade and during-upgrade-*"
wait_for "the first claim's CDI spec removed" 60 bash -c "[[ ! -e $GPU_DRA_CDI_ROOT/k8s.gpu.nvidia.com-claim_$FIRST_UID.json ]]"
driver_log "$NEW_POD" | grep -q "unprepared claim .*$FIRST_UID" || fail "the new driver pod did not unprepare $FIRST_CLAIM"
ok "helm upgrade rolled $DRIVER_POD -> $NEW_POD ($SECOND_REF) while 4 MIG pods arrived: all Running, no failed prepare, the running pod kept its GPU, the new driver prepares and unprepares"
clients_kept_their_servers "helm upgrade"
ok "(c) helm upgrade to $SECOND_REF: both MPS clients kept their servers"

# The new driver unprepares what the first one prepared: daemons stopped, nothing left behind.
mps_left_before=$(for claim in mig-2g-mps mps-gpu; do mps_folder "$E2E_KUBELET_ROOT/plugins/gpu.nvidia.com" "$(claim_uid "$claim")"; done)
kubectl delete pod mps-mig mps-gpu --grace-period=1 --timeout 60s >&2 || fail "deleting the MPS pods"
kubectl delete resourceclaim mig-2g-mps mps-gpu --timeout 60s >&2 || fail "deleting the MPS claims"
for dir in $mps_left_before; do
    wait_for "MPS folder $dir removed" 60 bash -c "[[ ! -e $dir ]]"
done
[[ -z $(mps_processes "$E2E_KUBELET_ROOT/") ]] || fail "MPS processes left: $(mps_processes "$E2E_KUBELET_ROOT/" | tr '\n' ' ')"
left_cgroups=$(for cg in $MPS_CGROUPS; do ls -d /sys/fs/cgroup/*"$cg" 2>/dev/null; done || true)
[[ -z $left_cgroups ]] || fail "MPS cgroups left: $left_cgroups"
grep -q " $E2E_KUBELET_ROOT/plugins/gpu.nvidia.com/mps/" /proc/self/mountinfo && fail "MPS shm mounts left"
[[ $(hw | jq '.mps_daemons // [] | length') == 0 ]] || fail "MPS daemons left in the simulated hardware: $(hw | jq -c '.mps_daemons')"
ok "the upgraded driver unprepared both MPS claims: daemons and servers stopped, no folder, cgroup or mount left"

# ---------------------------------------------------------------- 5. helm uninstall
"$HELM" uninstall "$RELEASE" --namespace "$NAMESPACE" --wait --timeout 120s >&2 || fail "helm uninstall"
wait_for "driver pods gone" 60 bash -c "[[ \$(kubectl -n $NAMESPACE get pods -o name | wc -l) == 0 ]]"
pod_running after-upgrade || fail "pod after-upgrade stopped running when the driver was uninstalled"
[[ -f $GPU_DRA_CDI_ROOT/k8s.gpu.nvidia.com-claim_$SECOND_UID.json ]] || fail "uninstall removed the running pod's CDI spec"
sockets=$(find "$E2E_KUBELET_ROOT/plugins_registry" "$E2E_KUBELET_ROOT/plugins/gpu.nvidia.com" -type s 2>/dev/null || true)
[[ -z $sockets ]] || fail "sockets left after uninstall: $sockets"
ok "helm uninstall: the running pod and its prepared GPU are left alone, no driver socket is left on the node"

report_mode "the driver image installed by the Helm chart (DaemonSet pod, hostPID, the node's driver root and kubelet folder)"
echo "$passed passed, 0 failed"
