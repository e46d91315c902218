# shellcheck shell=bash
# The driver as users install it, for the real-node scenarios (e2e/install.sh, pods.sh,
# rolling-update.sh): the driver image (e2e/build-image.sh, two tags of one build) imported into
# the real node's containerd and installed, restarted and upgraded through the Helm chart
# (deploy/helm/gpu-dra), with only values a user sets for such a node: simulated GPUs and their
# state file, the node's driver root, dev root, kubelet and CDI folders, and (chart_install's
# extra arguments) settings every flag also takes from the environment (`extraEnv`).
#
# Sourced after the script defines E2E, ROOT, WORK and log/fail; scripts that define no
# wait_for of their own get chart_wait_for's as wait_for.
# chart_wait_for DESCRIPTION TIMEOUT_SECONDS COMMAND...: until COMMAND succeeds, or fail.
chart_wait_for() {
    local what=$1 timeout=$2 deadline=$((SECONDS + $2))
    shift 2
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || fail "timed out after ${timeout}s waiting for: $what"
        sleep 0.3
    done
}
declare -F wait_for >/dev/null || wait_for() { chart_wait_for "$@"; }
CHART_NAMESPACE=gpu-dra
CHART_RELEASE=gpu-dra

# chart_build_images: helm, and the image archives (tags e2e-1, e2e-2; IMAGE_BINARY, optional,
# puts another gpu-dra build in them instead of the node profile's). Sets HELM, FIRST_ARCHIVE,
# FIRST_REF, SECOND_ARCHIVE, SECOND_REF, REPOSITORY, IMAGE_SIZE_BYTES.
chart_build_images() {
    HELM=$("$E2E/build-helm.sh" | tail -n 1)/helm
    local image_args=(--out "$WORK/image")
    [[ -z ${IMAGE_BINARY:-} ]] || image_args+=(--binary "$IMAGE_BINARY")
    eval "$("$E2E/build-image.sh" "${image_args[@]}" --tag e2e-1)"
    FIRST_ARCHIVE=$IMAGE_ARCHIVE FIRST_REF=$IMAGE_REF
    eval "$("$E2E/build-image.sh" "${image_args[@]}" --tag e2e-2)"
    SECOND_ARCHIVE=$IMAGE_ARCHIVE SECOND_REF=$IMAGE_REF
    REPOSITORY=${FIRST_REF%:*}
}

# chart_cluster_up [e2e/cluster up args...]: the control plane and the real node without a
# driver (the chart installs it), its pods reaching the API server through the Service. Only one
# real node per machine: waits (a while) for another cluster's node to go away.
chart_cluster_up() {
    local up_log=$WORK/up.log attempt
    for attempt in 1 2 3 4 5 6; do
        if "$E2E/cluster" up --real-node --no-driver --service-network "$@" >"$up_log" 2>&1; then return 0; fi
        if ((attempt < 6)) && grep -q 'gpu-dra-real-node.lock' "$up_log" && ! grep -q "$GPU_DRA_CLUSTER_DIR" "$up_log"; then
            log "another real node is running; retrying in 30s"
            "$E2E/cluster" down >/dev/null 2>&1 || true
            sleep 30
            continue
        fi
        sed 's/^/    /' "$up_log" >&2
        fail "the cluster with a real node did not start"
    done
}

# chart_import_images: both tags into the real node's containerd (after `e2e/cluster up`).
chart_import_images() {
    local archive
    for archive in "$FIRST_ARCHIVE" "$SECOND_ARCHIVE"; do
        "$E2E_CTR" --address "$E2E_CONTAINERD_ADDRESS" -n k8s.io images import "$archive" >/dev/null 2>>"$WORK/ctr.log" ||
            fail "ctr could not import $archive"
    done
    # Read whole before matching: `grep -q` leaving early would SIGPIPE ctr under pipefail.
    local refs
    refs=$("$E2E_CTR" --address "$E2E_CONTAINERD_ADDRESS" -n k8s.io images ls -q 2>>"$WORK/ctr.log") || true
    grep -qx "$FIRST_REF" <<<"$refs" || fail "containerd does not list $FIRST_REF after the import (it lists: $(tr '\n' ' ' <<<"$refs"))"
}

