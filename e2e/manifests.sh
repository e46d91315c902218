# YAML of the objects the e2e scripts create: pause pods and ResourceClaims. Sourced by lib.sh
# and by scripts that run their own clusters (fleet-replay.sh).
# shellcheck shell=bash

# pause_pod NAME RESOURCES [MORE]: a pause pod (YAML) whose one container has RESOURCES (a flow
# map), with MORE lines of pod spec.
pause_pod() {
    cat <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default}
spec:
  containers:
  - name: c
    image: registry.k8s.io/pause:3.10
    resources: $2
${3:-}
EOF
}

# pod_using_claim POD CLAIM: a pause pod whose one container uses ResourceClaim CLAIM (YAML).
pod_using_claim() {
    pause_pod "$1" "{claims: [{name: gpu}]}" "  resourceClaims:
  - {name: gpu, resourceClaimName: $2}"
}

# claim_yaml NAME CLASS [CEL [TOLERATED]]: a ResourceClaim for one device of CLASS (matching
# CEL; tolerating NoSchedule taints with key TOLERATED).
claim_yaml() {
    local extra=
    [[ -z ${3:-} ]] || extra+="
        selectors:
        - cel:
            expression: '$3'"
    [[ -z ${4:-} ]] || extra+="
        tolerations:
        - {key: $4, operator: Exists, effect: NoSchedule}"
    cat <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: $1, namespace: default}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: $2$extra
EOF
}

# shared_claim_yaml NAME CEL SHARING: claim_yaml's claim for one GPU matching CEL, shared as
# NVIDIA's GpuConfig says (SHARING: the flow mapping of its `sharing` field).
shared_claim_yaml() {
    claim_yaml "$1" gpu.nvidia.com "$2"
    cat <<EOF
    config:
    - requests: [gpu]
      opaque:
        driver: gpu.nvidia.com
        parameters:
          apiVersion: resource.nvidia.com/v1beta1
          kind: GpuConfig
          sharing: $3
EOF
}
# timesliced_claim_yaml NAME CEL INTERVAL: time-sliced (timeSlicingConfig.interval INTERVAL).
timesliced_claim_yaml() {
    shared_claim_yaml "$1" "$2" "{strategy: TimeSlicing, timeSlicingConfig: {interval: $3}}"
}
