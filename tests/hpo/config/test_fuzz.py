"""A study file is untrusted bytes: fuzzing the shipped study files, and the filesystem's dangers.

Whatever a study file holds, ``hpo launch FILE --dry-run``, ``hpo status FILE`` and ``hpo best FILE``
answer within a second with exit status 0 (launch only, and only for a valid file: the dry run then
prints the resolved study, and stderr holds only warnings, one line each naming the file), 2 (bad input: one line naming the file) or 3 (not ready: one line), never
a traceback, a hang or a memory blow-up.

Hypothesis mutates studies/quickstart.yaml and studies/resnet.yaml at the byte level (flips,
insertions, deletions, truncation, other encodings) and in their structure (keys dropped, renamed
or duplicated, values of other types, deep nesting, huge numbers, NaN, ``${`` strings, aliases and
alias bombs), in-process through :func:`hpo.commands.execute` so that Python's start-up does not
count; Hypothesis's ``deadline`` is the one-second bound, so that a slow input is named. The runs are
derandomized and keep no example database: CI sees the same examples every time. ``launch`` runs
with ``--dry-run`` only (a valid file never starts training), from a temporary folder with
``HPO_STORAGE`` and ``SCRATCH`` under it, so that nothing is written into the repository.

Explicit cases follow for what the filesystem does (a directory, a FIFO, /dev/zero, a 5 MiB file,
an uncreatable workdir) and for YAML's own dangers, a few of them through the real ``hpo`` script.
"""

from __future__ import annotations

import contextlib
import copy
import io
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpo.commands import execute, parse
from hpo.config import PRUNERS, SAMPLERS, load_study
from hpo.errors import StudyFileError
from trainer.yamlfile import load_yaml_mapping

REPO = Path(__file__).resolve().parents[3]
HPO = str(Path(sys.executable).parent / "hpo")
pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

STUDIES = {name: (REPO / "studies" / f"{name}.yaml").read_bytes() for name in ("quickstart", "resnet")}
COMMANDS = ("launch", "status", "best")
UNSET = "HPO_FUZZ_SURELY_UNSET"
# No database listens on port 1: opening the storage fails at once (the "not ready" answer).
NO_DATABASE = "postgresql://hpo@127.0.0.1:1/none"
# A guard against a hang (an alias bomb expanded, a FIFO read), not a speed target: such a file
# would take minutes; a refused one takes milliseconds, seconds on a machine busy with other tests.
BOUND_S = 15.0

# Examples per property. The examples are derandomized (the same on every run), so running many on
# every run re-checks the same files: 500 and 400 in the test command, about 10 s on a 2-core
# machine (a byte-level mutant takes ~4 ms, a structural one ~10 ms; most are refused early, a valid
# dry run ~30 ms). HPO_FUZZ_SCALE=4 runs the 2,000 and 1,600 of a deeper search (about 40 s).
FUZZ_SCALE = float(os.environ.get("HPO_FUZZ_SCALE", "1"))
BYTE_EXAMPLES = round(500 * FUZZ_SCALE)
STRUCTURE_EXAMPLES = round(400 * FUZZ_SCALE)
FUZZ_SETTINGS = settings(
    deadline=timedelta(seconds=BOUND_S),
    derandomize=True,  # the same examples on every run: CI is reproducible
    database=None,
    # Large inputs (a 50,000-character value, an alias bomb) are the point, not an accident.
    suppress_health_check=[HealthCheck.data_too_large, HealthCheck.too_slow],
)


# --------------------------------------------------------------------------------------------------
# The contract
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A temporary working folder and the variables the shipped studies read, for the module;
    then every command once on each shipped study, so that the first imports (Optuna's samplers,
    Ray Tune, the schema) are not counted against the fuzzed inputs' second."""
    root = tmp_path_factory.mktemp("fuzz")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("HPO_STORAGE", f"journal:{root}/resnet.journal")
        mp.setenv("SCRATCH", str(root / "scratch"))
        mp.setenv("IMAGENET_ROOT", str(root / "imagenet"))
        mp.setenv("HPO_ACCOUNT", "abc@a100")
        for name in (UNSET, "HPO_DEBUG", "PGPASSWORD", "HPO_CPU_ACCOUNT"):
            mp.delenv(name, raising=False)
        warm = root / "warm.yaml"
        statuses = []
        for data in STUDIES.values():
            warm.write_bytes(data)
            statuses += [answer(command, warm)[0] for command in COMMANDS]
        warm.write_bytes(STUDIES["quickstart"])
        settings_to_warm = [
            *(f"study.sampler={{name: {sampler}}}" for sampler in SAMPLERS),
            *(f"study.pruner={{name: {pruner}}}" for pruner in PRUNERS),
            "study.backend=ray",
            "resources.executor=slurm",
        ]
        for setting in settings_to_warm:
            statuses.append(answer("launch", warm, "--set", setting)[0])
        assert set(statuses) <= {0, 2, 3}, statuses  # 3: an optional extra (Ray) not installed
        warm.unlink()
        yield root
    assert not list(REPO.glob(".hpo-check-*"))  # the workdir check's throw-away folder is gone


