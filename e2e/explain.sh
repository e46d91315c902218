#!/usr/bin/env bash
# e2e: "why is my pod Pending?" on a live cluster. The driver publishes two simulated H100s
# (dynamic MIG) on the control plane; the real kube-scheduler places pods; then
# `gpu-dra explain pod/NAME` reads the cluster and must say:
#
#   1. a pod asking for a product the node does not have: the selector clause that is false;
#   2. a pod whose matching devices are all taken: which claims hold them;
#   3. a pod asking for a MIG device while whole-GPU claims hold the counters: the counters;
#   4. a scheduled pod: which devices it got;
#   5. the same explanation as the offline form fed the same objects (kubectl get … -o yaml);
#   6. a missing permission: an error naming it; and `kubectl gpu-dra explain` as a kubectl plugin;
#   7. a DeviceTaintRule: `gpu-dra match`'s offline prediction equals the scheduler's allocation
#      for pods with and without the toleration, and explain names the rule's taint;
#   8. extended resources (nvidia.com/gpu, the class's implicit name) in pods without claims: the
#      prediction equals the device in the claim the scheduler makes, and explain explains it;
#   9. `gpu-dra capacity` on the live cluster: how many more copies of a pod fit; one fewer after
#      one more binds (for a pod from a file, and for the bound pod itself: `capacity pod/NAME`);
#      a pod no node admits (nodeSelector): explain and capacity name the node filter.
#  10. a burst of four MIG pods before the driver republishes: the real scheduler puts them on one
#      GPU, exactly where `gpu-dra match` predicts (each profile's devices are chained).
#
# Mode: the driver runs as a host process publishing slices (no kubelet, no container): what is
# under test is `match`/`explain` against the real kube-scheduler, not the node path, which
# e2e/pods.sh runs with the image through the chart.
#
# Usage: e2e/explain.sh   (GPU_DRA=path/to/gpu-dra, default target/debug/gpu-dra)
set -euo pipefail
NAME=explain-e2e
NODE=explain-node-1
GPUS=sim:2xH100-SXM5-80GB
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

kubectl apply -f "$ROOT/deviceclasses/" >&2
start_driver
wait_for "devices published" 30 bash -c "kubectl get resourceslices -o json | jq -e '[.items[].spec.devices[]?.name] | index(\"gpu-1\")'"

pending() { kubectl get pod "$1" -o json | jq -e '.status.conditions[]? | select(.type == "PodScheduled" and .status == "False")' >/dev/null; }
bound() { [[ -n $(kubectl get pod "$1" -o jsonpath='{.spec.nodeName}') ]]; }
# The cluster's scheduler runs with K8S_FEATURE_GATES; explain as that scheduler would.
GATES=$(source "$ROOT/e2e/versions.env" && echo "$K8S_FEATURE_GATES")
explain() { "$GPU_DRA" explain "$@" -n default --kubeconfig "$KUBECONFIG" --feature-gates "$GATES"; }

# ---------------------------------------------------------------- 1. wrong product
claim_and_pod wrong-product gpu.nvidia.com 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA A100-SXM4-80GB"'
wait_for "wrong-product Pending" 60 pending wrong-product
out=$(explain pod/wrong-product) && fail "explain says wrong-product fits: $out"
grep -q "node $NODE" <<<"$out" || fail "no verdict for $NODE: $out"
grep -q 'productName == "NVIDIA A100-SXM4-80GB"' <<<"$out" || fail "the false selector is not named: $out"
grep -q 'NVIDIA H100 80GB HBM3' <<<"$out" || fail "the value the selector saw is not shown: $out"
ok "Pending pod asking for an A100: explain names the false selector and the H100s it saw"

