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
