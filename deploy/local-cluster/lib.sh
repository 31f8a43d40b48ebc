# Shared by up.sh and down.sh (sourced, not run): names, paths and small helpers.
# shellcheck shell=bash disable=SC2034  # the names are used by the scripts that source this

CLUSTER=localcluster
NODES=(n1 n2 n3)
# Sixteen more emulated nodes of 4 CPUs (partition wide), whose slurmd run only while wide.sh has
# them up: for measuring 64 trials in flight across many nodes. Down otherwise, used by nothing.
mapfile -t WIDE_NODES < <(printf 'w%d\n' {1..16})
PG_VERSION=15
PG_CLUSTER=main
PG_PORT=5432
PG_DB=hpo
PG_ROLE=hpo
PG_URL="postgresql://${PG_ROLE}@127.0.0.1:${PG_PORT}/${PG_DB}"
# Root-only copy of the generated PostgreSQL password, in pgpass format (usable as PGPASSFILE).
# Any database: the test suite creates a fresh database per test (the role may CREATEDB).
PG_PASSFILE=/etc/hpo/local-cluster.pgpass
PG_PASSLINE_PREFIX="127.0.0.1:${PG_PORT}:*:${PG_ROLE}:"

# MariaDB (slurmdbd's store) also serves the service's MySQL storage for the tests: the hpo user
# may create databases named hpo_*, one per test. Its password, generated once, root-only.
MYSQL_PORT=3306
MYSQL_USER=hpo
MYSQL_PASSFILE=/etc/hpo/local-cluster.mysql

SLURM_RUN=/run/slurm
SLURM_LOG=/var/log/slurm
SLURMCTLD_PID=$SLURM_RUN/slurmctld.pid
SLURMDBD_PID=$SLURM_RUN/slurmdbd.pid
slurmd_pidfile() { echo "$SLURM_RUN/slurmd-$1.pid"; }
MARIADB_PID=/run/mysqld/mysqld.pid

# The fault cluster (faults.sh): a second Slurm on this host, for the tests that stop its daemons.
FAULTS_CLUSTER=localfaults
FAULT_NODES=(f1 f2)
FAULTS_CONF_DIR=/etc/slurm-faults
FAULTS_RUN=/run/slurm-faults
FAULTS_LOG=/var/log/slurm-faults
MUNGED_PID=/run/munge/munged.pid

log() { printf '[%s] %s\n' "$SCRIPT" "$*" >&2; }
die() { printf '[%s] ERROR: %s\n' "$SCRIPT" "$*" >&2; exit 1; }

# True if process $1 exists and is not a zombie (PID 1 here may be slow to reap orphans).
alive() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [[ ${stat:0:1} != Z ]]
}
dead() { ! alive "$1"; }

# Prints the pid recorded in pidfile $1 if that process is alive and is named $2; fails otherwise
# (a stale pid file, or a pid reused by something else, counts as not running).
daemon_pid() {
    local pid=
    [[ -r $1 ]] || return 1
    read -r pid <"$1" || true
    [[ $pid =~ ^[0-9]+$ ]] && alive "$pid" || return 1
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$2" ]] || return 1
    echo "$pid"
}

# Runs "$@" every 0.5 s until it succeeds or $1 seconds have passed; returns 1 on timeout.
wait_for() {
    local deadline=$((SECONDS + $1))
    shift
    until "$@"; do
        ((SECONDS < deadline)) || return 1
        sleep 0.5
    done
}

# Sends SIGTERM to the daemon of pidfile $1 (named $2) and waits up to $3 s for it to exit, then
# SIGKILL. Does nothing when it is not running.
stop_daemon() {
    local pidfile=$1 name=$2 timeout=${3:-30} pid
    pid=$(daemon_pid "$pidfile" "$name") || return 0
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    if ! wait_for "$timeout" dead "$pid"; then
        log "$name (pid $pid) still running after ${timeout}s: SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        wait_for 5 dead "$pid" || die "could not stop $name (pid $pid)"
    fi
    rm -f "$pidfile"
}

# Template $1 with each following pair of arguments (placeholder, value) substituted; done by
# bash itself so that the password never shows on a command line.
render() {
    local text
    text=$(<"$1")
    shift
    while (($#)); do
        text=${text//"$1"/"$2"}
        shift 2
    done
    printf '%s' "$text"
}
# Writes content $2 to $1 (root-owned, mode $3) unless it is already there; succeeds only when
# the file changed, so that the daemons reading it get restarted.
update_file() {
    local dst=$1 content=$2 mode=$3 tmp
    if [[ -f $dst && $(<"$dst") == "$content" ]]; then
        chmod "$mode" "$dst"
        return 1
    fi
    tmp=$(mktemp "$dst.XXXXXX") # created mode 600: no window where a secret is readable
    printf '%s\n' "$content" >"$tmp"
    chmod "$mode" "$tmp"
    mv -f "$tmp" "$dst"
}