# ---------------------------------------------------------------- 2 and 4. taken; scheduled
claim_and_pod whole-a gpu.nvidia.com 'device.attributes["gpu.nvidia.com"].type == "gpu"'
claim_and_pod whole-b gpu.nvidia.com 'device.attributes["gpu.nvidia.com"].type == "gpu"'
wait_for "whole-a and whole-b scheduled" 60 bash -c "[[ -n \$(kubectl get pod whole-a -o jsonpath='{.spec.nodeName}') && -n \$(kubectl get pod whole-b -o jsonpath='{.spec.nodeName}') ]]"
claim_and_pod whole-c gpu.nvidia.com 'device.attributes["gpu.nvidia.com"].type == "gpu"'
wait_for "whole-c Pending" 60 pending whole-c
out=$(explain pod/whole-c) && fail "explain says whole-c fits: $out"
grep -q "default/whole-a" <<<"$out" && grep -q "default/whole-b" <<<"$out" || fail "the claims holding the GPUs are not named: $out"
ok "Pending pod whose GPUs are all taken: explain names the claims holding them"
out=$(explain pod/whole-a) || fail "explain of a scheduled pod failed: $out"
dev=$(kubectl get resourceclaim whole-a -o jsonpath='{.status.allocation.devices.results[0].device}')
grep -q "allocated: $dev" <<<"$out" && grep -q "scheduled on node $NODE" <<<"$out" || fail "scheduled pod: $out"
ok "scheduled pod: explain says it got $dev on $NODE"

# ---------------------------------------------------------------- 3. counters
claim_and_pod mig-1g mig.nvidia.com 'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"'
wait_for "mig-1g Pending" 60 pending mig-1g
out=$(explain pod/mig-1g) && fail "explain says mig-1g fits: $out"
grep -qi "counter" <<<"$out" || fail "the exhausted counters are not named: $out"
ok "Pending MIG pod while whole-GPU claims hold the counters: explain says so"

# ---------------------------------------------------------------- 5. same as offline
kubectl get resourceslices -o yaml >"$WORK/slices.yaml"
kubectl get resourceclaim whole-a whole-b -o yaml >"$WORK/allocated.yaml"
kubectl get resourceclaim mig-1g -o yaml >"$WORK/claim.yaml"
offline=$("$GPU_DRA" explain --slices "$WORK/slices.yaml" --classes "$ROOT/deviceclasses/" \
    --allocated "$WORK/allocated.yaml" --node "$NODE" "$WORK/claim.yaml") && fail "offline explain says mig-1g fits"
live=$(explain pod/mig-1g --node "$NODE" | sed '1,/^$/d') || true
[[ $live == "$offline" ]] || fail "live and offline explanations differ:
--- live
$live
--- offline
$offline"
ok "the live explanation equals the offline one for the same objects"

# ---------------------------------------------------------------- 6. permissions; kubectl plugin
kubectl create serviceaccount reader -n default >&2
kubectl create role pod-reader -n default --verb get,list --resource pods >&2
kubectl create rolebinding pod-reader -n default --role pod-reader --serviceaccount default:reader >&2
token=$(kubectl create token reader -n default)
token_kubeconfig "$WORK/reader.kubeconfig" "$token"
out=$("$GPU_DRA" explain pod/mig-1g -n default --kubeconfig "$WORK/reader.kubeconfig" 2>&1) && fail "explain worked without permission: $out"
grep -q "cannot get resourceclaim default/mig-1g" <<<"$out" && grep -q "forbidden" <<<"$out" && grep -q "needs get/list on" <<<"$out" ||
    fail "the missing permission is not named: $out"
ok "without permission to read claims: $(grep -o 'cannot get resourceclaim[^:]*' <<<"$out"): forbidden, and what it needs"
mkdir -p "$WORK/bin"
ln -s "$GPU_DRA" "$WORK/bin/kubectl-gpu_dra"
plugin=$(PATH="$WORK/bin:$PATH" kubectl gpu-dra explain pod/whole-a -n default --kubeconfig "$KUBECONFIG") || fail "kubectl gpu-dra: $plugin"
[[ $plugin == "$(explain pod/whole-a)" ]] || fail "kubectl gpu-dra explain differs: $plugin"
ok "kubectl gpu-dra explain (kubectl-gpu_dra on PATH) gives the same answer"

