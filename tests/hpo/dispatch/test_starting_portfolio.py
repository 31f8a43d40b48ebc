"""The learned starting portfolio (hpo/portfolio.py, hpo/portfolio.json): a study that names no
sampler runs its entries first, in the study's own ranges, once; one that names a sampler, or is
warm-started, does not."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from hpo import portfolio, search
from hpo.config import load_study
from hpo.errors import StudyFileError
from hpo.trial.check import check_parameters
from tests.hpo.helpers import load_trials, run_hpo, score_study, write_study

# A user's own objective over parameters two of which have a portfolio role (lr, wd).
OBJECTIVE = """
import math

def objective(params, trial):
    value = -abs(math.log10(params["lr"]) + 2) - abs(math.log10(params["wd"]) + 4) + params["x"]
    trial.report(1, value)
    return value
"""


def portfolio_study(tmp_path: Path, name: str, **study: Any) -> dict[str, Any]:
    (tmp_path / "my_objective.py").write_text(OBJECTIVE)
    document = score_study(tmp_path, name, {"steps": 1, "function": "my_objective:objective"}, **study)
    del document["study"]["sampler"]
    document["search_space"] = {
        "lr": {"type": "float", "low": 1e-4, "high": 0.1, "log": True},
        "wd": {"type": "float", "low": 1e-6, "high": 1e-2, "log": True},
        "x": {"type": "float", "low": 0.0, "high": 1.0},
    }
    return document


@pytest.mark.fast
def test_the_shipped_entries_map_into_any_studys_ranges(tmp_path: Path) -> None:
    shipped = json.loads(portfolio.SHIPPED.read_text())
    assert len(shipped["entries"]) >= 4 and len(shipped["from_tasks"]) >= 5
    study_file = write_study(tmp_path / "s.yaml", portfolio_study(tmp_path, "map", n_trials=8))
    spec = load_study(study_file)
    assert spec.study.portfolio.size == 4
    first = portfolio.starting_trials(spec)
    assert len(first) == 4 and all(set(p) == {"lr", "wd"} for p in first)  # x: no role, the sampler's
    dry = run_hpo("launch", str(study_file), "--dry-run")
    assert dry.returncode == 0 and "the learned starting portfolio's 4" in dry.stdout, dry.stdout + dry.stderr
    assert "\n# search: the learned portfolio's 4 entries (hpo/portfolio.json), then TPE" in dry.stdout
    for params in first:
        assert not [n for n, v in params.items() if spec.search_space[n].rejects(v)], params
    # Positions, not values: the first entry's lr sits where it sits in every range.
    lr = portfolio.shipped()[0]["lr"]
    assert portfolio.position(spec.search_space["lr"], first[0]["lr"]) == pytest.approx(lr, abs=1e-9)
    # An enqueued configuration that already holds an entry's values takes its place.
    spec.study.enqueue = [{**first[1], "x": 0.5}]
    assert portfolio.starting_trials(spec) == [first[0], *first[2:]]
    # A grid (step) and an int range hold the values the distribution holds.
    grid = load_study(
        write_study(
            tmp_path / "g.yaml",
            {
                **portfolio_study(tmp_path, "grid"),
                "search_space": {
                    "pct_start": {"type": "float", "low": 0.1, "high": 0.5, "step": 0.1},
                    "hidden": {"type": "int", "low": 10, "high": 100, "step": 10},
                },
            },
        )
    )
    for params in portfolio.starting_trials(grid):
        assert not [n for n, v in params.items() if grid.search_space[n].rejects(v)], params
        assert round(params["pct_start"] * 10, 9).is_integer() and params.get("hidden", 10) % 10 == 0


@pytest.mark.fast
def test_the_names_users_write_find_their_roles() -> None:
    known = {
        "lr": ["lr", "learning_rate", "max_lr", "base_lr", "optimizer.lr", "--lr", "Learning-Rate", "maxLR"],
        "batch_size": ["batch_size", "bs", "batch", "per_device_train_batch_size", "BatchSize"],
        "weight_decay": ["weight_decay", "wd", "optimizer.weight_decay"],
        "pct_start": ["pct_start", "warmup_ratio"],
        "capacity": ["width", "hidden", "hidden_size", "channels", "model.width"],
    }
    for role, names in known.items():
        assert {name: portfolio.role_of(name) for name in names} == dict.fromkeys(names, role)
    assert [portfolio.role_of(n) for n in ("dropout", "momentum", "lr_decay", "my_lr")] == [None] * 4
    # A role the file gives wins over the names: lr is my_lr's, and the lr parameter has none.
    space = dict.fromkeys(["lr", "my_lr", "bs", "dropout"])
    assert portfolio.roles(space) == {"lr": "lr", "bs": "batch_size"}
    assert portfolio.roles(space, {"lr": "my_lr"}) == {"my_lr": "lr", "bs": "batch_size"}


@pytest.mark.fast
def test_a_space_of_other_names_gets_the_portfolio_through_roles_and_says_what_it_sets(
    tmp_path: Path,
) -> None:
    document = portfolio_study(tmp_path, "names", n_trials=8)
    document["search_space"] = {
        "max_lr": {"type": "float", "low": 1e-4, "high": 0.1, "log": True},
        "bs": {"type": "categorical", "choices": [32, 64, 128]},
        "dropout": {"type": "float", "low": 0.0, "high": 0.5},
    }
    spec = load_study(write_study(tmp_path / "s.yaml", document))
    assert all(set(p) == {"max_lr", "bs"} for p in portfolio.starting_trials(spec))
    assert portfolio.coverage_line(spec) == (
        "portfolio: its 4 entries set max_lr (as lr), bs (as batch_size); the sampler draws dropout; no "
        "parameter found for weight_decay, pct_start, capacity (study.portfolio.roles maps a role to a "
        "parameter of another name)"
    )
    # No known name: nothing enqueued, and said; the file's roles then give the portfolio its say.
    document["search_space"] = {
        "step_size": document["search_space"]["max_lr"],
        "dropout": document["search_space"]["dropout"],
    }
    study_file = write_study(tmp_path / "s.yaml", document)
    spec = load_study(study_file)
    assert portfolio.starting_trials(spec) == []
    dry = run_hpo("launch", str(study_file), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert (
        "# portfolio: no parameter of the search space has a role it knows (lr, weight_decay, batch_size, "
        "pct_start, capacity): nothing enqueued from it, the sampler draws every trial; name yours with "
        "study.portfolio.roles, e.g. {lr: step_size}"
    ) in dry.stdout, dry.stdout
    document["study"]["portfolio"] = {"size": 2, "roles": {"lr": "step_size"}}
    spec = load_study(write_study(tmp_path / "s.yaml", document))
    learned = portfolio.starting_trials(spec)
    assert len(learned) == 2 and all(set(p) == {"step_size"} for p in learned)
    lr = portfolio.shipped()[0]["lr"]
    assert portfolio.position(spec.search_space["step_size"], learned[0]["step_size"]) == pytest.approx(lr)


@pytest.mark.fast
@pytest.mark.parametrize(
    ("setting", "said"),
    [
        (
            10,
            "study.portfolio: 10 entries asked, but the learned portfolio has 4 (hpo/portfolio.json): at most 4",
        ),
        (-1, "study.portfolio.size: must be >= 0, got -1"),
        (True, "study.portfolio: must be an integer (the size) or a mapping (size, roles), got True"),
        (
            {"roles": {"lrr": "lr"}},
            "study.portfolio.roles.lrr: no role 'lrr' (did you mean 'lr'?); one of lr, ",
        ),
        (
            {"roles": {"lr": "l_r"}},
            "study.portfolio.roles.lr: no search_space parameter 'l_r' (did you mean 'lr'?); one of lr, wd, x",
        ),
        ({"sise": 2}, "study.portfolio.sise: unknown key (did you mean 'size'?)"),
    ],
)
def test_a_portfolio_setting_that_cannot_hold_is_one_line_naming_its_key(
    tmp_path: Path, setting: Any, said: str
) -> None:
    document = portfolio_study(tmp_path, "bad")
    document["study"]["portfolio"] = setting
    study_file = write_study(tmp_path / "s.yaml", document)
    with pytest.raises(StudyFileError) as raised:
        portfolio.check(load_study(study_file))
    assert said in str(raised.value) and "\n" not in str(raised.value), str(raised.value)
    if setting == 10:  # as the user meets it: one line, exit 2, nothing stored
        launched = run_hpo("launch", str(study_file))
        assert launched.returncode == 2 and launched.stderr.count("\n") == 1, launched.stderr
        assert said in launched.stderr and not Path(document["study"]["workdir"]).exists(), launched.stderr


@pytest.mark.fast
def test_a_named_sampler_or_a_warm_start_gets_no_portfolio_unless_the_file_sets_one(tmp_path: Path) -> None:
    document = portfolio_study(tmp_path, "named")
    document["study"]["sampler"] = {"name": "tpe", "seed": 1}
    assert portfolio.starting_trials(load_study(write_study(tmp_path / "s.yaml", document))) == []
    document = portfolio_study(tmp_path, "warm")
    document["study"]["warm_start"] = {"studies": ["earlier"]}
    assert portfolio.starting_trials(load_study(write_study(tmp_path / "w.yaml", document))) == []
    # An explicit `portfolio` is honoured after a warm start too, as the docs say.
    document["study"]["portfolio"] = 2
    assert len(portfolio.starting_trials(load_study(write_study(tmp_path / "w2.yaml", document)))) == 2


@pytest.mark.fast
def test_the_search_line_says_which_sampler_and_start_a_study_gets_and_why(tmp_path: Path) -> None:
    def line(name: str, **study: Any) -> str:
        document = portfolio_study(tmp_path, name)
        document["study"].pop("pruner", None)
        document["study"].update(study)
        return search.strategy_line(load_study(write_study(tmp_path / f"{name}.yaml", document)))

    assert line("default", max_concurrent=3) == (
        "search: the learned portfolio's 4 entries (hpo/portfolio.json), then TPE (with the constant "
        "liar: 3 trials run at once); no pruner. Why: the study file names no sampler and no pruner: "
        "the default, replayed on the recorded tasks (docs/benchmarks.md)"
    )
    assert line("gp", sampler={"name": "gp"}, max_concurrent=1) == (
        "search: the GP; no pruner. Why: study.sampler names gp; no pruner is the default (none paid "
        "under OneCycle)"
    )
    assert line("warm", warm_start={"studies": ["earlier"]}, max_concurrent=1).endswith(
        "Why: the study file names no sampler, and a warm start replaces the portfolio; no pruner is the "
        "default (none paid under OneCycle)"
    )
    # Options without a name: the median rule from 4/9 of the steps, said as such.
    assert line("options", pruner={"options": {"n_startup_trials": 2}}, max_concurrent=1).endswith(
        "the median pruner. Why: the study file names no sampler (the default's); study.pruner gives "
        "options without a name: median stopping from 4/9 of the steps"
    )
    # The count is what the budget leaves: 2 trials, 2 entries.
    assert line("small", n_trials=2, max_concurrent=1).startswith("search: the learned portfolio's 2 entries")
    ray = line("ray", backend="ray", sampler={"name": "tpe"}, pruner={"name": "successive_halving"})
    assert "; Ray Tune's ASHAScheduler. Why: the study file names both" in ray, ray
    ordered = line("both", sampler={"name": "tpe", "ordered_choices": True}, pruner={"name": "median"})
    assert ordered.endswith(
        "numeric choices shown in their order; the median pruner. Why: the study file names both"
    )


@pytest.mark.fast
def test_never_more_entries_than_the_trials_the_budget_leaves(tmp_path: Path) -> None:
    # n_trials 2 with 4 entries used to enqueue all 4: two waited forever ("4 of 2 trials").
    spec = load_study(write_study(tmp_path / "s.yaml", portfolio_study(tmp_path, "small", n_trials=2)))
    assert len(portfolio.starting_trials(spec)) == 2
    spec.study.enqueue = [{"lr": 0.01, "wd": 1e-4, "x": 0.5}]
    assert len(portfolio.starting_trials(spec)) == 1  # the user's own enqueue comes first
    spec.study.enqueue *= 2
    assert portfolio.starting_trials(spec) == []


@pytest.mark.fast
def test_a_categorical_of_numbers_is_ordered_by_value_not_by_its_list(tmp_path: Path) -> None:
    document = portfolio_study(tmp_path, "batches", n_trials=8)
    document["search_space"]["batch_size"] = {"type": "categorical", "choices": [512, 32, 128, 64]}
    spec = load_study(write_study(tmp_path / "s.yaml", document))
    batch = spec.search_space["batch_size"]
    assert [portfolio.position(batch, b) for b in (32, 64, 128, 512)] == pytest.approx([0, 1 / 3, 2 / 3, 1])
    # The first entry asks for the smallest batch (position 0): 32, not the list's first, 512.
    assert portfolio.shipped()[0]["batch_size"] == 0.0
    assert portfolio.starting_trials(spec)[0]["batch_size"] == 32
    words = dataclasses.replace(batch, choices=["b", "a"])
    assert portfolio.position(words, "b") == 0.0  # no value order: the file's


@pytest.mark.fast
def test_no_proposal_of_a_default_study_is_a_near_copy_of_a_trial_it_holds(tmp_path: Path) -> None:
    """The portfolio's first entry is the first random draw of seed 0 (a recorded study's), and a
    default study's sampler, seed 0, drew it again right after the portfolio."""
    import optuna

    from hpo import search

    document = portfolio_study(tmp_path, "distinct", n_trials=14)
    del document["search_space"]["x"]  # lr and wd only: both of the entries' roles
    spec = load_study(write_study(tmp_path / "s.yaml", document))
    study = optuna.create_study(direction="maximize", sampler=search.sampler_for(spec))
    for params in portfolio.starting_trials(spec):
        study.enqueue_trial(params)
    space = search.distributions(spec)
    for _ in range(14):
        trial = study.ask(space)
        study.tell(trial, -abs(trial.params["lr"] - 0.01))
    trials = study.get_trials()
    for i, a in enumerate(trials):
        for b in trials[:i]:
            assert not search._near_copy(a.params, b.params, space), (a.number, a.params, b.number, b.params)
    # Without it, the seed-0 sampler's first proposal is the first entry again, to 4 digits.
    bare = optuna.create_study(sampler=search.build_sampler(spec.study.sampler, 1, spec.source))
    first = portfolio.starting_trials(spec)[0]
    drawn = bare.ask(space).params
    assert {n: round(portfolio.position(spec.search_space[n], v), 4) for n, v in drawn.items()} == {
        n: round(portfolio.position(spec.search_space[n], v), 4) for n, v in first.items()
    }


