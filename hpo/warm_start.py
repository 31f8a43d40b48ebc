"""Warm starts: seed a study with what earlier studies learned (``study.warm_start``).

``studies``: each earlier study's COMPLETE trials are added to this one as completed trials, once
(a relaunch does not import them again). They keep their values, not their curves: the pruner
compares this study's epochs with this study's epochs only. The sampler learns from them as from
its own trials; they are marked ``imported_from`` and count in no budget, are never re-run and
are never this study's best (their values were measured elsewhere). A parameter this space does
not have is left out of the imported trial (with a warning); a trial whose value lies outside
this space is dropped (with a warning). With ``rescale_lr``, an imported trainer lr is rescaled by
the linear rule when the global batch (batch_size x ranks) it ran with differs from what it would
be here, as ``search_space.lr.scale_with_batch_size`` does within a study.

``enqueue_best_of``: that study's best configurations are queued to run first, as this study's
own trials.

A source study that does not exist, measures another metric, or has no trial this space can take
is bad input: one line, exit 2, read before this study is created or anything submitted.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import optuna

from hpo import record, search, study_record, tally
from hpo.errors import StudyFileError
from hpo.storage import StorageRef, mask, open_storage, resolve_storage
from trainer.config import TrainConfig

if TYPE_CHECKING:
    from hpo.config import StudySpec

STUDY_ATTR_RANKS = "hpo_ranks_per_trial"
"""The processes one trial ran on (its global batch is batch_size times this)."""


@dataclasses.dataclass
class Plan:
    """What a warm start adds, read from the source studies before anything is written."""

    imports: dict[str, list[optuna.trial.FrozenTrial]] = dataclasses.field(default_factory=dict)
    """Per source study, the completed trials to add (already in this study's space)."""
    enqueue: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)


def plan(spec: StudySpec, storage: StorageRef) -> Plan:
    """Read the source studies, leaving out those this study (if it exists) imported already."""
    warm = spec.study.warm_start
    result = Plan()
    if not warm.sources:
        return result
    study: optuna.Study | None = None
    if not storage.missing:
        try:
            study = optuna.load_study(study_name=spec.study.name, storage=open_storage(storage, create=False))
        except KeyError:
            study = None
    done = (
        set(study.user_attrs.get(study_record.STUDY_ATTR_WARM_STARTED_FROM, []))
        if study is not None
        else set()
    )
    source_ref = resolve_storage(spec, warm.storage, spec.source) if warm.storage else storage
    for key, name in [*(("studies", n) for n in warm.studies), ("enqueue_best_of", warm.enqueue_best_of)]:
        if name is None or (key == "studies" and name in done):
            continue
        if key == "enqueue_best_of" and f"best-of:{name}" in done:
            continue
        source = _load(spec, source_ref, name, f"study.warm_start.{key}")
        trials, dropped = _translate(spec, source)
        if not trials:
            raise StudyFileError(
                f"{spec.source}: study.warm_start.{key}: study {name!r} has no completed trial this "
                f"search space can take ({'; '.join(dropped[:2]) or 'none completed'})"
            )
        if dropped:
            result.warnings.append(
                f"warm start from {name!r}: {len(dropped)} trials left out ({dropped[0]}"
                + (f"; {len(dropped) - 1} more" if len(dropped) > 1 else "")
                + ")"
            )
        if key == "studies":
            result.imports[name] = trials
        else:
            pick = max if spec.study.direction == "maximize" else min
            ranked = sorted(trials, key=lambda t: t.values[0], reverse=pick is max)
            result.enqueue = [dict(t.params) for t in ranked[: warm.enqueue_best]]
    return result


def apply(spec: StudySpec, study: optuna.Study, planned: Plan, log: Any = print) -> None:
    """Write the plan into this study (the launcher, holding the study's lease)."""
    done = list(study.user_attrs.get(study_record.STUDY_ATTR_WARM_STARTED_FROM, []))
    for warning in planned.warnings:
        log(f"warning: {warning}")
    # A launch stopped between adding trials and marking the study may have imported some.
    already = {
        t.user_attrs[record.ATTR_IMPORTED_FROM]
        for t in study.get_trials(deepcopy=False)
        if record.ATTR_IMPORTED_FROM in t.user_attrs
    }
    for name, trials in planned.imports.items():
        trials = [t for t in trials if t.user_attrs[record.ATTR_IMPORTED_FROM] not in already]
        study.add_trials(trials)
        done.append(name)
        study.set_user_attr(study_record.STUDY_ATTR_WARM_STARTED_FROM, done)
        log(
            f"warm start: imported {len(trials)} completed trials of study {name!r} (not counted in the budget)"
        )
    room = spec.study.n_trials - tally.started_count(study)
    if planned.enqueue and room > 0:
        # Not Optuna's skip_if_exists: it would match the imported copies of these very trials.
        ran = [t.params for t in tally.own_trials(study)] + [
            t.system_attrs.get("fixed_params", {})
            for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
        ]
        queued = [params for params in planned.enqueue if params not in ran][:room]
        for params in queued:
            study.enqueue_trial(params)
        best_of = spec.study.warm_start.enqueue_best_of
        done.append(f"best-of:{best_of}")
        study.set_user_attr(study_record.STUDY_ATTR_WARM_STARTED_FROM, done)
        log(f"enqueued the {len(queued)} best configurations of study {best_of!r} to run first")
    study.set_user_attr(STUDY_ATTR_RANKS, spec.trial_ranks)


