# shellcheck shell=bash
# mps_folder STATE_DIR KEY: the MPS daemon folder of a claim UID (or `shared-<GPU UUID>`): named
# after the key, or, where that would push the daemon's sockets past a unix socket address, by a
# digest with the key in its `owner` file (src/prepare/mps.rs).
mps_folder() {
    local d
    for d in "$1"/mps/*/; do
        d=${d%/}
        if [[ -f $d/owner && $(<"$d/owner") == "$2" ]]; then
            echo "$d"
            return
        fi
    done
    echo "$1/mps/$2"
}
# mps_processes FOLDER_PREFIX: every MPS process (control daemons and their servers) the driver
# started for a daemon folder starting with FOLDER_PREFIX (it marks their environment with
# GPU_DRA_MPS_FOLDER; inside the driver root they all see their pipe at /tmp/nvidia-mps).
mps_processes() { grep -lz "^GPU_DRA_MPS_FOLDER=$1" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 || true; }
# mps_daemons_of FOLDER_PREFIX: the control daemons among them (the fake servers run with
# --fake-server).
mps_daemons_of() {
    local pid
    for pid in $(mps_processes "$1"); do
        grep -qz -- '--fake-server' "/proc/$pid/cmdline" 2>/dev/null || echo "$pid"
    done
}
# mps_cgroups FOLDER_PREFIX: the cgroups (memory hierarchy paths) those processes run in.
mps_cgroups() {
    local pid
    for pid in $(mps_processes "$1"); do
        awk -F: '$2 == "memory" || $2 == "" { print $3; exit }' "/proc/$pid/cgroup" 2>/dev/null
    done | sort -u
}
