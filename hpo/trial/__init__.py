"""What runs inside a trial's job: the objective, the reporter to Optuna, the task, the worker loop;
and the trial API a user's script imports (``from hpo import trial``; see ``client``)."""

from hpo.trial.client import Trial, checkpoint_dir, in_study, number, params, report, share_decision

__all__ = ["Trial", "checkpoint_dir", "in_study", "number", "params", "report", "share_decision"]
