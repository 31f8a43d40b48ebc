"""The shape of the code, checked: no import cycles between modules or between packages, the
trainer independent of the service, Optuna's, Ray's and submitit's private APIs reached from one
module each, no underscore name imported across modules, short modules and functions (bench/
included in each of these), and tests that import no other test module and, when marked fast,
need no cluster. Each rule that reads the code has a self-test that feeds it a breach.

The graph is drawn with ``ast`` from every import statement, those inside functions included;
imports under ``if TYPE_CHECKING:`` are left out (they never run).
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from tests.conftest import fast_tests_on_the_cluster

pytestmark = pytest.mark.fast  # no cluster, no database, no training: `make test-fast`

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("hpo", "trainer", "bench")  # bench/ is the benchmarks' code, held to the same rules
# Optuna's private storage API, and OptunaSearch's internals in Ray Tune.
PRIVATE_OPTUNA = ("_storage", "_trial_id")
PRIVATE_RAY = ("_ot_trials", "_ot_study", "_completed_trials")
OWNERS = {"_storage": "hpo.record", "_trial_id": "hpo.record"} | dict.fromkeys(
    PRIVATE_RAY, "hpo.dispatch.ray.optuna_search"
)
# submitit's private names (``_make_sbatch_string``, the ``submitit.core._submit`` entry point): any
# name that starts with an underscore, reached through submitit's modules or named in a string. Each
# owner keeps one: a submitit release that changes it breaks there only.
SUBMITIT_PRIVATE_OWNERS = {
    "hpo.executors.jobs": "the module every submitit job runs, whatever its executor",
    "hpo.slurm.jobs": "_make_sbatch_string, which renders a Slurm job's script",
}


@functools.cache  # read once per run: every check walks the same tree
def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node, except what sits under ``if TYPE_CHECKING:``."""
    nodes: list[ast.AST] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        nodes.append(node)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                stack.extend(child.orelse)
                continue
            stack.append(child)
    return nodes


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The project modules ``module`` imports (``from a import b`` counts b where b is a module)."""
    found = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [*package.split(".")[: len(package.split(".")) - node.level + 1], base]
                ).strip(".")
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            # `import a.b.c` imports a and a.b too; only the deepest project module matters here.
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


@functools.cache
def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            # A package's __init__ importing its own submodules is not a cycle through the package.
            if target.startswith(node + "."):
                continue
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_import_graph_has_no_cycle() -> None:
    graph = _graph()
    assert len(graph) > 40, sorted(graph)  # the walk found the packages
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_trainer_never_imports_the_service() -> None:
    offenders = {
        module: sorted(t for t in targets if t.split(".")[0] == "hpo")
        for module, targets in _graph().items()
        if module.split(".")[0] == "trainer"
    }
    assert not any(offenders.values()), offenders


def test_private_apis_are_reached_from_their_owner_only() -> None:
    offenders = []
    for module, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in OWNERS and OWNERS[node.attr] != module:
                offenders.append(f"{module}:{node.lineno} .{node.attr}")
    assert not offenders, offenders


def test_the_cycle_finder_finds_a_cycle() -> None:
    # The checks above pass on a graph without cycles; this one shows they would fail on one.
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def _package_of(module: str, path: Path) -> str:
    """The package a module belongs to (``hpo.dispatch.ray.driver`` -> ``hpo.dispatch.ray``); a
    package is itself, and a top-level module (``hpo.record``) counts as a package of its own."""
    parent = module.rpartition(".")[0]
    if path.name == "__init__.py" or parent in PACKAGES:
        return module
    return parent


def _package_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for module, targets in _graph().items():
        package = _package_of(module, modules[module])
        edges = graph.setdefault(package, set())
        edges.update(_package_of(t, modules[t]) for t in targets)
        edges.discard(package)
    return graph


def test_the_packages_import_each_other_one_way() -> None:
    """No cycle between packages either (``hpo.slurm`` -> ``hpo.trial`` -> ``hpo.slurm`` passes the
    module check when no single module closes the loop): a package is a layer whose modules can be
    read without the packages that import it. A package using its own subpackage (``hpo.dispatch``
    and ``hpo.dispatch.ray``) is one layer, as a package's ``__init__`` importing its modules is."""
    graph = _package_graph()
    assert {"hpo.slurm", "hpo.trial", "hpo.dispatch.ray", "hpo.record"} <= set(graph), sorted(graph)
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_package_graph_collapses_modules_into_packages() -> None:
    root = REPO / "hpo"
    assert _package_of("hpo.dispatch.ray.driver", root / "dispatch/ray/driver.py") == "hpo.dispatch.ray"
    assert _package_of("hpo.slurm.accounting", root / "slurm/accounting.py") == "hpo.slurm"
    assert _package_of("hpo.slurm", root / "slurm/__init__.py") == "hpo.slurm"
    assert _package_of("hpo.record", root / "record.py") == "hpo.record"
    assert _cycle({"hpo.slurm": {"hpo.trial"}, "hpo.trial": {"hpo.slurm"}}) == [
        "hpo.slurm",
        "hpo.trial",
        "hpo.slurm",
    ]


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


