"""The README and the docs/ pages: every link resolves, every page is reachable from the README, the
README stays a landing page, and the commands in their code blocks parse (the `hpo` and trainer
parsers), name what exists (make targets, modules, scripts, study files) and, for `hpo launch`,
pass a dry run."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpo.commands import build_parser
from tests.conftest import REPO
from trainer.cli import build_parser as build_trainer_parser

pytestmark = pytest.mark.fast  # no cluster, no database, no training: `make test-fast`

README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
SHELL_BLOCKS = {"", "bash", "console", "sh", "shell"}
# Commands of the docs checked by parsing alone, each with why it cannot run here. None at present:
# studies/resnet.yaml's variables come from its own header (see header_environment).
PARSE_ONLY: dict[str, str] = {}
# Study-file arguments that stand for the reader's own file, each with why. None at present.
PLACEHOLDER_STUDIES: dict[str, str] = {}


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


@dataclass(frozen=True)
class Block:
    """A fenced code block: its language and its lines, each with its line number in the page."""

    page: Path
    language: str
    lines: tuple[tuple[int, str], ...]


@dataclass(frozen=True)
class Command:
    """One command of a shell code block, continuation lines joined, `$ ` and `# comment` left out."""

    page: Path
    line: int
    text: str
    argv: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{rel(self.page)}:{self.line}: {self.text}"


def blocks(page: Path) -> list[Block]:
    found: list[Block] = []
    language: str | None = None
    lines: list[tuple[int, str]] = []
    for number, line in enumerate(page.read_text().splitlines(), start=1):
        fence = re.match(r"^\s*```\s*([\w+-]*)", line)
        if fence and language is None:
            language, lines = fence.group(1).lower(), []
        elif fence:
            found.append(Block(page, language or "", tuple(lines)))
            language = None
        elif language is not None:
            lines.append((number, line))
    assert language is None, f"{rel(page)}: a code block is not closed"
    return found


def prose(page: Path) -> str:
    """The page with its code blocks and inline code blanked out, line numbers kept."""
    text = page.read_text()
    text = re.sub(
        r"^\s*```.*?^\s*```[^\n]*$", lambda m: re.sub(r"[^\n]", " ", m.group()), text, flags=re.M | re.S
    )
    return re.sub(r"`[^`]+`", lambda m: re.sub(r"[^\n]", " ", m.group()), text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but hyphens dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def page_anchors(page: Path) -> set[str]:
    """The anchors of the page's headings (outside code blocks), a repeated one numbered as GitHub does."""
    seen: dict[str, int] = {}
    raw = page.read_text().splitlines()
    for number, line in enumerate(prose(page).splitlines()):
        if re.match(r"^#{1,6}\s", line):
            base = slug(re.sub(r"^#{1,6}\s+|\s+#+\s*$", "", raw[number]))
            seen[base] = seen.get(base, 0) + 1
            if seen[base] > 1:
                seen[f"{base}-{seen[base] - 1}"] = 1
    return set(seen)


@dataclass(frozen=True)
class Link:
    page: Path
    line: int
    target: str

    @property
    def where(self) -> str:
        return f"{rel(self.page)}:{self.line}: ({self.target})"


def links(page: Path) -> list[Link]:
    text = prose(page)
    found = []
    for match in re.finditer(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text):
        line = text.count("\n", 0, match.start(1)) + 1
        found.append(Link(page, line, match.group(1)))
    return found


def local_links(page: Path) -> list[Link]:
    return [link for link in links(page) if not re.match(r"^(https?|mailto):", link.target)]


ALL_LINKS = [link for page in PAGES for link in local_links(page)]