def answer(command: str, path: Path, *options: str, dry_run: bool = True) -> tuple[int, str, str, float]:
    """Run ``hpo COMMAND FILE`` in-process: exit status, stdout, stderr, seconds."""
    overrides = [options[i + 1] for i in range(len(options)) if options[i] == "--set"]
    argv = [command, str(path), *(f"--set={override}" for override in overrides)]
    if command == "launch":
        argv += ["--dry-run"] if dry_run else ["--executor", "local"]
    request = parse(argv)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        start = time.monotonic()
        status = execute(request)
        elapsed = time.monotonic() - start
    return status, out.getvalue(), err.getvalue(), elapsed


def check_contract(command: str, path: Path) -> tuple[int, str]:
    """The contract of the module's docstring; returns the exit status and the error line."""
    status, out, err, _ = answer(command, path)
    assert status in (0, 2, 3), (status, err)
    if status == 0:
        assert command == "launch", (command, out)
        # A valid file may still earn a warning (a key dropped: `executor: slurm`, its Slurm keys kept).
        assert all(line.startswith(f"warning: {path}: ") for line in err.splitlines()), err
        load_study(path)  # valid indeed (raises otherwise)
        assert out.startswith(f"# {path}, resolved"), out[:200]
        assert out.rstrip().endswith("# dry run: nothing submitted"), out[-200:]
        return status, ""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith(f"hpo {command}: error: "), line
    assert "HPO_DEBUG" not in line, line  # the mark of an unforeseen exception
    if status == 2:
        assert str(path) in line, line
    assert out == ""
    return status, line


# --------------------------------------------------------------------------------------------------
# Byte-level mutations
# --------------------------------------------------------------------------------------------------

# Fragments that mean something to YAML or to the loader, inserted at random places.
TOKENS = [
    b"&a ", b"*a", b"<<: *a\n", b"!!python/object/apply:os.system ['true'] ", b"!!binary ", b"!!set ",
    b"!!int ", b"!!float ", b"!!str ", b"!foo ", b"---\n", b"...\n", b"%YAML 1.2\n", b"? ", b": ", b"- ",
    b"[", b"]", b"{", b"}", b"#", b"\t", b"\r", b"\x00", b"\xff\xfe", b"\xef\xbb\xbf", b"\xc3\x28", b"'",
    b'"', b"|\n", b">-\n", b"${", b"${HOME}", b"${" + UNSET.encode() + b"}", b"$$", b"~", b".nan", b".inf",
    b"9" * 400, b"1e999", b"0x", b"\\",
]  # fmt: skip


@st.composite
def byte_mutations(draw: st.DrawFn, data: bytes) -> bytes:
    for _ in range(draw(st.integers(1, 6))):
        size = len(data)
        at = draw(st.integers(0, size))
        kind = draw(st.sampled_from(["flip", "insert", "token", "delete", "truncate", "line"]))
        if kind == "flip" and size:
            at = min(at, size - 1)
            data = data[:at] + bytes([data[at] ^ (1 << draw(st.integers(0, 7)))]) + data[at + 1 :]
        elif kind == "insert":
            data = data[:at] + draw(st.binary(min_size=1, max_size=8)) + data[at:]
        elif kind == "token":
            data = data[:at] + draw(st.sampled_from(TOKENS)) + data[at:]
        elif kind == "delete":
            data = data[:at] + data[at + draw(st.integers(1, 64)) :]
        elif kind == "truncate":
            data = data[:at]
        elif kind == "line":  # duplicate or drop a whole line: duplicate keys, lost sections
            lines = data.split(b"\n")
            i = draw(st.integers(0, len(lines) - 1))
            if draw(st.booleans()):
                lines.insert(i, lines[i])
            else:
                del lines[i]
            data = b"\n".join(lines)
    return data