# No kubelet runs these pods and no controller-manager frees their claims: the pods go at
# once, the claims once their protection finalizer is dropped.
clear_pods_and_claims() {
    kubectl delete pod --all --grace-period=0 --force >&2 2>/dev/null
    kubectl delete resourceclaim --all --wait=false >&2
    for c in $(kubectl get resourceclaims -o name); do
        kubectl patch "$c" --type=merge -p '{"metadata":{"finalizers":null}}' >&2
    done
    wait_for "the earlier claims deleted" 60 bash -c '[[ -z $(kubectl get resourceclaims -o name) ]]'
}

# ---------------------------------------------------------------- 7. DeviceTaintRule, as the scheduler applies it
# An admin takes gpu-0 out with a DeviceTaintRule (NoSchedule). Before each pod is created,
# `gpu-dra match` predicts its device offline from the cluster's objects (slices, classes, the
# rule, allocated claims); the real scheduler must allocate exactly that: a pod without the
# toleration gets gpu-1, one with it gets gpu-0, a third without it stays Pending and explain
# names the taint.
clear_pods_and_claims

kubectl apply -f - >&2 <<EOF
apiVersion: resource.k8s.io/v1
kind: DeviceTaintRule
metadata: {name: gpu-0-maintenance}
spec:
  deviceSelector: {driver: gpu.nvidia.com, pool: $NODE, device: gpu-0}
  taint: {key: example.com/maintenance, value: planned, effect: NoSchedule}
EOF
# predict CLAIM_FILE: the device `gpu-dra match` allocates offline on the cluster's objects now.
predict() {
    kubectl get resourceslices -o yaml >"$WORK/t-slices.yaml"
    kubectl get devicetaintrules -o yaml >"$WORK/t-rules.yaml"
    kubectl get resourceclaims -o json | jq '{apiVersion: "v1", kind: "List", items: [.items[] | select(.status.allocation != null)]}' >"$WORK/t-held.json"
    local out
    # Exit 1 and no output: nothing fits.
    out=$("$GPU_DRA" match --slices "$WORK/t-slices.yaml" --classes "$ROOT/deviceclasses/" --allocated "$WORK/t-held.json" \
        --allocated "$WORK/t-rules.yaml" --node "$NODE" --feature-gates "$GATES" -o json "$1" 2>/dev/null) || true
    [[ -n $out ]] || out='{}'
    jq -r '.status.allocation.devices.results[0].device // "none"' <<<"$out"
}
for pod in plain: tolerating:example.com/maintenance; do
    name=${pod%%:*}
    claim_yaml "$name" gpu.nvidia.com "" "${pod#*:}" >"$WORK/$name.yaml"
    want=$(predict "$WORK/$name.yaml")
    { cat "$WORK/$name.yaml"; echo ---; pod_using_claim "$name" "$name"; } | kubectl apply -f - >&2
    wait_for "$name scheduled" 60 bound "$name"
    got=$(kubectl get resourceclaim "$name" -o jsonpath='{.status.allocation.devices.results[0].device}')
    [[ $got == "$want" ]] || fail "$name: the scheduler allocated $got, gpu-dra match predicted $want"
    case $name in
        plain) [[ $got == gpu-1 ]] || fail "the pod without the toleration got $got, not gpu-1" ;;
        tolerating) [[ $got == gpu-0 ]] || fail "the pod with the toleration got $got, not the tainted gpu-0" ;;
    esac
    ok "DeviceTaintRule on gpu-0: pod $name got $got from the scheduler, as gpu-dra match predicted offline"
done
claim_yaml plain-2 gpu.nvidia.com >"$WORK/plain-2.yaml"
[[ $(predict "$WORK/plain-2.yaml") == none ]] || fail "gpu-dra match predicts a device for plain-2"
{ cat "$WORK/plain-2.yaml"; echo ---; pod_using_claim plain-2 plain-2; } | kubectl apply -f - >&2
wait_for "plain-2 Pending" 60 pending plain-2
out=$(explain pod/plain-2 2>&1) && fail "explain says plain-2 fits: $out"
grep -q 'DeviceTaintRule gpu-0-maintenance taints' <<<"$out" && grep -q 'taint example.com/maintenance=planned:NoSchedule is not tolerated' <<<"$out" ||
    fail "explain does not name the rule and its taint: $out"
