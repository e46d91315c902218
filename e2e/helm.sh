#!/usr/bin/env bash
# e2e: the Helm chart (deploy/helm/gpu-dra) on the real control plane, and the driver running
# with nothing but the chart's permissions.
#
#   1. `helm lint` and `helm template` (Helm built from its Go module by e2e/build-helm.sh); the
#      rendered objects pass `kubectl apply --dry-run=server`; the chart's DeviceClasses equal
#      deviceclasses/; value switches (extended resources, driver name) render as documented;
#      values.schema.json refuses misspelt values and wrong types, naming them, and
#      docs/reference/chart-values.md is generated from it (e2e/chart-values-doc.py --check);
#   2. the ServiceAccount, RBAC, ValidatingAdmissionPolicy (+ binding) and DeviceClasses are
#      applied for real;
#   3. a token of the chart's ServiceAccount bound to the simulated Node carries the node name;
#      it may not do what the driver never does; the policy rejects its ResourceSlice writes for
#      another node and another driver;
#   4. `gpu-dra run --log-format json --metrics-addr ...` with that token alone publishes the
#      slices; /healthz and /readyz answer; with featureGates.DRAListTypeAttributes the API
#      server (gate on, e2e/versions.env) keeps numaNode as a list: the driver's dry-run check
#      passes under the chart's permissions and policy (e2e/gates.sh: the overhead table, and
#      the refusals when the API server's gates are off);
#   5. a pod asking only for `nvidia.com/gpu: 1` is scheduled by kube-scheduler through the
#      DeviceClass's extendedResourceName; kubelet-sim prepares the claim the scheduler made, the
#      driver reports status.devices with the token; unprepare cleans up;
#   6. /metrics shows the prepare/unprepare counters, latency buckets and published devices, and
#      the driver logged no authorization error.
#
# Usage: e2e/helm.sh   (GPU_DRA=path/to/gpu-dra, default target/debug/gpu-dra, built if missing)
set -euo pipefail
NAME=helm-e2e
NODE=e2e-helm-node
GPUS=sim:8xH100-SXM5-80GB
NAMESPACE=gpu-dra
RELEASE=gpu-dra
SA_USER=system:serviceaccount:$NAMESPACE:$RELEASE
# Helm first: a cold build takes minutes and must not hold a running control plane.
HELM_BIN=$("$(dirname "${BASH_SOURCE[0]}")/build-helm.sh" | tail -n 1)
HELM=$HELM_BIN/helm
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
CHART=$ROOT/deploy/helm/gpu-dra

# Objects of a multi-document YAML file as one JSON List (client-side, no server write).
as_json() { kubectl create --dry-run=client -o json -f "$1" | jq -s '{items: [.[] | if .kind == "List" then .items[] else . end]}'; }
render() { "$HELM" template "$RELEASE" "$CHART" --namespace "$NAMESPACE" "$@"; }
sa_kubectl() { kubectl --kubeconfig "$WORK/driver.kubeconfig" "$@"; }

# ---------------------------------------------------------------- 1. render, server dry run
"$HELM" lint --strict "$CHART" >&2 || fail "helm lint"
render --set metrics.service.enabled=true >"$WORK/chart.yaml" || fail "helm template"
as_json "$WORK/chart.yaml" >"$WORK/chart.json" || fail "the rendered chart is not valid YAML for kubectl"
kinds=$(jq -c '[.items[].kind] | sort' "$WORK/chart.json")
want='["ClusterRole","ClusterRoleBinding","DaemonSet","DeviceClass","DeviceClass","DeviceClass","Service","ServiceAccount","ValidatingAdmissionPolicy","ValidatingAdmissionPolicyBinding"]'
[[ $kinds == "$want" ]] || fail "rendered kinds: $kinds"
kubectl create namespace "$NAMESPACE" >&2
out=$(kubectl apply --dry-run=server -f "$WORK/chart.yaml" 2>&1) || fail "server dry run rejected the chart: $out"
ok "helm lint and template pass; the API server accepts all $(jq '.items | length' "$WORK/chart.json") rendered objects (dry run)"

# Same classes as the repository's deviceclasses/ (Helm only adds labels); NVIDIA's ComputeDomain
# classes only with computeDomains.enabled (below).
as_json "$ROOT/deviceclasses" | jq -S '[.items[] | {name: .metadata.name, spec} | select(.name | startswith("compute-domain") | not)] | sort_by(.name)' >"$WORK/classes.repo.json"
jq -S '[.items[] | select(.kind == "DeviceClass") | {name: .metadata.name, spec}] | sort_by(.name)' "$WORK/chart.json" >"$WORK/classes.chart.json"
diff -u "$WORK/classes.repo.json" "$WORK/classes.chart.json" >&2 || fail "the chart's DeviceClasses differ from deviceclasses/"
# NVIDIA's chart (its v0.5.0 module, rendered with its defaults: ComputeDomains on) installs the
# same five classes as deviceclasses/: a cluster switching charts keeps its users' classes.
NVIDIA_CHART=$("$E2E/build-k8s.sh" nvidia-chart | tail -n 1)/nvidia-chart
"$HELM" template nvidia "$NVIDIA_CHART" --namespace nvidia-dra --api-versions resource.k8s.io/v1 \
    --set gpuResourcesEnabledOverride=true >"$WORK/nvidia-chart.yaml" || fail "helm template of NVIDIA's chart"
