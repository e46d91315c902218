#!/usr/bin/env bash
# Predictions equal reality for gangs: `gpu-dra match --replicas` against kube-scheduler v1.37.2
# with its gang scheduling on (GenericWorkload, DRAWorkloadResourceClaims; scheduling.k8s.io/v1beta1
# served), on two simulated nodes of 4 H100s, each a real `gpu-dra run` (host process; no kubelet:
# what is checked is which pods the scheduler binds, with which devices; not what the pods get,
# which e2e/pods.sh checks through the chart and the kubelet). Part 1 is the scheduler's own
# gangs (PodGroups, plain pods); part 2 (below) runs the workload controllers, JobSet, LWS and
# the MPI operator, on two more nodes. Kueue is e2e/kueue.sh's.
#
# Part 1, in order, each applied when the one before has settled (8 GPUs in all):
#   1. PodGroup shared (gang minCount 2) with a workload-level claim of 1 GPU its two pods share,
#      each pod with 1 GPU of its own -> both bind, on the shared GPU's node (3 GPUs there);
#   2. PodGroup gang-fits (gang minCount 2): two pods of 2 GPUs -> both bind, on the other node;
#   3. PodGroup gang-short (gang minCount 2): two pods of 1 GPU where 1 GPU is left -> none
#      binds, and the GPU stays free;
#   4. pods after-0..1 of 1 GPU each (no group) -> one binds, one stays Pending.
# The same objects, with the live ResourceSlices, go through `gpu-dra match --replicas`
# beforehand; per workload, the pods it places must be the pods the scheduler bound (their count;
# the node a pod of equal nodes goes to is the scheduler's choice). Prints `workloads: N applied,
# predictions equal reality for N` (8: 4 of each part; ~40 s with the controllers built).
#
# Usage: e2e/workloads.sh   Environment: GPU_DRA, GPU_DRA_K8S_BIN.
set -euo pipefail
NAME=workloads-e2e
E2E=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$E2E")
# shellcheck source-path=SCRIPTDIR source=versions.env
source "$E2E/versions.env"
WORK=$(mktemp -d "/tmp/gpu-dra-$NAME.XXXXXX")
passed=0
DRIVER_PIDS=()
log() { echo "$NAME: $*" >&2; }
fail() {
    log "FAIL: $*"
    local f
    for f in "$WORK"/driver-*.log; do
        [[ -f $f ]] && { log "$f (tail):"; tail -n 15 "$f" >&2; }
    done
    echo "$passed passed, 1 failed"
    exit 1
}
ok() { passed=$((passed + 1)); log "ok - $*"; }
cleanup() {
    local pid
    for pid in "${DRIVER_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${DRIVER_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    [[ -n ${GPU_DRA_CLUSTER_DIR:-} ]] && "$E2E/cluster" down >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# shellcheck source-path=SCRIPTDIR source=sim-driver.sh
source "$E2E/sim-driver.sh"
use_private_binaries

NODES=(wl-1 wl-2)
GPUS=sim:4xH100-SXM5-80GB
export GPU_DRA_CLUSTER_DIR=$WORK/cluster
export GPU_DRA_CLUSTER_FEATURE_GATES="$K8S_FEATURE_GATES,GenericWorkload=true,DRAWorkloadResourceClaims=true"
export GPU_DRA_CLUSTER_RUNTIME_CONFIG=scheduling.k8s.io/v1beta1=true
# wl-3 and wl-4 get their drivers in part 2 (the workload controllers); until then they offer nothing.
"$E2E/cluster" up --nodes "$(IFS=,; echo "${NODES[*]},wl-3,wl-4")" >/dev/null 2>"$WORK/cluster-up.log" \
    || { cat "$WORK/cluster-up.log" >&2; fail "the control plane did not start"; }
eval "$("$E2E/cluster" env)"
kubectl apply -f "$ROOT/deviceclasses/" >/dev/null
for node in "${NODES[@]}"; do
    start_sim_driver "$node" "$GPUS" "$WORK/$node" "$WORK/driver-$node.log" --mig off
    DRIVER_PIDS+=("$SIM_DRIVER_PID")
done
deadline=$((SECONDS + 60))
until [[ $(kubectl get resourceslices --no-headers 2>/dev/null | wc -l) -ge ${#NODES[@]} ]]; do
    ((SECONDS < deadline)) || fail "the drivers did not publish within 60s"
    sleep 0.2
done
kubectl get resourceslices -o yaml >"$WORK/slices.yaml"
ok "two nodes of 4 H100s published; kube-scheduler with GenericWorkload and DRAWorkloadResourceClaims"

# ------------------------------------------------------------------ the workloads
claim() { # name, GPUs
    printf 'apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: %s}\nspec:\n  devices:\n    requests:\n    - name: gpu\n      exactly: {deviceClassName: gpu.nvidia.com, count: %s}\n---\n' "$1" "$2"
}
pod() { # name, claim, [pod group]
    printf 'apiVersion: v1\nkind: Pod\nmetadata: {name: %s}\nspec:\n' "$1"
    [[ -z ${3:-} ]] || printf '  schedulingGroup: {podGroupName: %s}\n' "$3"
    printf '  containers:\n  - {name: c, image: registry.k8s.io/pause:3.10, resources: {claims: [{name: gpu}]}}\n  resourceClaims:\n  - {name: gpu, resourceClaimName: %s}\n---\n' "$2"
}
group() { # name, minCount, [shared claim]
    printf 'apiVersion: scheduling.k8s.io/v1beta1\nkind: PodGroup\nmetadata: {name: %s}\nspec:\n  schedulingPolicy:\n    gang: {minCount: %s}\n' "$1" "$2"
    [[ -z ${3:-} ]] || printf '  resourceClaims:\n  - {name: shared, resourceClaimName: %s}\n' "$3"
    printf -- '---\n'
}
# Two pods sharing the group's claim, each with one GPU of its own.
shared_group() {
    group shared 2 shared-gpu
    claim shared-gpu 1
    local i
    for ((i = 0; i < 2; i++)); do
        claim "shared-$i" 1
        printf 'apiVersion: v1\nkind: Pod\nmetadata: {name: shared-%s}\nspec:\n  schedulingGroup: {podGroupName: shared}\n' "$i"
        printf '  containers:\n  - {name: c, image: registry.k8s.io/pause:3.10, resources: {claims: [{name: gpu}, {name: shared}]}}\n'
        printf '  resourceClaims:\n  - {name: gpu, resourceClaimName: shared-%s}\n  - {name: shared, resourceClaimName: shared-gpu}\n---\n' "$i"
    done
}
gang() { # name, minCount, pods, GPUs each
    group "$1" "$2"
    local i
    for ((i = 0; i < $3; i++)); do
        claim "$1-$i" "$4"
        pod "$1-$i" "$1-$i" "$1"
    done
}
{
    shared_group
    gang gang-fits 2 2 2
    gang gang-short 2 2 1
    for i in 0 1; do
        claim "after-$i" 1
        pod "after-$i" "after-$i"
    done
} >"$WORK/workloads.yaml"

# The prediction, from the live slices and the same objects, before anything is applied.
set +e
"$GPU_DRA" match --slices "$WORK/slices.yaml" --classes "$ROOT/deviceclasses" -f "$WORK/workloads.yaml" \
    --replicas -o json >"$WORK/predicted.json" 2>"$WORK/predicted.txt"
set -e
predicted() { # pod -> 1 placed, 0 not
    jq -r --arg c "$1" '[.items[]? // . | select(.metadata.name == $c and .status.allocation != null)] | length' "$WORK/predicted.json"
}

# Reality: apply in order, each settled before the next.
settle() { # pods...; waits until each is bound or the scheduler has given up on it
    local p deadline=$((SECONDS + 90))
    for p in "$@"; do
        until [[ -n $(kubectl get pod "$p" -o jsonpath='{.spec.nodeName}') ]] \
            || [[ $(kubectl get pod "$p" -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].reason}') == Unschedulable ]]; do
            ((SECONDS < deadline)) || fail "pod $p neither bound nor unschedulable within 90s"
            sleep 0.3
        done
    done
}
apply_part() { # first object name prefix
    python3 - "$WORK/workloads.yaml" "$1" <<'EOF' | kubectl apply -f - >/dev/null
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
for d in docs:
    if d["metadata"]["name"].startswith(sys.argv[2]):
        print("---"); print(yaml.safe_dump(d))
EOF
}
applied=0 equal=0
check() { # workload, pods...
    local workload=$1 p bound=0 placed=0
    shift
    for p in "$@"; do
        [[ -z $(kubectl get pod "$p" -o jsonpath='{.spec.nodeName}') ]] || bound=$((bound + 1))
        placed=$((placed + $(predicted "$p")))
    done
    applied=$((applied + 1))
    if ((bound == placed)); then
        equal=$((equal + 1))
        ok "$workload: kube-scheduler bound $bound of $# pods; gpu-dra match placed $placed"
    else
        log "prediction (stderr of match):"
        cat "$WORK/predicted.txt" >&2
        fail "$workload: kube-scheduler bound $bound of $# pods, gpu-dra match placed $placed"
    fi
}
apply_part shared
settle shared-0 shared-1
check "PodGroup shared (minCount 2, a claim of the group)" shared-0 shared-1
[[ $(kubectl get pod shared-0 -o jsonpath='{.spec.nodeName}') == $(kubectl get pod shared-1 -o jsonpath='{.spec.nodeName}') ]] \
    || fail "the pods sharing the group's claim went to different nodes"
ok "PodGroup shared: both pods on the node of the group's claim ($(kubectl get resourceclaim shared-gpu -o jsonpath='{.status.reservedFor[*].resource}'))"
apply_part gang-fits
settle gang-fits-0 gang-fits-1
check "PodGroup gang-fits (minCount 2)" gang-fits-0 gang-fits-1
apply_part gang-short
settle gang-short-0 gang-short-1
sleep 5 # a gang that waits at Permit would hold devices a while: it must not
check "PodGroup gang-short (minCount 2)" gang-short-0 gang-short-1
# Live: what stops the gang, read from the cluster: its first pod would take the one GPU left,
# its second finds none (before the plain pods take that GPU).
set +e
"$GPU_DRA" explain podgroup/gang-short --kubeconfig "$KUBECONFIG" >"$WORK/explain-gang.txt" 2>&1
rc=$?
set -e
((rc == 3)) && grep -q '^PodGroup default/gang-short: 0 of 2 pods bound; pending: gang-short-0, gang-short-1' "$WORK/explain-gang.txt" \
    && grep -A3 '^Pod default/gang-short-1' "$WORK/explain-gang.txt" | grep -q 'cannot be allocated' \
    || fail "explain podgroup/gang-short (exit $rc) did not name gang-short-1 as the pod that cannot fit: $(cat "$WORK/explain-gang.txt")"
ok "explain podgroup/gang-short (live): 0 of 2 bound; gang-short-0 would take the GPU left, gang-short-1 cannot be allocated"
apply_part after
settle after-0 after-1
check "pods after-0..1" after-0 after-1
grep -q 'PodGroup default/gang-short: none of its 2 pods binds' "$WORK/predicted.txt" \
    || fail "match did not say the short gang binds nothing: $(cat "$WORK/predicted.txt")"
# ------------------------------------------------------------------ part 2: the workload controllers
# JobSet, LeaderWorkerSet and the MPI operator (e2e/build-controllers.sh: the versions Kueue
# KUEUE_VERSION integrates with) as host processes, their webhooks registered with the API
# server (on loopback, a self-signed certificate) as their kustomize configs declare them, and
# kube-controller-manager's job, statefulset and resourceclaim controllers. Two more nodes:
# wl-3 (4 H100, whole GPUs) and wl-4 (2 H200 offered as dynamic MIG). wl-1 and wl-2 are full
# (checked), so the prediction reads wl-3 and wl-4's slices.
#
# Users' manifests in their projects' published form (e2e/workloads/, applied unchanged), each
# once the one before settled:
#   a. JobSet train     2 replicated Jobs of 1 pod, 1 H100 each (a CEL selector) -> 2 of 2;
#   b. MPIJob mpi       kubeflow.org/v2beta1: a launcher without devices and 1 worker of
#                       1 H100 -> 2 of 2 (the launcher is a pod of the job too);
#   c. LWS serve        2 groups of size 2 (leader + 1 worker), a 1g.18gb MIG device each
#                       -> 4 of 4, carved from wl-4's dynamic placements;
#   d. JobSet overflow  1 Job of 2 pods, 1 H100 each, where 1 is left -> 1 of 2 (no gang).
# Per workload: the pods its controller made = the pods `gpu-dra match` expands it to, and the
# pods kube-scheduler bound = the pods match placed.
CTL_NODES=(wl-3 wl-4)
declare -A CTL_GPUS=([wl-3]=sim:4xH100-SXM5-80GB [wl-4]=sim:2xH200-SXM5-141GB) CTL_MIG=([wl-3]=off [wl-4]=dynamic)
full=$(kubectl get resourceclaims -o json \
    | jq '[.items[].status.allocation.devices.results[]? | select(.pool == "wl-1" or .pool == "wl-2")] | length')
[[ $full == 8 ]] || fail "wl-1 and wl-2 should hold 8 allocated GPUs after part 1, not $full"
# Part 1's pods that did not bind would take part 2's GPUs once they appear: removed (unbound,
# so deleted at once without a kubelet). Their PodGroup stays: without pods it holds nothing.
mapfile -t unbound < <(kubectl get pods -o json | jq -r '.items[] | select(.spec.nodeName == null) | .metadata.name')
((${#unbound[@]} == 0)) || kubectl delete pod "${unbound[@]}" --wait >/dev/null

CBIN=$("$E2E/build-controllers.sh" | tail -n 1) || fail "building the workload controllers failed"
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
for node in "${CTL_NODES[@]}"; do
    start_sim_driver "$node" "${CTL_GPUS[$node]}" "$WORK/$node" "$WORK/driver-$node.log" --mig "${CTL_MIG[$node]}"
    DRIVER_PIDS+=("$SIM_DRIVER_PID")
done
kube-controller-manager --kubeconfig "$KUBECONFIG" \
    --controllers job-controller,statefulset-controller,resourceclaim-controller \
    --secure-port 0 --leader-elect=false --use-service-account-credentials=false \
    --feature-gates "$GPU_DRA_CLUSTER_FEATURE_GATES" --profiling=false --v=1 >"$WORK/kcm.log" 2>&1 &
DRIVER_PIDS+=("$!")
kubectl apply --server-side -f "$CBIN/jobset-config/crd/bases/" -f "$CBIN/lws-config/crd/bases/" \
    -f "$CBIN/mpi-operator-crds/" >/dev/null
kubectl wait --for condition=established --timeout 60s crd/jobsets.jobset.x-k8s.io \
    crd/leaderworkersets.leaderworkerset.x-k8s.io crd/mpijobs.kubeflow.org >/dev/null

# One self-signed pair serves both webhook servers; the API server trusts it per webhook.
mkdir -p "$WORK/certs"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj /CN=webhooks \
    -addext subjectAltName=IP:127.0.0.1 -keyout "$WORK/certs/tls.key" -out "$WORK/certs/tls.crt" 2>/dev/null
start_controller() { # name, config API group; its webhooks from CBIN/<name>-config/webhook
    local name=$1 group=$2 port health
    port=$(free_port) health=$(free_port)
    cat >"$WORK/$name-config.yaml" <<EOF
apiVersion: $group/v1alpha1
kind: Configuration
leaderElection: {leaderElect: false}
internalCertManagement: {enable: false}
webhook: {host: 127.0.0.1, port: $port, certDir: $WORK/certs}
metrics: {bindAddress: "0"}
health: {healthProbeBindAddress: "127.0.0.1:$health"}
EOF
    "$CBIN/$name" --config "$WORK/$name-config.yaml" --zap-log-level=info >"$WORK/$name.log" 2>&1 &
    DRIVER_PIDS+=("$!")
    local pid=$! deadline=$((SECONDS + 60))
    until curl -fsS "http://127.0.0.1:$health/readyz" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || { tail -n 20 "$WORK/$name.log" >&2; fail "$name was not ready within 60s"; }
        kill -0 "$pid" 2>/dev/null || { tail -n 20 "$WORK/$name.log" >&2; fail "$name exited"; }
        sleep 0.3
    done
    # Its webhook configurations as kustomize renders them, pointed at the loopback server.
    kubectl kustomize "$CBIN/$name-config/webhook" | python3 -c '
import base64, sys, yaml
name, port, cert = sys.argv[1:]
ca = base64.b64encode(open(cert, "rb").read()).decode()
for d in yaml.safe_load_all(sys.stdin):
    if not d or not d["kind"].endswith("WebhookConfiguration"):
        continue
    d["metadata"] = {"name": name + "-" + d["metadata"]["name"]}
    for w in d["webhooks"]:
        w["clientConfig"] = {"url": "https://127.0.0.1:%s%s" % (port, w["clientConfig"]["service"]["path"]), "caBundle": ca}
    print("---")
    print(yaml.safe_dump(d))
' "$name" "$port" "$WORK/certs/tls.crt" | kubectl apply -f - >/dev/null
}
start_controller jobset config.jobset.x-k8s.io
start_controller lws config.lws.x-k8s.io
kubectl create namespace mpi-operator >/dev/null # its leader-election lock
"$CBIN/mpi-operator" --kubeConfig "$KUBECONFIG" --lock-namespace mpi-operator >"$WORK/mpi-operator.log" 2>&1 &
DRIVER_PIDS+=("$!")
deadline=$((SECONDS + 60))
until grep -q 'Started workers' "$WORK/mpi-operator.log" \
    && [[ $(kubectl get resourceslices --field-selector spec.nodeName=wl-3 --no-headers 2>/dev/null | wc -l) -ge 1 ]] \
    && [[ $(kubectl get resourceslices --field-selector spec.nodeName=wl-4 --no-headers 2>/dev/null | wc -l) -ge 1 ]] \
    && grep -q 'Caches are synced' "$WORK/kcm.log"; do
    ((SECONDS < deadline)) || fail "the MPI operator, kube-controller-manager or wl-3/wl-4's drivers did not start within 60s"
    sleep 0.3
done
{
    kubectl get resourceslices --field-selector spec.nodeName=wl-3 -o yaml
    echo ---
    kubectl get resourceslices --field-selector spec.nodeName=wl-4 -o yaml
} >"$WORK/ctl-slices.yaml"
ok "JobSet $JOBSET_VERSION, LWS $LWS_VERSION (webhooks registered), MPI operator $MPI_OPERATOR_VERSION ready; wl-3 (4 H100) and wl-4 (2 H200, dynamic MIG) published"

set +e
"$GPU_DRA" match --slices "$WORK/ctl-slices.yaml" --classes "$ROOT/deviceclasses" -f "$E2E/workloads" \
    --replicas -o json >"$WORK/ctl-predicted.json" 2>"$WORK/ctl-predicted.txt"
set -e
predicted_counts() { # kind, name -> "placed total", from match's note on the workload
    sed -n -E "s|^note: $1 default/$2: all ([0-9]+) pods placed.*|\1 \1|p; s|^note: $1 default/$2: ([0-9]+) of ([0-9]+) pods placed.*|\1 \2|p" \
        "$WORK/ctl-predicted.txt"
}
pods_of() { # workload name -> its pods (made by its controller: named <name>-...)
    kubectl get pods -o json | jq -r --arg w "$1" '.items[] | select(.metadata.name | startswith($w + "-")) | .metadata.name'
}
check_controller() { # kind, name, manifest (in e2e/workloads)
    local kind=$1 name=$2 counts placed total pods=() p deadline=$((SECONDS + 90)) bound=0 made named
    counts=$(predicted_counts "$kind" "$name")
    [[ -n $counts ]] || { cat "$WORK/ctl-predicted.txt" >&2; fail "gpu-dra match said nothing of $kind $name"; }
    read -r placed total <<<"$counts"
    kubectl apply -f "$E2E/workloads/$3" >/dev/null
    # Its controller makes the pods (for LWS, the workers once their leader exists).
    until mapfile -t pods < <(pods_of "$name") && ((${#pods[@]} >= total)); do
        ((SECONDS < deadline)) || fail "$kind $name: its controller made ${#pods[@]} pods within 90s, gpu-dra match expanded it to $total: ${pods[*]}"
        sleep 0.3
    done
    settle "${pods[@]}"
    sleep 2 # a pod made late would show here
    mapfile -t pods < <(pods_of "$name")
    ((${#pods[@]} == total)) || fail "$kind $name: its controller made ${#pods[@]} pods (${pods[*]}), gpu-dra match expanded it to $total"
    for p in "${pods[@]}"; do
        [[ -z $(kubectl get pod "$p" -o jsonpath='{.spec.nodeName}') ]] || bound=$((bound + 1))
    done
    # The pods with claims carry the names match gave them (a random suffix as "-*").
    made=$(kubectl get pods -o json | jq -r --arg w "$name" '.items[] | select((.metadata.name | startswith($w + "-")) and (.spec.resourceClaims | length) > 0) | .metadata.name' \
        | sed -E 's/-[a-z0-9]{5}$/-*/' | sort | paste -sd' ')
    # (match's output holds the claims it allocated; its notes name each pod it could not place)
    named=$({
        jq -r '.items[]? | .metadata.ownerReferences[0].name' "$WORK/ctl-predicted.json"
        sed -n -E 's|^Pod default/([^ ]+) \(.*|\1|p' "$WORK/ctl-predicted.txt"
    } | grep "^$name-" | sed -E 's/-[a-z0-9]{5}$/-*/' | sort -u | paste -sd' ')
    [[ $made == "$named" ]] || fail "$kind $name: its controller named the pods with claims $made, gpu-dra match $named"
    applied=$((applied + 1))
    if ((bound == placed)); then
        equal=$((equal + 1))
        ok "$kind $name: its controller made $total pods ($made with claims, named as match named them), kube-scheduler bound $bound; gpu-dra match placed $placed of $total"
    else
        log "prediction (stderr of match):"
        cat "$WORK/ctl-predicted.txt" >&2
        fail "$kind $name: kube-scheduler bound $bound of $total pods, gpu-dra match placed $placed"
    fi
}
kubectl apply -f "$E2E/workloads/0-claim-templates.yaml" >/dev/null
check_controller JobSet train 1-jobset-train.yaml
check_controller MPIJob mpi 2-mpijob.yaml
check_controller LeaderWorkerSet serve 3-leaderworkerset-serve.yaml
check_controller JobSet overflow 4-jobset-overflow.yaml
set +e
"$GPU_DRA" explain jobset/overflow --kubeconfig "$KUBECONFIG" >"$WORK/explain-overflow.txt" 2>&1
rc=$?
set -e
((rc == 1)) && grep -q '^JobSet default/overflow: 1 of 2 pods bound' "$WORK/explain-overflow.txt" \
    && grep -q '^Pod default/overflow-workers-0-[01]-[a-z0-9]*: cannot be allocated on any of the 4 nodes' "$WORK/explain-overflow.txt" \
    || fail "explain jobset/overflow (exit $rc) did not name its pending pod as one that cannot fit: $(cat "$WORK/explain-overflow.txt")"
ok "explain jobset/overflow (live): 1 of 2 bound; the pending pod cannot be allocated on any node"
mig=$(kubectl get resourceclaims -o json | jq -r '[.items[] | select(.metadata.name | startswith("serve-")) | .status.allocation.devices.results[]? | select(.pool == "wl-4") | .device] | length')
[[ $mig == 4 ]] || fail "LWS serve: 4 MIG devices on wl-4 expected, the claims hold $mig"
line="workloads: $applied applied, predictions equal reality for $equal"
log "$line"
[[ -z ${GPU_DRA_TEST_REPORT:-} ]] || echo "$line" >>"$GPU_DRA_TEST_REPORT"
echo "$passed passed, 0 failed"