def reencoded(data: bytes, encoding: str) -> bytes:
    """The file in another encoding (the text's mutations may have made it invalid UTF-8)."""
    if encoding == "utf-8":
        return data
    text = data.decode("utf-8", errors="replace")
    return text.encode(encoding, errors="replace")


ENCODINGS = st.sampled_from(["utf-8"] * 6 + ["utf-8-sig", "utf-16", "utf-16-le", "utf-32", "latin-1"])


@st.composite
def mutated_files(draw: st.DrawFn) -> tuple[str, bytes]:
    """A shipped study's bytes, mutated, maybe in another encoding: (study, file content)."""
    name = draw(st.sampled_from(sorted(STUDIES)))
    return name, reencoded(draw(byte_mutations(STUDIES[name])), draw(ENCODINGS))


# The inputs are drawn by @given, outside the timed test: the deadline is the command's alone.
@settings(FUZZ_SETTINGS, max_examples=BYTE_EXAMPLES)
@given(file=mutated_files(), command=st.sampled_from(COMMANDS))
def test_byte_mutations_keep_the_contract(place: Path, file: tuple[str, bytes], command: str) -> None:
    name, data = file
    path = place / f"bytes-{name}.yaml"
    path.write_bytes(data)
    check_contract(command, path)


# --------------------------------------------------------------------------------------------------
# Structural mutations
# --------------------------------------------------------------------------------------------------

INTERESTING_STRINGS = [
    "${", "${HOME}", "${" + UNSET + "}", "${" + UNSET + ":-7}", "${" + UNSET + ":-${HOME}}", "$$", "$${X}",
    "${1}", "~nosuchuser-hpo/x", "/proc/hpo-fuzz", "/dev/null/x", "a\x00b", "", " ", "\n", "10m", "1:30:00",
    "-1", ".nan", "1e-4", "yes", "on", "null", "<<", "tpe", "random", "qmc", "gp", "cmaes", "median",
    "percentile", "hyperband", "successive_halving", "threshold", "pbt", "none", "local", "slurm", "optuna",
    "ray", "float", "int", "categorical", "val_loss", "gpu_hours", "journal:", "journal:rel.journal",
    "redis://x", "module load x; rm -rf /", "a" * 300,
]  # fmt: skip
NUMBERS = [
    0, -1, 1, 2, 3, 2**31, 2**63, 2**64 + 1, 10**308, 10**309, -(10**400), 0.0, -0.0, 1e-320, 1e308,
    math.nan, math.inf, -math.inf, 0.5, 1.5,
]  # fmt: skip

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from(NUMBERS),
    st.floats(),
    st.text(max_size=20),
    st.sampled_from(INTERESTING_STRINGS),
    st.binary(max_size=8),
    st.sampled_from([1_000, 10_001, 50_000]).map(lambda n: "x" * n),
)
KEYS = st.one_of(st.text(max_size=12), st.sampled_from([1, True, None, 1.5, "<<", "study", "lr", "name"]))
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=8,
)


def node_paths(document: Any) -> list[tuple[Any, ...]]:
    """Every path below ``document``; a shared value (an alias bomb) is entered once only."""
    found: list[tuple[Any, ...]] = []
    entered: set[int] = set()
    stack: list[tuple[tuple[Any, ...], Any]] = [((), document)]
    while stack:
        prefix, node = stack.pop()
        if id(node) in entered:
            continue
        entered.add(id(node))
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in items:
            found.append((*prefix, key))
            if isinstance(child, (dict, list)):
                stack.append(((*prefix, key), child))
    return sorted(found, key=repr)


