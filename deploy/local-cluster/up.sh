#!/usr/bin/env bash
# Starts a local test cluster on this one Debian 12 host, without systemd: a three-node Slurm (three
# slurmd daemons emulating n1, n2 and n3, slurmctld, slurmdbd on MariaDB for sacct, munge), a
# PostgreSQL 15 database for the HPO service, and the fault cluster of faults.sh (a second Slurm
# whose daemons the fault tests stop). Idempotent: what already runs is left running, so a
# second run only checks (a few seconds). Progress goes to stderr; the last line on stdout is the
# database URL (no password: it is in ~/.pgpass), so URL=$(deploy/local-cluster/up.sh | tail -1).
set -euo pipefail

SCRIPT=up
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"

[[ $(id -u) -eq 0 ]] || die "run as root (it installs packages and starts system daemons)"
# One run at a time: two at once (the test workers' fixtures) made PostgreSQL refuse a concurrent
# role update ("tuple concurrently updated"). The second waits, then only checks. flock(1) holds
# the lock and runs this script again with the lock's descriptor closed (-o): a descriptor this
# script held would pass to every daemon it starts, and they would keep the lock forever.
if [[ ${HPO_LOCAL_CLUSTER_LOCKED:-} != 1 ]]; then
    mkdir -p /run/lock
    HPO_LOCAL_CLUSTER_LOCKED=1 exec flock -o /run/lock/hpo-local-cluster-up.lock bash "${BASH_SOURCE[0]}" "$@"
fi
unset HPO_LOCAL_CLUSTER_LOCKED # not passed on to the daemons' environments
# Every daemon is started with its output sent to a log file: one holding our stdout open would
# keep $(up.sh | tail -1) waiting forever.
start_log() { echo "$SLURM_LOG/start-$1.log"; }
# Shows the end of a log on the way out, for errors.
die_log() {
    local file=$1
    shift
    [[ -r $file ]] && tail -n 20 "$file" | sed 's/^/    /' >&2
    die "$* (see $file)"
}

# ---- 1. Debian packages --------------------------------------------------------------------
PACKAGES=(munge slurmctld slurmd slurm-client slurmdbd mariadb-server postgresql)
missing=()
for pkg in "${PACKAGES[@]}"; do
    [[ $(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null) == "install ok installed" ]] || missing+=("$pkg")
done
if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    # Another apt may be running: wait for its locks rather than fail (update has no lock timeout
    # of its own, so it is retried).
    for try in $(seq 60); do
        apt-get update -qq >&2 && break
        ((try < 60)) || die "apt-get update kept failing"
        log "apt-get update failed (apt lock held?), retrying in 10 s"
        sleep 10
    done
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=900 \
        "${missing[@]}" </dev/null >&2
fi

install -d -m 755 "$SLURM_RUN" "$SLURM_LOG" /var/lib/slurm/slurmctld

# ---- 2. Host names ---------------------------------------------------------------------------
# n1, n2 and n3 (and the fault cluster's f1 and f2) are emulated on this host: they (and this
# host's own name, which slurm.conf uses) must resolve to 127.0.0.1 so that a DDP rendezvous on "n1"
# (or a Ray head on "f1") reaches this machine. Append only:
# /etc/hosts may be a bind mount (containers) that cannot be replaced.
HOST=$(hostname -s)
add_names=()
for name in "${NODES[@]}" "${WIDE_NODES[@]}" "${FAULT_NODES[@]}" "$HOST"; do
    addr=$(getent ahostsv4 "$name" | awk 'NR == 1 {print $1}') || true
    if [[ -z $addr ]]; then
        add_names+=("$name")
    elif [[ $addr != 127.* && $name != "$HOST" ]]; then
        die "$name resolves to $addr, not 127.0.0.1: remove that entry from /etc/hosts"
    fi
