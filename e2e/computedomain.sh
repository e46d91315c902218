#!/usr/bin/env bash
# ComputeDomains (compute-domain.nvidia.com) on a simulated GB200 NVL72 rack.
#
# The real node (kubelet, containerd, runc) runs the driver image through the Helm chart with
# computeDomains.enabled: the DaemonSet's pod serves both plugins (kubelet calls the channel
# plugin through its socket), the chart's Deployment runs the ComputeDomain controller, and the
# chart installs the CRD and NVIDIA's classes. Four more GB200 nodes are simulated: Node objects,
# each with `gpu-dra run --compute-domains` as a host process, kubelet's side played by
# kubelet-sim over each node's plugin socket; their pods are scheduled and their claims
# allocated by the real scheduler, but no container starts there (what a container would get is
# their CDI spec). Every node has a fake nvidia-imex in its driver root: a daemon that connects
# to the addresses of its node file over loopback (each node its own 127.0.0.x) and answers
# nvidia-imex-ctl. cd-b, cd-d, cd-e share the real node's NVLink clique; cd-c is in another.
#
#   1. NVIDIA's imex/channel-injection.yaml (image swapped): the pod runs on the real node and
#      lists /dev/nvidia-caps-imex-channels/channel0; the domain is Ready with the node; then
#      channel-injection-all.yaml (allocationMode: All): 2048 channels. Deleting each leaves no
#      template, claim or IMEX daemon.
#   2. NVIDIA's nvbandwidth-test-job.yaml: its ComputeDomain (numNodes: 4) as is; the MPIJob needs
#      the MPI operator and NVIDIA's sample image, neither of which this machine has, so the test
#      makes the operator's four worker pods from the job's Worker template (image and sshd
#      command swapped for a shell that lists the channels). One worker per node (channel 0 is
#      one per node); each prepare waits until all four IMEX daemons joined; the real node's
#      worker runs with channel0; four daemons, each connected to its three peers; Ready.
#      A helm upgrade under the same worker: the same daemon, the domain Ready, and the node's
#      clique label kept when the old pod goes.
#   3. A worker on cd-c (another clique) never joins: its prepare fails naming the clique, with
#      a WaitingForComputeDomain event, and no daemon of the domain lists cd-c. The fabric moves
#      cd-c to the first clique and back: its channel's cliqueID and its nvidia.com/gpu.clique
#      label (--gpu-clique-label; the chart's plugin labels the real node) follow; stopped, its
#      label goes. Then host-managed IMEX on cd-c.
#   4. kill -9: of cd-b's plugin right after it started its IMEX daemon, and of the controller
#      (the chart's scaled to 0, a host process with a failpoint instead) right after it made a
#      template: each restarted one finishes, nothing is duplicated or left.
#      The daemons talk mutual TLS with the domain's certificate (a Secret the controller makes):
#      openssl s_client holding it gets an answer, holding another authority's or plain TCP none;
#      commands go to a socket in the domain's folder, no port.
#   5. Everything deleted: no IMEX daemon, node entry, CDI spec, claim, template or IMEX
#      credentials are left.
set -euo pipefail
E2E=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$E2E")
cd "$ROOT"
NAME=computedomain
WORK=$(mktemp -d /tmp/gpu-dra-cd.XXXXXX)
# shellcheck source=chart.sh
source "$E2E/chart.sh"
# shellcheck source=metrics-sample.sh
source "$E2E/metrics-sample.sh"
export GPU_DRA_CLUSTER_DIR=$WORK/cluster
passed=0
T0=$SECONDS
GPUS=sim:4xGB200-186GB
SIM_NODES=(cd-b cd-c cd-d cd-e)
declare -A IP=([cd-b]=127.0.0.12 [cd-c]=127.0.0.13 [cd-d]=127.0.0.14 [cd-e]=127.0.0.15) PID=()
CONTROLLER_PID=

