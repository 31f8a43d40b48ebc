"""A candidate stop rule, measured by the replay and not shipped (it did not beat TPE without
pruning on the recorded tasks: bench/results/replay-notes.md): stop a trial whose final value,
predicted from its curve so far, is confidently worse than the best.

Optuna's median and successive-halving pruners compare a trial's value at a step with other
trials' values at that step. Under a OneCycle schedule (and any long warm-up) the early steps rank
configurations poorly (rank correlation with the last epoch 0.1 to 0.6 on the recorded tasks), so
a fixed step to start pruning from is either too early on one task or too late on another. This
rule learns, from the study's own completed trials, how well the value at each step predicts the
final one, and prunes only when that prediction is confidently below the best final value: where
early steps predict badly, the prediction's interval is wide and nothing is stopped.
"""

from __future__ import annotations

import math

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState


class CurvePruner(optuna.pruners.BasePruner):
    """At the step a trial just reported, fit ``final = a + b * value_at_step`` by least squares
    over the study's completed trials that reported that step, and prune when the trial's
    predicted final value plus ``z`` standard errors of prediction is still below (for a maximized
    metric; above, minimized) the best final value.

    ``n_startup_trials``: completed trials needed before any pruning (fewer, and the fit says
    little). ``n_warmup_steps``: steps before which no trial is pruned. ``z``: how sure the
    prediction must be; 2 is about 97.5% one-sided under Gaussian residuals.
    """

    def __init__(self, n_startup_trials: int = 5, n_warmup_steps: int = 0, z: float = 2.0) -> None:
        if n_startup_trials < 3:
            raise ValueError("n_startup_trials must be at least 3 (a line and its residuals)")
        if n_warmup_steps < 0:
            raise ValueError("n_warmup_steps must be 0 or more")
        if not z >= 0:
            raise ValueError("z must be 0 or more")
        self.n_startup_trials = n_startup_trials
        self.n_warmup_steps = n_warmup_steps
        self.z = z

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        step = trial.last_step
        if step is None or step < self.n_warmup_steps or len(study.directions) != 1:
            return False
        value = trial.intermediate_values[step]
        if not math.isfinite(value):
            return False
        sign = 1.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else -1.0
        pairs = [
            (t.intermediate_values[step], t.value)
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if step in t.intermediate_values and t.value is not None
        ]
        pairs = [(x, y) for x, y in pairs if math.isfinite(x) and math.isfinite(y)]
        if len(pairs) < self.n_startup_trials:
            return False
        x, y = (sign * np.array(column, dtype=float) for column in zip(*pairs, strict=True))
        upper = predicted_upper_bound(x, y, sign * value, self.z)
        return bool(upper < y.max())


def predicted_upper_bound(x: np.ndarray, y: np.ndarray, at: float, z: float) -> float:
    """The least-squares line's prediction of y at ``at`` plus ``z`` standard errors of a new
    observation there (the residual variance, the line's own uncertainty and its distance from
    the data's centre: the textbook prediction interval)."""
    n = len(x)
    centre = x.mean()
    spread = float(((x - centre) ** 2).sum())
    if spread <= 1e-12:  # every completed trial had the same value at this step: it predicts nothing
        return math.inf
    slope = float(((x - centre) * (y - y.mean())).sum() / spread)
    intercept = float(y.mean() - slope * centre)
    residual_var = float(((y - intercept - slope * x) ** 2).sum() / (n - 2))
    standard_error = math.sqrt(residual_var * (1 + 1 / n + (at - centre) ** 2 / spread))
    return intercept + slope * at + z * standard_error