@pytest.mark.fast
def test_a_proposal_that_is_no_copy_is_exactly_the_inner_samplers(tmp_path: Path) -> None:
    import optuna

    from hpo import search

    spec = load_study(write_study(tmp_path / "s.yaml", portfolio_study(tmp_path, "same", n_trials=12)))
    space = search.distributions(spec)
    sequences = []
    for sampler in (search.sampler_for(spec), search.build_sampler(spec.study.sampler, 1, spec.source)):
        study = optuna.create_study(sampler=sampler)
        for _ in range(12):
            trial = study.ask(space)
            study.tell(trial, trial.params["x"])
        sequences.append([t.params for t in study.get_trials()])
    # The random start-up trials but the second (the first's contrast, drawn by no sampler): the
    # inner's draws in turn (after them TPE models histories that differ by that second trial).
    assert sequences[0][:1] + sequences[0][2:10] == sequences[1][:9]
    assert sequences[0][1] == search._contrast(sequences[0][0], space)


@pytest.mark.fast
@pytest.mark.parametrize("with_portfolio", [False, True], ids=["no-portfolio", "portfolio"])
def test_a_studys_first_two_trials_never_fail_in_one_corner_over_twelve_seeds(
    tmp_path: Path, with_portfolio: bool
) -> None:
    """If both fail the same way, the parameters cannot explain it: fail fast stops after 2. (Two
    random draws lie both in the lowest or the highest third of one of 5 dimensions 72% of the
    time, and a pattern that matched nothing then cost a third trial or more.)"""
    import optuna

    from hpo import search
    from hpo.budget import failing

    document = portfolio_study(tmp_path, "corner", n_trials=12)
    document["search_space"].update(
        batch_size={"type": "categorical", "choices": [512, 32, 128, 64]},
        momentum={"type": "float", "low": 0.8, "high": 0.99},
        optimizer={"type": "categorical", "choices": ["sgd", "adamw"]},
    )
    for seed in range(1, 13):
        document["study"]["sampler"] = {"name": "tpe", "seed": seed}
        document["study"]["portfolio"] = 4 if with_portfolio else 0
        spec = load_study(write_study(tmp_path / "s.yaml", document))
        space = search.distributions(spec)
        study = optuna.create_study(sampler=search.sampler_for(spec))
        for params in portfolio.starting_trials(spec):
            study.enqueue_trial(params)
        first, second = study.ask(space), study.ask(space)  # both in flight, as a launch starts them
        pair = [study._storage.get_trial(t._trial_id) for t in (first, second)]
        assert not failing.confined(pair), (seed, first.params, second.params)