log() { echo "$NAME: $*" >&2; }
ok() { passed=$((passed + 1)); log "ok - $* ($((SECONDS - T0))s)"; }
fail() {
    log "FAIL: $*"
    if [[ -n ${KUBECONFIG:-} ]]; then
        kubectl get pods,resourceclaims,computedomains -A -o wide 2>&1 | sed 's/^/    /' >&2 || true
        kubectl get events -A --sort-by=.lastTimestamp 2>/dev/null | tail -n 15 | sed 's/^/    /' >&2 || true
    fi
    [[ -n ${E2E_POD_LOGS:-} ]] && { log "driver pods' logs (tail):"; driver_logs | cut -d' ' -f4- | tail -n 20 | cut -c1-300 | sed 's/^/    /' >&2; }
    local f
    for f in "$WORK"/controller.log "$WORK"/nodes/*/driver.log; do
        [[ -f $f ]] && { log "$f (tail):"; tail -n 12 "$f" | cut -c1-300 | sed 's/^/    /' >&2; }
    done
    echo "$passed passed, 1 failed"
    exit 1
}
imex_ask() { # SOCKET REQUEST: the fake daemon's answer on its command socket (its protocol)
    # Reached from its folder: the full path may pass a socket address's 108 bytes.
    python3 -c 'import os, socket, sys
os.chdir(os.path.dirname(sys.argv[1]))
s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(os.path.basename(sys.argv[1])); s.sendall(sys.argv[2].encode() + b"\n")
print(s.makefile().read(), end="")' "$1" "$2"
}
imex_daemons() { # the fake IMEX daemons of this run (chrooted into one of its driver roots)
    local p
    for p in $(pgrep -f "nvidia-imex -c" || true); do
        [[ $(readlink "/proc/$p/root" 2>/dev/null) == "$WORK"/* ]] && echo "$p"
    done
    true
}
no_imex_daemons() { [[ -z $(imex_daemons) ]]; }
cleanup() {
    local n p
    for n in "${!PID[@]}"; do kill -TERM "${PID[$n]}" 2>/dev/null || true; done
    [[ -z $CONTROLLER_PID ]] || kill "$CONTROLLER_PID" 2>/dev/null || true
    wait 2>/dev/null || true
    for p in $(imex_daemons); do kill -KILL "$p" 2>/dev/null || true; done
    # The real node's plugin restarts its daemons until the cluster is down (which kills them).
    "$E2E/cluster" down >/dev/null 2>&1 || true
    for p in $(imex_daemons); do kill -KILL "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT
set -E
trap 'fail "line $LINENO: unexpected failure of: $BASH_COMMAND"' ERR

export GPU_DRA=${GPU_DRA:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/gpu-dra}
[[ -x $GPU_DRA ]] || (cd "$ROOT" && cargo build --bin gpu-dra) >&2
IMEX=${CARGO_TARGET_DIR:-$ROOT/target}/debug/nvidia-imex
[[ -x $IMEX ]] || (cd "$ROOT" && cargo build -q -p fakenvml --bin nvidia-imex) >&2
BIN=${GPU_DRA_K8S_BIN:-$("$E2E/build-k8s.sh" | tail -n 1)}
export GPU_DRA_K8S_BIN=$BIN PATH="$BIN:$PATH"
chart_build_images
chart_cluster_up --gpus "$GPUS" --nodes "$(IFS=,; echo "${SIM_NODES[*]}")"
eval "$("$E2E/cluster" env)"
log "cluster up ($((SECONDS - T0))s)"
chart_import_images
# The simulated nodes have no kubelet: the chart's pods go to the real node only.
chart_install "$FIRST_REF" --set computeDomains.enabled=true --set computeDomains.gpuCliqueLabel=true \
    --set-json 'nodeSelector={"gpu-dra.e2e/real-node":"true"}' \
    --set-json 'computeDomains.controller.nodeSelector={"gpu-dra.e2e/real-node":"true"}' \
    --set-json 'extraEnv=[{"name":"GPU_DRA_GC_INTERVAL","value":"2s"},{"name":"GPU_DRA_RESYNC_INTERVAL","value":"5s"}]'
wait_for "the ComputeDomain controller" 60 bash -c "kubectl -n $CHART_NAMESPACE get deploy -l app.kubernetes.io/instance=$CHART_RELEASE -o json | jq -e '.items[0].status.readyReplicas == 1'"
REAL_STATE=$E2E_KUBELET_ROOT/plugins/compute-domain.nvidia.com
# The chart gives the plugin the pod's hostIP: the real node's InternalIP.
REAL_IP=$(kubectl get node "$E2E_NODE" -o json | jq -r '.status.addresses[] | select(.type == "InternalIP") | .address')
IP[$E2E_NODE]=$REAL_IP
log "chart installed with computeDomains.enabled ($((SECONDS - T0))s)"

# ---------------------------------------------------------------- simulated nodes
node_dir() { echo "$WORK/nodes/$1"; }
setup_node() {
    local n=$1 d
    d=$(node_dir "$n")
    mkdir -p "$d"
    "$GPU_DRA" sim --gpus "$GPUS" --node-name "$n" --sim-state "$d/hw.json" driver-root "$d/driver-root" >/dev/null
    install -m 0755 "$IMEX" "$d/driver-root/usr/bin/nvidia-imex"
    install -m 0755 "$IMEX" "$d/driver-root/usr/bin/nvidia-imex-ctl"
}
cd_kubelet() { local n=$1; shift; kubelet-sim --registration-socket "$(node_dir "$n")/registry/compute-domain.nvidia.com-reg.sock" --expect-name compute-domain.nvidia.com --timeout 45s "$@"; } # the kubelet's own deadline
start_node() { # node [ENV=VALUE ...]
    local n=$1 d
    shift
    d=$(node_dir "$n")
    env RUST_LOG=info "$@" "$GPU_DRA" run ${NODE_ARGS:-} --node-name "$n" --gpus "$GPUS" --sim-state "$d/hw.json" \
        --nvidia-driver-root "$d/driver-root" --kubeconfig "$KUBECONFIG" \
        --registrar-dir "$d/registry" --plugin-dir "$d/plugin" --kubelet-plugins-directory-path "$d/plugins" \
        --cdi-root "$d/cdi" --state-dir "$d/state" --compute-domains --node-ip "${IP[$n]}" \
        --imex-credentials-namespace "$CHART_NAMESPACE" \
        --compute-domain-ready-timeout 20s --gc-interval 2s --resync-interval 5s >>"$d/driver.log" 2>&1 &
    PID[$n]=$!
    local _
    for _ in $(seq 100); do
        kill -0 "${PID[$n]}" 2>/dev/null || fail "$n: the driver exited at start"
        [[ -S $d/registry/compute-domain.nvidia.com-reg.sock ]] && cd_kubelet "$n" register >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    fail "$n: the ComputeDomain plugin did not register"
}
stop_node() { kill -TERM "${PID[$1]}" 2>/dev/null || true; wait "${PID[$1]}" 2>/dev/null || true; unset "PID[$1]"; }
for n in "${SIM_NODES[@]}"; do setup_node "$n"; done
"$GPU_DRA" sim --gpus "$GPUS" --node-name cd-c --sim-state "$(node_dir cd-c)/hw.json" \
    fabric --cluster-uuid 7f1f1a8e-5b7d-4c1e-9a34-0c2e6d0b7201 --clique-id 2
CLIQUE1=7f1f1a8e-5b7d-4c1e-9a34-0c2e6d0b7201.1 CLIQUE2=7f1f1a8e-5b7d-4c1e-9a34-0c2e6d0b7201.2

# ---------------------------------------------------------------- helpers
# nvidia FILE: NVIDIA's spec with the local image (its pull policy as is: the image is local).
nvidia() { sed -e "s|image: .*|image: $E2E_IMAGE|" "$E2E/pods/nvidia/$1"; }
claim_of() { kubectl get pod "$1" -o json | jq -r '.status.resourceClaimStatuses[0].resourceClaimName // empty'; }
claim_ref() { local c; c=$(claim_of "$1"); echo "default/$c/$(kubectl get resourceclaim "$c" -o jsonpath='{.metadata.uid}')"; }
pod_node() { kubectl get pod "$1" -o jsonpath='{.spec.nodeName}'; }
domain_status() { kubectl get computedomain "$1" -o jsonpath='{.status.status}'; }
pod_log() { cat "$E2E_POD_LOGS"/default_"$1"_*/*/*.log 2>/dev/null | cut -d" " -f4-; } # without the CRI prefix
cd_specs() { ls "$GPU_DRA_CDI_ROOT"/k8s.compute-domain.nvidia.com-* "$WORK"/nodes/*/cdi/k8s.compute-domain.nvidia.com-* 2>/dev/null || true; }