# A string that names a private part of submitit: submitit.core._submit, core._submit, _make_sbatch_string.
SUBMITIT_PRIVATE_TEXT = re.compile(r"\bsubmitit(\.\w+)*\._\w+|\bcore\._submit\b|\b_make_sbatch_string\b")


def _submitit_private_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """Where a module reaches a private name of submitit: imported from it, an attribute of a name
    bound to one of its modules, or a string that names one (``python -m submitit.core._submit``).
    Docstrings are left out: they may say what the code does."""
    bound: set[str] = set()  # local names of submitit's modules and of what was imported from them
    uses = []
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "submitit":
                    bound.add(alias.asname or alias.name.split(".")[0])
                    if any(_is_private(part) for part in alias.name.split(".")):
                        uses.append((node.lineno, alias.name))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "submitit":
            module = node.module or ""
            for alias in node.names:
                bound.add(alias.asname or alias.name)
                if any(_is_private(part) for part in [*module.split("."), alias.name]):
                    uses.append((node.lineno, f"{module}.{alias.name}"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in bound:
                uses.append((node.lineno, ast.unparse(node)))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and SUBMITIT_PRIVATE_TEXT.search(node.value)
        ):
            uses.append((node.lineno, repr(node.value)))
    return sorted(uses)


def test_submitits_private_names_are_used_in_one_module() -> None:
    """submitit's private API (no release promises it) is reached from one module: a submitit
    release that changes it breaks there only, as Optuna's and Ray's do in theirs."""
    offenders = [
        f"{module}:{line} {what}"
        for module, path in _modules().items()
        if module not in SUBMITIT_PRIVATE_OWNERS
        for line, what in _submitit_private_uses(ast.parse(path.read_text()))
    ]
    assert not offenders, offenders
    for owner in SUBMITIT_PRIVATE_OWNERS:
        path = _modules()[owner]
        assert _submitit_private_uses(ast.parse(path.read_text())), f"{owner} no longer needs to be an owner"


def test_the_submitit_check_sees_each_way_of_reaching_a_private_name() -> None:
    source = """
import submitit
from submitit.slurm.slurm import _make_sbatch_string
from submitit.core import core
from submitit.core._submit import main
submitit.helpers._private()
core._helper
command = f"python -m submitit.core._submit {folder}"
"""
    assert [line for line, _ in _submitit_private_uses(ast.parse(source))] == [3, 5, 6, 7, 8]
    assert _submitit_private_uses(ast.parse("import submitit\nsubmitit.helpers.DelayedSubmission")) == []


def _underscore_imports(module: str, path: Path, known: set[str]) -> list[tuple[int, str]]:
    """The underscore names ``module`` takes from another project module: ``from x import _y``,
    ``import x._y``, and ``x._y`` where x is a project module it imported."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    modules_bound: dict[str, str] = {}  # local name -> project module
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], base]).strip(".")
            if base.split(".")[0] not in PACKAGES:
                continue
            for alias in node.names:
                if _is_private(alias.name) and base != module:
                    found.append((node.lineno, f"from {base} import {alias.name}"))
                if f"{base}.{alias.name}" in known:
                    modules_bound[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] not in PACKAGES:
                    continue
                if any(_is_private(part) for part in alias.name.split(".")):
                    found.append((node.lineno, f"import {alias.name}"))
                if alias.asname and alias.name in known:
                    modules_bound[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and _is_private(node.attr)
            and isinstance(node.value, ast.Name)
            and modules_bound.get(node.value.id, module) != module
        ):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_module_takes_another_modules_underscore_names() -> None:
    """An underscore name is its module's own: what another module needs is made public where it
    is defined (no ``_KeyProblem = KeyProblem`` aliases for a neighbour to import)."""
    modules = _modules()
    offenders = [
        f"{module}:{line} {what}"
        for module, path in modules.items()
        for line, what in _underscore_imports(module, path, set(modules))
    ]
    assert not offenders, offenders


def test_the_record_reads_and_writes_and_runs_nothing() -> None:
    """`hpo/record.py` and `hpo/study_record.py` are the layer under dispatch, the trial's job and
    the views: they import none of them (what the record needs of a fail reason is
    `hpo/failures.py`'s, which imports nothing of hpo; of the study's own record, only what
    `hpo/study_record.py` holds, which imports nothing of hpo)."""
    above = ("hpo.dispatch", "hpo.observe", "hpo.trial", "hpo.slurm", "hpo.budget", "hpo.commands")
    graph = _graph()
    assert not [t for t in graph["hpo.record"] if t.startswith(above)], graph["hpo.record"]
    assert not [t for t in graph["hpo.study_record"] if t.startswith("hpo")], graph["hpo.study_record"]
    assert not [t for t in graph["hpo.failures"] if t.startswith("hpo")], graph["hpo.failures"]


def test_the_configuration_is_pure_input() -> None:
    """`hpo/config` turns a study file into a StudySpec and nothing more: it imports nothing of
    the service but the errors, the paths and the executor registry (which executors are installed:
    ``resources.executor`` names one); the checks that need the machine or a backend are
    `hpo/dispatch/preflight.py`'s."""
    allowed = ("hpo.config", "hpo.errors", "hpo.paths", "hpo.executors")
    offenders = {
        module: sorted(t for t in targets if t.startswith("hpo") and not t.startswith(allowed))
        for module, targets in _graph().items()
        if module.startswith("hpo.config")
    }
    assert not any(offenders.values()), offenders


def test_dispatch_and_observe_do_not_import_each_other_both_ways() -> None:
    """The views read what dispatch writes (the lease, the Ray rendezvous); dispatch never imports
    the views (its live progress line is its own)."""
    graph = _graph()
    upward = {
        m: sorted(t for t in ts if t.startswith("hpo.observe"))
        for m, ts in graph.items()
        if m.startswith("hpo.dispatch")
    }
    assert not any(upward.values()), upward


MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60
# What is longer today, each with why; the test fails on any other, and on an entry that no longer
# needs to be here (so the list only shrinks).
LONG_MODULES: dict[str, str] = {}
LONG_FUNCTIONS: dict[str, str] = {}
# bench/ is held to the same lengths; what it has over them today, to be shortened (the list only
# shrinks as the rest do).
BENCH_LONG_MODULES: dict[str, str] = {}
BENCH_LONG_FUNCTIONS: dict[str, str] = {}


def _lengths() -> tuple[dict[str, int], dict[str, int]]:
    """Lines of each module, and of each function (``path:name``), in hpo/, trainer/ and bench/."""
    modules, functions = {}, {}
    paths = [*_modules().values(), *sorted((REPO / "bench").rglob("*.py"))]
    for path in paths:
        name = path.relative_to(REPO).as_posix()
        text = path.read_text()
        modules[name] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                key = f"{name}:{node.name}"
                functions[key] = max(
                    functions.get(key, 0), (node.end_lineno or node.lineno) - node.lineno + 1
                )
    return modules, functions


def test_modules_and_functions_stay_short() -> None:
    modules, functions = _lengths()
    allowed_modules = set(LONG_MODULES) | set(BENCH_LONG_MODULES)
    allowed_functions = set(LONG_FUNCTIONS) | set(BENCH_LONG_FUNCTIONS)
    long_modules = {m for m, n in modules.items() if n > MAX_MODULE_LINES}
    long_functions = {f for f, n in functions.items() if n > MAX_FUNCTION_LINES}
    assert long_modules <= allowed_modules, {m: modules[m] for m in long_modules - allowed_modules}
    assert long_functions <= allowed_functions, {f: functions[f] for f in long_functions - allowed_functions}
    # An entry whose module or function got short leaves the list.
    assert allowed_modules <= long_modules, allowed_modules - long_modules
    assert allowed_functions <= long_functions, allowed_functions - long_functions
    assert all(m.startswith("bench/") for m in [*BENCH_LONG_MODULES, *BENCH_LONG_FUNCTIONS])


def _page_against_tree(page: str, modules: dict[str, Path]) -> tuple[list[str], list[str]]:
    """docs/architecture.md's package table against the modules: those it does not name, and the
    names it gives that are no module (in a package's row, or a top-level row of its own)."""
    rows = {
        line.split("|")[1].strip().strip("`"): line
        for line in page.splitlines()
        if line.startswith("| `hpo/") or line.startswith("| `trainer/")
    }
    files = {path.relative_to(REPO).as_posix() for path in modules.values()}
    missing = []
    for module, path in modules.items():
        if not module.startswith(("hpo.", "trainer.")) or path.name in ("__init__.py", "__main__.py"):
            continue
        relative = path.relative_to(REPO).as_posix()
        parts = relative.split("/")
        if parts[0] == "hpo" and len(parts) == 2:  # hpo/x.py: a row of its own
            if relative not in rows:
                missing.append(relative)
            continue
        # hpo/dispatch/ for hpo/dispatch/ray/driver.py too; trainer/ for every trainer module
        package = "trainer/" if parts[0] == "trainer" else "/".join(parts[:2]) + "/"
        named = f"`{'/'.join(parts[2:])}`" in rows.get(package, "") or f"`{parts[-1]}`" in rows.get(
            package, ""
        )
        if not named:
            missing.append(relative)
    stale = [name for name in rows if not name.endswith("/") and name not in files]  # a row of its own
    stale += [
        package + name
        for package, row in rows.items()
        if package.endswith("/")
        for name in re.findall(r"`([\w/]+\.py)`", row)
        # under the package, or a module elsewhere that the row refers to by its path
        if name not in files and not any(f.startswith(package) and f.endswith("/" + name) for f in files)
    ]
    return missing, stale


def test_the_architecture_page_names_every_module() -> None:
    """docs/architecture.md's package table matches the tree: each module of `hpo/` and `trainer/`
    is named in the row of its package (as `name.py`, or `hpo/name.py` for a top-level module of
    the service; the trainer has one row), and each name the table gives is a module that exists."""
    missing, stale = _page_against_tree((REPO / "docs" / "architecture.md").read_text(), _modules())
    assert not missing, f"modules docs/architecture.md does not name: {missing}"
    assert not stale, f"docs/architecture.md names modules that do not exist: {stale}"


def test_the_page_check_finds_a_module_left_out_and_rows_gone_stale() -> None:
    modules = {
        "hpo.record": REPO / "hpo/record.py",
        "hpo.dispatch.common": REPO / "hpo/dispatch/common.py",
        "hpo.dispatch.ray.driver": REPO / "hpo/dispatch/ray/driver.py",
    }
    page = "\n".join([
        "| `hpo/record.py` | the record |",
        "| `hpo/gone.py` | a module that was removed |",
        "| `hpo/dispatch/` | `common.py`, `ray/driver.py`, `moved.py` |",
    ])  # fmt: skip
    assert _page_against_tree(page, modules) == ([], ["hpo/gone.py", "hpo/dispatch/moved.py"])
    page = "| `hpo/dispatch/` | `common.py` |"
    assert _page_against_tree(page, modules) == (["hpo/record.py", "hpo/dispatch/ray/driver.py"], [])


def _test_modules_imported(path: Path) -> list[tuple[int, str]]:
    """The test modules (``test_*.py``) a file under tests/ imports, relative imports included."""
    relative = path.relative_to(REPO).with_suffix("").parts
    package = relative[:-1]
    found: set[tuple[int, str]] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], base]).strip(".")
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            parts = name.split(".")
            tests = [i for i, part in enumerate(parts) if part.startswith("test_")]
            if tests:  # the test module itself, not each name taken from it
                found.add((node.lineno, ".".join(parts[: tests[0] + 1])))
    return sorted(found)


