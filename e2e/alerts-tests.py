#!/usr/bin/env python3
"""Writes a `promtool test rules` file for the chart's alerts from /metrics samples the e2e run
scraped (e2e/health.sh: before and after an XID 79; e2e/checkpoint.sh: a refusing driver).

Each test feeds Prometheus a baseline sample for 10 minutes and then the fault sample, as a
PodMonitor would scrape them (every series gains the target's namespace and pod labels). The
expected alerts are derived from the samples by the rules' meaning, written out below, so the
test fails when a rule does not fire for a fault the driver reported (or fires on a healthy
node).

Usage: alerts-tests.py RULES.json SAMPLES_DIR > tests.yaml   (RULES.json: the rendered
PrometheusRule's spec, as JSON; promtool reads JSON as YAML.)
"""
import json
import re
import sys

NAMESPACE, POD = "gpu-dra", "gpu-dra-x7k2p"
BASELINE_MINUTES, FAULT_MINUTES = 10, 30
# Evaluated 5 minutes into the fault: inside every rule's window, past every `for`.
FAULT_EVAL, BASELINE_EVAL = "15m", "5m"

SERIES = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def read_sample(path):
    """{series text with the target labels: (name, labels dict, value)}"""
    series = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            m = SERIES.match(line)
            if not m:
                sys.exit(f"{path}: not a sample line: {line!r}")
            name, body, value = m.group(1), m.group(3) or "", float(m.group(4))
            labels = {"namespace": NAMESPACE, "pod": POD}
            labels.update(dict(LABEL.findall(body)))
            text = name + "{" + ",".join(
                f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
            series[text] = (name, labels, value)
    return series


def values(baseline, fault):
    """promtool's value string: the baseline value (or `_`, absent) then the fault's."""
    fmt = lambda v: "_" if v is None else repr(v)
    return " ".join([fmt(baseline)] * BASELINE_MINUTES + [fmt(fault)] * FAULT_MINUTES)


def expected(rules, alert, matches, by, series):
    """The alerts `alert` must raise: one per distinct `by` label set of the matching series."""
    rule = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == alert)
    seen = {}
    for name, labels, value in series:
        if not matches(name, labels, value):
            continue
        key = tuple(labels.get(k, "") for k in by)
        out = {k: v for k, v in zip(by, key) if v != ""}
        out.update(rule.get("labels", {}))
        annotations = {
            k: re.sub(r"\{\{ \$labels\.([a-zA-Z_]+) \}\}", lambda m: labels.get(m.group(1), ""), v)
            for k, v in rule.get("annotations", {}).items()
        }
        seen[key] = {"exp_labels": out, "exp_annotations": annotations}
    return [seen[k] for k in sorted(seen)]


def test(rules, baseline, fault, checks):
    inputs = [
        {"series": text, "values": values(
            baseline[text][2] if text in baseline else None,
            fault[text][2] if text in fault else None)}
        for text in sorted(set(baseline) | set(fault))
    ]
    alert_tests = []
    for alert, matches, by in checks:
        for at, sample in [(BASELINE_EVAL, baseline), (FAULT_EVAL, fault)]:
            alert_tests.append({
                "eval_time": at, "alertname": alert,
                "exp_alerts": expected(rules, alert, matches, by, sample.values())})
    return {"interval": "1m", "input_series": inputs, "alert_rule_test": alert_tests}


def main():
    rules_path, samples = sys.argv[1], sys.argv[2]
    with open(rules_path) as f:
        rules = json.load(f)
    xid_rule = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "GpuDraXidErrors")
    ignored = re.search(r'xid!~"\^\(([^)]*)\)\$"', xid_rule["expr"]).group(1).split("|")
    healthy = read_sample(f"{samples}/healthy.prom")
    xid = read_sample(f"{samples}/xid-79.prom")
    unusable = read_sample(f"{samples}/checkpoint-unusable.prom")
    before_xid = {labels.get("xid"): value for name, labels, value in healthy.values()
                  if name == "gpu_dra_gpu_xid_errors_total"}
    fault_checks = [
        ("GpuDraDeviceTainted", lambda n, l, v: n == "gpu_dra_device_taint" and v > 0,
         ["namespace", "pod", "device", "key", "effect"]),
        ("GpuDraGpuLost", lambda n, l, v: n == "gpu_dra_device_taint" and v > 0
         and l.get("key") == "gpu.nvidia.com/gpu-lost", ["namespace", "pod", "device"]),
        # XIDs not ignored that are new or grew since the baseline.
        ("GpuDraXidErrors", lambda n, l, v: n == "gpu_dra_gpu_xid_errors_total"
         and l.get("xid") not in ignored and v > before_xid.get(l.get("xid"), 0),
         ["namespace", "pod", "gpu", "xid"]),
    ]
    checkpoint_checks = [
        ("GpuDraCheckpointUnusable", lambda n, l, v: n == "gpu_dra_checkpoint_unusable" and v > 0,
         ["namespace", "pod"]),
    ]
    document = {
        "rule_files": [rules_path],
        "evaluation_interval": "1m",
        "tests": [test(rules, healthy, xid, fault_checks),
                  test(rules, healthy, unusable, checkpoint_checks)],
    }
    # Every fault must raise something, or the samples did not show it.
    for t, alert in [(0, "GpuDraXidErrors"), (0, "GpuDraGpuLost"), (1, "GpuDraCheckpointUnusable")]:
        raised = [a for a in document["tests"][t]["alert_rule_test"]
                  if a["alertname"] == alert and a["eval_time"] == FAULT_EVAL and a["exp_alerts"]]
        if not raised:
            sys.exit(f"the samples show no fault for {alert}: check {samples}")
    json.dump(document, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