# ---------------------------------------------------------------- 1. channel injection
nvidia channel-injection.yaml | kubectl apply -f - >/dev/null
wait_for "imex-channel-injection Running" 90 bash -c "[[ \$(kubectl get pod imex-channel-injection -o jsonpath='{.status.phase}') == Running ]]"
[[ $(pod_node imex-channel-injection) == "$E2E_NODE" ]] || fail "imex-channel-injection went to $(pod_node imex-channel-injection)"
wait_for "the pod's listing" 20 bash -c "grep -q channel0 $E2E_POD_LOGS/default_imex-channel-injection_*/*/*.log"
listing=$(pod_log imex-channel-injection)
grep -qE '^c.* channel0$' <<<"$listing" || fail "no character device channel0 in the pod's /dev/nvidia-caps-imex-channels: $listing"
[[ $(domain_status imex-channel-injection) == Ready ]] || fail "imex-channel-injection is $(domain_status imex-channel-injection)"
nodes=$(kubectl get computedomain imex-channel-injection -o json | jq -c '[.status.nodes[] | [.name, .ipAddress, .cliqueID, .status]]')
[[ $nodes == "[[\"$E2E_NODE\",\"$REAL_IP\",\"$CLIQUE1\",\"Ready\"]]" ]] || fail "status.nodes: $nodes"
[[ $(imex_daemons | wc -l) == 1 ]] || fail "IMEX daemons: $(imex_daemons | wc -l), want 1"
ok "NVIDIA's channel-injection.yaml: the pod runs on the real node with /dev/nvidia-caps-imex-channels/channel0; the domain is Ready with the node (its host address and clique); one IMEX daemon"
kubectl delete -f <(nvidia channel-injection.yaml) --wait=true --timeout 60s >/dev/null
wait_for "the IMEX daemon stopped" 30 no_imex_daemons
wait_for "the template gone" 30 bash -c "! kubectl get resourceclaimtemplate imex-channel-0"
[[ -z $(kubectl get resourceclaims -o name) ]] || fail "claims left: $(kubectl get resourceclaims -o name)"
[[ -z $(cd_specs) ]] || fail "CDI specs left: $(cd_specs)"
ok "deleting it: pod, claim, template and domain gone, the IMEX daemon stopped, no CDI spec left"

nvidia channel-injection-all.yaml | kubectl apply -f - >/dev/null
wait_for "imex-channel-injection-all Running" 90 bash -c "[[ \$(kubectl get pod imex-channel-injection-all -o jsonpath='{.status.phase}') == Running ]]"
wait_for "the pod's listing" 20 bash -c "grep -q channel2047 $E2E_POD_LOGS/default_imex-channel-injection-all_*/*/*.log"
count=$(pod_log imex-channel-injection-all | grep -cE '^c.* channel[0-9]+$')
[[ $count == 2048 ]] || fail "imex-channel-injection-all sees $count channels, want 2048"
ok "NVIDIA's channel-injection-all.yaml (allocationMode: All): the pod sees all 2048 channels"
kubectl delete -f <(nvidia channel-injection-all.yaml) --wait=true --timeout 60s >/dev/null
wait_for "the all-channels domain gone" 30 bash -c "! kubectl get computedomain imex-channel-injection-all"
wait_for "its IMEX daemon stopped" 30 no_imex_daemons

# ---------------------------------------------------------------- 2. nvbandwidth workers
for n in cd-b cd-d cd-e; do start_node "$n"; done
wait_for "channel-0 on the real node and cd-b, cd-d, cd-e" 30 bash -c \
    '[[ $(kubectl get resourceslices -o json | jq "[.items[] | select(.spec.driver==\"compute-domain.nvidia.com\")] | length") == 4 ]]'
cliques=$(kubectl get resourceslices -o json | jq -c '[.items[] | select(.spec.driver == "compute-domain.nvidia.com") | .spec.devices[0].attributes.cliqueID.string] | unique')
[[ $cliques == "[\"$CLIQUE1\"]" ]] || fail "channel-0's cliqueID attributes: $cliques"
# computeDomains.gpuCliqueLabel: the chart's plugin labels the real node; the host-process nodes
# run without --gpu-clique-label and get none.
node_clique_label() { kubectl get node "$1" -o json | jq -r '.metadata.labels["nvidia.com/gpu.clique"] // empty'; }
export -f node_clique_label
wait_for "the real node's nvidia.com/gpu.clique label" 30 bash -c "[[ \$(node_clique_label $E2E_NODE) == $CLIQUE1 ]]"
[[ -z $(node_clique_label cd-b) ]] || fail "cd-b got a clique label without --gpu-clique-label"
ok "computeDomains.gpuCliqueLabel: the real node carries nvidia.com/gpu.clique=$CLIQUE1 (set by the chart's plugin); a node without the flag carries none"
job=$(sed -n '/^kind: MPIJob/,$p' "$E2E/pods/nvidia/nvbandwidth-test-job.yaml" | sed '1i apiVersion: kubeflow.org/v2beta1' | python3 -c 'import sys, yaml, json; print(json.dumps(yaml.safe_load(sys.stdin)))')
# The ComputeDomain exactly as the file has it.
python3 -c 'import sys, yaml
for d in yaml.safe_load_all(open(sys.argv[1])):
    if d and d["kind"] == "ComputeDomain": print(yaml.safe_dump(d))' "$E2E/pods/nvidia/nvbandwidth-test-job.yaml" | kubectl apply -f - >/dev/null
