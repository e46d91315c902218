#!/usr/bin/env bash
# Predictions equal Kueue: `gpu-dra match -f ... --replicas` against Kueue's own manager
# (sigs.k8s.io/kueue KUEUE_VERSION, e2e/build-controllers.sh), which admits queued Jobs by quota on
# gpu-dra's devices (feature gate DynamicResourceAllocation, `resources.deviceClassMappings`:
# gpu.nvidia.com counted as nvidia.com/gpu), beside kube-controller-manager's Job, ResourceClaim
# and garbage-collector controllers and kube-scheduler v1.37.2, over three simulated gpu-dra
# nodes (4 H100s, 2 A100 80GB, 2 A100 40GB: 8 GPUs), each a real `gpu-dra run`.
#
# What it proves less than it seems: the nodes are host processes and no kubelet runs, so a pod
# is "bound" when kube-scheduler set its nodeName (its claims allocated); nothing starts, and
# what containers get is e2e/pods.sh's. Kueue runs as a host process, not through its chart: its
# webhooks are served (on loopback, a self-signed certificate) but not registered with the API
# server, so the Jobs here are created as users' Kueue manifests write them (`suspend: true`,
# the queue-name label), and the ClusterQueue's finalizer and the webhooks' validation are
# skipped. Its metrics certificate, at the fixed path /etc/kueue/metrics/certs, is put there in
# a mount namespace of its own (an overlay on /etc that only Kueue sees).
#
# In order, each applied when Kueue has decided on the one before (ClusterQueue team: 6 GPUs):
#   1. q-pairs    2 pods of 2 GPUs: 4 of 6 -> admitted, both pods bound;
#   2. q-three    3 pods of 1 GPU: 3, 2 left -> held (nvidia.com/gpu, 1 more needed), no pod;
#   3. q-singles  2 pods of 1 GPU: 2 of the 2 left -> admitted (BestEffortFIFO: the held Job
#                 does not block it), both bound;
#   4. q-selector a claim template with a CEL selector -> inadmissible (Kueue refuses selectors);
#   5. q-mig      a claim of mig.nvidia.com, a class no mapping names -> inadmissible;
#   6. q-named    a pod naming a ResourceClaim (not a template) -> inadmissible;
#   7. q-cpu      1 GPU and a cpu request the ClusterQueue does not cover -> held (cpu).
# Then the Jobs are deleted, their pods and claims gone, and the gang (ClusterQueue gang: 8 GPUs,
# the whole fleet):
#   8. q-gang9    9 pods of 1 GPU: held whole (needs 9 of 8): none of its pods is even made;
#   9. q-gang8    8 pods of 1 GPU: admitted all at once, all 8 bound (time from create to the
#                 8th bound printed).
# Then the same 6 GPUs under a ClusterQueue with `queueingStrategy: StrictFIFO`:
#  10. s-pairs    2 pods of 2 GPUs -> admitted; 11. s-three 3 pods of 1 GPU -> held by quota;
#  12. s-singles  2 pods of 1 GPU, which would fit the 2 GPUs left -> held behind s-three (Kueue
#                 does not try it: after 5 s it is still suspended, not admitted, no pod).
# The same objects (the Configuration file Kueue runs with, ResourceFlavor, ClusterQueue,
# LocalQueue, templates, Jobs) with the live ResourceSlices go through `gpu-dra match --replicas`;
# per Job: admitted or held as Kueue decided, for the same reason (the resource and how much is
# missing; the refused feature), and as many pods placed as kube-scheduler bound (which node a
# pod goes to is the scheduler's choice, not compared). Prints `kueue: N workloads, predictions
# equal Kueue for N` (~45 s with Kueue built).
#
# Then Jobs pending together (the ClusterQueue held while they are made): Kueue takes them by
# priority (a WorkloadPriorityClass), then creation time; match, given the Jobs as the API
# server returns them, in the reverse order, predicts the same:
#  13. p-urgent  2 pods, priority 1000, made last -> admitted first;
#  14. p-plain   2 pods, made first -> admitted (4 GPUs of quota);
#  15. p-late    2 pods, made second -> held by quota.
#
# Usage: e2e/kueue.sh   Environment: GPU_DRA, GPU_DRA_K8S_BIN.
set -euo pipefail
NAME=kueue-e2e
E2E=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$E2E")
# shellcheck source-path=SCRIPTDIR source=versions.env
source "$E2E/versions.env"
WORK=$(mktemp -d "/tmp/gpu-dra-$NAME.XXXXXX")
passed=0
PIDS=()
log() { echo "$NAME: $*" >&2; }
fail() {
    log "FAIL: $*"
    local f
    for f in "$WORK"/kueue.log "$WORK"/kcm.log "$WORK"/driver-*.log; do
        [[ -f $f ]] && { log "$f (tail):"; tail -n 15 "$f" >&2; }
    done
    echo "$passed passed, 1 failed"
    exit 1
}
ok() { passed=$((passed + 1)); log "ok - $*"; }
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    if [[ -n ${GPU_DRA_CLUSTER_DIR:-} ]]; then "$E2E/cluster" down >/dev/null 2>&1 || true; fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# shellcheck source-path=SCRIPTDIR source=sim-driver.sh
source "$E2E/sim-driver.sh"
use_private_binaries
KBIN=$("$E2E/build-controllers.sh" | tail -n 1) || fail "building Kueue failed"
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
now() { date +%s.%N; }

