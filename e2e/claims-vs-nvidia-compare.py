#!/usr/bin/env python3
"""Compares what NVIDIA's DRA driver and gpu-dra did with the same claims (e2e/claims-vs-nvidia.sh).

Each side's record (the kubelet's answer, what the runtimes' CDI library injects for the claim's CDI
ids and the device metadata files among its mounts, the claim's status.devices, the GPUs, their PCI
functions' bindings and the MPS daemons after prepare and after unprepare, the CDI files left) is
flattened to paths. A path whose value differs, or that one side lacks, is a mismatch unless the
explained-differences table covers it (TSV: path regex, side that has the value, or "both" where the
values differ; a regex each value shown must match; why). Claim UIDs, the driver root and the run's
folder are replaced by placeholders first. Prints each explained difference once with its reason,
each mismatch, and last `CLAIMS FIELDS EXPLAINED`; exits 1 on a mismatch.
"""
import argparse
import json
import posixpath
import re
import sys


def normalize(text, uids, driver_root, work):
    for claim, uid in uids.items():
        text = text.replace(uid, f"<uid:{claim}>")
    return text.replace(driver_root, "<driver-root>").replace(work, "<work>")


def flatten(doc, driver_root, work):
    uids = doc["uids"]
    fields = {}

    def put(path, value):
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        fields[normalize(path, uids, driver_root, work)] = normalize(text, uids, driver_root, work)

    for claim, devices in doc["answer"].items():
        for device in devices:
            name = device.get("device_name") or device.get("deviceName") or json.dumps(device, sort_keys=True)
            for key, value in device.items():
                put(f"answer/{claim}/{name}/{key}", value)
    for claim, injected in doc["inject"].items():
        prefix = f"inject/{claim}"
        put(f"{prefix}/injectError", injected.get("injectError", ""))
        put(f"{prefix}/specErrors", injected.get("specErrors", {}))
        put(f"{prefix}/devices", sorted(injected.get("devices", [])))
        for node in injected.get("linuxDevices", []):
            put(f"{prefix}/linuxDevices/{node['path']}", {k: node.get(k) for k in ("type", "major", "minor")})
        for mount in injected.get("mounts", []):
            put(f"{prefix}/mounts/{mount['destination']}",
                {"source": mount.get("source"), "type": mount.get("type"), "options": sorted(mount.get("options") or [])})
        for entry in injected.get("env", []):
            key, _, value = entry.partition("=")
            put(f"{prefix}/env/{key}", value)
        links = {}
        for stage, hooks in (injected.get("hooks") or {}).items():
            seen = {}
            for hook in hooks:
                args = hook.get("args") or []
                if args[1:2] == ["create-symlinks"]:
                    # What the container gets is the links, however they are split over hooks
                    # and whether a target is relative.
                    for i, arg in enumerate(args):
                        if i > 0 and args[i - 1] == "--link":
                            target, _, link = arg.partition("::")
                            links[link] = posixpath.normpath(posixpath.join(posixpath.dirname(link), target))
                    put(f"{prefix}/hooks/{stage}/create-symlinks/path", hook.get("path"))
                    continue
                key = " ".join([hook.get("path", "").rsplit("/", 1)[-1]] + args[1:2])
                seen[key] = seen.get(key, 0) + 1
                if seen[key] > 1:
                    key = f"{key}#{seen[key]}"
                put(f"{prefix}/hooks/{stage}/{key}/path", hook.get("path"))
                put(f"{prefix}/hooks/{stage}/{key}/args", args)
                put(f"{prefix}/hooks/{stage}/{key}/env", hook.get("env") or [])
        for link, target in links.items():
            # Followed through the other links to the file it ends at.
            for _ in range(10):
                if target not in links:
                    break
                target = links[target]
            put(f"{prefix}/links/{link}", target)
    def put_tree(path, value):
        if isinstance(value, dict) and value:
            for key, v in value.items():
                put_tree(f"{path}/{key}", v)
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for i, v in enumerate(value):
                put_tree(f"{path}/{i}", v)
        else:
            put(path, value)

    for claim, files in doc.get("metadata", {}).items():
        # The device metadata files' contents (KEP-5304), by where the container gets them.
        # A file holds a document per API version written: each compared with its version's.
        for destination, documents in files.items():
            for document in documents:
                document = dict(document)
                version = document.pop("apiVersion", "?")
                put_tree(f"metadata/{claim}/{destination}/{version}", document)
    for claim, status in doc["status"].items():
        for entry in status:
            name = f"{entry.get('pool')}/{entry.get('device')}"
            for key, value in entry.items():
                if key not in ("pool", "device", "driver"):
                    put(f"status/{claim}/{name}/{key}", value)
            put(f"status/{claim}/{name}", "present")
    for when, gpus in doc["hardware"].items():
        for gpu in gpus:
            for key, value in gpu.items():
                if key != "minor":
                    put(f"hardware/{when}/gpu{gpu['minor']}/{key}", value)
    for when, functions in doc.get("pci", {}).items():
        # Each PCI function's binding, and the VFIO nodes in the node's /dev.
        for key, value in functions.items():
            if isinstance(value, dict):
                for field, v in value.items():
                    put(f"pci/{when}/{key}/{field}", v)
            else:
                put(f"pci/{when}/{key}", value)
    for when, daemons in doc.get("mps", {}).items():
        # MPS control daemons, each by the devices it serves: what it was told.
        put(f"mps/{when}/daemons", len(daemons))
        for daemon in daemons:
            for key, value in daemon.items():
                if key != "devices":
                    put(f"mps/{when}/{','.join(daemon['devices'])}/{key}", value)
    put("left/cdi", doc["left"]["cdi"])
    for claim, error in doc.get("unprepare_errors", {}).items():
        put(f"unprepare/{claim}/first-call-error", error)
    return fields


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--explained", required=True)
    parser.add_argument("--driver-root", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("nvidia")
    parser.add_argument("ours")
    args = parser.parse_args()
    rules = []
    for line in open(args.explained):
        if not line.strip() or line.startswith("#"):
            continue
        path, side, values, why = line.rstrip("\n").split("\t")
        rules.append((re.compile(path), side, re.compile(values), why))
    nvidia_doc, ours_doc = json.load(open(args.nvidia)), json.load(open(args.ours))
    nvidia = flatten(nvidia_doc, args.driver_root, args.work)
    ours = flatten(ours_doc, args.driver_root, args.work)
    mismatches, explained, used = [], 0, {}
    for path in sorted(set(nvidia) | set(ours)):
        a, b = nvidia.get(path), ours.get(path)
        if a == b:
            continue
        side = "both" if a is not None and b is not None else ("nvidia" if a is not None else "ours")
        shown = [v for v in (a, b) if v is not None]
        rule = next((r for r in rules if r[0].fullmatch(path) and r[1] == side
                     and all(r[2].fullmatch(v) for v in shown)), None)
        if rule is None:
            mismatches.append(f"MISMATCH {path}: nvidia={a!r} ours={b!r}")
            continue
        explained += 1
        used.setdefault(rule[3], []).append(path)
    for why, paths in used.items():
        print(f"explained ({len(paths)}): {why} [e.g. {paths[0]}]")
    for line in mismatches:
        print(line)
    print(len(nvidia_doc["uids"]), len(set(nvidia) | set(ours)), explained)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