replicas=$(jq -r '.spec.mpiReplicaSpecs.Worker.replicas' <<<"$job")
[[ $replicas == 4 ]] || fail "the job's workers: $replicas"
# The MPI operator's worker pods: <job>-worker-<i> from the Worker template; image swapped, and
# sshd (not in the local image) swapped for a shell that lists the channels and waits.
for i in $(seq 0 $((replicas - 1))); do
    jq --arg img "$E2E_IMAGE" --arg i "$i" '{apiVersion: "v1", kind: "Pod",
        metadata: {name: ("nvbandwidth-test-worker-" + $i), labels: .spec.mpiReplicaSpecs.Worker.template.metadata.labels},
        spec: (.spec.mpiReplicaSpecs.Worker.template.spec
            | .containers[0].image = $img
            | .containers[0].command = ["sh", "-c"]
            | .containers[0].args = ["ls -la /dev/nvidia-caps-imex-channels; trap \"exit 0\" TERM; sleep 9999 & wait"]
            | del(.containers[0].env))}' <<<"$job" | kubectl apply -f - >/dev/null
done
workers=()
for i in $(seq 0 $((replicas - 1))); do workers+=("nvbandwidth-test-worker-$i"); done
all_allocated() { local w; for w in "${workers[@]}"; do [[ -n $(pod_node "$w") && -n $(claim_of "$w") ]] || return 1; done; }
wait_for "four workers scheduled with their claims" 60 all_allocated
declare -A placed=()
for w in "${workers[@]}"; do placed[$(pod_node "$w")]=$w; done
((${#placed[@]} == 4)) || fail "workers share nodes: $(for w in "${workers[@]}"; do printf '%s ' "$w=$(pod_node "$w")"; done)"
[[ -n ${placed[$E2E_NODE]:-} && -n ${placed[cd-b]:-} && -n ${placed[cd-d]:-} && -n ${placed[cd-e]:-} ]] || fail "workers not on the four clique-1 nodes: ${!placed[*]}"
# The simulated nodes' kubelets, all at once; the real node's kubelet does its own.
sim_pids=()
for n in cd-b cd-d cd-e; do
    cd_kubelet "$n" prepare --claim "$(claim_ref "${placed[$n]}")" >"$WORK/prep-$n.json" &
    sim_pids+=($!)
done
for p in "${sim_pids[@]}"; do wait "$p" || fail "kubelet-sim prepare failed: $(cat "$WORK"/prep-*.json)"; done
for n in cd-b cd-d cd-e; do
    err=$(jq -r '.claims[0].error // empty' "$WORK/prep-$n.json")
    [[ -z $err ]] || fail "$n: $err"
    id=$(jq -r '.claims[0].devices[0].cdi_device_ids[0]' "$WORK/prep-$n.json")
    spec=$(cat "$(node_dir "$n")"/cdi/k8s.compute-domain.nvidia.com-claim_*.json)
    [[ $id == k8s.compute-domain.nvidia.com/claim=*-channel-0 &&
       $(jq -r '.devices[0].containerEdits.deviceNodes | map(.path) | join(",")' <<<"$spec") == /dev/nvidia-caps-imex-channels/channel0 ]] ||
        fail "$n: CDI device $id, spec $spec"
done
real_worker=${placed[$E2E_NODE]}
wait_for "$real_worker Running" 90 bash -c "[[ \$(kubectl get pod $real_worker -o jsonpath='{.status.phase}') == Running ]]"
wait_for "$real_worker's listing" 20 bash -c "grep -q channel0 $E2E_POD_LOGS/default_${real_worker}_*/*/*.log"
ok "nvbandwidth-test-job.yaml's ComputeDomain and four workers from its Worker template: one per node, every prepare returned channel 0 once all four IMEX daemons had joined; the real node's worker runs with channel0"
[[ $(imex_daemons | wc -l) == 4 ]] || fail "IMEX daemons: $(imex_daemons | wc -l), want 4"
nvb_uid=$(kubectl get computedomain nvbandwidth-test-compute-domain -o jsonpath='{.metadata.uid}')
for n in "$E2E_NODE" cd-b cd-d cd-e; do
    # Peers connect asynchronously after each daemon starts: wait for the mesh, up to a deadline.
    deadline=$((SECONDS + 30))
    sock=$REAL_STATE/domains/$nvb_uid/cmd.sock
    [[ $n == "$E2E_NODE" ]] || sock=$(node_dir "$n")/state/compute-domains/domains/$nvb_uid/cmd.sock
    while peers=$(imex_ask "$sock" NODES 2>&1) || true
        [[ $(grep -c ' CONNECTED$' <<<"$peers") != 3 ]]; do
        ((SECONDS < deadline)) || fail "$n's IMEX daemon is not connected to its three peers within 30 s: $peers"
        sleep 0.5
    done
done
wait_for "nvbandwidth-test-compute-domain Ready" 20 bash -c "[[ \$(kubectl get computedomain nvbandwidth-test-compute-domain -o jsonpath='{.status.status}') == Ready ]]"
nodes=$(kubectl get computedomain nvbandwidth-test-compute-domain -o json | jq -c '[.status.nodes[] | [.name, .ipAddress, .status]] | sort')
[[ $nodes == "[[\"cd-b\",\"127.0.0.12\",\"Ready\"],[\"cd-d\",\"127.0.0.14\",\"Ready\"],[\"cd-e\",\"127.0.0.15\",\"Ready\"],[\"$E2E_NODE\",\"$REAL_IP\",\"Ready\"]]" ]] ||
    fail "status.nodes: $nodes"
ok "four IMEX daemons, one per node, each connected to its three peers; status.nodes lists the four Ready and the domain is Ready"

# Who may talk to the daemons: peers only with the domain's certificate (mutual TLS, from the
# Secret the controller made for the domain), commands only on the domain folder's socket.
# openssl's s_client is the probe (another TLS implementation than the daemons').
secret=gpu-dra-imex-$nvb_uid
kubectl -n "$CHART_NAMESPACE" get secret "$secret" -o json >"$WORK/secret.json" || fail "no Secret $CHART_NAMESPACE/$secret for the domain's IMEX credentials"
for f in ca.crt tls.crt tls.key; do jq -r --arg f "$f" '.data[$f]' "$WORK/secret.json" | base64 -d >"$WORK/domain-$f"; done
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj /CN=compute-domain-daemon \
    -addext subjectAltName=DNS:compute-domain-daemon -keyout "$WORK/other.key" -out "$WORK/other.crt" 2>/dev/null
probe_tls() { # IP CERT KEY: what the daemon answers a HELLO over TLS with that client certificate
    echo "HELLO probe" | timeout 3 openssl s_client -connect "$1:50000" -cert "$2" -key "$3" -CAfile "$WORK/domain-ca.crt" \
        -servername compute-domain-daemon -verify_return_error -quiet 2>&1 || true
}
for n in "$E2E_NODE" cd-b; do
    ip=${IP[$n]}
    said=$(probe_tls "$ip" "$WORK/domain-tls.crt" "$WORK/domain-tls.key")
    grep -q "^HELLO $ip" <<<"$said" || fail "$n's IMEX daemon does not answer a client holding the domain's certificate: $said"
    said=$(probe_tls "$ip" "$WORK/other.crt" "$WORK/other.key")
    ! grep -q "^HELLO" <<<"$said" || fail "$n's IMEX daemon answered a client with another authority's certificate: $said"
    said=$(timeout 3 bash -c "exec 3<>/dev/tcp/$ip/50000; echo 'HELLO probe' >&3; head -c 200 <&3 | tr -d '\\0'" 2>&1 || true)
    ! grep -q "HELLO" <<<"$said" || fail "$n's IMEX daemon answered a plain TCP client: $said"
    ! timeout 2 bash -c "exec 3<>/dev/tcp/$ip/50005" 2>/dev/null || fail "$n's IMEX daemon takes commands on $ip:50005"
done
ok "IMEX daemons talk mutual TLS with the domain's certificate (Secret $CHART_NAMESPACE/$secret): a client holding it gets an answer; one with another authority's certificate, or plain TCP, does not; no command port"

# The driver pod deleted under the running worker (what users see as a driver restart): the
# real node's IMEX daemon is the same process before and after, the worker keeps running, and the
# new pod's plugin finds the domain it serves.
real_daemon() { imex_daemons | while read -r p; do if [[ $(readlink "/proc/$p/root") == "$E2E_DRIVER_ROOT" ]]; then echo "$p"; fi; done; }
before=$(real_daemon)
[[ -n $before ]] || fail "no IMEX daemon on the real node"
registrations=$(grep -c 'Registered DRA plugin.*compute-domain.nvidia.com' "$GPU_DRA_CLUSTER_DIR/logs/kubelet.log")
driver_restart
[[ $(real_daemon) == "$before" ]] || fail "the real node's IMEX daemon changed across the driver restart: $before -> $(real_daemon)"
[[ $(kubectl get pod "$real_worker" -o jsonpath='{.status.phase}') == Running ]] || fail "$real_worker stopped across the driver restart"
wait_for "the new driver pod's plugin registered" 30 bash -c "(( \$(grep -c 'Registered DRA plugin.*compute-domain.nvidia.com' $GPU_DRA_CLUSTER_DIR/logs/kubelet.log) > $registrations ))"
sleep 3 # two of the plugin's rounds (GPU_DRA_GC_INTERVAL=2s)
[[ $(kubectl get computedomain nvbandwidth-test-compute-domain -o jsonpath='{.status.status}') == Ready ]] || fail "the domain is not Ready after the driver restart"
[[ $(real_daemon) == "$before" ]] || fail "the restarted plugin replaced the real node's IMEX daemon"
ok "driver pod deleted under the running worker: the real node's IMEX daemon ($before) outlives it, the worker keeps running, the new pod's plugin keeps the domain Ready with the same daemon"

# A seamless helm upgrade under the running worker: the new pod runs the channel plugin beside
# the old one on one book and IMEX folder (both under the node-wide book lock), then the old one
# goes. The real node's IMEX daemon is the same process after, the domain stays Ready, and the
# node keeps its nvidia.com/gpu.clique label: the old pod leaves it to the new one instead of
# removing it on its way out (before, it stayed off for the new pod's 10-minute re-assertion).
old_pod=$(driver_ready) || fail "no ready driver pod before the upgrade"
chart_upgrade "$SECOND_REF"
new_pod=$(driver_ready) || fail "no ready driver pod after the upgrade"
[[ $new_pod != "$old_pod" ]] || fail "helm upgrade did not replace $old_pod"
[[ $(node_clique_label "$E2E_NODE") == "$CLIQUE1" ]] \
    || fail "the real node lost its clique label when the old pod $old_pod went: '$(node_clique_label "$E2E_NODE")'"
sleep 3 # two of the plugin's rounds (GPU_DRA_GC_INTERVAL=2s)
[[ $(real_daemon) == "$before" ]] || fail "the upgrade replaced the real node's IMEX daemon: $before -> $(real_daemon)"
[[ $(kubectl get pod "$real_worker" -o jsonpath='{.status.phase}') == Running ]] || fail "$real_worker stopped across the upgrade"
[[ $(kubectl get computedomain nvbandwidth-test-compute-domain -o jsonpath='{.status.status}') == Ready ]] || fail "the domain is not Ready after the upgrade"
[[ $(node_clique_label "$E2E_NODE") == "$CLIQUE1" ]] || fail "the clique label is gone after the upgrade"
ok "helm upgrade under the running worker ($old_pod -> $new_pod): the same IMEX daemon ($before), the worker runs, the domain stays Ready, and the node keeps its clique label"

# ---------------------------------------------------------------- 3. another clique
NODE_ARGS=--gpu-clique-label start_node cd-c
jq --arg img "$E2E_IMAGE" '{apiVersion: "v1", kind: "Pod", metadata: {name: "nvbandwidth-test-worker-c"},
    spec: (.spec.mpiReplicaSpecs.Worker.template.spec | .nodeSelector = {"kubernetes.io/hostname": "cd-c"}
        | .containers[0].image = $img | .containers[0].command = ["sh", "-c"] | .containers[0].args = ["sleep 9999"]
        | del(.containers[0].env) | .containers[0].resources.limits = {})}' <<<"$job" | kubectl apply -f - >/dev/null
wait_for "the cd-c worker's claim" 60 bash -c "[[ -n \$(kubectl get pod nvbandwidth-test-worker-c -o json | jq -r '.status.resourceClaimStatuses[0].resourceClaimName // empty') ]]"
wait_for "the cd-c worker scheduled" 60 bash -c "[[ \$(kubectl get pod nvbandwidth-test-worker-c -o jsonpath='{.spec.nodeName}') == cd-c ]]"
out=$(cd_kubelet cd-c prepare --claim "$(claim_ref nvbandwidth-test-worker-c)") || true
err=$(jq -r '.claims[0].error // empty' <<<"$out")
[[ $err == *"1 of 4 nodes of NVLink clique $CLIQUE2 ready"* ]] || fail "the cd-c worker prepared, or failed otherwise: $out"
events=$(kubectl get events --field-selector reason=WaitingForComputeDomain -o json | jq '[.items[] | select(.involvedObject.name == "'"$(claim_of nvbandwidth-test-worker-c)"'")] | length')
((events >= 1)) || fail "no WaitingForComputeDomain event on the cd-c worker's claim"
uid=$(kubectl get computedomain nvbandwidth-test-compute-domain -o jsonpath='{.metadata.uid}')
for f in "$REAL_STATE/domains/$uid/hosts" "$(node_dir cd-b)/state/compute-domains/domains/$uid/hosts"; do
    [[ -f $f ]] || fail "no hosts file $f"
    [[ $(grep -c 'compute-domain-daemon-' "$f") == 4 ]] || fail "$f does not name the clique's four nodes: $(cat "$f")"
    grep -q 127.0.0.13 "$f" && fail "$f lists cd-c"
done
ok "a worker on cd-c (clique 2) never joins: its prepare fails naming its clique (1 of 4 ready), with a WaitingForComputeDomain event on its claim; no daemon of the domain has its address (NVIDIA's static node names, mapped in each daemon's own /etc/hosts)"
cd_kubelet cd-c unprepare --claim "$(claim_ref nvbandwidth-test-worker-c)" >/dev/null || fail "unprepare on cd-c"
[[ $(imex_daemons | wc -l) == 4 ]] || fail "IMEX daemons after cd-c's unprepare: $(imex_daemons | wc -l), want 4"

# ---------------------------------------------------------------- 3a. the fabric moves a node
# Fabric partitioning moves cd-c into clique 1 while its plugin runs, then back: the plugin reads
# its clique again at each round and its published channel follows. cd-c is one of the
# host-process nodes (kubelet-sim over its socket), not the image through the chart: the real
# node's GPUs have one fabric, and moving it needs the simulator's state file.
move_cd_c() { "$GPU_DRA" sim --gpus "$GPUS" --node-name cd-c --sim-state "$(node_dir cd-c)/hw.json" \
    fabric --cluster-uuid 7f1f1a8e-5b7d-4c1e-9a34-0c2e6d0b7201 --clique-id "$1" >/dev/null; }
cd_c_clique() { kubectl get resourceslices -o json | jq -r '[.items[] | select(.spec.driver == "compute-domain.nvidia.com" and .spec.nodeName == "cd-c") | .spec.devices[0].attributes.cliqueID.string] | first'; }
wait_for "cd-c's nvidia.com/gpu.clique label (--gpu-clique-label) in clique 2" 30 bash -c "[[ \$(node_clique_label cd-c) == $CLIQUE2 ]]"
move_cd_c 1
export -f cd_c_clique
wait_for "cd-c's channel in clique 1" 30 bash -c "[[ \$(cd_c_clique) == $CLIQUE1 ]]"
wait_for "cd-c's label in clique 1" 30 bash -c "[[ \$(node_clique_label cd-c) == $CLIQUE1 ]]"
move_cd_c 2
wait_for "cd-c's channel back in clique 2" 30 bash -c "[[ \$(cd_c_clique) == $CLIQUE2 ]]"
wait_for "cd-c's label back in clique 2" 30 bash -c "[[ \$(node_clique_label cd-c) == $CLIQUE2 ]]"
ok "the fabric moves cd-c to clique 1 and back while its plugin runs: its published channel's cliqueID and its nvidia.com/gpu.clique label follow each move"

# ---------------------------------------------------------------- 3b. host-managed IMEX
# cd-c's plugin with --imex-mode host-managed: the admin runs nvidia-imex on the host with a
# command socket (here: the fake one, chrooted into cd-c's driver root, its socket inside it).
stop_node cd-c
[[ -z $(node_clique_label cd-c) ]] || fail "cd-c's plugin stopped and left its label: $(node_clique_label cd-c)"
ok "cd-c's plugin stopped (SIGTERM): its nvidia.com/gpu.clique label is removed"
droot=$(node_dir cd-c)/driver-root
mkdir -p "$droot/etc/admin-imex"
printf 'BIND_INTERFACE_IP=%s\nSERVER_PORT=50000\nIMEX_NODE_CONFIG_FILE=/etc/admin-imex/nodes.cfg\nIMEX_CMD_ENABLED=1\nIMEX_CMD_PORT=50005\nIMEX_CMD_UNIX_DOMAIN_PATH=/etc/admin-imex/cmd.sock\nDAEMONIZE=1\n' "${IP[cd-c]}" >"$droot/etc/admin-imex/config.cfg"
echo "${IP[cd-c]}" >"$droot/etc/admin-imex/nodes.cfg"
cd_metrics_port=$(metrics_port)
NODE_ARGS="--imex-mode host-managed --imex-host-socket $droot/etc/admin-imex/cmd.sock --metrics-addr 127.0.0.1:$cd_metrics_port" start_node cd-c
# NVIDIA's prepared-devices series of the channel plugin, as its dashboards read it.
cd_channels() {
    curl -sf "http://127.0.0.1:$cd_metrics_port/metrics" |
        awk '$1 == "nvidia_dra_prepared_devices{node=\"cd-c\",driver=\"compute-domain.nvidia.com\",device_type=\"channel\"}" { print $2 }'
}
ref_c=$(claim_ref nvbandwidth-test-worker-c)
out=$(cd_kubelet cd-c prepare --claim "$ref_c") || true
err=$(jq -r '.claims[0].error // empty' <<<"$out")
[[ $err == *"the host's IMEX daemon"*"cmd.sock"* ]] || fail "host-managed prepare without the host daemon: $out"
chroot "$droot" /usr/bin/nvidia-imex -c /etc/admin-imex/config.cfg || fail "the admin's IMEX daemon did not start"
out=$(cd_kubelet cd-c prepare --claim "$ref_c") || fail "host-managed prepare: $out"
[[ -z $(jq -r '.claims[0].error // empty' <<<"$out") ]] || fail "host-managed prepare: $out"
[[ $(cd_channels) == 1 ]] || fail "nvidia_dra_prepared_devices of the channel plugin after one prepare (a failed one before): $(cd_channels)"
spec=$(cat "$(node_dir cd-c)"/cdi/k8s.compute-domain.nvidia.com-claim_*.json)
[[ $(jq -r '.devices[0].containerEdits.deviceNodes | map(.path) | join(",")' <<<"$spec") == /dev/nvidia-caps-imex-channels/channel0 ]] || fail "host-managed CDI spec: $spec"
[[ -z $(ls "$(node_dir cd-c)/state/compute-domains/domains" 2>/dev/null) ]] || fail "the host-managed plugin started a daemon of its own"
kubectl get computedomain nvbandwidth-test-compute-domain -o json | jq -e '[.status.nodes[] | select(.name == "cd-c")] | length == 0' >/dev/null ||
    fail "the host-managed node registered itself in the domain"
cd_kubelet cd-c unprepare --claim "$ref_c" >/dev/null || fail "host-managed unprepare"
[[ $(cd_channels) == 0 ]] || fail "nvidia_dra_prepared_devices of the channel plugin after the unprepare: $(cd_channels)"
admin=$(imex_daemons | while read -r p; do if [[ $(readlink "/proc/$p/root") == "$droot" ]]; then echo "$p"; fi; done)
[[ -n $admin ]] || fail "the unprepare stopped the admin's IMEX daemon"
kill "$admin"
stop_node cd-c
ok "host-managed IMEX (cd-c): a prepare fails naming the host daemon's socket until the admin's nvidia-imex answers READY there, then injects channel 0 (nvidia_dra_prepared_devices channel 1, 0 again after the unprepare); no daemon of its own, no node entry, and the admin's daemon outlives the unprepare"

# ---------------------------------------------------------------- 4. kill -9
ref_b=$(claim_ref "${placed[cd-b]}")
prepare_b() {
    local out
    out=$(cd_kubelet cd-b prepare --claim "$ref_b") || fail "prepare on cd-b: $out"
    [[ -z $(jq -r '.claims[0].error // empty' <<<"$out") ]] || fail "prepare on cd-b: $out"
}
# Each of the plugin's step boundaries (gpu_dra::prepare::failpoint::COMPUTE_DOMAIN_STEPS).
for step in cd-prepare-booked cd-prepare-daemon-started cd-unprepare-unbooked; do
    stop_node cd-b
    start_node cd-b GPU_DRA_FAILPOINT=$step
    case $step in
        cd-unprepare-*) cd_kubelet cd-b unprepare --claim "$ref_b" >/dev/null 2>&1 || true ;;
        *) cd_kubelet cd-b prepare --claim "$ref_b" >/dev/null 2>&1 || true ;;
    esac
    wait "${PID[cd-b]}" 2>/dev/null || true
    kill -0 "${PID[cd-b]}" 2>/dev/null && fail "cd-b's plugin outlived its failpoint $step"
    grep -q "failpoint reached.*$step" "$(node_dir cd-b)/driver.log" || fail "cd-b's plugin did not reach $step"
    start_node cd-b
    if [[ $step == cd-unprepare-* ]]; then
        # The claim left the book, its daemon did not: the restarted plugin stops it.
        wait_for "cd-b's daemon stopped after $step" 30 bash -c "[[ -z \$(ls $(node_dir cd-b)/state/compute-domains/domains 2>/dev/null) ]]"
        [[ $(imex_daemons | wc -l) == 3 ]] || fail "IMEX daemons after $step: $(imex_daemons | wc -l), want 3"
    fi
    prepare_b
    [[ $(imex_daemons | wc -l) == 4 ]] || fail "IMEX daemons after kill -9 at $step: $(imex_daemons | wc -l), want 4"
    # The other nodes' daemons re-read their peers when cd-b's comes back, and each plugin
    # reports its own node: the status settles rather than being Ready at the prepare's return.
    ready_nodes() { kubectl get computedomain nvbandwidth-test-compute-domain -o json | jq '[.status.nodes[] | select(.status == "Ready")] | length'; }
    deadline=$((SECONDS + 30))
    until [[ $(ready_nodes) == 4 ]]; do
        ((SECONDS < deadline)) ||
            fail "status.nodes 30 s after kill -9 at $step: $(kubectl get computedomain nvbandwidth-test-compute-domain -o json | jq -c .status.nodes)"
        sleep 0.5
    done