# ------------------------------------------------------------------ cluster, drivers, controllers
NODES=(kq-1 kq-2 kq-3)
declare -A GPUS=([kq-1]=sim:4xH100-SXM5-80GB [kq-2]=sim:2xA100-SXM4-80GB [kq-3]=sim:2xA100-SXM4-40GB)
export GPU_DRA_CLUSTER_DIR=$WORK/cluster
"$E2E/cluster" up --nodes "$(IFS=,; echo "${NODES[*]}")" >/dev/null 2>"$WORK/cluster-up.log" \
    || { cat "$WORK/cluster-up.log" >&2; fail "the control plane did not start"; }
eval "$("$E2E/cluster" env)"
kubectl apply -f "$ROOT/deviceclasses/" >/dev/null
for node in "${NODES[@]}"; do
    start_sim_driver "$node" "${GPUS[$node]}" "$WORK/$node" "$WORK/driver-$node.log" --mig off
    PIDS+=("$SIM_DRIVER_PID")
done
# The controllers a Job needs without a kubelet: its pods made (job), their claims made from the
# templates (resourceclaim), and what a deleted Job owned removed (garbage-collector).
kube-controller-manager --kubeconfig "$KUBECONFIG" \
    --controllers job-controller,resourceclaim-controller,garbage-collector-controller \
    --secure-port 0 --leader-elect=false --use-service-account-credentials=false \
    --feature-gates "$K8S_FEATURE_GATES" --profiling=false --v=1 >"$WORK/kcm.log" 2>&1 &
PIDS+=("$!")
kubectl apply --server-side -f "$KBIN/kueue-crds/" >/dev/null
kubectl wait --for condition=established --timeout 60s crd/clusterqueues.kueue.x-k8s.io \
    crd/localqueues.kueue.x-k8s.io crd/resourceflavors.kueue.x-k8s.io crd/workloads.kueue.x-k8s.io >/dev/null
kubectl create namespace kueue-system >/dev/null

# Kueue's Configuration: the same file goes to `gpu-dra match` below.
HEALTH_PORT=$(free_port)
cat >"$WORK/kueue-config.yaml" <<EOF
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
featureGates: {DynamicResourceAllocation: true, VisibilityOnDemand: false}
resources:
  deviceClassMappings:
  - name: nvidia.com/gpu
    deviceClassNames: [gpu.nvidia.com]
integrations:
  frameworks: [batch/job]
leaderElection: {leaderElect: false}
internalCertManagement: {enable: false}
webhook: {host: 127.0.0.1, port: $(free_port), certDir: $WORK/kueue-certs}
metrics: {bindAddress: "0"}
health: {healthProbeBindAddress: "127.0.0.1:$HEALTH_PORT"}
EOF
# Without internal certificate management Kueue serves its webhooks from certDir and reads a
# metrics certificate from /etc/kueue/metrics/certs (fixed): one self-signed pair for both.
mkdir -p "$WORK/kueue-certs" "$WORK/etc/upper/kueue/metrics/certs" "$WORK/etc/work"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj /CN=kueue \
    -addext subjectAltName=IP:127.0.0.1 -keyout "$WORK/kueue-certs/tls.key" -out "$WORK/kueue-certs/tls.crt" 2>/dev/null
