#!/usr/bin/env python3
"""Compares the ResourceSlices NVIDIA's DRA driver published for a node with gpu-dra's, field by
field (e2e/vs-nvidia.sh).

Every device of either side is flattened to paths (attributes with their type, capacities,
counters a device consumes, taints, ...), as are the slices' shared counter sets and node
selection and the pool's layout. A path whose value differs, or that one side lacks, is a
mismatch unless the explained-differences table (TSV: config glob, path regex, side that has the
value or "both" where the values differ, a regex the values must match, why) covers it. Prints each explained difference once with its reason, each mismatch,
and last `DEVICES FIELDS EXPLAINED`; exits 1 on any mismatch.
"""
import argparse
import fnmatch
import json
import re
import sys


def typed(value):
    """An attribute as `type=value` (DRA attributes hold exactly one typed field)."""
    if isinstance(value, dict) and len(value) == 1:
        (kind, inner), = value.items()
        return f"{kind}={json.dumps(inner, sort_keys=True)}"
    return json.dumps(value, sort_keys=True)


def flatten(slices):
    """Path -> value for everything the slices say."""
    fields = {}
    items = slices.get("items", [])
    pools = {}
    for item in items:
        spec = item.get("spec", {})
        pool = spec.get("pool", {})
        pools.setdefault(pool.get("name"), set()).add(pool.get("resourceSliceCount"))
        where = {k: spec[k] for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection") if k in spec}
        fields["slice/nodeSelection"] = json.dumps(where, sort_keys=True)
        fields["slice/driver"] = spec.get("driver")
        for counter_set in spec.get("sharedCounters", []) or []:
            name = counter_set.get("name")
            for counter, value in (counter_set.get("counters") or {}).items():
                fields[f"sharedCounters/{name}/{counter}"] = json.dumps(value, sort_keys=True)
        for device in spec.get("devices", []) or []:
            name = device.get("name")
            prefix = f"device/{name}"
            fields[prefix] = "present"
            for attr, value in (device.get("attributes") or {}).items():
                fields[f"{prefix}/attributes/{attr}"] = typed(value)
            for cap, value in (device.get("capacity") or {}).items():
                fields[f"{prefix}/capacity/{cap}"] = json.dumps(value, sort_keys=True)
            for consumed in device.get("consumesCounters", []) or []:
                set_name = consumed.get("counterSet")
                for counter, value in (consumed.get("counters") or {}).items():
                    fields[f"{prefix}/consumesCounters/{set_name}/{counter}"] = json.dumps(value, sort_keys=True)
            for taint in device.get("taints", []) or []:
                fields[f"{prefix}/taints/{taint.get('key')}"] = json.dumps(
                    {k: taint.get(k) for k in ("value", "effect")}, sort_keys=True)
            for key in sorted(set(device) - {"name", "attributes", "capacity", "consumesCounters", "taints"}):
                fields[f"{prefix}/{key}"] = json.dumps(device[key], sort_keys=True)
    for pool, counts in pools.items():
        fields[f"pool/{pool}/slices"] = "consistent" if len(counts) == 1 else f"inconsistent {sorted(counts)}"
    return fields


def load_explained(path):
    rules = []
    with open(path) as table:
        for line in table:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            parts = line.split("\t")
            if len(parts) != 5:
                sys.exit(f"{path}: a rule needs 5 tab-separated columns (config, path regex, side, value regex, why): {line!r}")
            config, pattern, side, value, why = parts
            if side not in ("nvidia", "ours", "both"):
                sys.exit(f"{path}: side must be nvidia, ours or both: {line!r}")
            rules.append((config, re.compile(pattern), side, re.compile(value), why))
    return rules


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--explained", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("nvidia")
    parser.add_argument("ours")
    args = parser.parse_args()
    with open(args.nvidia) as f:
        nvidia = flatten(json.load(f))
    with open(args.ours) as f:
        ours = flatten(json.load(f))
    rules = [r for r in load_explained(args.explained) if fnmatch.fnmatch(args.config, r[0])]
    mismatches, used = [], {}
    for path in sorted(set(nvidia) | set(ours)):
        theirs, mine = nvidia.get(path), ours.get(path)
        if theirs == mine:
            continue
        side = "ours" if theirs is None else "nvidia" if mine is None else "both"
        values = [v for v in (theirs, mine) if v is not None]
        rule = next((r for r in rules if r[1].fullmatch(path) and r[2] == side
                     and all(r[3].fullmatch(v) for v in values)), None)
        if rule:
            used.setdefault(rule[4], []).append(path)
        else:
            mismatches.append(f"MISMATCH {path}: NVIDIA {theirs!r}, gpu-dra {mine!r}")
    devices = len({p.split("/")[1] for p in set(nvidia) | set(ours) if p.startswith("device/")})
    for why, paths in used.items():
        print(f"explained ({len(paths)}): {why}  e.g. {paths[0]}")
    for line in mismatches:
        print(line)
    explained = sum(len(p) for p in used.values())
    print(f"{devices} {len(set(nvidia) | set(ours))} {explained}")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