done
ok "kill -9 of cd-b's plugin at each of its steps (booked, daemon started, unbooked): the restarted plugin prepares again with one daemon, or stops the daemon no claim holds; four Ready nodes, four daemons"
kubectl -n "$CHART_NAMESPACE" scale deploy -l app.kubernetes.io/instance=$CHART_RELEASE --replicas=0 >/dev/null
wait_for "the chart's controller stopped" 60 bash -c "[[ -z \$(kubectl -n $CHART_NAMESPACE get pods -l app.kubernetes.io/component=compute-domain-controller -o name) ]]"
start_controller() { # [ENV=VALUE ...]
    env "$@" "$GPU_DRA" compute-domain-controller --kubeconfig "$KUBECONFIG" --resync-interval 2s --imex-credentials-namespace "$CHART_NAMESPACE" >>"$WORK/controller.log" 2>&1 &
    CONTROLLER_PID=$!
}
controller_killed_at() { # step
    wait_for "the controller killed at $1" 30 bash -c "! kill -0 $CONTROLLER_PID 2>/dev/null"
    wait "$CONTROLLER_PID" 2>/dev/null || true
    grep -q "failpoint reached.*$1" "$WORK/controller.log" || fail "the controller did not reach $1"
}
injection_domain() { # NVIDIA's channel-injection.yaml's ComputeDomain alone
    python3 -c 'import sys, yaml
for d in yaml.safe_load_all(open(sys.argv[1])):
    if d and d["kind"] == "ComputeDomain": print(yaml.safe_dump(d))' "$E2E/pods/nvidia/channel-injection.yaml"
}
# Each of the controller's step boundaries (COMPUTE_DOMAIN_STEPS): killed there, restarted, the
# domain ends with one template and a status; deleted, template and finalizer go.
for step in cd-controller-finalizer-added cd-controller-template-created cd-controller-template-deleted; do
    if [[ $step == *-deleted ]]; then start_controller; else start_controller GPU_DRA_FAILPOINT=$step; fi
    injection_domain | kubectl apply -f - >/dev/null
    if [[ $step != *-deleted ]]; then controller_killed_at "$step"; start_controller; fi
    wait_for "imex-channel-injection NotReady (no node yet) after $step" 30 bash -c "[[ \$(kubectl get computedomain imex-channel-injection -o jsonpath='{.status.status}') == NotReady ]]"
    uid=$(kubectl get computedomain imex-channel-injection -o jsonpath='{.metadata.uid}')
    [[ $(kubectl get resourceclaimtemplates -l resource.nvidia.com/computeDomain="$uid" -o name | wc -l) == 1 ]] ||
        fail "after $step: imex-channel-injection does not have exactly one template"
    if [[ $step == *-deleted ]]; then
        kill "$CONTROLLER_PID"; wait "$CONTROLLER_PID" 2>/dev/null || true
        start_controller GPU_DRA_FAILPOINT=$step
        kubectl delete computedomain imex-channel-injection --wait=false >/dev/null
        controller_killed_at "$step"
        kubectl get computedomain imex-channel-injection >/dev/null 2>&1 || fail "the domain went before its finalizer was removed"
        start_controller
    else
        kubectl delete computedomain imex-channel-injection --wait=false >/dev/null
    fi
    wait_for "imex-channel-injection gone after $step" 30 bash -c "! kubectl get computedomain imex-channel-injection"
    kubectl get resourceclaimtemplate imex-channel-0 >/dev/null 2>&1 && fail "after $step: imex-channel-0 outlived its domain"
    kill "$CONTROLLER_PID"; wait "$CONTROLLER_PID" 2>/dev/null || true