def test_a_study_without_a_sampler_runs_the_portfolio_first_and_once(tmp_path: Path) -> None:
    document = portfolio_study(tmp_path, "portfolio-first", n_trials=5, max_concurrent=1)
    study_file = write_study(tmp_path / "study.yaml", document)
    spec = load_study(study_file)
    first = portfolio.starting_trials(spec)

    launched = run_hpo("launch", str(study_file))

    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert "4 enqueued to run first (4 from the learned starting portfolio)" in launched.stdout
    assert (
        "portfolio: its 4 entries set lr (as lr), wd (as weight_decay); the sampler draws x; no "
        "parameter found for batch_size, pct_start, capacity" in launched.stdout
    ), launched.stdout
    trials = sorted(load_trials(document), key=lambda t: t.number)
    assert [{n: t.params[n] for n in ("lr", "wd")} for t in trials[:4]] == first
    # `hpo launch --check` runs what this launch ran first: the entry, x as the sampler drew it.
    assert check_parameters(spec) == trials[0].params
    assert all(t.state.name == "COMPLETE" for t in trials) and len(trials) == 5
    # A relaunch with a larger budget enqueues nothing again: the sampler proposes the rest.
    document["study"]["n_trials"] = 7
    write_study(study_file, document)
    relaunched = run_hpo("launch", str(study_file))
    assert relaunched.returncode == 0, relaunched.stdout + relaunched.stderr
    assert "enqueued" not in relaunched.stdout
    later = sorted(load_trials(document), key=lambda t: t.number)[5:]
    assert len(later) == 2 and all({n: t.params[n] for n in ("lr", "wd")} not in first for t in later)
