"""The site's limits on one user's jobs, read from Slurm once per launch.

Slurm refuses a submission past the user's MaxSubmitJobs (of the QoS or the association: pending
and running jobs, each array task one job) and leaves jobs past MaxJobs pending; a job array may
not be longer than MaxArraySize. The launcher reads them here (``sacctmgr show qos/assoc``,
``scontrol show config``, ``squeue`` for the user's other jobs) so that ``max_concurrent`` and
``--workers`` fit inside them (``hpo.dispatch.site``). Where accounting cannot be asked (no
slurmdbd, no ``sacctmgr``), there are no limits to read and nothing is clamped: sbatch judges.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import pwd
import subprocess

from hpo.config.values import parse_duration_min

_QOS_FIELDS = ("Name", "MaxSubmitPU", "MaxJobsPU", "GrpSubmit", "GrpJobs")
_ASSOC_FIELDS = ("Account", "User", "Partition", "DefaultQOS", "MaxSubmit", "MaxJobs")


@dataclasses.dataclass(frozen=True)
class JobLimit:
    """At most ``jobs`` of the user's jobs at once (``refused``: past it sbatch fails; otherwise
    the jobs past it pend), as ``name`` says where it comes from."""

    jobs: int
    name: str
    refused: bool
    qos: str | None = None
    """The QoS the limit belongs to (None: the user's association, every QoS)."""
    account: str | None = None
    """The association's account, for an association's limit."""
    per_user: bool = True
    """False for a QoS's Grp limits: every user's jobs in the QoS count."""


def _run_all(*commands: list[str]) -> list[str | None]:
    """The commands' outputs (see :func:`_run`), run at once: each is a round trip to a Slurm
    daemon, a tenth of a second or more, and a launch asks several before its first job."""
    with concurrent.futures.ThreadPoolExecutor(len(commands)) as pool:
        return list(pool.map(_run, commands))


def _run(args: list[str]) -> str | None:
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def parse_table(out: str, fields: tuple[str, ...]) -> list[dict[str, str]]:
    """``sacctmgr -n -P show ... format=<fields>``: one dict per line."""
    rows = []
    for line in out.splitlines():
        if "|" in line:
            values = line.split("|")
            rows.append(dict(zip(fields, [*values, *[""] * len(fields)], strict=False)))
    return rows


def _number(text: str) -> int | None:
    return int(text) if text.strip().isdigit() else None


def job_limits(qos: str | None, account: str | None) -> list[JobLimit]:
    """The limits on how many jobs this user may have at once that apply to a job of ``qos``
    (None: the association's default QoS, else ``normal``) and ``account`` (None: the default)."""
    assoc_out, qos_out = _run_all(
        [
            "sacctmgr",
            "-n",
            "-P",
            "show",
            "assoc",
            "where",
            f"user={_user()}",
            f"format={','.join(_ASSOC_FIELDS)}",
        ],
        ["sacctmgr", "-n", "-P", "show", "qos", f"format={','.join(_QOS_FIELDS)}"],
    )
    if assoc_out is None or qos_out is None:
        return []
    return limits_from(parse_table(assoc_out, _ASSOC_FIELDS), parse_table(qos_out, _QOS_FIELDS), qos, account)


def limits_from(
    assocs: list[dict[str, str]], qoses: list[dict[str, str]], qos: str | None, account: str | None
) -> list[JobLimit]:
    """:func:`job_limits` from the two tables (tested on recorded outputs)."""
    mine = [a for a in assocs if account is None or a["Account"] == account]
    limits: list[JobLimit] = []
    for assoc in mine[:1]:  # the account's association (the first listed: sacctmgr's default first)
        where = f"association {assoc['Account']}/{assoc['User']}"
        if (n := _number(assoc["MaxSubmit"])) is not None:
            limits.append(JobLimit(n, f"{where}'s MaxSubmitJobs", refused=True, account=assoc["Account"]))
        if (n := _number(assoc["MaxJobs"])) is not None:
            limits.append(JobLimit(n, f"{where}'s MaxJobs", refused=False, account=assoc["Account"]))
        qos = qos or assoc["DefaultQOS"] or None
    qos = qos or "normal"
    for row in qoses:
        if row["Name"] != qos:
            continue
        for key, label, refused in (
            ("MaxSubmitPU", "MaxSubmitJobsPerUser", True),
            ("GrpSubmit", "GrpSubmitJobs", True),
            ("MaxJobsPU", "MaxJobsPerUser", False),
            ("GrpJobs", "GrpJobs", False),
        ):
            if (n := _number(row[key])) is not None:
                per_user = not key.startswith("Grp")
                limits.append(JobLimit(n, f"QoS {qos}'s {label}", refused, qos=qos, per_user=per_user))
    return limits


def max_array_size() -> int | None:
    """``scontrol show config``'s MaxArraySize: a job array's indexes run from 0 to one less."""
    out = _run(["scontrol", "show", "config"])
    for line in (out or "").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "MaxArraySize":
            return _number(value)
    return None


def users_other_jobs(limit: JobLimit, own_names: set[str]) -> int | None:
    """How many of the user's queued jobs count against ``limit`` besides the study's own (each
    array task one job); None when squeue cannot tell."""
    args = ["squeue", "-h", "-r", "-o", "%j"]
    if limit.per_user:
        args += ["-u", _user()]
    if limit.qos is not None:
        args += ["-q", limit.qos]
    if limit.account is not None:
        args += ["-A", limit.account]
    out = _run(args)
    if out is None:
        return None
    return sum(1 for name in out.splitlines() if name.strip() and name.strip() not in own_names)


def _default_qos_query() -> list[str]:
    return ["sacctmgr", "-n", "-P", "show", "assoc", "where", f"user={_user()}", "format=Account,DefaultQOS"]


def _default_qos(account: str | None, out: str | None) -> str:
    """The default QoS of the user's association with ``account`` from :func:`_default_qos_query`."""
    for line in (out or "").splitlines():
        assoc, _, default = line.partition("|")
        if default and (account is None or assoc == account):
            return default
    return "normal"


def qos_walls() -> dict[str, str] | None:
    """Each QoS's MaxWall as sacctmgr prints it (empty where it has none); None where sacctmgr
    cannot be asked (no accounting)."""
    out = _run(_QOS_WALLS_QUERY)
    return None if out is None else parse_qos_walls(out)


_QOS_WALLS_QUERY = ["sacctmgr", "-n", "-P", "show", "qos", "format=Name,MaxWall"]


def parse_qos_walls(out: str) -> dict[str, str]:
    """``sacctmgr -n -P show qos format=Name,MaxWall``: QoS name -> its MaxWall as printed."""
    return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)


