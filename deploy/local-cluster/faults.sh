#!/usr/bin/env bash
# Starts the fault cluster beside the local cluster: a second Slurm (slurmctld, slurmdbd and the two
# nodes f1 and f2, each on ports of its own) for the tests that stop slurmctld, slurmdbd or a node,
# which would otherwise stop every test running beside them. Run by up.sh after the local cluster
# is up (it reuses its munge, its MariaDB and slurmdbd's database user); idempotent. Reach it with
# SLURM_CONF=/etc/slurm-faults/slurm.conf (the tests' `fault_cluster` fixture sets it).
set -euo pipefail
SCRIPT=faults
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
[[ $(id -u) -eq 0 ]] || die "run as root"
start_log() { echo "$FAULTS_LOG/start-$1.log"; }

export SLURM_CONF=$FAULTS_CONF_DIR/slurm.conf
install -d -m 755 "$FAULTS_CONF_DIR" "$FAULTS_RUN" "$FAULTS_LOG" /var/lib/slurm-faults/slurmctld

# slurmdbd's MariaDB user (made by up.sh) gets this cluster's database too.
dbd_pass=$(sed -n 's/^StoragePass=//p' /etc/slurm/slurmdbd.conf)
[[ $dbd_pass =~ ^[0-9a-f]{32}$ ]] || die "no slurmdbd password in /etc/slurm/slurmdbd.conf: run up.sh first"
mariadb --protocol=socket -u root <<SQL
CREATE DATABASE IF NOT EXISTS slurm_faults_acct_db;
GRANT ALL PRIVILEGES ON slurm_faults_acct_db.* TO 'slurm'@'localhost';
SQL

mem_mb=$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)
conf_changed=0
update_file "$SLURM_CONF" "$(render "$HERE/faults.conf.in" @CLUSTER@ "$FAULTS_CLUSTER" \
    @HOST@ "$(hostname -s)" @REAL_MEMORY@ $((mem_mb < 8000 ? mem_mb : 8000)))" 644 && conf_changed=1
update_file "$FAULTS_CONF_DIR/slurmdbd.conf" "$(render "$HERE/faults-dbd.conf.in" \
    @STORAGE_PASS@ "$dbd_pass")" 600 && conf_changed=1
chown root:root "$SLURM_CONF" "$FAULTS_CONF_DIR/slurmdbd.conf"
if ((conf_changed)); then
    for node in "${FAULT_NODES[@]}"; do stop_daemon "$FAULTS_RUN/slurmd-$node.pid" slurmd; done
    stop_daemon "$FAULTS_RUN/slurmctld.pid" slurmctld
    stop_daemon "$FAULTS_RUN/slurmdbd.pid" slurmdbd
fi

dbd_ok() { sacctmgr -n -P list cluster format=cluster >/dev/null 2>&1; }
if ! daemon_pid "$FAULTS_RUN/slurmdbd.pid" slurmdbd >/dev/null; then
    log "starting the fault cluster's slurmdbd"
    slurmdbd </dev/null >"$(start_log slurmdbd)" 2>&1 || die "slurmdbd did not start (see $(start_log slurmdbd))"
fi
wait_for 90 dbd_ok || die "the fault cluster's slurmdbd does not answer after 90 s (see $FAULTS_LOG/slurmdbd.log)"
if ! sacctmgr -n -P list cluster format=cluster | grep -qx "$FAULTS_CLUSTER"; then
    log "registering cluster $FAULTS_CLUSTER"
    out=$(sacctmgr -i add cluster "$FAULTS_CLUSTER" 2>&1) || [[ $out == *"already exists"* ]] || die "sacctmgr add cluster: $out"
fi
if ! daemon_pid "$FAULTS_RUN/slurmctld.pid" slurmctld >/dev/null; then
    log "starting the fault cluster's slurmctld"
    slurmctld </dev/null >"$(start_log slurmctld)" 2>&1 || die "slurmctld did not start (see $(start_log slurmctld))"
fi
for node in "${FAULT_NODES[@]}"; do
    if ! daemon_pid "$FAULTS_RUN/slurmd-$node.pid" slurmd >/dev/null; then
        log "starting slurmd for $node"
        install -d -m 755 "/var/lib/slurm-faults/slurmd/$node"
        slurmd -N "$node" </dev/null >"$(start_log "slurmd-$node")" 2>&1 || die "slurmd -N $node did not start"
    fi
done

# Up once both nodes answer and are neither down nor drained (a test's drain is undone here).
nodes_up() {
    local states node state ok=0
    states=$(sinfo -h -N -o '%N %t' 2>/dev/null) || return 1
    for node in "${FAULT_NODES[@]}"; do
        state=$(awk -v n="$node" '$1 == n {print $2}' <<<"$states")
        case $state in
            idle | mix | alloc | comp) ;;
            drain | drng | down)
                scontrol update NodeName="$node" State=RESUME 2>/dev/null || true
                ok=1
                ;;
            *) ok=1 ;;
        esac
    done
    return $ok
}
wait_for 60 nodes_up || die "fault nodes ${FAULT_NODES[*]} not up after 60 s: $(sinfo -h -N -o '%N %t' 2>&1 | tr '\n' ' ')"
sacct_ok() { sacct -n -X -a -S now-1minutes -o jobid >/dev/null 2>&1; }
wait_for 30 sacct_ok || die "sacct does not answer on the fault cluster (see $FAULTS_LOG/slurmdbd.log)"
log "fault cluster ok: $FAULTS_CLUSTER, nodes ${FAULT_NODES[*]} (SLURM_CONF=$SLURM_CONF)"