done
if ((${#add_names[@]})); then
    log "adding 127.0.0.1 ${add_names[*]} to /etc/hosts"
    printf '127.0.0.1 %s # hpo local-cluster\n' "${add_names[*]}" >>/etc/hosts
fi

# ---- 3. munge ----------------------------------------------------------------------------------
munge_ok() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }
if [[ ! -s /etc/munge/munge.key ]]; then
    log "creating the munge key"
    runuser -u munge -- mungekey --create
fi
if ! munge_ok; then
    log "starting munged"
    install -d -o munge -g munge -m 755 /run/munge
    # munged refuses to run as root; it daemonizes once its socket is ready.
    runuser -u munge -- /usr/sbin/munged </dev/null >/dev/null 2>>"$(start_log munged)" ||
        die_log "$(start_log munged)" "munged did not start"
    wait_for 15 munge_ok || die_log /var/log/munge/munged.log "munged does not answer"
fi

# ---- 4. MariaDB, the store of slurmdbd -----------------------------------------------------
mariadb_ok() { mariadb-admin --protocol=socket ping >/dev/null 2>&1; }
if ! mariadb_ok; then
    log "starting MariaDB"
    install -d -o mysql -g mysql -m 755 /run/mysqld
    install -d -o mysql -g adm -m 2750 /var/log/mysql
    [[ -d /var/lib/mysql/mysql ]] ||
        mariadb-install-db --user=mysql --datadir=/var/lib/mysql >"$(start_log mariadb-install-db)" 2>&1
    # mariadbd will not run as root: --user=mysql makes it switch to mysql at once (as mysqld_safe
    # does). It does not daemonize, hence setsid -f.
    setsid -f /usr/sbin/mariadbd --user=mysql </dev/null >>/var/log/mysql/mariadbd.log 2>&1
    wait_for 60 mariadb_ok || die_log /var/log/mysql/mariadbd.log "MariaDB does not answer after 60 s"
fi

# slurmdbd's MariaDB password: generated once, kept in slurmdbd.conf (mode 600) and reused.
dbd_pass=$(sed -n 's/^StoragePass=//p' /etc/slurm/slurmdbd.conf 2>/dev/null) || true
[[ $dbd_pass =~ ^[0-9a-f]{32}$ ]] || dbd_pass=$(openssl rand -hex 16)
# The password goes through stdin, never onto a command line. root logs in by unix socket.
mariadb --protocol=socket -u root <<SQL
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$dbd_pass';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$dbd_pass';
GRANT ALL PRIVILEGES ON slurm_acct_db.* TO 'slurm'@'localhost';
SQL

# The service's MySQL storage, for the storage tests: user hpo over TCP, databases hpo_*.
install -d -m 700 "$(dirname "$MYSQL_PASSFILE")"
mysql_pass=$(cat "$MYSQL_PASSFILE" 2>/dev/null) || true
[[ $mysql_pass =~ ^[0-9a-f]{32}$ ]] || mysql_pass=$(openssl rand -hex 16)
update_file "$MYSQL_PASSFILE" "$mysql_pass" 600 || true
mariadb --protocol=socket -u root <<SQL
CREATE USER IF NOT EXISTS '$MYSQL_USER'@'127.0.0.1' IDENTIFIED BY '$mysql_pass';
ALTER USER '$MYSQL_USER'@'127.0.0.1' IDENTIFIED BY '$mysql_pass';
GRANT ALL PRIVILEGES ON \`hpo\_%\`.* TO '$MYSQL_USER'@'127.0.0.1';
SQL

# ---- 5. Slurm configuration ------------------------------------------------------------------
# Each emulated node claims 8000 MB, or all of this host's memory if it has less.
mem_mb=$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)
real_memory=$((mem_mb < 8000 ? mem_mb : 8000))
install -d -m 755 /etc/slurm
slurm_conf_changed=0
dbd_conf_changed=0
update_file /etc/slurm/slurm.conf "$(render "$HERE/slurm.conf.in" @CLUSTER@ "$CLUSTER" \
    @HOST@ "$HOST" @REAL_MEMORY@ "$real_memory")" 644 && slurm_conf_changed=1
# slurmdbd refuses a slurmdbd.conf readable by others or not owned by SlurmUser (root here).
update_file /etc/slurm/slurmdbd.conf "$(render "$HERE/slurmdbd.conf.in" \
    @STORAGE_PASS@ "$dbd_pass")" 600 && dbd_conf_changed=1
chown root:root /etc/slurm/slurm.conf /etc/slurm/slurmdbd.conf

# ---- 6. slurmdbd, then the cluster's record, then slurmctld and the slurmd -------------------
if ((dbd_conf_changed)); then stop_daemon "$SLURMDBD_PID" slurmdbd; fi
dbd_ok() { sacctmgr -n -P list cluster format=cluster >/dev/null 2>&1; }
if ! daemon_pid "$SLURMDBD_PID" slurmdbd >/dev/null; then
    log "starting slurmdbd"
    slurmdbd </dev/null >"$(start_log slurmdbd)" 2>&1 || die_log "$(start_log slurmdbd)" "slurmdbd did not start"
fi
# The first start creates the accounting tables, which takes a while.
wait_for 90 dbd_ok || die_log "$SLURM_LOG/slurmdbd.log" "slurmdbd does not answer sacctmgr after 90 s"
clusters=$(sacctmgr -n -P list cluster format=cluster)
if ! grep -qx "$CLUSTER" <<<"$clusters"; then
    log "registering cluster $CLUSTER in the accounting database"
    out=$(sacctmgr -i add cluster "$CLUSTER" 2>&1) || [[ $out == *"already exists"* ]] || die "sacctmgr add cluster: $out"
fi
# A QoS with a MaxWall, as Jean Zay's qos_gpu-dev (2 h) has: hpo launch refuses a longer trial.
if ! sacctmgr -n -P show qos format=Name | grep -qx short5; then
    log "adding QoS short5 (MaxWall 5 min)"
    out=$(sacctmgr -i add qos short5 MaxWall=00:05:00 2>&1) || [[ $out == *"already exists"* ]] || die "sacctmgr add qos: $out"
fi
# A QoS capping each user's queued jobs, as a site's development QoS does: past 3, sbatch is refused.
if ! sacctmgr -n -P show qos format=Name | grep -qx dev3; then
    log "adding QoS dev3 (MaxSubmitJobsPerUser 3)"
    out=$(sacctmgr -i add qos dev3 MaxSubmitJobsPerUser=3 2>&1) || [[ $out == *"already exists"* ]] || die "sacctmgr add qos: $out"
fi
# Limits are enforced (slurm.conf): root, who runs the tests, may use every QoS here.
if [[ $(sacctmgr -n -P show assoc where user=root format=QOS) != "dev3,normal,short5" ]]; then
    out=$(sacctmgr -i modify user root set qos=normal,short5,dev3 defaultqos=normal 2>&1) || die "sacctmgr modify user root: $out"
fi

if ((slurm_conf_changed)); then
    # A changed slurm.conf (node lines included) is simplest to apply by restarting.
    for node in "${NODES[@]}" "${WIDE_NODES[@]}"; do stop_daemon "$(slurmd_pidfile "$node")" slurmd; done
    stop_daemon "$SLURMCTLD_PID" slurmctld
fi
if ! daemon_pid "$SLURMCTLD_PID" slurmctld >/dev/null; then
    log "starting slurmctld"
    slurmctld </dev/null >"$(start_log slurmctld)" 2>&1 || die_log "$(start_log slurmctld)" "slurmctld did not start"
fi
for node in "${NODES[@]}"; do
    if ! daemon_pid "$(slurmd_pidfile "$node")" slurmd >/dev/null; then
        log "starting slurmd for $node"
        install -d -m 755 "/var/lib/slurm/slurmd/$node"
        # -N: this daemon is node $node; its port, spool, log and pid file follow from slurm.conf.
        slurmd -N "$node" </dev/null >"$(start_log "slurmd-$node")" 2>&1 ||
            die_log "$(start_log "slurmd-$node")" "slurmd -N $node did not start"
    fi
done

# ---- 7. Wait for the nodes, then run real jobs ---------------------------------------------
# A node is usable once it answers (no "*" after its state) and is not down or drained; a node
# drained by an earlier failure is resumed, as this is a throw-away test cluster.
nodes_up() {
    local states node state ok=0
    states=$(sinfo -h -N -o '%N %t' 2>/dev/null) || return 1
    for node in "${NODES[@]}"; do
        state=$(awk -v n="$node" '$1 == n {print $2}' <<<"$states")
        case $state in
            idle | mix | alloc | comp) ;;
            drain)
                log "$node is drained ($(sinfo -h -N -n "$node" -o %E)): resuming it"
                scontrol update NodeName="$node" State=RESUME || true
                ok=1
                ;;
            *) ok=1 ;;
        esac
    done
    return $ok
}
sacct_ok() { sacct -n -X -a -S now-1minutes -o jobid >/dev/null 2>&1; }
wait_for 60 nodes_up || {
    sinfo -N -o '%N %t %E' >&2 || true
    die "nodes ${NODES[*]} not up after 60 s (see $SLURM_LOG/slurmctld.log, $SLURM_LOG/slurmd-n*.log)"
}
wait_for 30 sacct_ok || die "sacct does not work (see $SLURM_LOG/slurmdbd.log)"

if [[ $(sinfo -h -N -p debug -o '%t' | sort -u) == idle ]]; then
    # One task on each node: proves both slurmd daemons launch steps.
    # shellcheck disable=SC2016  # expanded by the job's shell, not here
    got=$(timeout 60 srun -N2 -n2 --ntasks-per-node=1 -t 1 -J local-cluster-check \
        bash -c 'echo $SLURMD_NODENAME $SLURM_PROCID' | sort) || die "srun -N2 failed: $got"
    [[ $got == $'n1 0\nn2 1' ]] || die "srun -N2 printed '$got', expected 'n1 0' and 'n2 1'"
    # A batch job must reach sacct as COMPLETED: proves accounting end to end.
    jobid=$(sbatch --parsable -N1 -t 1 -J local-cluster-check -o /dev/null --wrap true)
    job_state() { sacct -j "$jobid" -X -n -o state 2>/dev/null | tr -d ' '; }
    job_done() { [[ $(job_state) =~ ^(COMPLETED|FAILED|CANCELLED.*|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY)$ ]]; }
    wait_for 60 job_done || die "batch job $jobid not finished in sacct after 60 s (state: '$(job_state)')"
    [[ $(job_state) == COMPLETED ]] || die "batch job $jobid ended $(job_state)"
    log "slurm ok: srun on n1 and n2, batch job $jobid COMPLETED in sacct"
else
    log "slurm ok: nodes busy with jobs, test jobs skipped"
fi

# ---- 8. PostgreSQL 15 for the HPO service --------------------------------------------------
pg_status() { pg_lsclusters -h "$PG_VERSION" "$PG_CLUSTER" 2>/dev/null | awk '{print $4}'; }
if [[ -z $(pg_lsclusters -h "$PG_VERSION" "$PG_CLUSTER" 2>/dev/null) ]]; then
    log "creating PostgreSQL cluster $PG_VERSION/$PG_CLUSTER"
    pg_createcluster "$PG_VERSION" "$PG_CLUSTER" >&2
fi
pg_conf=/etc/postgresql/$PG_VERSION/$PG_CLUSTER/conf.d/hpo-local-cluster.conf
pg_conf_changed=0
update_file "$pg_conf" "$(<"$HERE/postgresql.conf")" 644 && pg_conf_changed=1
chown postgres:postgres "$pg_conf"
# pg_hba.conf of Debian already asks for scram-sha-256 on 127.0.0.1; make sure it still does.
grep -Eq '^host\s+all\s+all\s+127\.0\.0\.1/32\s+(scram-sha-256|md5)\s*$' \
    "/etc/postgresql/$PG_VERSION/$PG_CLUSTER/pg_hba.conf" ||
    die "pg_hba.conf has no 'host all all 127.0.0.1/32 scram-sha-256' line"
# pg_ctlcluster would hand over to systemctl where systemd runs; we start the server directly.
if [[ $(pg_status) == online* ]]; then
    if ((pg_conf_changed)); then
        log "restarting PostgreSQL (configuration changed)"
        pg_ctlcluster --skip-systemctl-redirect "$PG_VERSION" "$PG_CLUSTER" restart </dev/null >/dev/null 2>&1 ||
            die_log "/var/log/postgresql/postgresql-$PG_VERSION-$PG_CLUSTER.log" "PostgreSQL did not restart"
    fi
else
    log "starting PostgreSQL $PG_VERSION"
    pg_ctlcluster --skip-systemctl-redirect "$PG_VERSION" "$PG_CLUSTER" start </dev/null >/dev/null 2>&1 ||
        die_log "/var/log/postgresql/postgresql-$PG_VERSION-$PG_CLUSTER.log" "PostgreSQL did not start"
fi
wait_for 30 pg_isready -q -h 127.0.0.1 -p "$PG_PORT" || die "PostgreSQL does not accept connections on 127.0.0.1:$PG_PORT"

# The hpo role's password: generated once, kept in a root-only pgpass file and reused.
install -d -m 700 "$(dirname "$PG_PASSFILE")"
pg_pass=$(grep -F "$PG_PASSLINE_PREFIX" "$PG_PASSFILE" 2>/dev/null | cut -d: -f5) || true
[[ $pg_pass =~ ^[0-9a-f]{32}$ ]] || pg_pass=$(openssl rand -hex 16)
update_file "$PG_PASSFILE" "$PG_PASSLINE_PREFIX$pg_pass" 600 || true
# Role and database, idempotently; the password reaches psql through stdin only.
runuser -u postgres -- psql -X -q -v ON_ERROR_STOP=1 -d postgres >/dev/null <<SQL
SELECT 'CREATE ROLE $PG_ROLE LOGIN' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_ROLE')\gexec
ALTER ROLE $PG_ROLE WITH LOGIN CREATEDB PASSWORD '$pg_pass';
SELECT 'CREATE DATABASE $PG_DB OWNER $PG_ROLE' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '$PG_DB')\gexec
SQL
# Clients authenticate through ~/.pgpass: replace our line there, keep the others.
pgpass=${HOME:?}/.pgpass
others=$(grep -vE "^127\.0\.0\.1:${PG_PORT}:[^:]*:${PG_ROLE}:" "$pgpass" 2>/dev/null) || true
update_file "$pgpass" "${others:+$others$'\n'}$PG_PASSLINE_PREFIX$pg_pass" 600 || true
[[ $(psql -X -A -t -w "$PG_URL" -c 'select 1' 2>&1) == 1 ]] ||
    die "cannot connect to $PG_URL with the password of $pgpass"
log "postgres ok: $PG_URL (password in $pgpass and $PG_PASSFILE)"

# ---- 9. The fault cluster: a second Slurm for the tests that stop its daemons ----------------
bash "$HERE/faults.sh"

echo "$PG_URL"