ok "a third pod without the toleration: Pending on the scheduler and in gpu-dra match; explain names the rule's taint"

# ---------------------------------------------------------------- 8. extended resources, as the scheduler allocates them
# Pods that ask for `nvidia.com/gpu` (the class's extendedResourceName) or the class's implicit
# name in their limits, with no claim: the scheduler makes a claim for them (KEP-5004). Before
# each pod is created `gpu-dra match` predicts the claim's device offline; the scheduler's claim
# (named in the pod's status.extendedResourceClaimStatus) must have exactly that.
clear_pods_and_claims
kubectl delete devicetaintrule --all >&2
extended_claim() { kubectl get pod "$1" -o jsonpath='{.status.extendedResourceClaimStatus.resourceClaimName}'; }
for pod in ext-a:nvidia.com/gpu ext-b:deviceclass.resource.kubernetes.io/gpu.nvidia.com; do
    name=${pod%%:*}
    # RESOURCE: 1 in the limits, no claim.
    pause_pod "$name" "{requests: {cpu: 10m}, limits: {\"${pod#*:}\": 1}}" >"$WORK/$name.yaml"
    want=$(predict "$WORK/$name.yaml")
    kubectl apply -f "$WORK/$name.yaml" >&2
    wait_for "$name scheduled with its extended-resource claim" 60 bash -c "[[ -n \$(kubectl get pod $name -o jsonpath='{.spec.nodeName}') && -n \$(kubectl get pod $name -o jsonpath='{.status.extendedResourceClaimStatus.resourceClaimName}') ]]"
    claim=$(extended_claim "$name")
    got=$(kubectl get resourceclaim "$claim" -o jsonpath='{.status.allocation.devices.results[0].device}')
    request=$(kubectl get resourceclaim "$claim" -o jsonpath='{.spec.devices.requests[0].name}')
    [[ $got == "$want" && -n $got ]] || fail "$name (${pod#*:}: 1): the scheduler's claim $claim has $got, gpu-dra match predicted $want"
    [[ $request == container-0-request-1 ]] || fail "$name: the scheduler named the request $request (gpu-dra names it container-0-request-1)"
    ok "extended resource ${pod#*:}: pod $name got $got through the scheduler's claim $claim, as gpu-dra match predicted offline"
done
pause_pod ext-c "{requests: {cpu: 10m}, limits: {nvidia.com/gpu: 1}}" >"$WORK/ext-c.yaml"
[[ $(predict "$WORK/ext-c.yaml") == none ]] || fail "gpu-dra match predicts a device for ext-c with both GPUs taken"
kubectl apply -f "$WORK/ext-c.yaml" >&2
wait_for "ext-c Pending" 60 pending ext-c
out=$(explain pod/ext-c 2>&1) && fail "explain says ext-c fits: $out"
grep -q 'ext-c-extended-resources' <<<"$out" && grep -q 'container-0-request-1' <<<"$out" ||
    fail "explain does not explain the extended-resource claim: $out"
ok "a third nvidia.com/gpu pod: Pending on the scheduler and in gpu-dra match; live explain explains its extended-resource claim"

