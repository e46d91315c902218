#!/usr/bin/env bash
# Fleet predictions at scale (issue 55, item 6): `gpu-dra capacity` and `gpu-dra match
# --replicas` over NODES simulated nodes of 8×H100 with dynamic MIG, from one file of their
# ResourceSlices as `kubectl get resourceslices -o json` writes it (a List, indented), each node
# with its own GPU UUIDs (as a real fleet: no two nodes' devices are alike), for a pod asking one
# 3g.40gb MIG device (capacity) and a Job of REPLICAS such pods (match).
#
# Prints the input's size, then each command's wall time and peak RSS (GNU time). Not in
# run-tests: a measurement, not a check.
#
# Usage: e2e/bench-fleet.sh   (NODES=1000 REPLICAS=2000; GPU_DRA=path, default: a release build)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
NODES=${NODES:-1000}
REPLICAS=${REPLICAS:-2000}
if [[ -z ${GPU_DRA:-} ]]; then
    (cd "$ROOT" && cargo build --release --bin gpu-dra) >&2
    GPU_DRA=${CARGO_TARGET_DIR:-$ROOT/target}/release/gpu-dra
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# Each node's slices from the driver's own publishing code, then one List of all of them.
mkdir "$WORK/nodes"
for i in $(seq 0 $((NODES - 1))); do
    "$GPU_DRA" slices --gpus sim:8xH100-SXM5-80GB --node-name "node-$i" -o json \
        >"$WORK/nodes/$i.json" 2>/dev/null &
    if ((i % 8 == 7)); then wait; fi
done
wait
python3 - "$WORK" "$NODES" <<'PYEOF'
import json, sys
work, nodes = sys.argv[1], int(sys.argv[2])
with open(f"{work}/fleet.json", "w") as out:
    out.write('{\n    "apiVersion": "v1",\n    "kind": "List",\n    "items": [\n')
    first = True
    for i in range(nodes):
        for item in json.load(open(f"{work}/nodes/{i}.json"))["items"]:
            out.write("" if first else ",\n")
            first = False
            out.write(json.dumps(item, indent=4))
    out.write('\n    ]\n}\n')
PYEOF
rm -rf "$WORK/nodes"

template='apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: mig-3g, namespace: default}
spec:
  spec:
    devices:
      requests:
      - name: mig
        exactly:
          deviceClassName: mig.nvidia.com
          selectors:
          - cel: {expression: '"'"'device.attributes["gpu.nvidia.com"].profile == "3g.40gb"'"'"'}'
cat >"$WORK/pod.yaml" <<EOF
$template
---
apiVersion: v1
kind: Pod
metadata: {name: trainer, namespace: default}
spec:
  resourceClaims:
  - {name: mig, resourceClaimTemplateName: mig-3g}
  containers:
  - {name: c, image: busybox, resources: {claims: [{name: mig}]}}
EOF
cat >"$WORK/job.yaml" <<EOF
$template
---
apiVersion: batch/v1
kind: Job
metadata: {name: trainers, namespace: default}
spec:
  parallelism: $REPLICAS
  completions: $REPLICAS
  template:
    spec:
      restartPolicy: Never
      resourceClaims:
      - {name: mig, resourceClaimTemplateName: mig-3g}
      containers:
      - {name: c, image: busybox, resources: {claims: [{name: mig}]}}
EOF

size=$(du -m "$WORK/fleet.json" | cut -f1)
echo "fleet: $NODES nodes of 8×H100 (dynamic MIG), one List of their ResourceSlices, $size MB"
measure() {
    local label=$1
    shift
    # rc 1 (nothing fits) is an answer here, not a failure.
    /usr/bin/time -f "%e %M" -o "$WORK/time" "$@" >"$WORK/out" 2>"$WORK/err" || [[ $? == 1 ]] ||
        { cat "$WORK/err" >&2; exit 1; }
    read -r secs kb <"$WORK/time"
    printf '%-44s %7.2f s  %6d MiB peak RSS\n' "$label" "$secs" $((kb / 1024))
}
measure "capacity (one 3g.40gb pod)" \
    "$GPU_DRA" capacity --slices "$WORK/fleet.json" --classes "$ROOT/deviceclasses" -f "$WORK/pod.yaml"
head -1 "$WORK/out"
measure "match --replicas (Job of $REPLICAS such pods)" \
    "$GPU_DRA" match --slices "$WORK/fleet.json" --classes "$ROOT/deviceclasses" -f "$WORK/job.yaml" --replicas