# chart_scrape [IP]: the driver pod's /metrics, read as Prometheus reads it under the chart's
# default metrics.auth=kubernetes: with a service account token allowed `get` on /metrics
# (created once: ServiceAccount e2e-scraper, its ClusterRole and binding). IP: the driver pod's
# address (default: $DRIVER_POD's).
chart_scrape() {
    local ip=${1:-}
    [[ -n $ip ]] || ip=$(kubectl get pod -n "$CHART_NAMESPACE" "$DRIVER_POD" -o jsonpath='{.status.podIP}')
    if [[ -z ${CHART_SCRAPE_TOKEN:-} ]]; then
        kubectl apply -f - >/dev/null <<'YAML'
apiVersion: v1
kind: ServiceAccount
metadata: {name: e2e-scraper, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: e2e-metrics-reader}
rules: [{nonResourceURLs: ["/metrics"], verbs: ["get"]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: e2e-metrics-reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: e2e-metrics-reader}
subjects: [{kind: ServiceAccount, name: e2e-scraper, namespace: default}]
YAML
        CHART_SCRAPE_TOKEN=$(kubectl create token e2e-scraper -n default --duration 2h)
    fi
    curl -sf -H "Authorization: Bearer $CHART_SCRAPE_TOKEN" "http://$ip:9400/metrics"
}

# chart_install REF [helm args...]: `helm install` of REF's tag, waiting for a ready release. The
# chart owns the DeviceClasses (the cluster applied deviceclasses/ for the other tests).
chart_install() {
    local ref=$1
    shift
    kubectl delete deviceclass --all >&2
    CHART_ARGS=(
        --namespace "$CHART_NAMESPACE" --create-namespace
        --set "image.repository=$REPOSITORY" --set image.pullPolicy=Never
        --set-string "gpus=${E2E_GPUS//,/\\,}" --set "mig=$E2E_MIG" --set "simState=$GPU_DRA_SIM_STATE"
        --set "nvidiaDriverRoot=$E2E_DRIVER_ROOT" --set "devRoot=$GPU_DRA_DEV_ROOT"
        --set "kubeletDir=$E2E_KUBELET_ROOT" --set "cdiRoot=$GPU_DRA_CDI_ROOT"
        "$@"
    )
    "$HELM" install "$CHART_RELEASE" "$ROOT/deploy/helm/gpu-dra" "${CHART_ARGS[@]}" --set "image.tag=${ref##*:}" \
        --wait --timeout 120s >&2 || fail "helm install did not reach a ready release"
}

# chart_upgrade REF [HELM ARGS...]: `helm upgrade` to REF's tag with chart_install's values
# (and these), waiting for the release to be ready.
chart_upgrade() {
    local ref=$1
    shift
    driver_logs_archive
    "$HELM" upgrade "$CHART_RELEASE" "$ROOT/deploy/helm/gpu-dra" "${CHART_ARGS[@]}" --set "image.tag=${ref##*:}" "$@" \
        --wait --timeout 180s >&2 || fail "helm upgrade did not reach a ready release"
}

# The DaemonSet's pods (not the ComputeDomain controller's).
driver_pods() { kubectl -n "$CHART_NAMESPACE" get pods -l "app.kubernetes.io/instance=$CHART_RELEASE,app.kubernetes.io/component!=compute-domain-controller" -o json; }

# driver_ready: the name of the DaemonSet's one pod that is not going away, once it is Ready.
driver_ready() {
    driver_pods | jq -e -r '[.items[] | select(.metadata.deletionTimestamp == null)] | select(length == 1) | .[0]
        | select(any(.status.conditions[]?; .type == "Ready" and .status == "True")) | .metadata.name'
}

# driver_log POD: what the pod's driver container printed (every restart of it).
driver_log() { cat "$E2E_POD_LOGS"/"$CHART_NAMESPACE"_"$1"_*/driver/*.log 2>/dev/null; }

# driver_logs_archive: a copy of every driver pod's logs, kept when the pod is gone (the kubelet
# removes a pod's logs with the pod).
driver_logs_archive() {
    local f
    for f in "$E2E_POD_LOGS"/"$CHART_NAMESPACE"_*/driver/*.log; do
        [[ -f $f ]] || continue
        # Copied whole each time, under the file's own name: the last copy of each wins.
        mkdir -p "$WORK/driver-pod-logs"
        cp "$f" "$WORK/driver-pod-logs/$(basename "$(dirname "$(dirname "$f")")")-$(basename "$f")" 2>/dev/null || true
    done
}

# driver_logs: everything every driver pod of this run printed.
driver_logs() {
    driver_logs_archive
    cat "$WORK"/driver-pod-logs/*.log 2>/dev/null || true
}

# driver_stop: `kubectl delete pod` of the driver pod, returning once it is gone (the DaemonSet
# is already starting another).
driver_stop() {
    local old
    old=$(driver_ready) || fail "no ready driver pod to restart"
    driver_logs_archive
    kubectl -n "$CHART_NAMESPACE" delete pod "$old" --wait=true --timeout 60s >&2 || fail "deleting driver pod $old"
}

# driver_wait_ready: waits for the DaemonSet's pod to be Ready; sets DRIVER_POD.
driver_wait_ready() {
    wait_for "a driver pod Ready" 90 driver_ready
    DRIVER_POD=$(driver_ready)
}

# driver_restart: what users see as a driver restart: the driver pod deleted, the DaemonSet's
# next one Ready. Sets DRIVER_POD.
driver_restart() {
    driver_stop
    driver_wait_ready
}

# report_mode TEXT: says (and, under e2e/run-tests, adds to the run's count lines) how this
# script ran the driver and how many checks passed.
report_mode() {
    log "mode: $1"
    [[ -z ${GPU_DRA_TEST_REPORT:-} ]] || echo "real node, $NAME: $passed checks passed; mode: $1" >>"$GPU_DRA_TEST_REPORT"
}