as_json "$ROOT/deviceclasses" | jq -S '[.items[] | {name: .metadata.name, spec}] | sort_by(.name)' >"$WORK/classes.all.json"
# (Read as YAML, not through kubectl: its chart may render kinds this cluster does not serve.)
python3 -c 'import json, sys, yaml; print(json.dumps({"items": [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]}))' \
    "$WORK/nvidia-chart.yaml" | jq -S '[.items[] | select(.kind == "DeviceClass") | {name: .metadata.name, spec}] | sort_by(.name)' \
    >"$WORK/classes.nvidia.json"
[[ $(jq length "$WORK/classes.nvidia.json") == 5 ]] || fail "NVIDIA's chart rendered $(jq -c 'map(.name)' "$WORK/classes.nvidia.json"), not its five classes"
diff -u "$WORK/classes.all.json" "$WORK/classes.nvidia.json" >&2 || fail "NVIDIA's chart's DeviceClasses differ from deviceclasses/"
render --set extendedResources.enabled=false --set driverName=gpu.example.com --set healthTaintEffects=lost=NoExecute \
    >"$WORK/variant.yaml" || fail "helm template with options"
as_json "$WORK/variant.yaml" | jq -e '
    ([.items[] | select(.kind == "DeviceClass") | .spec.extendedResourceName] == [null, null, null])
    and ([.items[] | select(.kind == "DeviceClass") | .spec.selectors[0].cel.expression
          | contains("device.driver == '"'gpu.example.com'"'")] | all)
    and (.items[] | select(.kind == "ClusterRole") | .rules[] | select(.resources == ["resourceclaims/driver"])
         | .resourceNames == ["gpu.example.com"])
    and (.items[] | select(.kind == "DaemonSet") | .spec.template.spec.containers[0].args
         | index("--driver-name=gpu.example.com") != null and index("--health-taint-effects=lost=NoExecute") != null)' >/dev/null \
    || fail "extendedResources.enabled=false / driverName / healthTaintEffects did not render as expected"
ok "the chart's DeviceClasses equal deviceclasses/, and so do NVIDIA's chart's (v0.5.0, its defaults); extendedResources, driverName and healthTaintEffects switch as documented"

# metrics.auth=kubernetes: the flag, and the reviews it needs in the driver's ClusterRole (the
# reviews themselves against the API server: tests/metrics_auth.rs); a value it does not know is
# refused by the schema.
render --set metrics.auth=kubernetes >"$WORK/auth.yaml" || fail "helm template with metrics.auth=kubernetes"
as_json "$WORK/auth.yaml" | jq -e --arg role "$RELEASE" '
    (.items[] | select(.kind == "DaemonSet") | .spec.template.spec.containers[0].args | index("--metrics-auth=kubernetes") != null)
    and ([.items[] | select(.kind == "ClusterRole" and .metadata.name == $role) | .rules[]
          | select(.resources == ["tokenreviews"] or .resources == ["subjectaccessreviews"]) | .verbs] == [["create"], ["create"]])' >/dev/null \
    || fail "metrics.auth=kubernetes did not render the flag and the review permissions"
render --set metrics.auth=basic >/dev/null 2>"$WORK/auth.err" && fail "metrics.auth=basic rendered"
grep -q "metrics.auth" "$WORK/auth.err" || fail "metrics.auth=basic: $(cat "$WORK/auth.err")"
ok "metrics.auth=kubernetes passes --metrics-auth and grants TokenReview and SubjectAccessReview; an unknown value is refused"

# values.schema.json types every value and knows every key: a misspelt value (nested or top-level)
# and a wrong type are refused before anything renders, naming the value; the values reference
# page is generated from the schema and must be its current output.
for refused in "image.tagg=x|at '/image': additional properties 'tagg' not allowed" \
    "imag.tag=x|at '': additional properties 'imag' not allowed" \
    "metrics.port=abc|at '/metrics/port': got string, want integer"; do
    render --set "${refused%%|*}" >/dev/null 2>"$WORK/schema.err" && fail "${refused%%|*} rendered"
    grep -qF "${refused#*|}" "$WORK/schema.err" || fail "${refused%%|*}: $(cat "$WORK/schema.err")"
done
python3 "$ROOT/e2e/chart-values-doc.py" --check "$ROOT/docs/reference/chart-values.md" || fail "docs/reference/chart-values.md is stale: run e2e/chart-values-doc.py"
ok "values.schema.json refuses a misspelt value (image.tagg, imag.tag) and a wrong type (metrics.port=abc), naming each; docs/reference/chart-values.md is e2e/chart-values-doc.py's output"

