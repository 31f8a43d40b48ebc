"""Watching a study: live progress, `hpo report`, and optuna-dashboard in a real headless browser.

One real small study (trials as local processes, the embedded journal storage) is run once; the
tests read it the way a user would. Its trials are the torch-free stand-in (tests/hpo/helpers.py):
the views are the subject; the trainer's own study is watched in tests/hpo/dispatch/test_launch.py.
"""

from __future__ import annotations

import contextlib
import csv
import json
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from hpo.tally import format_value
from tests.hpo.helpers import HPO, REPO, load_trials, run_hpo, stand_in_study, study_document, write_study

ARTIFACTS = REPO / "test-artifacts"
PLOTS = ("optimization_history", "learning_curves", "parallel_coordinate", "param_importances", "slice")


@pytest.fixture(scope="module")
def finished_study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], str]:
    """A real 6-trial study, launched with its output on a pipe (not a terminal)."""
    root = tmp_path_factory.mktemp("observe")
    document = stand_in_study(root, "observe-study", epoch_s=0.5, study={"n_trials": 6})
    study_file = write_study(root / "study.yaml", document)
    launch = run_hpo("launch", str(study_file))
    assert launch.returncode == 0, launch.stdout + launch.stderr
    return study_file, document, launch.stdout


def test_progress_on_a_non_terminal_is_plain_lines(finished_study: tuple[Path, dict[str, Any], str]) -> None:
    _, _, output = finished_study
    assert "\r" not in output and "\x1b" not in output, repr(output[-500:])
    progress = [line for line in output.splitlines() if line.startswith("progress: ")]
    assert progress, output
    # A line each time trials end, with a time-left estimate while trials remain; the last one
    # counts them all.
    assert re.fullmatch(r"progress: 6/6 done \(.*\), 0 running, best val_accuracy=0\.\d+ \(trial \d\), "
                        r"[\d.e-]+ CPU-hours used", progress[-1]), progress[-1]  # fmt: skip
    assert any(re.search(r", [12] running, .* CPU-hours used, ~\d+ (s|min) left$", line) for line in progress)
    assert len(progress) >= 4