@pytest.mark.parametrize("link", ALL_LINKS, ids=[f"{rel(link.page)}:{link.line}" for link in ALL_LINKS])
def test_the_link_resolves(link: Link) -> None:
    path, _, anchor = link.target.partition("#")
    target = (link.page.parent / path).resolve() if path else link.page
    assert target.exists(), f"{link.where}: no such file {target}"
    if anchor:
        assert target.suffix == ".md", f"{link.where}: an anchor into a page that is not markdown"
        assert anchor in page_anchors(target), (
            f"{link.where}: no heading of {rel(target)} has the anchor #{anchor} "
            f"(its anchors: {sorted(page_anchors(target))})"
        )


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    reached, todo = {README}, [README]
    while todo:
        page = todo.pop()
        for link in local_links(page):
            path = link.target.partition("#")[0]
            target = (page.parent / path).resolve() if path else page
            if target in PAGES and target not in reached:
                reached.add(target)
                todo.append(target)
    assert not set(PAGES) - reached, f"not linked from README.md: {sorted(map(rel, set(PAGES) - reached))}"


def test_the_readme_is_a_landing_page() -> None:
    lines = len(README.read_text().splitlines())
    assert lines < 200, f"README.md has {lines} lines: move the reference into docs/"


def test_the_readme_study_file_passes_a_dry_run(tmp_path: Path) -> None:
    examples = [b for b in blocks(README) if b.language == "yaml" and b.lines and b.lines[0][1] == "study:"]
    assert examples, "README.md shows no study file"
    for block in examples:
        study = tmp_path / "example.yaml"
        study.write_text("\n".join(line for _, line in block.lines) + "\n")
        proc = run_hpo(["launch", str(study), "--dry-run"], {})
        assert proc.returncode == 0, f"README.md:{block.lines[0][0]}: {proc.stderr.strip()}"


def logical_lines(block: Block) -> Iterator[tuple[int, str]]:
    """The block's lines with backslash continuations joined, each with its first line's number."""
    start, parts = 0, list[str]()
    for number, line in block.lines:
        if not parts:
            start = number
        if line.rstrip().endswith("\\"):
            parts.append(line.rstrip()[:-1])
            continue
        parts.append(line)
        yield start, " ".join(part.strip() for part in parts)
        parts = []
    if parts:
        yield start, " ".join(part.strip() for part in parts)