# computeDomains.enabled: the CRD, NVIDIA's two classes, the controller's Deployment and RBAC,
# the channel plugin's flags, permissions and admission rule; the API server takes them all.
render --include-crds --set computeDomains.enabled=true >"$WORK/cd.yaml" || fail "helm template with computeDomains.enabled"
as_json "$WORK/cd.yaml" >"$WORK/cd.json" || fail "the computeDomains render is not valid YAML"
kinds=$(jq -c '[.items[].kind] | sort' "$WORK/cd.json")
# Two admission policies: ResourceSlices, and the driver's ComputeDomain status writes; two
# Roles: the controller's (its leader-election Lease, the domains' IMEX credentials) and the
# driver's (it reads those credentials).
want='["ClusterRole","ClusterRole","ClusterRoleBinding","ClusterRoleBinding","CustomResourceDefinition","DaemonSet","Deployment","DeviceClass","DeviceClass","DeviceClass","DeviceClass","DeviceClass","Role","Role","RoleBinding","RoleBinding","ServiceAccount","ServiceAccount","ValidatingAdmissionPolicy","ValidatingAdmissionPolicy","ValidatingAdmissionPolicyBinding","ValidatingAdmissionPolicyBinding"]'
[[ $kinds == "$want" ]] || fail "computeDomains.enabled rendered kinds: $kinds"
# The driver may get a Secret by name (a domain's IMEX credentials), not list or change them.
jq -e '[.items[] | select(.kind == "Role") | .rules[] | select(.resources == ["secrets"]) | .verbs] | sort == [["get"], ["get", "create", "delete"]]' "$WORK/cd.json" >/dev/null \
    || fail "computeDomains.enabled: the Roles' secret verbs: $(jq -c '[.items[] | select(.kind == "Role") | .rules]' "$WORK/cd.json")"
as_json "$ROOT/deviceclasses" | jq -S '[.items[] | {name: .metadata.name, spec}] | sort_by(.name)' >"$WORK/cd-classes.repo.json"
jq -S '[.items[] | select(.kind == "DeviceClass") | {name: .metadata.name, spec}] | sort_by(.name)' "$WORK/cd.json" >"$WORK/cd-classes.chart.json"
diff -u "$WORK/cd-classes.repo.json" "$WORK/cd-classes.chart.json" >&2 || fail "computeDomains.enabled: the chart's DeviceClasses differ from deviceclasses/"
jq -e '(.items[] | select(.kind == "DaemonSet") | .spec.template.spec.containers[0].args
        | index("--compute-domains") != null and index("--imex-mode=driver-managed") != null)
    and (.items[] | select(.kind == "Deployment") | .spec.template.spec.containers[0].args[0] == "compute-domain-controller")' "$WORK/cd.json" >/dev/null \
    || fail "computeDomains.enabled: the plugin's or the controller's arguments"
kubectl create namespace "$NAMESPACE" --dry-run=client -o yaml | kubectl apply -f - >&2
crd=$(jq '{apiVersion: "v1", kind: "List", items: [.items[] | select(.kind == "CustomResourceDefinition")]}' "$WORK/cd.json")
kubectl apply -f - <<<"$crd" >&2 || fail "the ComputeDomain CRD was refused"
out=$(kubectl apply --dry-run=server -f "$WORK/cd.yaml" 2>&1) || fail "server dry run rejected the computeDomains render: $out"
"$HELM" template "$RELEASE" "$CHART" --set computeDomains.enabled=true --set computeDomains.imex.mode=hostManaged >/dev/null 2>"$WORK/cd.err" &&
    fail "computeDomains.imex.mode=hostManaged without hostSocket rendered"
grep -q "needs computeDomains.imex.hostSocket" "$WORK/cd.err" || fail "hostManaged without hostSocket: $(cat "$WORK/cd.err")"
ok "computeDomains.enabled: CRD, NVIDIA's classes (equal to deviceclasses/), controller Deployment and RBAC, plugin flags; the API server accepts them (dry run); hostManaged without its socket is refused"

# The gated slice fields: featureGates as NVIDIA's chart takes them, the overhead table as a
# ConfigMap the driver reads (section 4 runs the driver with exactly these).
render --set featureGates.DRAListTypeAttributes=true --set featureGates.DRANodeAllocatableResources=true \
    --set-json 'nodeAllocatableOverhead={"NVIDIA H100 80GB HBM3": {"memory": {"perPod": "2Gi", "perContainer": "512Mi"}}, "NVIDIA H100 80GB HBM3/1g.10gb": {"memory": {"perPod": "256Mi"}}}' \
    >"$WORK/gated.yaml" || fail "helm template with featureGates and nodeAllocatableOverhead"
as_json "$WORK/gated.yaml" >"$WORK/gated.json"
GATED_ARGS=$(jq -r '.items[] | select(.kind == "DaemonSet") | .spec.template.spec.containers[0].args[] | select(startswith("--feature-gates="))' "$WORK/gated.json")
[[ $GATED_ARGS == --feature-gates=DRAListTypeAttributes=true,DRANodeAllocatableResources=true, ]] || fail "featureGates rendered as: $GATED_ARGS"
jq -r '.items[] | select(.kind == "ConfigMap") | .data["node-allocatable-overhead.yaml"]' "$WORK/gated.json" >"$WORK/overhead.yaml"
grep -q 'perPod: 2Gi' "$WORK/overhead.yaml" || fail "the overhead ConfigMap: $(cat "$WORK/overhead.yaml")"
jq -e '.items[] | select(.kind == "DaemonSet") | .spec.template.spec.containers[0].args
    | index("--node-allocatable-overhead=/etc/gpu-dra/node-allocatable-overhead.yaml") != null' "$WORK/gated.json" >/dev/null \
    || fail "--node-allocatable-overhead is not passed"
