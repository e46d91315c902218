# shellcheck shell=bash
# The node's slices of one driver, for the differentials that let each driver publish in turn
# (e2e/vs-nvidia.sh, e2e/compute-domain-vs-nvidia.sh). Source it after lib.sh (it replaces
# lib.sh's slices_json, which lists every driver's); SLICES_DRIVER: gpu.nvidia.com by default.
slices_json() { kubectl get resourceslices -o json --field-selector "spec.nodeName=$NODE,spec.driver=${SLICES_DRIVER:-gpu.nvidia.com}"; }
device_count() { slices_json | jq '[.items[].spec.devices[]?] | length'; }
# settled FILE: the node's slices, once their device count held still for 2 s.
settled() {
    local last=-1 n stable=0
    for _ in $(seq 120); do
        n=$(device_count)
        if [[ $n == "$last" && $n -gt 0 ]]; then
            stable=$((stable + 1))
            ((stable >= 4)) && { slices_json >"$1"; return 0; }
        else
            stable=0
        fi
        last=$n
        sleep 0.5
    done
    return 1
}
clear_slices() {
    kubectl delete resourceslices --field-selector "spec.nodeName=$NODE" --wait=true >/dev/null 2>&1 || true
    for _ in $(seq 40); do [[ $(device_count) == 0 ]] && return 0; sleep 0.25; done
    fail "the node's slices were not deleted"
}