def test_no_test_module_imports_another() -> None:
    """What several test modules share is in a helpers module (``tests/hpo/helpers.py``) or a
    conftest.py: a test module imported by another would run its tests' set-up on import, and
    its helpers would be moved or renamed with it."""
    offenders = [
        f"{path.relative_to(REPO)}:{line} {name}"
        for path in sorted((REPO / "tests").rglob("*.py"))
        for line, name in _test_modules_imported(path)
    ]
    assert not offenders, offenders


def test_the_fast_layer_requests_no_cluster() -> None:
    """`make test-fast` runs with the cluster stopped: tests/conftest.py stops the collection when
    a test marked fast requests a cluster fixture, itself or through another fixture."""

    class Item:
        def __init__(self, nodeid: str, fast: bool, fixturenames: list[str]) -> None:
            self.nodeid, self.fast, self.fixturenames = nodeid, fast, fixturenames

        def get_closest_marker(self, name: str) -> object | None:
            return object() if name == "fast" and self.fast else None

    items = [
        Item("pure", True, ["tmp_path"]),
        Item("on_the_cluster", True, ["dev3_alone", "local_cluster"]),
        Item("a_database", True, ["fresh_database", "local_cluster"]),
        Item("slow_on_the_cluster", False, ["local_cluster"]),
    ]
    assert fast_tests_on_the_cluster(items) == ["on_the_cluster", "a_database"]  # type: ignore[arg-type]