done
ok "kill -9 of the controller at each of its steps (finalizer added, template made, template deleted): the restarted one finishes (one template, a status; on deletion the finalizer), nothing left"
# A node that left the cluster (its entry written by no plugin any more) leaves the domain.
start_controller
kubectl apply --server-side --subresource=status --field-manager=gpu-dra-node-cd-gone -f - >/dev/null <<EOF
apiVersion: resource.nvidia.com/v1beta1
kind: ComputeDomain
metadata: {name: nvbandwidth-test-compute-domain, namespace: default}
status:
  nodes: [{name: cd-gone, ipAddress: 127.0.0.99, cliqueID: "$CLIQUE1", index: 9, status: Ready}]
EOF
wait_for "cd-gone out of status.nodes" 30 bash -c "! kubectl get computedomain nvbandwidth-test-compute-domain -o json | jq -e '.status.nodes[] | select(.name == \"cd-gone\")'"
[[ $(kubectl get computedomain nvbandwidth-test-compute-domain -o json | jq '.status.nodes | length') == 4 ]] || fail "the controller removed live nodes"
kill "$CONTROLLER_PID"; wait "$CONTROLLER_PID" 2>/dev/null || true
CONTROLLER_PID=
kubectl -n "$CHART_NAMESPACE" scale deploy -l app.kubernetes.io/instance=$CHART_RELEASE --replicas=1 >/dev/null
ok "the controller removes the entry of a node that is not in the cluster and keeps the four live ones"