out=$(kubectl apply --dry-run=server -f "$WORK/gated.yaml" 2>&1) || fail "server dry run rejected the gated chart: $out"
ok "featureGates render as --feature-gates, nodeAllocatableOverhead as a ConfigMap the driver reads; the API server accepts them (dry run)"

# A values file brought from NVIDIA's chart (its values.yaml verbatim, tests/fixtures/helm/): what
# gpu-dra has a key for moves there (ComputeDomains on, NVIDIA's node affinity and log
# verbosity), the rest is accepted at NVIDIA's defaults only; NVIDIA's image, its webhook and a
# value gpu-dra has no key for are refused naming the key, and so is a key no chart has.
NVIDIA_VALUES=$ROOT/tests/fixtures/helm/nvidia-values.yaml
render -f "$NVIDIA_VALUES" >/dev/null 2>"$WORK/nv.err" && fail "NVIDIA's values with NVIDIA's image rendered"
grep -q "image.repository \"registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu\" is NVIDIA's driver's image" "$WORK/nv.err" \
    || fail "NVIDIA's image: $(cat "$WORK/nv.err")"
# NVIDIA's defaults do not install with its own chart either: its guard wants
# gpuResourcesEnabledOverride=true (the classic device plugin gone); so does ours, naming it.
render -f "$NVIDIA_VALUES" --set image.repository=ghcr.io/gpu-dra/gpu-dra >/dev/null 2>"$WORK/nv.err" && fail "NVIDIA's values rendered without gpuResourcesEnabledOverride"
grep -q "gpuResourcesEnabledOverride false" "$WORK/nv.err" || fail "gpuResourcesEnabledOverride: $(cat "$WORK/nv.err")"
render -f "$NVIDIA_VALUES" --set image.repository=ghcr.io/gpu-dra/gpu-dra --set gpuResourcesEnabledOverride=true >"$WORK/nv.yaml" || fail "helm template with NVIDIA's values"
as_json "$WORK/nv.yaml" >"$WORK/nv.json"
jq -e '(.items[] | select(.kind == "DaemonSet") | .spec.template.spec
        | (.containers[0].args | index("--compute-domains") != null and index("--imex-mode=driver-managed") != null)
          and (.containers[0].env[] | select(.name == "RUST_LOG") | .value == "info,gpu_dra=debug")
          and ([.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[].matchExpressions[].key]
               | index("feature.node.kubernetes.io/cpu-model.vendor_id") != null))
    and ([.items[] | select(.kind == "Deployment")] | length == 1)' "$WORK/nv.json" >/dev/null \
    || fail "NVIDIA's values did not move to gpu-dra's keys: $(jq -c '.items[] | select(.kind == "DaemonSet") | .spec.template.spec.containers[0] | {args, env}' "$WORK/nv.json")"
out=$(kubectl apply --dry-run=server -f "$WORK/nv.yaml" 2>&1) || fail "server dry run rejected the render of NVIDIA's values: $out"
for refused in "webhook.enabled=true|webhook.enabled true (NVIDIA's admission webhook" \
    "kubeletPlugin.metrics.metricsPath=/m|kubeletPlugin.metrics.metricsPath: \"/m\" is a value of NVIDIA's chart" \
    "kubeletPlugin.containers.gpus.env[0].name=CDI_ROOT|kubeletPlugin.containers.gpus.env CDI_ROOT: a setting of NVIDIA's plugin" \
    "computeDomain.enabled=true|additional properties 'computeDomain' not allowed" \
    "featureGates.ConsumableShares=false,consumableShares=4|featureGates.ConsumableShares false with consumableShares \"4\""; do
    render --set "${refused%%|*}" >/dev/null 2>"$WORK/refused.err" && fail "${refused%%|*} rendered"
    grep -qF "${refused#*|}" "$WORK/refused.err" || fail "${refused%%|*}: $(cat "$WORK/refused.err")"
done
# What NVIDIA's values files and its BATS suite's installs set: its ConsumableShares gate beside a
# mode (the mode alone here), its sysfs root variable (gpu-dra's GPU_DRA_SYSFS_ROOT), and the
# component label its scripts select the plugin pods by.
render --set featureGates.ConsumableShares=true --set featureGates.MPSSupport=true --set consumableShares=4 \
    --set 'kubeletPlugin.containers.gpus.env[0].name=NVIDIA_DRA_SYSFS_ROOT' --set 'kubeletPlugin.containers.gpus.env[0].value=/driver-root/sys' \
    >"$WORK/gates.yaml" || fail "helm template with NVIDIA's ConsumableShares gate"