def at(document: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        document = document[key]
    return document


def alias_bomb(width: int, depth: int) -> list[Any]:
    """width ** depth leaves from depth lists: YAML aliases all but the first of each level."""
    level: list[Any] = ["lol"] * width
    for _ in range(depth - 1):
        level = [level] * width
    return level


@st.composite
def structural_mutations(draw: st.DrawFn, document: dict[str, Any]) -> dict[str, Any]:
    document = copy.deepcopy(document)
    for _ in range(draw(st.integers(1, 4))):
        paths = node_paths(document)
        if not paths:
            document[draw(KEYS)] = draw(VALUES)
            continue
        path = draw(st.sampled_from(paths))
        parent = at(document, path[:-1])
        key = path[-1]
        kind = draw(
            st.sampled_from(
                ["drop", "rename", "replace", "replace", "nest", "share", "bomb", "recurse", "add"]
            )
        )
        if kind == "drop":
            del parent[key]
        elif kind == "rename" and isinstance(parent, dict):
            new = draw(KEYS)
            items = [(new if k == key else k, v) for k, v in parent.items()]
            parent.clear()
            parent.update(items)
        elif kind == "replace":
            parent[key] = draw(VALUES)
        elif kind == "nest":
            value = parent[key]
            for _ in range(draw(st.sampled_from([1, 2, 10, 70]))):
                value = [value] if draw(st.booleans()) else {"x": value}
            parent[key] = value
        elif kind == "share":  # the same value in two places: an anchor and an alias
            other = draw(st.sampled_from(paths))
            at(document, other[:-1])[other[-1]] = parent[key]
        elif kind == "bomb":
            parent[key] = alias_bomb(draw(st.integers(2, 10)), draw(st.integers(2, 9)))
        elif kind == "recurse" and isinstance(parent[key], (dict, list)):
            value = parent[key]
            if isinstance(value, dict):
                value["again"] = value
            else:
                value.append(value)
        elif kind == "add" and isinstance(parent[key], dict):
            parent[key][draw(KEYS)] = draw(VALUES)
    return document


def serialized(document: Any, flow: bool | None, unicode: bool) -> str:
    try:
        return yaml.safe_dump(document, sort_keys=False, default_flow_style=flow, allow_unicode=unicode)
    except yaml.representer.RepresenterError:  # a key the dumper cannot write: nothing to test
        return "study: {}\n"


PARSED = {name: load_yaml_mapping(REPO / "studies" / f"{name}.yaml") for name in STUDIES}


@st.composite
def restructured_files(draw: st.DrawFn) -> tuple[str, str]:
    """A shipped study's document, mutated and written back as YAML: (study, file content)."""
    name = draw(st.sampled_from(sorted(STUDIES)))
    document = draw(structural_mutations(PARSED[name]))
    return name, serialized(document, draw(st.sampled_from([False, None, True])), draw(st.booleans()))


@settings(FUZZ_SETTINGS, max_examples=STRUCTURE_EXAMPLES)
@given(file=restructured_files(), command=st.sampled_from(COMMANDS))
def test_structural_mutations_keep_the_contract(place: Path, file: tuple[str, str], command: str) -> None:
    name, text = file
    path = place / f"structure-{name}.yaml"
    path.write_bytes(text.encode("utf-8", errors="surrogatepass"))
    check_contract(command, path)


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_shipped_studies_answer_0_then_2(place: Path, name: str) -> None:
    """The unmutated files: a valid dry run; no study stored yet for status and best."""
    path = place / f"shipped-{name}.yaml"
    path.write_bytes(STUDIES[name])
    assert check_contract("launch", path)[0] == 0
    for command in ("status", "best"):
        status, line = check_contract(command, path)
        assert status == 2 and "run `hpo launch` first" in line, line


# --------------------------------------------------------------------------------------------------
# Explicit cases: the filesystem, and YAML's own dangers
# --------------------------------------------------------------------------------------------------


def quickstart_text(**study: str) -> str:
    """The quickstart study with some ``study:`` keys set (as raw YAML text)."""
    document = copy.deepcopy(PARSED["quickstart"])
    document["study"].update(study)
    return yaml.safe_dump(document, sort_keys=False)


def one_line_error(
    command: str, path: Path, expected: tuple[str, ...], status: int = 2, *, dry_run: bool = True
) -> str:
    code, out, err, elapsed = answer(command, path, dry_run=dry_run)
    assert elapsed <= BOUND_S, f"{elapsed:.2f} s"
    assert code == status, err
    lines = err.splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert out == ""
    for text in (str(path), *expected):
        assert text in lines[0], f"{text!r} not in {lines[0]!r}"
    return lines[0]


def make_fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def alias_bomb_text() -> str:
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]")
    return "study: {name: bomb}\ntrainer:\n" + "".join(f"  {line}\n" for line in lines)


