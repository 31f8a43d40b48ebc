"""YAML files read as people write them: numbers resolved as in YAML 1.2, one mapping per file.

Shared by the trainer's ``--config`` files and the service's study files (the service imports it
from here; the trainer never imports the service).

A config file is untrusted bytes. Reading one ends in a mapping or in a :class:`ConfigError` of one
line naming the file, and within bounded time and memory: only a regular file of at most
:data:`MAX_BYTES` is read (never a FIFO or a device, which would block or never end); it must be
UTF-8 (or UTF-16/32 with a byte-order mark); and the document is plain data (strings, numbers,
booleans, null, lists, mappings of scalar keys without a duplicate; no tag that builds anything
else) of at most :data:`MAX_DEPTH` levels and :data:`MAX_NODES` values, aliases counted as many
times as they are used, so that an alias bomb ("billion laughs") is refused before anything walks
the expanded tree. Each refusal names the line.
"""

from __future__ import annotations

import codecs
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.events import AliasEvent, Event, ScalarEvent
from yaml.nodes import MappingNode, Node, ScalarNode

from trainer.errors import ConfigError

MAX_BYTES = 1 << 20
"""The largest config file read (1 MiB); the shipped ones are under 10 KiB."""
MAX_DEPTH = 64
"""Collections nested deeper than this are refused (a study file has 4 or 5 levels)."""
MAX_NODES = 5_000
"""Values in one document, aliases expanded (a study file has a few hundred)."""
MAX_SCALAR_CHARS = 10_000
"""The longest single value, in characters."""

_INT_TAG, _FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_MERGE_TAG = "tag:yaml.org,2002:merge"
# Tags of SafeLoader that build types no config value has (tuples, sets): refused like any other tag.
_UNSUPPORTED_TAGS = ("tag:yaml.org,2002:omap", "tag:yaml.org,2002:pairs", "tag:yaml.org,2002:set")


class UnsupportedYaml(yaml.MarkedYAMLError):
    """Valid YAML that a config file may not hold (a tag, a list as a key, an alias bomb...)."""


def _refuse(problem: str, mark: Any) -> UnsupportedYaml:
    return UnsupportedYaml(None, None, problem, mark)