as_json "$WORK/gates.yaml" | jq -e '.items[] | select(.kind == "DaemonSet") | .spec.template
    | (.spec.containers[0].args | index("--consumable-shares=4") != null and index("--feature-gates=MPSSupport=true,") != null)
      and (.spec.containers[0].env | any(.name == "GPU_DRA_SYSFS_ROOT" and .value == "/driver-root/sys"))
      and .metadata.labels["dra-driver-nvidia-gpu-component"] == "kubelet-plugin"' >/dev/null \
    || fail "NVIDIA's gate, sysfs variable or label: $(as_json "$WORK/gates.yaml" | jq -c '.items[] | select(.kind == "DaemonSet") | .spec.template | {labels: .metadata.labels, args: .spec.containers[0].args, env: .spec.containers[0].env}')"
ok "NVIDIA's values.yaml: its keys move to gpu-dra's (ComputeDomains, node affinity, log level) and the API server accepts the render (dry run); its install guard applies as in its chart; NVIDIA's image, its webhook, a value without equivalent and an unknown key are refused, each named"

# ---------------------------------------------------------------- 2. apply RBAC, policy, classes
jq '{apiVersion: "v1", kind: "List", items: [.items[] | select(.kind != "DaemonSet" and .kind != "Service")]}' \
    "$WORK/chart.json" | kubectl apply -f - >&2 || fail "applying the chart's RBAC, policy and DeviceClasses"
policy=$RELEASE-resourceslices
# The policy's type-check status comes from kube-controller-manager, which this control plane
# does not run; steps 3 and 4 show every expression compiles and evaluates (accepted and
# rejected writes, each with its own message).
ok "ServiceAccount, ClusterRole/Binding, ValidatingAdmissionPolicy/Binding and DeviceClasses applied"

# ---------------------------------------------------------------- 3. the driver's identity
token=$(kubectl -n "$NAMESPACE" create token "$RELEASE" --bound-object-kind Node --bound-object-name "$NODE" --duration 1h) \
    || fail "cannot create a Node-bound token for the chart's ServiceAccount"
token_kubeconfig "$WORK/driver.kubeconfig" "$token"
whoami=$(sa_kubectl auth whoami -o json) || fail "the token does not authenticate: $whoami"
jq -e --arg user "$SA_USER" --arg node "$NODE" '.status.userInfo.username == $user
    and .status.userInfo.extra["authentication.kubernetes.io/node-name"] == [$node]' <<<"$whoami" >/dev/null \
    || fail "the token lacks the node name: $whoami"
for denied in "list secrets -A" "get pods" "list resourceclaims -A" "update nodes" "delete deviceclasses" "update resourceclaims/status"; do
    # shellcheck disable=SC2086 # word splitting of the verb and resource is intended
    [[ $(sa_kubectl auth can-i $denied 2>/dev/null) == no ]] || fail "the driver's service account may '$denied'"
done
ok "a token of the chart's ServiceAccount bound to Node $NODE carries its node name and no permission the driver does not use"

slice() { # NAME NODE DRIVER
    cat <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: $1}
spec:
  driver: $3
  nodeName: $2
  pool: {name: $2, generation: 1, resourceSliceCount: 1}
  devices: [{name: gpu-0}]
EOF
}
slice foreign-slice other-node gpu.nvidia.com >"$WORK/foreign.yaml"
slice wrong-driver-slice "$NODE" other.example.com >"$WORK/wrong-driver.yaml"
# The policy takes effect a moment after it is created; dry runs probe without writing.
wait_for "policy enforced" 30 bash -c "! kubectl --kubeconfig $WORK/driver.kubeconfig create --dry-run=server -f $WORK/foreign.yaml"
out=$(sa_kubectl create -f "$WORK/foreign.yaml" 2>&1) && fail "a ResourceSlice for another node was accepted: $out"
[[ $out == *"ValidatingAdmissionPolicy '$policy'"* && $out == *"may only write ResourceSlices of that node, not of node other-node"* ]] \
    || fail "rejected for the wrong reason: $out"
out=$(sa_kubectl create -f "$WORK/wrong-driver.yaml" 2>&1) && fail "a ResourceSlice of another driver was accepted: $out"
[[ $out == *"may only write ResourceSlices of driver gpu.nvidia.com"* ]] || fail "rejected for the wrong reason: $out"
[[ $(kubectl get resourceslices -o name | wc -l) == 0 ]] || fail "a rejected slice exists"
out=$(kubectl create -f "$WORK/foreign.yaml" 2>&1) || fail "the policy must not restrict other users: $out"
kubectl delete -f "$WORK/foreign.yaml" >&2
ok "the policy rejects the driver's ResourceSlice writes for another node and another driver (other users unaffected)"

# ComputeDomains with the clique label: RBAC lets the driver patch Nodes and ComputeDomain
# status at all; the chart's policies narrow that to its own Node's one label and its own node's
# entry in status.nodes. Checked with the same Node-bound token, as the API server evaluates them.
render --include-crds --set computeDomains.enabled=true --set computeDomains.gpuCliqueLabel=true >"$WORK/cdlabel.yaml" \
    || fail "helm template with computeDomains.gpuCliqueLabel"
as_json "$WORK/cdlabel.yaml" | jq --arg role "$RELEASE" '{apiVersion: "v1", kind: "List", items: [.items[]
        | select(.kind == "ValidatingAdmissionPolicy" or .kind == "ValidatingAdmissionPolicyBinding"
            or (.kind == "ClusterRole" and .metadata.name == $role))]}' |
    kubectl apply -f - >&2 || fail "applying the ComputeDomain RBAC and policies"