def _load(spec: StudySpec, ref: StorageRef, name: str, key: str) -> optuna.Study:
    missing = StudyFileError(f"{spec.source}: {key}: no study {name!r} in {mask(str(ref))}")
    if ref.missing:
        raise missing
    try:
        source = optuna.load_study(study_name=name, storage=open_storage(ref, create=False))
    except KeyError:
        raise missing from None
    stored = study_record.stored_definition(source)
    theirs = stored["objectives"] if stored else None
    ours = search.objective_names(spec)
    if theirs is not None and theirs != ours:
        raise StudyFileError(
            f"{spec.source}: {key}: study {name!r} measures {', '.join(theirs)}, this one {', '.join(ours)}"
        )
    if [d.name.lower() for d in source.directions] != search.directions(spec):
        raise StudyFileError(
            f"{spec.source}: {key}: study {name!r} optimizes in another direction than this one"
        )
    return source


def _translate(spec: StudySpec, source: optuna.Study) -> tuple[list[optuna.trial.FrozenTrial], list[str]]:
    """The source's completed trials as trials of this study's space, and why others were dropped."""
    space = search.distributions(spec)
    definition = study_record.stored_definition(source) or {}
    ranks_there = int(source.user_attrs.get(STUDY_ATTR_RANKS, spec.trial_ranks))
    trials: list[optuna.trial.FrozenTrial] = []
    dropped: list[str] = []
    unknown: set[str] = set()
    for trial in source.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        if not trial.values or trial.user_attrs.get(record.ATTR_INFEASIBLE) or not tally.is_own(trial):
            continue
        params = {k: v for k, v in trial.params.items() if k in space}
        unknown.update(k for k in trial.params if k not in space)
        if spec.study.warm_start.rescale_lr and "lr" in params and spec.objective is None:
            params["lr"] = _rescaled_lr(spec, definition, trial.params, ranks_there)
        outside = [
            f"trial {trial.number}: {k} {why}"
            for k, v in params.items()
            if (why := spec.search_space[k].rejects(v)) is not None
        ]
        if outside or not params:
            dropped.append(outside[0] if outside else f"trial {trial.number}: no parameter of this space")
            continue
        try:
            trials.append(
                optuna.trial.create_trial(
                    params=params,
                    distributions={k: space[k] for k in params},
                    values=list(trial.values),
                    user_attrs={record.ATTR_IMPORTED_FROM: f"{source.study_name}#{trial.number}"},
                )
            )
        except ValueError as err:  # a value off this space's step grid (a rescaled lr, say)
            dropped.append(f"trial {trial.number}: {err}")
    if unknown:
        dropped.insert(0, f"parameters {', '.join(sorted(unknown))} are not in this space and were left out")
    return trials, dropped


def _rescaled_lr(spec: StudySpec, there: dict[str, Any], params: dict[str, Any], ranks_there: int) -> float:
    """The source trial's lr as a value of this study's lr parameter, keeping lr / global batch."""
    fixed_there = there.get("fixed", {})
    scale_there = there.get("search_space", {}).get("lr", {}).get("scale_with_batch_size")
    batch_there = int(params.get("batch_size", fixed_there.get("batch_size", TrainConfig.batch_size)))
    global_there = batch_there * ranks_there
    lr_used = float(params["lr"]) * (global_there / scale_there if scale_there else 1.0)
    scale_here = spec.search_space["lr"].scale_with_batch_size
    if scale_here:
        return lr_used * scale_here / global_there
    batch_here = int(params.get("batch_size", spec.trainer.get("batch_size", TrainConfig.batch_size)))
    if "batch_size" not in spec.search_space:
        batch_here = int(spec.trainer.get("batch_size", TrainConfig.batch_size))
    return lr_used * batch_here * spec.trial_ranks / global_there