# ---------------------------------------------------------------- 9. how many more fit, live
clear_pods_and_claims
capacity() { "$GPU_DRA" capacity --kubeconfig "$KUBECONFIG" --feature-gates "$GATES" -o json "$@"; }
fits_on_node() { jq -r --arg node "$NODE" '.nodes[] | select(.node == $node) | .fits'; }
pause_pod cap-a "{requests: {cpu: 10m}, limits: {nvidia.com/gpu: 1}}" >"$WORK/cap-a.yaml"
before=$(capacity --cluster -f "$WORK/cap-a.yaml") || fail "gpu-dra capacity --cluster: $before"
[[ $(fits_on_node <<<"$before") == 2 ]] || fail "two idle H100s: capacity says $before"
kubectl apply -f "$WORK/cap-a.yaml" >&2
wait_for "cap-a scheduled" 60 bound cap-a
after=$(capacity --cluster -f "$WORK/cap-a.yaml") || fail "gpu-dra capacity --cluster after one pod: $after"
[[ $(fits_on_node <<<"$after") == 1 ]] || fail "one pod bound: capacity should go from 2 to 1: $after"
grep -q "devices in use" <<<"$(jq -r '.nodes[].stops' <<<"$after")" || fail "what stops the next copy is not named: $after"
copies=$(capacity pod/cap-a -n default) || fail "gpu-dra capacity pod/cap-a: $copies"
[[ $(fits_on_node <<<"$copies") == 1 ]] || fail "capacity pod/cap-a (copies of the bound pod): $copies"
ok "gpu-dra capacity on the cluster: 2 more nvidia.com/gpu pods fit, 1 after one binds (from a file and as pod/cap-a)"
# A pod whose nodeSelector no node has: the scheduler's node filter, before any device.
pause_pod elsewhere "{requests: {cpu: 10m}, limits: {nvidia.com/gpu: 1}}" "  nodeSelector: {pool: a100}" | kubectl apply -f - >&2
wait_for "elsewhere Pending" 60 pending elsewhere
out=$(explain pod/elsewhere) && fail "explain says elsewhere fits: $out"
grep -q "node $NODE: the pod may not go there: nodeSelector pool=a100: the node has no label pool" <<<"$out" ||
    fail "explain does not name the node filter: $out"
[[ $(capacity pod/elsewhere -n default | jq '.total') == 0 ]] || fail "capacity counts copies of a pod no node admits"
ok "a pod whose nodeSelector no node matches: explain and capacity name the node filter"
# ---------------------------------------------------------------- 10. a burst, before any republish
# Four 1g.20gb pods at once. Nothing prepares their claims here (no kubelet), so the driver never
# republishes and the scheduler takes every device from the same published order, as it does on a
# real node for pods that arrive faster than prepare carves their instances. Each profile's
# devices are chained (the next is the best once the earlier ones are taken): the four fill
# gpu-0 and gpu-1 stays whole for a 7g request. `gpu-dra match` predicts the same.
clear_pods_and_claims
kubectl delete pod elsewhere --ignore-not-found >&2
burst_yaml() { # index
    cat <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: burst-$1, namespace: default}
spec:
  devices:
    requests:
    - name: mig
      exactly:
        deviceClassName: mig.nvidia.com
        selectors: [{cel: {expression: "device.attributes['gpu.nvidia.com'].profile == '1g.20gb'"}}]
---
apiVersion: v1
kind: Pod
metadata: {name: burst-$1, namespace: default}
spec:
  containers: [{name: c, image: registry.k8s.io/pause:3.10, resources: {claims: [{name: mig}]}}]
  resourceClaims: [{name: mig, resourceClaimName: burst-$1}]
---
EOF
}
for i in 1 2 3 4; do burst_yaml "$i"; done >"$WORK/burst.yaml"
kubectl get resourceslices -o yaml >"$WORK/burst-slices.yaml"
predicted=$("$GPU_DRA" match --slices "$WORK/burst-slices.yaml" --classes "$ROOT/deviceclasses/" --node "$NODE" --feature-gates "$GATES" \
    -o json -f "$WORK/burst.yaml" 2>/dev/null | jq -r '[.items[].status.allocation.devices.results[0].device] | sort | join(",")')
[[ $predicted == gpu-0-mig-* && $predicted != *gpu-1* ]] || fail "gpu-dra match puts the burst on: $predicted"
kubectl apply -f "$WORK/burst.yaml" >&2
wait_for "the burst's four claims allocated" 90 bash -c \
    "[[ \$(kubectl get resourceclaims -o json | jq '[.items[] | select(.status.allocation != null)] | length') == 4 ]]"
got=$(kubectl get resourceclaims -o json | jq -r '[.items[].status.allocation.devices.results[0].device] | sort | join(",")')
[[ $got == "$predicted" ]] || fail "the scheduler placed the burst on $got; gpu-dra match predicted $predicted"
ok "a burst of four 1g.20gb pods before any republish: the scheduler put all four on gpu-0 ($got), as gpu-dra match predicted; gpu-1 stays whole"
echo "$passed passed, 0 failed"