class YamlLoader(yaml.SafeLoader):
    """Numbers resolved as in YAML 1.2, not PyYAML's YAML 1.1; plain data only, within limits.

    In YAML 1.1 ``1e-4`` (no dot, or no exponent sign) is a string, and ``1:30:00`` is the
    sexagesimal integer 5400: learning rates and Slurm time limits are written exactly like that.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0
        self._aliases = 0
        self._expanded: dict[str, int] = {}  # anchor -> values in its node, once composed

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        # Counted while composing, so that the limits stop a huge or explosive document early.
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            anchor = event.anchor
            if anchor in self.anchors and anchor not in self._expanded:
                raise _refuse(f"alias *{anchor} refers to a node that contains it", event.start_mark)
            self._aliases += 1
            self._count(self._expanded.get(anchor or "", 0), event)
            return super().compose_node(parent, index)
        if isinstance(event, ScalarEvent) and len(event.value) > MAX_SCALAR_CHARS:
            raise _refuse(
                f"a value of {len(event.value):,} characters (at most {MAX_SCALAR_CHARS:,})",
                event.start_mark,
            )
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _refuse(f"nested more than {MAX_DEPTH} levels deep", event.start_mark)
        before = self._nodes
        self._count(1, event)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if event.anchor is not None:
            self._expanded[event.anchor] = self._nodes - before
        return node

    def _count(self, values: int, event: Event) -> None:
        self._nodes += values
        if self._nodes > MAX_NODES:
            if self._aliases:
                problem = (
                    f"aliases expand the document to more than {MAX_NODES:,} values "
                    f"({self._aliases} aliases so far: an alias bomb?)"
                )
            else:
                problem = f"more than {MAX_NODES:,} values; a config file holds a few hundred"
            raise _refuse(problem, event.start_mark)

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError, LookupError, AttributeError, ArithmeticError) as err:
            # PyYAML's own constructors fail so on an explicit tag with a wrong value (`!!int abc`,
            # `!!int` of nothing, `!!bool maybe`).
            raise _refuse(
                f"cannot read {_short(node.tag)} {str(node.value)[:40]!r}: {err}", node.start_mark
            ) from None

    def construct_undefined(self, node: Node) -> Any:
        raise _refuse(
            f"tag {_short(node.tag)} is not allowed: a config file holds plain data (strings, "
            "numbers, booleans, null, lists, mappings)",
            node.start_mark,
        )

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        # Duplicates among the keys written here; a merge (<<) may repeat a key on purpose.
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            if not isinstance(key_node, ScalarNode):
                kind = "mapping" if isinstance(key_node, MappingNode) else "list"
                raise _refuse(f"a key must be a name, found a {kind}", key_node.start_mark)
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise _refuse(f"duplicate key {key_node.value!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)

    def construct_yaml_int(self, node: ScalarNode) -> int:
        # No setting needs more than 64 bits; beyond, products of settings (a global batch size)
        # overflow a float, and int() of more than 4300 digits raises.
        digits = len(str(node.value))
        too_large = _refuse(f"integer of {digits} digits is too large (at most 64 bits)", node.start_mark)
        if digits > 100:
            raise too_large
        value = super().construct_yaml_int(node)
        if abs(value) >= 2**64:
            raise too_large
        return value


def _short(tag: str | None) -> str:
    return (
        "!!" + tag.removeprefix("tag:yaml.org,2002:")
        if tag and tag.startswith("tag:yaml.org,2002:")
        else str(tag)
    )


YamlLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_INT_TAG, _FLOAT_TAG)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
YamlLoader.add_implicit_resolver(
    _INT_TAG, re.compile(r"^(?:[-+]?(?:0|[1-9][0-9_]*)|0x[0-9a-fA-F]+)$"), list("-+0123456789")
)
YamlLoader.add_implicit_resolver(
    _FLOAT_TAG,
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.VERBOSE,
    ),
    list("-+0123456789."),
)
YamlLoader.yaml_constructors = {
    tag: constructor
    for tag, constructor in yaml.SafeLoader.yaml_constructors.items()
    if tag not in _UNSUPPORTED_TAGS
}
# The class's own methods, not SafeConstructor's functions that the table above holds.
YamlLoader.add_constructor(_INT_TAG, YamlLoader.construct_yaml_int)
YamlLoader.add_constructor(None, YamlLoader.construct_undefined)


def read_config_text(path: str | Path) -> str:
    """A config file's text: a regular file of at most :data:`MAX_BYTES`, UTF-8 (or UTF-16/32 with
    a byte-order mark). Never blocks on a FIFO nor reads an endless device."""
    data = _read_bytes(path)
    encoding = "utf-8"
    for bom, with_bom in (
        (codecs.BOM_UTF32_LE, "utf-32"),  # before UTF-16: its mark begins like UTF-16 LE's
        (codecs.BOM_UTF32_BE, "utf-32"),
        (codecs.BOM_UTF16_LE, "utf-16"),
        (codecs.BOM_UTF16_BE, "utf-16"),
        (codecs.BOM_UTF8, "utf-8-sig"),
    ):
        if data.startswith(bom):
            encoding = with_bom
            break
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as err:
        if encoding == "utf-8":
            line = data.count(b"\n", 0, err.start) + 1
            where = f"line {line}, byte 0x{data[err.start]:02x}"
            raise ConfigError(f"{path}: not UTF-8 text ({where}): save it as UTF-8") from None
        raise ConfigError(
            f"{path}: not valid {encoding.upper()} text (at byte {err.start}): {err.reason}"
        ) from None


def _read_bytes(path: str | Path) -> bytes:
    def cannot(reason: str) -> ConfigError:
        return ConfigError(f"{path}: cannot read config file: {reason}")

    def check_regular(mode: int) -> None:
        if stat.S_ISDIR(mode):
            raise cannot("Is a directory")
        if not stat.S_ISREG(mode):
            raise cannot(f"not a regular file (a {_file_kind(mode)})")

    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError) as err:  # ValueError: a NUL byte in the path
        raise cannot(getattr(err, "strerror", None) or str(err)) from None
    # Checked before opening: opening a device can do things (a tape rewinds). O_NONBLOCK, and the
    # check again on the open file, for a FIFO swapped in meanwhile (its open would wait a writer).
    check_regular(mode)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as err:
        raise cannot(err.strerror or str(err)) from None
    try:
        check_regular(os.fstat(fd).st_mode)
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_BYTES:  # a file growing as it is read stops here too
            chunk = os.read(fd, MAX_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as err:
        raise cannot(err.strerror or str(err)) from None
    finally:
        os.close(fd)
    if size > MAX_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_BYTES >> 20} MiB, which no config file needs")
    return b"".join(chunks)


def _file_kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return kind
    return "special file"


def load_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """A config file's mapping (empty for an empty file); any problem is a one-line ConfigError."""
    text = read_config_text(path)
    try:
        values = yaml.load(text, Loader=YamlLoader)  # safe: a SafeLoader subclass
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: {yaml_problem(err, text)}") from None
    except (ValueError, TypeError, LookupError, AttributeError, ArithmeticError, RecursionError) as err:
        # Not met so far; whatever input makes PyYAML itself fail is still the file's problem.
        raise ConfigError(f"{path}: not valid YAML: {type(err).__name__}: {err}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys, got {type(values).__name__}")
    return values


def yaml_problem(err: yaml.YAMLError, text: str) -> str:
    """A YAML error as one line that names the line: ``not valid YAML (line 3): ...``."""
    line: int | None = None
    if isinstance(err, yaml.MarkedYAMLError):
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = err.problem or err.context or "unknown problem"
        if err.context == "expected a single document in the stream":
            problem = "more than one document (a second ---); a config file is one document"
    elif isinstance(err, yaml.reader.ReaderError):
        line = text.count("\n", 0, err.position) + 1
        problem = f"unacceptable character #x{err.character:04x}: special characters are not allowed"
        if err.character == 0:
            problem += " (UTF-16 text without a byte-order mark?)"
    else:
        problem = str(err)
    problem = " ".join(str(problem).split())  # one line, whatever the message held
    if isinstance(err, UnsupportedYaml):
        return f"line {line}: {problem}" if line is not None else problem
    return f"not valid YAML (line {line}): {problem}" if line is not None else f"not valid YAML: {problem}"