def split_command(text: str) -> tuple[str, ...]:
    """The argv of a shell line: its comment, a redirection or pipe and what follows left out, and
    leading VAR=value assignments too. A line shlex cannot split is `("<unsplittable>", reason)`."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    argv: list[str] = []
    try:
        for token in lexer:
            if token and all(char in lexer.punctuation_chars for char in token):
                break
            argv.append(token)
    except ValueError as err:
        return (UNSPLITTABLE, str(err))
    while argv and re.match(r"^[A-Za-z_]\w*=", argv[0]):
        argv.pop(0)
    return tuple(argv)


UNSPLITTABLE = "<unsplittable>"
# In a code block with no language, which may show output, only these lines are commands.
COMMAND_START = re.compile(
    r"^(\$\s+)?([A-Za-z_]\w*=\S*\s+)*(hpo|make|python3?|bash|sh|source|\.|\.?\.?/\S+|\.venv/\S+)(\s|$)"
)


def commands() -> list[Command]:
    found = []
    for page in PAGES:
        for block in blocks(page):
            if block.language not in SHELL_BLOCKS:
                continue
            for line, text in logical_lines(block):
                if not block.language and not COMMAND_START.match(text.strip()):
                    continue
                text = re.sub(r"^\s*\$\s+", "", text).strip()
                if not text or text.startswith("#"):
                    continue
                argv = split_command(text)
                if argv:
                    found.append(Command(page, line, text, argv))
    return found


def program(argv: tuple[str, ...]) -> str:
    return Path(argv[0]).name


COMMANDS = commands()
HPO_COMMANDS = [c for c in COMMANDS if program(c.argv) == "hpo"]
LAUNCHES = [c for c in HPO_COMMANDS if c.argv[1:2] == ("launch",) and c.text not in PARSE_ONLY]


def ids(found: list[Command]) -> list[str]:
    return [f"{rel(c.page)}:{c.line}" for c in found]


def parse(parser_argv: tuple[str, ...], command: Command, trainer: bool = False) -> None:
    parser = build_trainer_parser() if trainer else build_parser()
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            parser.parse_args(list(parser_argv))
    except SystemExit as exit:
        code = exit.code
    else:
        return
    pytest.fail(f"{command.where}: does not parse (exit {code}): {errors.getvalue().strip()}")


@pytest.mark.parametrize("command", HPO_COMMANDS, ids=ids(HPO_COMMANDS))
def test_the_hpo_command_parses(command: Command) -> None:
    argv = command.argv[1:]
    if argv[:1] == ("train",):
        parse(argv[1:], command, trainer=True)
        return
    parse(argv, command)
    args = build_parser().parse_args(list(argv))
    study = getattr(args, "study_file", None)
    if study is not None and str(study) not in PLACEHOLDER_STUDIES:
        assert (REPO / study).is_file(), f"{command.where}: no study file {study} in the repository"


def header_environment(study: Path) -> dict[str, str]:
    """The variables a study file's header tells its reader to export (`#   export NAME=value`): a
    dry run gets them as a reader who followed it would have them. It connects to no database."""
    found = {}
    for line in study.read_text().splitlines():
        if match := re.match(r"^#\s+export\s+([A-Za-z_]\w*)=(\S+)", line):
            found[match.group(1)] = match.group(2)
    return found


def run_hpo(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpo", *argv],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("command", LAUNCHES, ids=ids(LAUNCHES))
def test_the_launch_command_passes_a_dry_run(command: Command) -> None:
    argv = list(command.argv[1:])
    study = REPO / build_parser().parse_args(argv).study_file
    assert study.is_file(), f"{command.where}: no study file {study}"
    if "--dry-run" not in argv:
        argv.append("--dry-run")
    # --check would run the command here, training up to its first report (tests/hpo/budget/
    # test_fail_fast.py runs it); what the docs promise is that the command line and its study hold.
    argv = [arg for arg in argv if arg != "--check"]
    proc = run_hpo(argv, header_environment(study))
    assert proc.returncode == 0, f"{command.where}: exit {proc.returncode}: {proc.stderr.strip()}"


def makefile_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, flags=re.M)}


def module_exists(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


OTHER_COMMANDS = [c for c in COMMANDS if program(c.argv) != "hpo"]


@pytest.mark.parametrize("command", OTHER_COMMANDS, ids=ids(OTHER_COMMANDS))
def test_the_command_names_what_exists(command: Command) -> None:
    argv = command.argv
    name = program(argv)
    assert argv[0] != UNSPLITTABLE, f"{command.where}: not a shell command line ({argv[1]})"
    if name == "make":
        missing = [t for t in argv[1:] if not t.startswith("-") and t not in makefile_targets()]
        assert not missing, f"{command.where}: no make target {missing} in the Makefile"
    elif re.fullmatch(r"python(3(\.\d+)?)?", name) and argv[1:2] == ("-m",):
        module = argv[2]
        assert module_exists(module), f"{command.where}: no module {module}"
        if module == "trainer":
            parse(argv[3:], command, trainer=True)
            config = build_trainer_parser().parse_args(list(argv[3:])).config
            assert config is None or (REPO / config).is_file(), f"{command.where}: no file {config}"
    elif re.fullmatch(r"python(3(\.\d+)?)?", name) or name in ("bash", "sh", ".", "source"):
        script = argv[1]
        assert (REPO / script).is_file(), f"{command.where}: no file {script}"
    elif "/" in argv[0]:
        assert (REPO / argv[0]).is_file(), f"{command.where}: no file {argv[0]}"


MODULE_MENTIONS = [
    (block.page, number, match.group(1))
    for page in PAGES
    for block in blocks(page)
    if block.language in SHELL_BLOCKS
    for number, line in block.lines
    for match in re.finditer(r"\bpython3?\s+-m\s+([\w.]+)", line)
]


@pytest.mark.parametrize(
    ("page", "line", "module"), MODULE_MENTIONS, ids=[f"{rel(p)}:{n}" for p, n, _ in MODULE_MENTIONS]
)
def test_a_module_named_in_a_code_block_exists(page: Path, line: int, module: str) -> None:
    assert module_exists(module), f"{rel(page)}:{line}: no module {module}"


def test_the_allow_lists_name_commands_of_the_docs() -> None:
    texts = {c.text for c in COMMANDS}
    studies = {str(a) for c in HPO_COMMANDS for a in c.argv}
    assert set(PARSE_ONLY) <= texts, set(PARSE_ONLY) - texts
    assert set(PLACEHOLDER_STUDIES) <= studies, set(PLACEHOLDER_STUDIES) - studies


# --- the statements that have a source: checked against it --------------------------------------
def flat_text(path: Path) -> str:
    """A page's text with its line breaks and runs of spaces as one space."""
    return " ".join(path.read_text().split())