def test_report_holds_every_plot_and_every_trial(
    finished_study: tuple[Path, dict[str, Any], str], tmp_path: Path
) -> None:
    study_file, document, _ = finished_study
    out = tmp_path / "report"
    result = run_hpo("report", str(study_file), "--out", str(out))
    assert result.returncode == 0, result.stderr
    trials = load_trials(document)

    page = (out / "index.html").read_text()
    for plot in PLOTS:
        assert f"<h2 id='{plot}'>" in page, plot
        image = Image.open(out / f"{plot}.png")
        assert image.width >= 400 and image.height >= 300, plot
    assert "<p class='note'>not available" not in page
    assert page.count('class="plotly-graph-div"') == len(PLOTS)
    assert "pruning saved" in page
    # Pruned trials are drawn as such: their curves end with an "x" marker.
    assert any(t.state.name == "PRUNED" for t in trials)
    assert re.search(r'"symbol":\[("circle",)*"x"\]', page)

    with (out / "trials.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert sorted(int(row["number"]) for row in rows) == [t.number for t in trials]
    assert {row["number"]: row["state"] for row in rows} == {str(t.number): t.state.name for t in trials}

    summary = json.loads((out / "summary.json").read_text())
    best = max((t for t in trials if t.state.name == "COMPLETE"), key=lambda t: t.value)
    assert summary["best"]["number"] == best.number and summary["best"]["value"] == best.value
    assert (
        f"best trial {best.number}: val_accuracy={format_value(best.value)} " in page
    )  # as `hpo best` says it
    assert summary["trials"] == len(trials) == sum(summary["states"].values())
    assert set(summary["cost"]["per_trial"]) == {str(t.number) for t in trials}
    assert summary["cost"]["total"] > 0


def test_report_of_a_study_that_does_not_exist_is_a_one_line_error(tmp_path: Path) -> None:
    study_file = write_study(tmp_path / "study.yaml", study_document("never-launched", tmp_path / "work"))
    result = run_hpo("report", str(study_file), "--out", str(tmp_path / "report"))
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert "no study 'never-launched'" in result.stderr
    assert not (tmp_path / "report").exists()


@contextlib.contextmanager
def dashboard(study_file: Path) -> Iterator[tuple[str, list[str]]]:
    """`hpo dashboard` on a free port: yields its base URL and, once it has stopped, its output."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    server = subprocess.Popen(
        [HPO, "dashboard", str(study_file), "--port", str(port)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output: list[str] = []
    try:
        _wait_listening(port, server)
        yield f"http://127.0.0.1:{port}", output
    finally:
        server.terminate()
        output.append(server.communicate(timeout=30)[0])


def _wait_listening(port: int, server: subprocess.Popen[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise AssertionError(
                f"hpo dashboard did not listen on {port}: {server.communicate(timeout=30)[0]}"
            )
        time.sleep(0.2)


def _chromium(url: str, profile: Path, *action: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium kept off the network: every host name but 127.0.0.1 fails to resolve,
    and the background services that phone home are off."""
    browser = shutil.which("chromium")
    assert browser, "chromium is missing: deploy/install-system-deps.sh installs it"
    command = [
        browser,
        "--headless",
        "--no-sandbox",  # as root in a container
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-default-apps",
        "--disable-extensions",
        "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=20000",  # let the page's scripts fetch and render the trials
        "--window-size=1400,1000",
        *action,
        url,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_optuna_dashboard_shows_the_study_and_its_trials_in_a_real_browser(
    finished_study: tuple[Path, dict[str, Any], str], tmp_path: Path
) -> None:
    study_file, document, _ = finished_study
    trials = load_trials(document)
    with dashboard(study_file) as (url, output):
        base = f"{url}/dashboard"
        home = _chromium(f"{base}/", tmp_path / "profile", "--dump-dom")
        assert home.returncode == 0, home.stderr[-2000:]
        assert "observe-study" in home.stdout

        page = _chromium(f"{base}/studies/0/trials", tmp_path / "profile", "--dump-dom")
        assert page.returncode == 0, page.stderr[-2000:]
        for trial in trials:
            assert f"Trial {trial.number}" in page.stdout, trial.number
        # The service's trial attributes are there for the user: job id, GPU- and CPU-hours. (The
        # trainer's own measurements are user attributes like these: test_measurements.py.)
        for attr in ("job_id", "gpu_hours", "cpu_hours", "elapsed_s"):
            assert attr in page.stdout, attr

        ARTIFACTS.mkdir(exist_ok=True)
        shot = ARTIFACTS / "optuna-dashboard.png"
        shot.unlink(missing_ok=True)
        taken = _chromium(f"{base}/studies/0", tmp_path / "profile", f"--screenshot={shot}")
        assert taken.returncode == 0 and Image.open(shot).size == (1400, 1000), taken.stderr[-2000:]
    port = url.rsplit(":", 1)[1]
    assert f"{url}/dashboard/studies/0" in output[0]
    assert f"ssh -N -L {port}:127.0.0.1:{port}" in output[0]


@pytest.fixture(scope="module")
def pareto_study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A real multi-objective study: validation accuracy up, CPU-hours down, no pruning. Its trials
    are the torch-free stand-in (helpers.py): the views of a Pareto front are the subject."""
    root = tmp_path_factory.mktemp("pareto")
    document = stand_in_study(
        root,
        "pareto-study",
        epochs=2,
        epoch_s=0.5,
        study={"n_trials": 5, "pruner": {"name": "none"}, "also_minimize": "cpu_hours"},
    )
    study_file = write_study(root / "study.yaml", document)
    launch = run_hpo("launch", str(study_file))
    assert launch.returncode == 0, launch.stdout + launch.stderr
    assert "Pareto front (val_accuracy vs cpu_hours): trial " in launch.stdout
    return study_file, document


def test_a_multi_objective_study_gives_a_pareto_front(
    pareto_study: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    import optuna

    study_file, document = pareto_study
    trials = load_trials(document)
    assert [t.state.name for t in trials] == ["COMPLETE"] * 5
    for t in trials:  # the second objective is the trial's own CPU-hours; the curve is kept
        assert len(t.values) == 2 and t.values[1] == t.user_attrs["cpu_hours"] > 0
        assert (
            t.user_attrs["epoch_values"].keys() == {"1", "2"}
            and t.user_attrs["epoch_values"]["2"] == t.values[0]
        )
    front = [
        t.number
        for t in trials
        if not any(
            o.values[0] >= t.values[0] and o.values[1] <= t.values[1] and o.values != t.values for o in trials
        )
    ]
    assert front
    study = optuna.load_study(study_name="pareto-study", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(document["study"]["workdir"] + "/optuna.journal")))  # fmt: skip
    assert sorted(t.number for t in study.best_trials) == sorted(front)
    assert study.metric_names == ["val_accuracy", "cpu_hours"]

    best = run_hpo("best", str(study_file))
    assert best.returncode == 0, best.stderr
    listed = [int(n) for n in re.findall(r"^  trial (\d+): val_accuracy=", best.stdout, re.M)]
    assert sorted(listed) == sorted(front), best.stdout
    top = max((t for t in trials if t.number in front), key=lambda t: t.values[0])
    assert f"best trial {top.number}: val_accuracy={format_value(top.values[0])} " in best.stdout

    out = tmp_path / "report"
    assert run_hpo("report", str(study_file), "--out", str(out)).returncode == 0
    page = (out / "index.html").read_text()
    assert "<h2 id='pareto_front'>" in page and "<p class='note'>not available" not in page
    assert Image.open(out / "pareto_front.png").width >= 400
    summary = json.loads((out / "summary.json").read_text())
    assert summary["objectives"] == {"val_accuracy": "maximize", "cpu_hours": "minimize"}
    assert sorted(p["number"] for p in summary["pareto_front"]) == sorted(front)


def test_optuna_dashboard_shows_the_pareto_front(
    pareto_study: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    study_file, _ = pareto_study
    with dashboard(study_file) as (url, _):
        page = _chromium(f"{url}/dashboard/studies/0", tmp_path / "profile", "--dump-dom")
    assert page.returncode == 0, page.stderr[-2000:]
    assert "pareto-study" in page.stdout and "Pareto Front" in page.stdout


def test_dashboard_refuses_a_bad_port_in_one_line(finished_study: tuple[Path, dict[str, Any], str]) -> None:
    study_file, _, _ = finished_study
    result = run_hpo("dashboard", str(study_file), "--port", "70000")
    assert (
        result.returncode == 2
        and result.stderr.strip() == "hpo dashboard: error: --port: must be 1 to 65535, got 70000"
    )