kubectl apply -f - >&2 <<'NODE'
apiVersion: v1
kind: Node
metadata: {name: other-node, labels: {kubernetes.io/hostname: other-node}}
NODE
wait_for "the Node policy enforced" 30 bash -c "! kubectl --kubeconfig $WORK/driver.kubeconfig label node other-node --dry-run=server nvidia.com/gpu.clique=x"
refused() { # WHY COMMAND...: the driver's token may not do it, and the policy says WHY
    local why=$1 out
    shift
    out=$(sa_kubectl "$@" 2>&1) && fail "the driver's token could: $*"
    [[ $out == *"ValidatingAdmissionPolicy"* && $out == *"$why"* ]] || fail "$* refused for the wrong reason: $out"
}
sa_kubectl label node "$NODE" nvidia.com/gpu.clique=4f7c.1 >&2 || fail "the driver cannot set its own Node's clique label"
refused "may only change that Node, not other-node" label node other-node nvidia.com/gpu.clique=4f7c.1
refused "may only change that Node, not other-node" taint node other-node evict=all:NoExecute
refused "may not change a Node's spec" taint node "$NODE" evict=all:NoExecute
refused "may change only the nvidia.com/gpu.clique label of its Node, not node-role.kubernetes.io/control-plane" \
    label node "$NODE" node-role.kubernetes.io/control-plane=
refused "may not change a Node's annotations" annotate node "$NODE" note=x
sa_kubectl label node "$NODE" nvidia.com/gpu.clique- >&2 || fail "the driver cannot remove its own Node's clique label"
[[ -z $(kubectl get node other-node -o jsonpath='{.spec.taints}') ]] || fail "other-node was tainted"
ok "the Node policy: the driver's token sets and removes its own Node's clique label, and cannot label or taint another Node, nor change anything else of its own"

kubectl create namespace tenant-b --dry-run=client -o yaml | kubectl apply -f - >&2
kubectl apply -f - >&2 <<'DOMAIN'
apiVersion: resource.nvidia.com/v1beta1
kind: ComputeDomain
metadata: {name: training, namespace: tenant-b}
spec:
  numNodes: 2
  channel: {resourceClaimTemplate: {name: training-channel}}
DOMAIN
kubectl -n tenant-b patch computedomain training --subresource=status --type=merge \
    -p '{"status": {"nodes": [{"name": "other-node", "ipAddress": "10.0.0.2", "cliqueID": "4f7c.1", "index": 0, "status": "Ready"}]}}' >&2 \
    || fail "the admin cannot write the ComputeDomain's status"
add_entry() { # NAME IP INDEX: a JSON patch adding a status.nodes entry
    printf '[{"op": "add", "path": "/status/nodes/-", "value": {"name": "%s", "ipAddress": "%s", "cliqueID": "4f7c.1", "index": %s}}]' "$@"
}
# status_patch TYPE BODY [dry]: PATCH the domain's status with the driver's token as the driver
# does (no GET first: its role has none on the status); prints the API server's answer.
status_patch() {
    local server ca
    server=$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')
    ca=$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.certificate-authority}')
    curl -sS --cacert "$ca" -H "Authorization: Bearer $token" -H "Content-Type: application/$1" -X PATCH --data "$2" \
        "$server/apis/resource.nvidia.com/v1beta1/namespaces/tenant-b/computedomains/training/status${3:+?dryRun=All}"
}
patch_refused() { # WHY TYPE BODY: the patch is refused by the policy, saying WHY
    local out
    out=$(status_patch "$2" "$3")
    jq -e --arg why "$1" '.kind == "Status" and (.message | contains("ValidatingAdmissionPolicy") and contains($why))' <<<"$out" >/dev/null \
        || fail "the driver's status patch $3 was not refused for: $1: $out"
}
wait_for "the ComputeDomain policy enforced" 30 bash -c "$(declare -f status_patch); token='$token'; status_patch json-patch+json '$(add_entry intruder 10.0.0.9 2)' dry | jq -e '.kind == \"Status\"'"
out=$(status_patch json-patch+json "$(add_entry "$NODE" 10.0.0.1 1)")
jq -e '.kind == "ComputeDomain"' <<<"$out" >/dev/null || fail "the driver cannot add its own node's entry: $out"
patch_refused "may only write its own entry in status.nodes, not intruder" json-patch+json "$(add_entry intruder 10.0.0.9 2)"
patch_refused "may only write its own entry in status.nodes, not other-node" json-patch+json \
    '[{"op": "replace", "path": "/status/nodes/0/ipAddress", "value": "10.6.6.6"}]'
patch_refused "may not change a ComputeDomain's status.status" merge-patch+json '{"status": {"status": "Ready"}}'
nodes=$(kubectl -n tenant-b get computedomain training -o json | jq -c '[.status.nodes[] | {name, ipAddress}]')
[[ $nodes == '[{"name":"other-node","ipAddress":"10.0.0.2"},{"name":"'"$NODE"'","ipAddress":"10.0.0.1"}]' ]] \
    || fail "status.nodes after the refused writes: $nodes"
