# shellcheck shell=bash
# The driver's /metrics for later checks; sourced by e2e/lib.sh and e2e/pods.sh (after `fail`).

# A free local TCP port, for a driver's --metrics-addr.
metrics_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# save_metrics_sample NAME URL: with GPU_DRA_METRICS_SAMPLES set, keeps the driver's /metrics as
# NAME.prom there (e2e/alerts.sh tests the chart's alert rules on them; e2e/run-tests prints the
# real node's as the dashboard's table).
save_metrics_sample() {
    [[ -n ${GPU_DRA_METRICS_SAMPLES:-} ]] || return 0
    mkdir -p "$GPU_DRA_METRICS_SAMPLES"
    curl -sf "$2" >"$GPU_DRA_METRICS_SAMPLES/$1.prom" || fail "cannot scrape $2 for the metrics sample $1"
}
