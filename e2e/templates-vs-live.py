#!/usr/bin/env python3
"""Templates vs live slices: `gpu-dra templates --form slices` of each node (one file per node)
against the ResourceSlices its driver published (`kubectl get resourceslices -o json`).

Compared per slice name: the whole spec (driver, node, pool name and slice count, every device
with its attributes, capacities, counters and taints, every counter set), less what only a real
node knows (each GPU's and MIG device's `uuid` and `parentUUID`) and the pool's generation.
Prints `templates vs live slices: N nodes, S slices, D devices, C counter sets, M mismatches`,
then one line per mismatch; exits 1 if there is any."""
import json
import sys

IDENTITY = ("uuid", "parentUUID")


def norm(slice_):
    spec = json.loads(json.dumps(slice_["spec"]))
    spec.get("pool", {}).pop("generation", None)
    for device in spec.get("devices") or []:
        for name in IDENTITY:
            (device.get("attributes") or {}).pop(name, None)
    return spec


def main():
    live = {s["metadata"]["name"]: s for s in json.load(open(sys.argv[1]))["items"]}
    nodes = slices = devices = counter_sets = 0
    mismatches = []
    seen = set()
    for path in sys.argv[2:]:
        nodes += 1
        for template in json.load(open(path))["items"]:
            name = template["metadata"]["name"]
            seen.add(name)
            slices += 1
            devices += len(template["spec"].get("devices") or [])
            counter_sets += len(template["spec"].get("sharedCounters") or [])
            if name not in live:
                mismatches.append(f"{name}: in the templates, not published")
                continue
            want, got = norm(template), norm(live[name])
            if want != got:
                keys = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
                mismatches.append(f"{name}: spec.{', spec.'.join(keys)} differ")
    pools = {json.load(open(p))["items"][0]["spec"]["pool"]["name"] for p in sys.argv[2:]}
    for name, s in live.items():
        if s["spec"]["pool"]["name"] in pools and name not in seen:
            mismatches.append(f"{name}: published, not in the templates")
    print(
        f"templates vs live slices: {nodes} nodes, {slices} slices, {devices} devices, "
        f"{counter_sets} counter sets, {len(mismatches)} mismatches"
    )
    for line in mismatches:
        print(f"  {line}")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