def writes(content: Callable[[Path], str | bytes]) -> Callable[[Path], Path]:
    """A case's file maker: writes ``content(path)`` (made when the test runs) to ``path``."""

    def make(path: Path) -> Path:
        data = content(path)
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        return path

    return make


def make_directory(path: Path) -> Path:
    path.mkdir()
    return path


# name -> (the file's maker, substrings of the error line)
CASES: dict[str, tuple[Callable[[Path], Path], tuple[str, ...]]] = {
    "missing": (lambda p: p, ("cannot read config file", "No such file")),
    "directory": (make_directory, ("cannot read config file", "directory")),
    "fifo": (make_fifo, ("cannot read config file", "not a regular file (a FIFO)")),
    "dev-zero": (lambda p: Path("/dev/zero"), ("cannot read config file", "character device")),
    "5-mib": (writes(lambda p: quickstart_text() + "# " + "x" * (5 << 20) + "\n"), ("larger than 1 MiB",)),
    "alias-bomb": (writes(lambda p: alias_bomb_text()), ("line 6", "aliases expand", "alias bomb")),
    "recursive-alias": (writes(lambda p: "study: &a [*a]\n"), ("line 1", "*a refers to a node that contains it")),
    "deep-nesting": (
        writes(lambda p: "study: " + "[" * 10_000 + "]" * 10_000 + "\n"),
        ("line 1", "nested more than 64 levels"),
    ),
    "deep-block-nesting": (
        writes(lambda p: "".join(f"{' ' * i}k:\n" for i in range(1_000))),
        ("line 64", "nested more than 64 levels"),
    ),
    "utf-16-without-bom": (
        writes(lambda p: quickstart_text().encode("utf-16-le")),
        ("unacceptable character #x0000", "UTF-16"),
    ),
    "invalid-utf-8": (writes(lambda p: b"study:\n  name: caf\xe9\n"), ("not UTF-8 text (line 2, byte 0xe9)",)),
    "python-tag": (
        writes(lambda p: f"study: !!python/object/apply:os.system ['touch {p}.pwned']\n"),
        ("line 1", "tag !!python/object/apply:os.system is not allowed"),
    ),
    "set-tag": (writes(lambda p: "study: !!set {a, b}\n"), ("tag !!set is not allowed",)),
    "bad-int-tag": (writes(lambda p: "study: {name: !!int abc}\n"), ("line 1", "cannot read !!int 'abc'")),
    "huge-integer": (
        writes(lambda p: "study: {name: x, n_trials: " + "9" * 5000 + "}\n"),
        ("line 1", "integer of 5000 digits is too large"),
    ),
    "huge-scalar": (
        writes(lambda p: "study: {name: '" + "x" * 200_000 + "'}\n"),
        ("line 1", "a value of 200,000 characters"),
    ),
    "duplicate-key": (writes(lambda p: quickstart_text() + "study: {name: again}\n"), ("duplicate key 'study'",)),
    "two-documents": (
        writes(lambda p: quickstart_text() + "---\n" + quickstart_text()),
        ("not valid YAML (line", "more than one document"),
    ),
    "unclosed": (writes(lambda p: "study: {name: x\n"), ("not valid YAML (line 2)",)),
    "nul-byte": (writes(lambda p: b"study: {name: x\x00}\n"), ("line 1", "#x0000")),
    "key-with-line-break": (
        writes(lambda p: quickstart_text() + 'launcher: {"a\\rb": 1}\n'),  # a key with a carriage return
        ("launcher", "a\\rb"),
    ),
    "workdir-tilde-user": (
        writes(lambda p: quickstart_text(workdir="~nosuchuser-hpo/x")),
        ("study.workdir", "~nosuchuser-hpo"),
    ),
    "workdir-nul": (writes(lambda p: quickstart_text(workdir="/tmp/a\x00b")), ("study.workdir", "NUL")),
}  # fmt: skip


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_dangerous_file_is_one_line_and_exit_2(place: Path, tmp_path: Path, case: str, command: str) -> None:
    make, expected = CASES[case]
    path = make(tmp_path / "study.yaml")
    one_line_error(command, path, expected)
    assert not list(tmp_path.glob("*.pwned"))  # the tag ran nothing