cp "$WORK/kueue-certs/tls.key" "$WORK/kueue-certs/tls.crt" "$WORK/etc/upper/kueue/metrics/certs/"
deadline=$((SECONDS + 60))
until [[ $(kubectl get resourceslices --no-headers 2>/dev/null | wc -l) -ge ${#NODES[@]} ]] \
    && grep -q 'Caches are synced' "$WORK/kcm.log"; do
    ((SECONDS < deadline)) || fail "the drivers did not publish or kube-controller-manager did not sync within 60s"
    sleep 0.2
done
kubectl get resourceslices -o yaml >"$WORK/slices.yaml"
# shellcheck disable=SC2016 # expanded by the inner sh
unshare -m --propagation private sh -c \
    'mount -t overlay overlay -o "lowerdir=/etc,upperdir=$0/upper,workdir=$0/work" /etc && exec "$@"' \
    "$WORK/etc" "$KBIN/kueue" --config "$WORK/kueue-config.yaml" >"$WORK/kueue.log" 2>&1 &
PIDS+=("$!")
KUEUE_PID=$!
deadline=$((SECONDS + 60))
until curl -fsS "http://127.0.0.1:$HEALTH_PORT/readyz" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || fail "Kueue was not ready within 60s"
    kill -0 "$KUEUE_PID" 2>/dev/null || fail "Kueue exited"
    sleep 0.3
done
grep -q 'DRA mapper initialized from configuration' "$WORK/kueue.log" \
    || fail "Kueue did not take the deviceClassMappings (DynamicResourceAllocation)"
ok "8 GPUs on 3 nodes published; Kueue $KUEUE_VERSION ready with gpu.nvidia.com mapped to nvidia.com/gpu"

# ------------------------------------------------------------------ the objects
queue() { # ClusterQueue (and its LocalQueue) name, GPUs
    printf 'apiVersion: kueue.x-k8s.io/v1beta2\nkind: ClusterQueue\nmetadata: {name: %s}\nspec:\n  namespaceSelector: {}\n' "$1"
    printf '  resourceGroups:\n  - coveredResources: [nvidia.com/gpu]\n    flavors:\n    - name: default\n      resources:\n      - {name: nvidia.com/gpu, nominalQuota: %s}\n---\n' "$2"
    printf 'apiVersion: kueue.x-k8s.io/v1beta2\nkind: LocalQueue\nmetadata: {name: %s, namespace: default}\nspec: {clusterQueue: %s}\n---\n' "$1" "$1"
}
template() { # name, class, count, [CEL selector]
    printf 'apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata: {name: %s}\nspec:\n  spec:\n    devices:\n      requests:\n      - name: gpu\n        exactly:\n          deviceClassName: %s\n          count: %s\n' "$1" "$2" "$3"
    [[ -z ${4:-} ]] || printf '          selectors:\n          - cel: {expression: %s}\n' "'$4'"
    printf -- '---\n'
}
job() { # name, LocalQueue, pods, claim template (claim:NAME: a ResourceClaim), [CPU request]
    printf 'apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: %s\n  labels: {kueue.x-k8s.io/queue-name: %s}\n' "$1" "$2"
    printf 'spec:\n  parallelism: %s\n  completions: %s\n  completionMode: Indexed\n  suspend: true\n' "$3" "$3"
    printf '  template:\n    spec:\n      restartPolicy: Never\n      containers:\n      - name: c\n        image: registry.k8s.io/pause:3.10\n'
    local requests=
    [[ -z ${5:-} ]] || requests="requests: {cpu: \"$5\"}, "
    printf '        resources: {%sclaims: [{name: gpu}]}\n' "$requests"
    if [[ $4 == claim:* ]]; then
        printf '      resourceClaims:\n      - {name: gpu, resourceClaimName: %s}\n---\n' "${4#claim:}"
    else
        printf '      resourceClaims:\n      - {name: gpu, resourceClaimTemplateName: %s}\n---\n' "$4"
    fi
}
printf 'apiVersion: kueue.x-k8s.io/v1beta2\nkind: ResourceFlavor\nmetadata: {name: default}\n---\n' >"$WORK/flavor.yaml"
{
    queue team 6
    template one-gpu gpu.nvidia.com 1
    template two-gpus gpu.nvidia.com 2
    template any-gpu gpu.nvidia.com 1 'device.driver == "gpu.nvidia.com"'
    template one-mig mig.nvidia.com 1
} >"$WORK/team.yaml"
{
    queue gang 8
} >"$WORK/gang.yaml"
# The same 6 GPUs under StrictFIFO: a Job held by quota holds every later one of its queue.
queue strict 6 | sed 's/^  namespaceSelector: {}$/&\n  queueingStrategy: StrictFIFO/' >"$WORK/strict.yaml"
job q-pairs team 2 two-gpus >"$WORK/q-pairs.yaml"
job q-three team 3 one-gpu >"$WORK/q-three.yaml"
job q-singles team 2 one-gpu >"$WORK/q-singles.yaml"
job q-selector team 1 any-gpu >"$WORK/q-selector.yaml"
job q-mig team 1 one-mig >"$WORK/q-mig.yaml"
job q-named team 1 claim:shared-gpu >"$WORK/q-named.yaml"
job q-cpu team 1 one-gpu 1 >"$WORK/q-cpu.yaml"
job q-gang9 gang 9 one-gpu >"$WORK/q-gang9.yaml"
job q-gang8 gang 8 one-gpu >"$WORK/q-gang8.yaml"
job s-pairs strict 2 two-gpus >"$WORK/s-pairs.yaml"
job s-three strict 3 one-gpu >"$WORK/s-three.yaml"
job s-singles strict 2 one-gpu >"$WORK/s-singles.yaml"
PHASE1=(q-pairs q-three q-singles q-selector q-mig q-named q-cpu)
PHASE2=(q-gang9 q-gang8)
PHASE3=(s-pairs s-three s-singles)
# What each held Job's reason must name, in Kueue's words and in match's.
declare -A REASON=([q-three]='nvidia.com/gpu' [q-selector]='CEL selectors' [q-mig]='mig.nvidia.com'
    [q-named]='DynamicResourceAllocation' [q-cpu]='cpu' [q-gang9]='nvidia.com/gpu' [s-three]='nvidia.com/gpu')

# The prediction, from the live slices, the Configuration Kueue runs with and the same objects.
predict() { # phase, queue file, Jobs...
    local phase=$1 files=(-f "$WORK/kueue-config.yaml" -f "$WORK/flavor.yaml") f
    shift
    for f in "$@"; do [[ $f == */* ]] && files+=(-f "$f") || files+=(-f "$WORK/$f.yaml"); done
    set +e
    "$GPU_DRA" match --slices "$WORK/slices.yaml" --classes "$ROOT/deviceclasses" "${files[@]}" \
        --replicas -o json >"$WORK/predicted-$phase.json" 2>"$WORK/predicted-$phase.txt"
    local rc=$?
    set -e
    ((rc == 0 || rc == 3)) || { cat "$WORK/predicted-$phase.txt" >&2; fail "gpu-dra match exited $rc"; }
}
predicted_held() { # phase, job -> why, empty when admitted
    sed -n "s|^note: Job default/$2: Kueue would not admit it (\(.*\)): it stays suspended.*|\1|p" "$WORK/predicted-$1.txt"
}
predicted_placed() { # phase, job -> pods placed
    jq -r --arg j "$2" '[.items[]? // . | select(.status.allocation != null) | .metadata.ownerReferences[]?
        | select(.kind == "Pod" and (.name | test("^" + $j + "-[a-z0-9]+$"))) | .name] | unique | length' "$WORK/predicted-$1.json"
}

# ------------------------------------------------------------------ Kueue's decisions
workload_of() { # job -> the Workload's JSON
    kubectl get workloads -o json | jq -c --arg j "$1" 'first(.items[] | select(any(.metadata.ownerReferences[]?; .kind == "Job" and .name == $j))) // empty'
}
condition() { # workload JSON, type, field
    jq -r --arg t "$2" --arg f "$3" 'first(.status.conditions[]? | select(.type == $t) | .[$f]) // empty' <<<"$1"
}
decided() { # job: waits until Kueue admitted it or said why not; sets WL
    local deadline=$((SECONDS + 60))
    while :; do
        WL=$(workload_of "$1")
        if [[ -n $WL ]]; then
            [[ $(condition "$WL" Admitted status) == True ]] && return
            [[ $(condition "$WL" QuotaReserved status) == False && -n $(condition "$WL" QuotaReserved message) ]] && return
        fi
        ((SECONDS < deadline)) || fail "Kueue did not decide on Job $1 within 60s: ${WL:-no Workload}"
        sleep 0.2
    done
}
bound_pods() { # job -> pods of the Job with a node
    kubectl get pods -l "batch.kubernetes.io/job-name=$1" -o json | jq '[.items[] | select(.spec.nodeName != null)] | length'
}
settle() { # job, pods: waits until that many of its pods are bound
    local deadline=$((SECONDS + 90))
    until (($(bound_pods "$1") >= $2)); do
        ((SECONDS < deadline)) || fail "Job $1: $(bound_pods "$1") of $2 pods bound after 90s (kubectl get pods: $(kubectl get pods -l "batch.kubernetes.io/job-name=$1" --no-headers 2>&1 | head -n 10))"
        sleep 0.2
    done
}
# A quota shortfall in Kueue's words -> "RESOURCE missing N" (or "RESOURCE over N"); in match's
# words ("ClusterQueue Q: R needs N, L of T left") the same.
kueue_short() {
    sed -nE 's/.*insufficient unused quota for ([^ ]+) in flavor [^,]+, ([0-9]+) more needed.*/\1 missing \2/p
        s/.*insufficient quota for ([^ ]+) in flavor .*current podset request \(([0-9]+)\) > maximum capacity \(([0-9]+)\).*/\1 over \2 \3/p' <<<"$1"
}
match_short() {
    local r n l t
    read -r r n l t < <(sed -nE 's/.*quota: ClusterQueue [^:]+: ([^ ]+) needs ([0-9.]+), ([0-9.]+) of ([0-9.]+) left.*/\1 \2 \3 \4/p' <<<"$1")
    [[ -n ${r:-} ]] || return 0
    if [[ $kshort == *" over "* ]]; then echo "$r over $n $t"; else echo "$r missing $((n - l))"; fi
}
workloads=0 equal=0
compare() { # phase, job, [pods]: Kueue's decision (and the bound pods) against the prediction
    local phase=$1 j=$2 pods=${3:-} held kwhy kstate mstate bound placed kshort=
    decided "$j"
    held=$(predicted_held "$phase" "$j")
    placed=$(predicted_placed "$phase" "$j")
    if [[ $(condition "$WL" Admitted status) == True ]]; then
        kstate=admitted
        settle "$j" "$pods"
        kwhy="ClusterQueue $(jq -r '.status.admission.clusterQueue' <<<"$WL")"
    else
        kstate=held
        kwhy=$(condition "$WL" QuotaReserved message)
        sleep 2 # a held Job stays suspended: no pod may appear
        [[ $(kubectl get job "$j" -o jsonpath='{.spec.suspend}') == true ]] || fail "Job $j is held by Kueue but not suspended"
    fi
    bound=$(bound_pods "$j")
    mstate=admitted
    [[ -z $held ]] || mstate=held
    workloads=$((workloads + 1))
    local detail="Kueue: $kstate ($kwhy), $bound pods bound; gpu-dra match: $mstate${held:+ ($held)}, $placed pods placed"
    [[ $kstate == "$mstate" && $bound == "$placed" ]] || { log "prediction (stderr of match):"; cat "$WORK/predicted-$phase.txt" >&2; fail "Job $j: $detail"; }
    if [[ $kstate == held ]]; then
        local want=${REASON[$j]:-}
        [[ -n $want && $kwhy == *"$want"* && $held == *"$want"* ]] \
            || fail "Job $j: held for different reasons (both should name '$want'): $detail"
        kshort=$(kueue_short "$kwhy")
        if [[ -n $kshort || -n $(match_short "$held") ]]; then
            [[ $kshort == "$(match_short "$held")" ]] \
                || fail "Job $j: quota shortfall differs: Kueue '$kshort', match '$(match_short "$held")': $detail"
        fi
    fi
    equal=$((equal + 1))
    ok "Job $j: $detail"
}

# ------------------------------------------------------------------ phase 1: quota of 6 GPUs
kubectl apply -f "$WORK/flavor.yaml" -f "$WORK/team.yaml" >/dev/null
kubectl wait --for condition=Active --timeout 30s clusterqueue/team >/dev/null || fail "ClusterQueue team is not Active"
predict 1 "$WORK/team.yaml" "${PHASE1[@]}"
declare -A PODS=([q-pairs]=2 [q-three]=3 [q-singles]=2 [q-selector]=1 [q-mig]=1 [q-named]=1 [q-cpu]=1 [q-gang9]=9 [q-gang8]=8 [s-pairs]=2 [s-three]=3)
for j in "${PHASE1[@]}"; do
    kubectl apply -f "$WORK/$j.yaml" >/dev/null
    compare 1 "$j" "${PODS[$j]}"
done
# Live: what holds a queued Job, in Kueue's words, with its ClusterQueue.
set +e
"$GPU_DRA" explain job/q-three --kubeconfig "$KUBECONFIG" >"$WORK/explain-q-three.txt" 2>&1
rc=$?
set -e
((rc == 1)) && grep -q '^Job default/q-three: Kueue holds it (LocalQueue default/team, ClusterQueue team; Workload .*nvidia.com/gpu' "$WORK/explain-q-three.txt" \
    || fail "explain job/q-three (exit $rc) did not say Kueue holds it on ClusterQueue team for nvidia.com/gpu: $(cat "$WORK/explain-q-three.txt")"
ok "explain job/q-three (live): $(cat "$WORK/explain-q-three.txt")"

# ------------------------------------------------------------------ phase 2: the gang, 8 GPUs
clear_jobs() { # jobs...: deleted, with their pods, claims and Workloads
    kubectl delete jobs "$@" --wait=false >/dev/null
    kubectl delete pods -l batch.kubernetes.io/job-name --force --grace-period=0 >/dev/null 2>&1 || true
    local deadline=$((SECONDS + 90))
    until [[ -z $(kubectl get pods,resourceclaims,workloads --no-headers 2>/dev/null) ]]; do
        ((SECONDS < deadline)) || fail "pods, claims or workloads still there after 90s: $(kubectl get pods,resourceclaims,workloads --no-headers 2>&1 | head -n 10)"
        kubectl delete pods --all --force --grace-period=0 >/dev/null 2>&1 || true
        sleep 0.5
    done
}
clear_jobs "${PHASE1[@]}"
ok "phase 1's Jobs, pods, claims and Workloads gone: the 8 GPUs free"
kubectl apply -f "$WORK/gang.yaml" -f "$WORK/team.yaml" >/dev/null
kubectl wait --for condition=Active --timeout 30s clusterqueue/gang >/dev/null || fail "ClusterQueue gang is not Active"
predict 2 "$WORK/gang.yaml" "$WORK/team.yaml" "${PHASE2[@]}"
kubectl apply -f "$WORK/q-gang9.yaml" >/dev/null
compare 2 q-gang9 9
[[ -z $(kubectl get pods -l batch.kubernetes.io/job-name=q-gang9 --no-headers 2>/dev/null) ]] \
    || fail "the held gang q-gang9 has pods"
start=$(now)
kubectl apply -f "$WORK/q-gang8.yaml" >/dev/null
decided q-gang8
admitted_at=$(now)
settle q-gang8 8
bound_at=$(now)
compare 2 q-gang8 8
gang_line=$(awk -v s="$start" -v a="$admitted_at" -v b="$bound_at" \
    'BEGIN { printf "gang of 8 (1 GPU each, 8-GPU fleet): admitted %.1fs, all 8 bound %.1fs after create", a - s, b - s }')
log "$gang_line"

# ------------------------------------------------------------------ phase 3: StrictFIFO
clear_jobs "${PHASE2[@]}"
kubectl apply -f "$WORK/strict.yaml" >/dev/null
kubectl wait --for condition=Active --timeout 30s clusterqueue/strict >/dev/null || fail "ClusterQueue strict is not Active"
predict 3 "$WORK/strict.yaml" "$WORK/team.yaml" "${PHASE3[@]}"
for j in s-pairs s-three; do
    kubectl apply -f "$WORK/$j.yaml" >/dev/null
    compare 3 "$j" "${PODS[$j]}"
done
# Behind a Job held by quota, Kueue does not try the next one at all (it fits the 2 GPUs left):
# no decision to wait for; after a while it is still suspended, not admitted, with no pod.
kubectl apply -f "$WORK/s-singles.yaml" >/dev/null
sleep 5
WL=$(workload_of s-singles)
held=$(predicted_held 3 s-singles)
workloads=$((workloads + 1))
[[ -n $WL && $(condition "$WL" Admitted status) != True && $(kubectl get job s-singles -o jsonpath='{.spec.suspend}') == true &&
    $(bound_pods s-singles) == 0 ]] || fail "Job s-singles: Kueue admitted it behind the held s-three under StrictFIFO: ${WL:-no Workload}"
[[ $held == *"waiting behind Job default/s-three"* && $(predicted_placed 3 s-singles) == 0 ]] ||
    fail "Job s-singles: Kueue holds it behind s-three (StrictFIFO); gpu-dra match: ${held:-admitted}"
equal=$((equal + 1))
ok "Job s-singles: Kueue: held behind s-three (StrictFIFO; it would fit the 2 GPUs left), no pod; gpu-dra match: held ($held)"

# ------------------------------------------------------------------ phase 4: pending together
# Three Jobs wait in one queue at once (its ClusterQueue held while they are made, 1.1 s apart:
# Kueue's timestamps are to the second): p-plain, p-late, then p-urgent (WorkloadPriorityClass
# urgent, 1000), 2 GPUs each, where the quota is 4. Kueue takes the urgent one first, then the
# earlier of the other two. match reads the Jobs as the API server returns them (their
# creationTimestamps), listed in the reverse order: input order alone, or creation time alone,
# would each predict another pair.
clear_jobs "${PHASE3[@]}"
printf 'apiVersion: kueue.x-k8s.io/v1beta2\nkind: WorkloadPriorityClass\nmetadata: {name: urgent}\nvalue: 1000\n---\n' >"$WORK/urgent.yaml"
queue prio 4 >"$WORK/prio.yaml"
kubectl apply -f "$WORK/urgent.yaml" >/dev/null
sed 's/^  namespaceSelector: {}$/&\n  stopPolicy: Hold/' "$WORK/prio.yaml" | kubectl apply -f - >/dev/null
job p-plain prio 2 one-gpu >"$WORK/p-plain.yaml"
job p-urgent prio 2 one-gpu | sed 's|^  labels: {kueue.x-k8s.io/queue-name: prio}$|  labels: {kueue.x-k8s.io/queue-name: prio, kueue.x-k8s.io/priority-class: urgent}|' >"$WORK/p-urgent.yaml"
job p-late prio 2 one-gpu >"$WORK/p-late.yaml"
grep -q 'priority-class: urgent' "$WORK/p-urgent.yaml" || fail "p-urgent has no priority class label"
for j in p-plain p-late p-urgent; do
    kubectl apply -f "$WORK/$j.yaml" >/dev/null
    sleep 1.1
done
deadline=$((SECONDS + 60))
until [[ $(kubectl get workloads --no-headers 2>/dev/null | wc -l) == 3 ]]; do
    ((SECONDS < deadline)) || fail "Kueue did not make the 3 Workloads within 60s: $(kubectl get workloads 2>&1)"
    sleep 0.2
done
kubectl get jobs p-urgent p-late p-plain -o yaml >"$WORK/p-live.yaml"
predict 4 "$WORK/prio.yaml" "$WORK/team.yaml" "$WORK/urgent.yaml" "$WORK/p-live.yaml"
kubectl apply -f "$WORK/prio.yaml" >/dev/null # the hold lifted
REASON[p-late]='nvidia.com/gpu'
compare 4 p-urgent 2
compare 4 p-plain 2
compare 4 p-late
[[ $(jq -r .spec.priority <<<"$(workload_of p-urgent)") == 1000 ]] || fail "Kueue did not give p-urgent priority 1000"

line="kueue: $workloads workloads, predictions equal Kueue for $equal"
log "$line"
[[ -z ${GPU_DRA_TEST_REPORT:-} ]] || echo "$line" >>"$GPU_DRA_TEST_REPORT"
echo "$passed passed, 0 failed"