def test_the_readme_gives_the_recorded_gpu_check() -> None:
    import json

    recorded = json.loads((REPO / "bench" / "results" / "gpu.json").read_text())
    checks = {c["name"]: c for c in recorded["checks"]}
    bf16, fp16 = (checks[f"resnet50-{kind}"]["figures"] for kind in ("bf16", "fp16"))
    # The images/s as the check printed them.
    shown = {
        kind: re.search(r"trainer ([\d,]+) images/s", checks[f"resnet50-{kind}"]["line"]).group(1)
        for kind in ("bf16", "fp16")
    }  # type: ignore[union-attr]
    packing = checks["packing"]["figures"]["against_k1"]
    text = flat_text(README)
    ok = sum(c["ok"] for c in recorded["checks"])
    for figure in (
        f"one {recorded['machine']['gpus'][0]}",
        f"passed {ok} of {len(recorded['checks'])} checks in {recorded['seconds']:.0f} s",
        f"ResNet-50 at {shown['bf16']} images/s in bf16 and {shown['fp16']} in fp16",
        f"{bf16['trainer_over_bare']:.3f}x and {fp16['trainer_over_bare']:.3f}x a bare training loop",
        f"{bf16['against_published']['NVIDIA DLE, A100, AMP']:.2f}x NVIDIA's published A100 figure",
        f"two trials per GPU gave {packing['2']:.2f}x the trials per GPU-hour and four {packing['4']:.2f}x",
    ):
        assert figure in text, f"README.md does not say {figure!r} (bench/results/gpu.json)"
    # The benchmarks page's gpu section is the check's own output.
    assert (REPO / "bench" / "results" / "gpu.txt").read_text().strip() in (
        REPO / "docs" / "benchmarks.md"
    ).read_text()


def test_the_pages_give_the_default_pruner_the_schema_gives(tmp_path: Path) -> None:
    from hpo.config import load_study

    study = tmp_path / "s.yaml"
    study.write_text("study: {name: s}\nsearch_space: {lr: {type: float, low: 0.01, high: 1.0}}\n")
    default = load_study(study).study.pruner.name
    assert default == "none"  # the sentences below say it in words
    readme_comment = next(
        line for line in README.read_text().splitlines() if "metric: val_accuracy  " in line
    )
    assert "no pruner unless named" in readme_comment, readme_comment
    assert f"options; default `{default}`:" in flat_text(REPO / "docs" / "running-a-study.md")
    assert (
        "No sampler and no pruner named: the measured default"
        in (REPO / "studies" / "resnet.yaml").read_text()
    )
    for page in PAGES:
        text = flat_text(page)
        for wrong in ("median stopping unless named", "default pruner is median", "default: median"):
            assert wrong not in text, f"{rel(page)} says {wrong!r}; the default pruner is {default}"


def test_the_readme_counts_the_fast_layer(request: pytest.FixtureRequest) -> None:
    said = re.search(r"none of which needs the cluster: (\d+) tests in", flat_text(README))
    assert said, "README.md no longer says how many tests `make test-fast` runs"
    assert int(said.group(1)) == fast_test_count(request), "README.md's count of the fast tests"


def fast_test_count(request: pytest.FixtureRequest) -> int:
    """How many tests `make test-fast` (`-m fast`) runs: from this session's own collection when it
    collected the whole suite (`make test`, `make test-fast`), else collected again."""
    option = request.config.option
    whole = [str(a) for a in request.config.args] in ([], ["tests"]) and not option.keyword
    if whole and option.markexpr in ("", "fast"):
        return sum(1 for item in request.session.items if item.get_closest_marker("fast"))
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "fast", "-p", "no:cacheprovider"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    ).stdout  # fmt: skip
    return int(re.search(r"(\d+)/\d+ tests collected", collected).group(1))  # type: ignore[union-attr]
