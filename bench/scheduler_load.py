"""What a run costs Slurm's daemons: slurmctld's RPCs (``sdiag``) and slurmdbd's (``sacctmgr show
stats``), both counted by message type from a reset before the run to a read after it.

A site rate-limits slurmctld per user (Slurm 23.02's ``rl_enable``: a 30-token bucket refilled at 2
per second by default) and watches slurmdbd's ``DBD_GET_JOBS_COND`` (one per ``sacct`` call): these
two counts are what a launcher's polling adds to the load of the jobs themselves.
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from dataclasses import dataclass, field

_RPC_LINE = re.compile(r"^\s+([A-Z][A-Z0-9_]+)\s+\(\s*\d+\)\s+count:(\d+)")

# The counters' own RPCs: the reset and the read, not the run's.
_OWN = {"REQUEST_STATS_INFO", "DBD_CLEAR_STATS", "DBD_GET_STATS"}

SACCT_QUERY = "DBD_GET_JOBS_COND"

# slurmctld RPCs a user's command sends (the rest come from slurmd and slurmstepd for each job:
# step and batch completion, epilog, registration). By type, since all run as one user here.
CLIENT_RPCS = {
    "REQUEST_SUBMIT_BATCH_JOB": "sbatch",
    "REQUEST_JOB_INFO": "squeue",
    "REQUEST_JOB_INFO_SINGLE": "squeue -j / scontrol show job",
    "REQUEST_JOB_USER_INFO": "squeue -u",
    "REQUEST_NODE_INFO": "sinfo",
    "REQUEST_PARTITION_INFO": "sinfo",
    "REQUEST_BUILD_INFO": "scontrol show config",
    "REQUEST_JOB_STEP_CREATE": "srun (a step)",
    "REQUEST_JOB_ALLOCATION_INFO": "srun (inside a job)",
    "REQUEST_CANCEL_JOB_STEP": "scancel",
    "REQUEST_KILL_JOB": "scancel",
    "REQUEST_JOB_REQUEUE": "scontrol requeue",
    "REQUEST_UPDATE_JOB": "scontrol update",
    "REQUEST_FED_INFO": "any client command (federation look-up)",
}


def parse_rpc_counts(out: str) -> Counter[str]:
    """``sdiag`` or ``sacctmgr show stats``: message type -> count, from the "by message type"
    section only (the "by user" section repeats the totals)."""
    counts: Counter[str] = Counter()
    section = ""
    for line in out.splitlines():
        if line and not line[0].isspace():
            section = line
            continue
        if "by message type" not in section:
            continue
        match = _RPC_LINE.match(line)
        if match and match.group(1) not in _OWN:
            counts[match.group(1)] += int(match.group(2))
    return counts


@dataclass
class SchedulerLoad:
    """RPCs counted over one run."""

    controller: Counter[str] = field(default_factory=Counter)
    database: Counter[str] = field(default_factory=Counter)

    @property
    def controller_total(self) -> int:
        return sum(self.controller.values())

    @property
    def sacct_queries(self) -> int:
        return self.database[SACCT_QUERY]

    def summary(self, trials: int, minutes: float) -> dict[str, object]:
        return {
            "slurmctld_rpcs": self.controller_total,
            "slurmctld_rpcs_per_trial": round(self.controller_total / trials, 2),
            "slurmctld_rpcs_per_min": round(self.controller_total / minutes, 1),
            "sacct_queries": self.sacct_queries,
            "sacct_queries_per_trial": round(self.sacct_queries / trials, 2),
            "slurmctld_by_type": dict(self.controller.most_common()),
        }


def reset() -> None:
    """Zero both daemons' RPC counters (root, or the SlurmUser, may)."""
    subprocess.run(["sdiag", "--reset"], check=True, capture_output=True, timeout=60)
    subprocess.run(["sacctmgr", "-i", "clear", "stats"], check=True, capture_output=True, timeout=60)


def read() -> SchedulerLoad:
    sdiag = subprocess.run(["sdiag"], check=True, capture_output=True, text=True, timeout=60).stdout
    stats = subprocess.run(
        ["sacctmgr", "show", "stats"], check=True, capture_output=True, text=True, timeout=60
    ).stdout
    return SchedulerLoad(parse_rpc_counts(sdiag), parse_rpc_counts(stats))