def test_utf_16_with_a_byte_order_mark_is_read(place: Path, tmp_path: Path) -> None:
    """YAML allows UTF-16 and UTF-32 with a byte-order mark (Windows editors write them)."""
    for encoding in ("utf-16", "utf-32", "utf-8-sig"):
        path = tmp_path / f"{encoding}.yaml"
        path.write_bytes(quickstart_text(workdir=str(tmp_path / "w")).encode(encoding))
        assert check_contract("launch", path)[0] == 0
        assert load_study(path).study.name == "quickstart"
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize(
    ("workdir", "expected"),
    [
        ("/proc/hpo-fuzz/w", ("study.workdir", "cannot create /proc/hpo-fuzz/w", "mkdir in /proc fails")),
        ("{tmp}/file/w", ("study.workdir", "{tmp}/file is a file, not a folder")),
        ("{tmp}/" + "n" * 300, ("study.workdir", "File name too long")),
    ],
)
@pytest.mark.parametrize("dry_run", [True, False])
def test_uncreatable_workdir_is_refused_before_anything(
    place: Path, tmp_path: Path, workdir: str, expected: tuple[str, ...], dry_run: bool
) -> None:
    (tmp_path / "file").write_text("")
    path = tmp_path / "study.yaml"
    path.write_text(quickstart_text(workdir=workdir.format(tmp=tmp_path)))
    one_line_error("launch", path, tuple(e.format(tmp=tmp_path) for e in expected), dry_run=dry_run)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "study.yaml"]  # nothing created


def test_journal_that_cannot_be_created(place: Path, tmp_path: Path) -> None:
    path = tmp_path / "study.yaml"
    path.write_text(quickstart_text(workdir=str(tmp_path / "w"), storage="journal:/proc/hpo-fuzz/s.journal"))
    one_line_error("launch", path, ("study.storage", "cannot create /proc/hpo-fuzz"))
    path.write_text(quickstart_text(workdir=str(tmp_path / "w"), storage=f"journal:{tmp_path}"))
    one_line_error("launch", path, ("study.storage", f"{tmp_path} is not a journal file"))
    assert not (tmp_path / "w").exists()


def test_set_cannot_nest_without_bound(place: Path, tmp_path: Path) -> None:
    path = tmp_path / "study.yaml"
    path.write_text(quickstart_text(workdir=str(tmp_path / "w")))
    with pytest.raises(StudyFileError, match="key path of more than 64 parts"):
        load_study(path, ["trainer." + ".".join(["a"] * 10_000) + "=1"])
    with pytest.raises(StudyFileError, match="the value is not valid YAML"):
        load_study(path, ["trainer.x=" + "[" * 10_000])


@pytest.mark.parametrize("case", ["fifo", "alias-bomb", "dev-zero", "python-tag"])
def test_the_real_command_line_gives_the_same_line(place: Path, tmp_path: Path, case: str) -> None:
    make, expected = CASES[case]
    path = make(tmp_path / "study.yaml")
    line = one_line_error("launch", path, expected)
    proc = subprocess.run(
        [HPO, "launch", str(path), "--dry-run"],
        cwd=place,
        env={k: v for k, v in os.environ.items() if k != "HPO_DEBUG"},
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [line]
    assert proc.stdout == ""


@pytest.mark.parametrize("command", ["status", "best"])
def test_storage_that_does_not_answer_is_exit_3(place: Path, tmp_path: Path, command: str) -> None:
    path = tmp_path / "study.yaml"
    path.write_text(quickstart_text(workdir=str(tmp_path / "w"), storage=NO_DATABASE))
    line = one_line_error(command, path, ("study.storage", "cannot open", "hint:"), status=3)
    assert "127.0.0.1:1" in line


@pytest.mark.parametrize("section", ["study", "resources", "launcher", "trainer"])
def test_a_key_named_self_is_bad_input(place: Path, tmp_path: Path, section: str) -> None:
    document = copy.deepcopy(PARSED["quickstart"])
    document["study"]["workdir"] = str(tmp_path / "w")
    document.setdefault(section, {})["self"] = 1
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    one_line_error("launch", path, (f"{section}", "self"))


def test_loader_refuses_what_python_would_run() -> None:
    """The loader is safe on its own (the trainer's --config reads through it too)."""
    from trainer.yamlfile import YamlLoader

    for text in (
        "!!python/name:os.system",
        "!!python/object/new:os.system [true]",
        "!!set {a}",
        "!!omap [a: 1]",
    ):
        with pytest.raises(yaml.YAMLError, match="is not allowed"):
            yaml.load(text, Loader=YamlLoader)
