#!/usr/bin/env bash
# e2e: the chart's monitoring (metrics.prometheusRule, metrics.dashboard), checked by Prometheus'
# own promtool (built from its Go module by e2e/build-helm.sh at PROMETHEUS_VERSION):
#
#   1. the rendered PrometheusRule's rules pass `promtool check rules`; every query of the
#      rendered Grafana dashboard parses (checked as recording rules);
#   2. `promtool test rules` on /metrics samples this run scraped from the driver
#      (GPU_DRA_METRICS_SAMPLES, written by e2e/health.sh and e2e/checkpoint.sh): an injected
#      XID 79 raises GpuDraXidErrors, GpuDraDeviceTainted and GpuDraGpuLost, an unusable
#      checkpoint GpuDraCheckpointUnusable; none of them fires on the healthy sample.
#
# No cluster: Prometheus itself evaluates the rules (e2e/alerts-tests.py writes the tests).
#
# Usage: GPU_DRA_METRICS_SAMPLES=DIR e2e/alerts.sh   (after e2e/health.sh and e2e/checkpoint.sh
#        ran with the same GPU_DRA_METRICS_SAMPLES; e2e/run-tests does this)
set -euo pipefail
E2E=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$E2E/.." && pwd)
NAME=alerts-e2e
passed=0
log() { echo "$NAME: $*" >&2; }
fail() { log "FAIL: $*"; echo "$passed passed, 1 failed"; exit 1; }
ok() { passed=$((passed + 1)); log "ok - $*"; }

SAMPLES=${GPU_DRA_METRICS_SAMPLES:-}
[[ -n $SAMPLES ]] || fail "GPU_DRA_METRICS_SAMPLES is not set: run e2e/health.sh and e2e/checkpoint.sh with it first"
for sample in healthy xid-79 checkpoint-unusable; do
    [[ -s $SAMPLES/$sample.prom ]] || fail "no metrics sample $SAMPLES/$sample.prom (from e2e/health.sh or e2e/checkpoint.sh)"
done
PROMTOOL=$("$E2E/build-helm.sh" promtool | tail -n 1)/promtool
HELM=$("$E2E/build-helm.sh" | tail -n 1)/helm
WORK=$(mktemp -d "/tmp/gpu-dra-$NAME.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# ---------------------------------------------------------------- 1. rules and dashboard queries
python3 "$ROOT/deploy/dashboard.py" --check || fail "the dashboard JSON is not deploy/dashboard.py's output"
"$HELM" template gpu-dra "$ROOT/deploy/helm/gpu-dra" --namespace gpu-dra \
    --set metrics.prometheusRule.enabled=true --set metrics.dashboard.enabled=true >"$WORK/chart.yaml" \
    || fail "helm template with the monitoring values"
python3 - "$WORK" <<'PYEOF' || fail "the rendered chart lacks the PrometheusRule or the dashboard"
import json, sys, yaml
work = sys.argv[1]
docs = [d for d in yaml.safe_load_all(open(f"{work}/chart.yaml")) if d]
rule = next(d for d in docs if d["kind"] == "PrometheusRule")
json.dump(rule["spec"], open(f"{work}/rules.json", "w"), indent=1)
board = next(d for d in docs if d["kind"] == "ConfigMap" and "gpu-dra.json" in d.get("data", {}))
dashboard = json.loads(board["data"]["gpu-dra.json"])
queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
# Grafana's variables, as Grafana substitutes them for "All".
rules = [{"record": f"dashboard:query_{i}", "expr": q.replace("$node", ".*")} for i, q in enumerate(queries)]
json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, open(f"{work}/dashboard-rules.json", "w"), indent=1)
PYEOF
out=$("$PROMTOOL" check rules "$WORK/rules.json" 2>&1) || fail "promtool check rules: $out"
alerts=$(jq '[.groups[].rules[] | select(.alert)] | length' "$WORK/rules.json")
queries=$(jq '.groups[0].rules | length' "$WORK/dashboard-rules.json")
out=$("$PROMTOOL" check rules "$WORK/dashboard-rules.json" 2>&1) || fail "a dashboard query does not parse: $out"
ok "promtool check rules: the chart's $alerts alerts and the dashboard's $queries queries are valid PromQL"

# ---------------------------------------------------------------- 2. the alerts on this run's metrics
python3 "$E2E/alerts-tests.py" "$WORK/rules.json" "$SAMPLES" >"$WORK/tests.json" || fail "cannot build the alert tests from the samples"
out=$(cd "$WORK" && "$PROMTOOL" test rules tests.json 2>&1) || fail "promtool test rules: $out"
fired=$(jq -r '[.tests[].alert_rule_test[] | select(.eval_time == "15m" and (.exp_alerts | length) > 0) | "\(.alertname) ×\(.exp_alerts | length)"] | join(", ")' "$WORK/tests.json")
ok "promtool test rules on the scraped samples: $fired fire on the faults, nothing on the healthy node"
echo "$passed passed, 0 failed"
