#!/usr/bin/env bash
# Stops what deploy/local-cluster/up.sh started: jobs, the fault cluster, slurmd n1, n2 and n3,
# slurmctld, slurmdbd, MariaDB, munged and PostgreSQL. Idempotent: whatever is not running is skipped. Configuration,
# passwords, accounting and database contents stay, for the next up.sh.
set -euo pipefail

SCRIPT=down
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"

[[ $(id -u) -eq 0 ]] || die "run as root"

# Cancel the jobs first: a slurmd that stops leaves its jobs' processes running (so that it can
# be restarted under them), which here would be orphans.
if daemon_pid "$SLURMCTLD_PID" slurmctld >/dev/null; then
    no_jobs() { [[ -z $(squeue -h -o %i 2>/dev/null) ]]; }
    if ! no_jobs; then
        log "cancelling all jobs"
        scancel --partition=debug,isolated,wide 2>/dev/null || true
        wait_for 30 no_jobs || log "jobs still in the queue after 30 s: stopping anyway"
    fi
fi

# The fault cluster first (faults.sh), its jobs with it.
if daemon_pid "$FAULTS_RUN/slurmctld.pid" slurmctld >/dev/null; then
    SLURM_CONF=$FAULTS_CONF_DIR/slurm.conf scancel --partition=faults 2>/dev/null || true
fi
for node in "${FAULT_NODES[@]}"; do stop_daemon "$FAULTS_RUN/slurmd-$node.pid" slurmd; done
stop_daemon "$FAULTS_RUN/slurmctld.pid" slurmctld
stop_daemon "$FAULTS_RUN/slurmdbd.pid" slurmdbd

# Reverse order of up.sh: the daemons that talk to the others go first.
for node in "${NODES[@]}" "${WIDE_NODES[@]}"; do stop_daemon "$(slurmd_pidfile "$node")" slurmd; done
stop_daemon "$SLURMCTLD_PID" slurmctld
stop_daemon "$SLURMDBD_PID" slurmdbd
stop_daemon "$MARIADB_PID" mariadbd 60
stop_daemon "$MUNGED_PID" munged

if command -v pg_lsclusters >/dev/null &&
    [[ $(pg_lsclusters -h "$PG_VERSION" "$PG_CLUSTER" 2>/dev/null | awk '{print $4}') == online* ]]; then
    log "stopping PostgreSQL $PG_VERSION"
    pg_ctlcluster --skip-systemctl-redirect "$PG_VERSION" "$PG_CLUSTER" stop </dev/null >/dev/null 2>&1 ||
        die "PostgreSQL did not stop (see /var/log/postgresql/postgresql-$PG_VERSION-$PG_CLUSTER.log)"
fi
log "all stopped"