ok "the ComputeDomain policy: the driver's token writes its own node's entry in another namespace's domain, and cannot add another node's, change one, or the domain's status"
kubectl delete node other-node >&2

# ---------------------------------------------------------------- 4. the driver on the token alone
# With the chart's DRAListTypeAttributes gate (the per-device overhead runs in e2e/gates.sh:
# kube-scheduler 1.37.2 cannot bind the nvidia.com/gpu pod of section 5 to a device with it).
# shellcheck disable=SC2119 # start_driver's arguments are optional environment settings
KUBECONFIG=$WORK/driver.kubeconfig DRIVER_ARGS="--log-format json --metrics-addr 127.0.0.1:0 --feature-gates=DRAListTypeAttributes=true" start_driver
# Port 0: the kernel picks a free port; the driver logs the one it got.
wait_for "metrics endpoint logged" 20 grep -q '"serving /metrics, /healthz and /readyz"' "$WORK/driver.log"
jq -e . "$WORK/driver.log" >/dev/null || fail "--log-format json wrote a line that is not JSON"
METRICS=http://$(jq -r 'select(.fields.message == "serving /metrics, /healthz and /readyz") | .fields.addr' "$WORK/driver.log" | head -n 1)
# As many devices as `gpu-dra slices` shows for this node (whole GPUs and MIG placements).
DEVICES=$("$GPU_DRA" slices "${GPU_ARGS[@]}" --sim-state "$WORK/hw.json" --node-name "$NODE" -o json | jq '[.items[].spec.devices[]?] | length')
wait_for "$DEVICES devices published" 30 bash -c "[[ \$(kubectl get resourceslices -o json | jq '[.items[].spec.devices[]?] | length') == $DEVICES ]]"
[[ $(slices_json | jq -r '[.items[].metadata.ownerReferences[0].kind] | unique | .[]') == Node ]] \
    || fail "the slices are not owned by the Node"
[[ $(curl -s -o /dev/null -w '%{http_code}' "$METRICS/healthz") == 200 ]] || fail "/healthz"
wait_for "/readyz 200" 20 bash -c "[[ \$(curl -s -o /dev/null -w '%{http_code}' $METRICS/readyz) == 200 ]]"
ok "gpu-dra run with only the chart's permissions published $DEVICES devices; JSON logs; /healthz and /readyz are 200 at $METRICS"
gated=$(slices_json | jq -c '[.items[].spec.devices[]? | select(.name == "gpu-0" or .name == "gpu-0-mig-1g10gb-19-0")
    | .attributes["resource.kubernetes.io/numaNode"]] | unique')
[[ $gated == '[{"ints":[0]}]' ]] || fail "the API server did not keep numaNode as a list: $gated"
grep -q 'the API server keeps' "$WORK/driver.log" || fail "the driver did not check the gated field with the API server"
ok "with featureGates.DRAListTypeAttributes the stored slices carry numaNode as [0] (the driver's dry-run check passes with the chart's permissions and policy)"

# ---------------------------------------------------------------- 5. nvidia.com/gpu: 1, no claim
kubectl apply -f - >&2 <<'EOF'
apiVersion: v1
kind: Pod
metadata: {name: classic-gpu-pod, namespace: default}
spec:
  containers:
  - name: cuda
    image: registry.k8s.io/pause:3.10
    resources:
      limits: {nvidia.com/gpu: 1}
EOF
wait_for "pod bound" 60 bash -c "[[ \$(kubectl get pod classic-gpu-pod -o jsonpath='{.spec.nodeName}') == $NODE ]]"
pod=$(kubectl get pod classic-gpu-pod -o json)
claim_name=$(jq -r '.status.extendedResourceClaimStatus.resourceClaimName // empty' <<<"$pod")
[[ -n $claim_name ]] || fail "the pod has no extendedResourceClaimStatus: $(jq -c .status <<<"$pod")"
jq -e '.status.extendedResourceClaimStatus.requestMappings[0] | .containerName == "cuda" and .resourceName == "nvidia.com/gpu"' <<<"$pod" >/dev/null \
    || fail "unexpected request mapping: $(jq -c .status.extendedResourceClaimStatus <<<"$pod")"
claim=$(kubectl get resourceclaim "$claim_name" -o json)
uid=$(jq -r .metadata.uid <<<"$claim")
jq -e '.status.allocation.devices.results | length == 1 and .[0].driver == "gpu.nvidia.com"' <<<"$claim" >/dev/null \
    || fail "the scheduler's claim is not allocated one GPU: $(jq -c .status <<<"$claim")"
device=$(jq -r '.status.allocation.devices.results[0].device' <<<"$claim")
[[ $device =~ ^gpu-[0-9]+$ ]] || fail "allocated $device, not a full GPU"
ok "kube-scheduler scheduled the nvidia.com/gpu pod onto $NODE through the DeviceClass: claim $claim_name, $device"

out=$(kubelet prepare --claim "default/$claim_name/$uid") || fail "prepare: $out"
[[ $(jq -r '.claims[0].error' <<<"$out") == "" ]] || fail "prepare: $(jq -r '.claims[0].error' <<<"$out")"
[[ $(jq -r '.claims[0].devices[0].cdi_device_ids[0]' <<<"$out") == "k8s.gpu.nvidia.com/claim=$uid-$device" ]] \
    || fail "unexpected CDI id: $out"
