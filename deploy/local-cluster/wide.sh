#!/usr/bin/env bash
# Starts (up) or stops (down) the slurmd daemons of w1..w16, the partition "wide" of
# deploy/local-cluster: 16 emulated nodes of 4 CPUs each on this one host, for measuring 64 trials
# in flight across many nodes (python -m bench dispatch --wide). Run up.sh first; down.sh stops
# them too. Idempotent.
set -euo pipefail

SCRIPT=wide
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"

[[ $(id -u) -eq 0 ]] || die "run as root"
daemon_pid "$SLURMCTLD_PID" slurmctld >/dev/null || die "slurmctld is not running: run up.sh first"

case ${1:-} in
    up)
        for node in "${WIDE_NODES[@]}"; do
            daemon_pid "$(slurmd_pidfile "$node")" slurmd >/dev/null && continue
            install -d -m 755 "/var/lib/slurm/slurmd/$node"
            slurmd -N "$node" </dev/null >"$SLURM_LOG/start-slurmd-$node.log" 2>&1 ||
                die "slurmd -N $node did not start (see $SLURM_LOG/start-slurmd-$node.log)"
        done
        # A node slurmctld marked down while its slurmd was away comes back once it answers.
        wide_up() {
            local states
            states=$(sinfo -h -N -p wide -o '%t' 2>/dev/null) || return 1
            if grep -q -E '^(down|drain)' <<<"$states"; then
                scontrol update NodeName="w[1-16]" State=RESUME 2>/dev/null || true
                return 1
            fi
            [[ $(sort -u <<<"$states") == idle ]]
        }
        wait_for 90 wide_up || die "partition wide not idle after 90 s: $(sinfo -h -N -p wide -o '%N %t' | sort -u -k2 | head -3)"
        log "partition wide up: ${#WIDE_NODES[@]} nodes, $(sinfo -h -p wide -o %C | cut -d/ -f4) CPUs"
        ;;
    down)
        for node in "${WIDE_NODES[@]}"; do stop_daemon "$(slurmd_pidfile "$node")" slurmd; done
        ;;
    *) die "usage: $0 up|down" ;;
esac
