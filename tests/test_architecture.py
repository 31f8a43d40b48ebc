"""The shape of the code, checked: no import cycles, the trainer independent of the service, and
Optuna's and Ray's private APIs reached from one module each.

The graph is drawn with ``ast`` from every import statement, those inside functions included;
imports under ``if TYPE_CHECKING:`` are left out (they never run).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("hpo", "trainer")
# Optuna's private storage API, and OptunaSearch's internals in Ray Tune.
PRIVATE_OPTUNA = ("_storage", "_trial_id")
PRIVATE_RAY = ("_ot_trials", "_ot_study", "_completed_trials")
OWNERS = {"_storage": "hpo.record", "_trial_id": "hpo.record"} | dict.fromkeys(
    PRIVATE_RAY, "hpo.dispatch.ray.optuna_search"
)


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
    the service but the errors and the paths (the checks that need the machine or a backend are
    `hpo/dispatch/preflight.py`'s)."""
    allowed = ("hpo.config", "hpo.errors", "hpo.paths")
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


def _lengths() -> tuple[dict[str, int], dict[str, int]]:
    modules, functions = {}, {}
    for path in _modules().values():
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
    long_modules = {m for m, n in modules.items() if n > MAX_MODULE_LINES}
    long_functions = {f for f, n in functions.items() if n > MAX_FUNCTION_LINES}
    assert long_modules <= set(LONG_MODULES), {m: modules[m] for m in long_modules - set(LONG_MODULES)}
    assert long_functions <= set(LONG_FUNCTIONS), {
        f: functions[f] for f in long_functions - set(LONG_FUNCTIONS)
    }
    # An entry whose module or function got short leaves the list.
    assert set(LONG_MODULES) <= long_modules, set(LONG_MODULES) - long_modules
    assert set(LONG_FUNCTIONS) <= long_functions, set(LONG_FUNCTIONS) - long_functions


def test_the_architecture_page_names_every_module() -> None:
    """docs/architecture.md's package table matches the tree: each module of `hpo/` is named in the
    row of its package (as `name.py`, or `hpo/name.py` for a top-level module), and each name
    the table gives is a module that exists."""
    page = (REPO / "docs" / "architecture.md").read_text()
    rows = {
        line.split("|")[1].strip().strip("`"): line
        for line in page.splitlines()
        if line.startswith("| `hpo/") or line.startswith("| `trainer/")
    }
    missing = []
    for module, path in _modules().items():
        if not module.startswith("hpo.") or path.name == "__init__.py" or path.name == "__main__.py":
            continue
        relative = path.relative_to(REPO).as_posix()
        parts = relative.split("/")
        if len(parts) == 2:  # hpo/x.py: a row of its own
            if relative not in rows:
                missing.append(relative)
            continue
        package = "/".join(parts[:2]) + "/"  # hpo/dispatch/ for hpo/dispatch/ray/driver.py too
        named = f"`{'/'.join(parts[2:])}`" in rows.get(package, "") or f"`{parts[-1]}`" in rows.get(
            package, ""
        )
        if not named:
            missing.append(relative)
    assert not missing, f"modules docs/architecture.md does not name: {missing}"
    stale = [
        package + name
        for package, row in rows.items()
        if package.endswith("/")
        for name in re.findall(r"`([\w/]+\.py)`", row)
        if not list((REPO / package).rglob(name.rsplit("/", 1)[-1]))
    ]
    assert not stale, f"docs/architecture.md names modules that do not exist: {stale}"