spec=$WORK/cdi/k8s.gpu.nvidia.com-claim_$uid.json
[[ -f $spec ]] || fail "no CDI spec at $spec"
wait_for "status.devices reported with the driver's token" 20 bash -c \
    "kubectl get resourceclaim $claim_name -o json | jq -e '.status.devices[0].data.uuid | startswith(\"GPU-\")'"
info=$(curl -sf "$METRICS/metrics" | grep "^gpu_dra_prepared_device_info{.*claim=\"$claim_name\"") \
    || fail "no gpu_dra_prepared_device_info series for the prepared claim"
for label in 'namespace="default"' "claim_uid=\"$uid\"" "dra_device=\"$device\"" 'UUID="GPU-' 'GPU_I_ID=""' \
    'pods="default/classic-gpu-pod"' \
    "Hostname=\"$NODE\"" 'sharing="exclusive"'; do
    [[ $info == *"$label"* ]] || fail "the info series lacks $label: $info"
done
bad=$(kubelet prepare --claim "default/no-such-claim/0000")
[[ $(jq -r '.claims[0].error' <<<"$bad") == *"not found"* ]] || fail "a missing claim must fail: $bad"
out=$(kubelet unprepare --claim "default/$claim_name/$uid") || fail "unprepare: $out"
[[ $(jq -r '.claims[0].error' <<<"$out") == "" ]] || fail "unprepare: $out"
[[ ! -e $spec ]] || fail "CDI spec still there after unprepare"
! curl -sf "$METRICS/metrics" | grep -q "^gpu_dra_prepared_device_info{.*claim=\"$claim_name\"" \
    || fail "the claim's gpu_dra_prepared_device_info series is still there after unprepare"
ok "kubelet-sim prepared the scheduler's claim (CDI spec, status.devices via associated-node:patch, a gpu_dra_prepared_device_info series with DCGM's labels) and unprepared it (series gone)"

# ---------------------------------------------------------------- 6. metrics, no authorization errors
metrics=$(curl -sf "$METRICS/metrics") || fail "GET /metrics"
value() { awk -v s="$1" '$1 == s { print $2; found = 1 } END { if (!found) print "missing" }' <<<"$metrics"; }
positive() { [[ $(value "$1") =~ ^[0-9.e+]+$ ]] && awk -v v="$(value "$1")" 'BEGIN { exit !(v > 0) }'; }
for series in 'gpu_dra_prepare_requests_total{result="ok"}' 'gpu_dra_prepare_requests_total{result="error"}' \
    gpu_dra_prepare_errors_total 'gpu_dra_unprepare_requests_total{result="ok"}' \
    gpu_dra_prepare_duration_seconds_count 'gpu_dra_prepare_duration_seconds_bucket{le="+Inf"}' \
    'gpu_dra_prepare_duration_seconds_bucket{le="32.768"}' gpu_dra_unprepare_duration_seconds_count \
    'gpu_dra_slice_sync_writes_total{operation="create"}'; do
    positive "$series" || fail "$series is $(value "$series"), expected > 0"
done
[[ $(value gpu_dra_published_devices) == "$DEVICES" ]] || fail "gpu_dra_published_devices is $(value gpu_dra_published_devices)"
[[ $(value gpu_dra_prepared_claims) == 0 && $(value gpu_dra_prepared_devices) == 0 ]] || fail "prepared gauges not back to 0"
[[ $(value gpu_dra_slice_sync_errors_total) == 0 ]] || fail "slice sync errors: $(value gpu_dra_slice_sync_errors_total)"
# NVIDIA's driver's series, under its names and labels, for dashboards written for it.
for series in 'nvidia_dra_requests_total{driver="gpu.nvidia.com",operation="prepare"}' \
    'nvidia_dra_node_prepare_errors_total{driver="gpu.nvidia.com",error_type="prepare_devices"}' \
    'nvidia_dra_request_duration_seconds_count{driver="gpu.nvidia.com",operation="unprepare"}'; do
    positive "$series" || fail "$series is $(value "$series"), expected > 0"
done
[[ $(value 'nvidia_dra_requests_inflight{driver="gpu.nvidia.com",operation="prepare"}') == 0 ]] || fail "requests still in flight"
[[ $(value "nvidia_dra_prepared_devices{node=\"$NODE\",driver=\"gpu.nvidia.com\",device_type=\"gpu\"}") == 0 ]] \
    || fail "nvidia_dra_prepared_devices: $(grep '^nvidia_dra_prepared_devices' <<<"$metrics")"
if grep -qi forbidden "$WORK/driver.log"; then
    grep -i forbidden "$WORK/driver.log" | head -n 5 >&2
    fail "the driver hit an authorization error"
fi
ok "/metrics: prepare ok=$(value 'gpu_dra_prepare_requests_total{result="ok"}') error=$(value 'gpu_dra_prepare_requests_total{result="error"}'), latency buckets filled, $DEVICES published devices, NVIDIA's nvidia_dra_* series too; no authorization error in the driver log"

echo "$passed passed, 0 failed"