def longest_job_min(qos: str | None, partition: str | None, account: str | None) -> tuple[float, str] | None:
    """The longest time limit a job may ask for, in minutes, and what sets it: the QoS's MaxWall
    (``qos``, else the default QoS of the user's association with ``account``) or the partition's
    MaxTime (``partition``, else the default one), whichever is shorter; None where neither has
    one or Slurm cannot tell."""
    found: list[tuple[float, str]] = []
    walls_out, times, *assoc_out = _run_all(
        _QOS_WALLS_QUERY, ["sinfo", "-h", "-o", "%P|%l"], *([] if qos else [_default_qos_query()])
    )
    qos = qos or _default_qos(account, assoc_out[0])
    wall = (parse_qos_walls(walls_out) if walls_out is not None else {}).get(qos, "").strip()
    if wall:
        found.append((parse_duration_min("MaxWall", wall), f"QoS {qos}'s MaxWall is {wall}"))
    for line in (times or "").splitlines():
        name, _, limit = line.partition("|")
        default = name.endswith("*")
        name = name.rstrip("*")
        if (name == partition or (partition is None and default)) and limit.strip() not in ("", "infinite"):
            found.append(
                (
                    parse_duration_min("MaxTime", limit.strip()),
                    f"partition {name}'s MaxTime is {limit.strip()}",
                )
            )
    return min(found) if found else None