# ---------------------------------------------------------------- 5. nothing left
kubectl delete pod "${workers[@]}" nvbandwidth-test-worker-c --wait=false >/dev/null
for n in cd-b cd-d cd-e; do cd_kubelet "$n" unprepare --claim "$(claim_ref "${placed[$n]}")" >/dev/null 2>&1 || fail "unprepare on $n"; done
# The simulated nodes have no kubelet to finish their pods' deletion.
kubectl delete pod "${workers[@]}" nvbandwidth-test-worker-c --grace-period=0 --force >/dev/null 2>&1 || true
wait_for "the workers gone" 90 bash -c "[[ -z \$(kubectl get pods -o name) ]]"
wait_for "every IMEX daemon stopped" 60 no_imex_daemons
left=$(kubectl get computedomain nvbandwidth-test-compute-domain -o json | jq '.status.nodes // [] | length')
[[ $left == 0 ]] || fail "status.nodes keeps $left nodes"
python3 -c 'import sys, yaml
for d in yaml.safe_load_all(open(sys.argv[1])):
    if d and d["kind"] == "ComputeDomain": print(yaml.safe_dump(d))' "$E2E/pods/nvidia/nvbandwidth-test-job.yaml" | kubectl delete -f - --wait=true --timeout 60s >/dev/null
wait_for "the workers' claims gone" 60 bash -c "[[ -z \$(kubectl get resourceclaims -o name) ]]"
[[ -z $(kubectl get resourceclaimtemplates -o name) ]] || fail "templates left: $(kubectl get resourceclaimtemplates -o name)"
[[ -z $(cd_specs) ]] || fail "CDI specs left: $(cd_specs)"
kubectl -n "$CHART_NAMESPACE" get secret "$secret" >/dev/null 2>&1 && fail "the domain's IMEX credentials outlived it (Secret $secret)"
ok "all deleted: no IMEX daemon, node entry, CDI spec, claim, template or IMEX credentials is left"
report_mode "the driver image through the Helm chart on the real node (computeDomains.enabled: both plugins in the DaemonSet's pod, the controller Deployment); four simulated GB200 nodes as host processes with kubelet-sim"
echo "$passed passed, 0 failed"