# What tells the storage kinds apart: their URL schemes, Optuna's classes for them, the journal's prefix.
STORAGE_KIND_MARKS = re.compile(
    r"JOURNAL_PREFIX|[\"']journal:|[\"'](postgresql|sqlite|mysql)|JournalStorage|RDBStorage"
)
STORAGE_KIND_OWNERS = (
    "hpo/storage.py",
    "hpo/outages.py",
    "hpo/rdb.py",
    "hpo/journal.py",
    "hpo/locks.py",
    "hpo/config/",
)


def _storage_kind_offenders(sources: dict[str, str]) -> list[str]:
    """The lines, outside the storage modules, that tell a storage kind by its scheme or class."""
    offenders = []
    for relative, text in sources.items():
        if relative.startswith(STORAGE_KIND_OWNERS):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if STORAGE_KIND_MARKS.search(line.split("#", 1)[0]):
                offenders.append(f"{relative}:{number}: {line.strip()}")
    return offenders


def test_only_the_storage_modules_tell_the_storage_kinds_apart() -> None:
    """A module outside ``hpo/storage.py`` (and the journal, outage and lock code it picks) asks the
    ``StorageRef`` what differs between kinds; ``hpo/config`` checks the URL the study file gives."""
    sources = {p.relative_to(REPO).as_posix(): p.read_text() for p in sorted((REPO / "hpo").rglob("*.py"))}
    offenders = _storage_kind_offenders(sources)
    assert not offenders, "\n".join(offenders)


def test_the_storage_kind_check_finds_a_module_that_tells_kinds_apart() -> None:
    sources = {
        "hpo/observe/views.py": 'if url.startswith("postgresql"):  # a breach\n    pass\n# "sqlite" in a comment\n',
        "hpo/dispatch/common.py": "storage = optuna.storages.JournalStorage(backend)\n",
        "hpo/storage.py": 'if url.startswith("mysql"):\n',  # the owner may
    }
    assert _storage_kind_offenders(sources) == [
        'hpo/observe/views.py:1: if url.startswith("postgresql"):  # a breach',
        "hpo/dispatch/common.py:1: storage = optuna.storages.JournalStorage(backend)",
    ]
