#!/usr/bin/env python3
"""Prints the dashboard's "which pod holds which GPU slice" panel as a Markdown table, from a
/metrics sample (gpu_dra_prepared_device_info series).

Usage: metrics-table.py SAMPLE.prom
"""
import re
import sys

SERIES = re.compile(r'^gpu_dra_prepared_device_info\{(.*)\}\s+\S+$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

rows = []
with open(sys.argv[1]) as f:
    for line in f:
        m = SERIES.match(line.strip())
        if m:
            rows.append(dict(LABEL.findall(m.group(1))))
print("| claim | pods | device | GPU (UUID) | MIG device (GPU_I_PROFILE / GPU_I_ID) | sharing |")
print("|---|---|---|---|---|---|")
for r in sorted(rows, key=lambda r: (r.get("namespace", ""), r.get("claim", ""), r.get("dra_device", ""))):
    mig = f'{r["GPU_I_PROFILE"]} / {r["GPU_I_ID"]}' if r.get("GPU_I_PROFILE") else ""
    sharing = r.get("sharing", "") + (f' ({r["consumed"]})' if r.get("consumed") else "")
    print(f'| {r.get("namespace")}/{r.get("claim")} | {r.get("pods", "").replace(",", ", ")} | '
          f'{r.get("dra_device")} | {r.get("UUID", "")[:13]}… | {mig} | {sharing} |')
