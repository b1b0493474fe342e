"""One parsing discipline for what gpulens reads from outside (files a user points at, values a user
types, bodies a peer sends): bounded nesting, bounded integer digits, finite numbers, integers a
SQLite column can hold, text that must be UTF-8. Each check raises `UnsafeValue` (a ValueError with a
short reason such as "it nests deeper than 64 levels"); `load_json`, `json_lines` and `read_text`
turn that into one BadInputError sentence naming the file and the line (exit 2).

Readers that skip a bad line (a recording) call `json_value` and count the UnsafeValue; readers that
refuse a bad file call `load_json` / `json_lines`.
"""

from __future__ import annotations

import gc
import json
import math
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpulens.errors import BadInputError, shown

MAX_JSON_DEPTH = 64  # no gpulens file nests deeper than a handful of levels
MAX_INT_DIGITS = 30  # beyond any count, id or timestamp (SQLite's integers have 19 digits)
MAX_FILE_BYTES = 256 << 20  # a config, rule file or dataset larger than this is refused, not read
SQLITE_INT_MIN = -(1 << 63)
SQLITE_INT_MAX = (1 << 63) - 1

# A value that may be non-finite or too long is rare; only text that could hold one takes the slow path
# (Python callbacks for every number), so a recording of ordinary lines parses at json.loads's speed.
# (Two patterns: one alternation is twice as slow as both searches.)
_LONG_DIGITS = re.compile(r"[0-9]{%d}" % (MAX_INT_DIGITS + 1))
_BIG_EXPONENT = re.compile(r"[eE]\+?0*[0-9]{3}")


class UnsafeValue(ValueError):
    """A value refused by one of the checks; `str()` is a short reason (no file name, no full stop)."""


class _BadNumber(UnsafeValue):
    """Raised inside the decoder, which knows no position: json_value finds `token` in the text."""

    def __init__(self, token: str, problem: str):
        super().__init__(problem)
        self.token, self.problem = token, problem


def _refuse_constant(name: str) -> Any:
    raise _BadNumber(name, "which is not a finite number")


def _checked_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise _BadNumber(text, "which is too large to be a finite number")
    return v


def _checked_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise _BadNumber(text, f"an integer of {digits} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _locate(text: str, e: _BadNumber, in_line: bool = False) -> UnsafeValue:
    """The number's line, column and key, found in the text (its first bare occurrence)."""
    m = re.search(r"(?<![\w.\"])%s(?![\w.\"])" % re.escape(e.token), text)
    if m is None:
        return UnsafeValue(f"it holds {_short(e.token)}, {e.problem}")
    line = text.count("\n", 0, m.start()) + 1
    col = m.start() - (text.rfind("\n", 0, m.start()) + 1) + 1
    key = re.search(r'"([^"\\]{1,64})"\s*:\s*$', text[max(0, m.start() - 100):m.start()])
    where = (f"at column {col}" if in_line else f"at line {line}, column {col}") + (f" (key {key.group(1)!r})" if key else "")
    return UnsafeValue(f"it holds {_short(e.token)} {where}, {e.problem}")


# Built once: json.loads with any keyword builds a new decoder (and scanner) per call.
_FAST = json.JSONDecoder(parse_constant=_refuse_constant)
_CHECKED = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_checked_float, parse_int=_checked_int)


def _short(text: str, limit: int = 24) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def _depth_within(value: Any, limit: int) -> bool:
    """Whether lists and objects nest at most `limit` deep (iterative: no recursion to exhaust)."""
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = list(v.values())
        elif not isinstance(v, list):
            continue
        if d > limit:
            return False
        stack.extend((c, d + 1) for c in v if isinstance(c, dict | list))
    return True


def decode_utf8(data: bytes) -> str:
    """Bytes as UTF-8 text, or UnsafeValue naming the first byte that is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UnsafeValue(f"it is not UTF-8 text (byte {e.start + 1} is 0x{data[e.start]:02x})") from None


def json_value(text: str | bytes, *, max_depth: int = MAX_JSON_DEPTH, check_numbers: bool = True, in_line: bool = False) -> Any:
    """One JSON document, checked: UnsafeValue for bad JSON (with its line and column), NaN or
    Infinity, a number that overflows to infinity, an integer of more than MAX_INT_DIGITS digits, a
    nesting deeper than `max_depth`, or bytes that are not UTF-8.

    `check_numbers=False` is for a hot reader that checks every field's number itself (a recording:
    gpu.trace_fields.number): overflowing floats and long integers are then its job; NaN, Infinity,
    depth and Python's own digit limit are still refused here. `in_line`: the text is one line of a
    JSONL file whose caller names the line, so a position is its column only."""
    if isinstance(text, bytes | bytearray):
        text = decode_utf8(bytes(text))
    if text.startswith("\ufeff"):  # a byte order mark, as Windows editors write one: not part of the JSON
        text = text[1:]
    slow = check_numbers and (_LONG_DIGITS.search(text) is not None or _BIG_EXPONENT.search(text) is not None)
    # no cyclic garbage collection while the decoder recurses: a hostile nesting takes it to the
    # recursion limit, where a collected object's finalizer would fail and print a traceback of its own
    collecting = gc.isenabled()
    gc.disable()
    try:
        value = (_CHECKED if slow else _FAST).decode(text)
    except _BadNumber as e:
        raise _locate(text, e, in_line) from None
    except RecursionError:
        raise UnsafeValue(f"it nests deeper than {max_depth} levels") from None
    except json.JSONDecodeError as e:
        at = f"column {e.colno}" if in_line else f"line {e.lineno}, column {e.colno}"
        raise UnsafeValue(f"it is not JSON ({e.msg} at {at})") from None
    except ValueError as e:  # Python's own integer digit limit, reached only off the slow path
        raise UnsafeValue(f"it holds a number Python cannot read ({e})") from None
    finally:
        if collecting:
            gc.enable()
    if text.count("[") + text.count("{") > max_depth and not _depth_within(value, max_depth):
        raise UnsafeValue(f"it nests deeper than {max_depth} levels")
    return value


def load_json(text: str | bytes, where: str, *, hint: str) -> Any:
    """`json_value`, or one sentence naming `where` ("the model config /x/config.json")."""
    try:
        return json_value(text)
    except UnsafeValue as e:
        raise BadInputError(f"{_capital(where)} cannot be read: {e}.", hint=hint) from None


def json_duplicate_key(text: str) -> str | None:
    """The first key an object in `text` (JSON that `json_value` already accepted) gives twice, else
    None: `json` keeps the last value silently, as PyYAML does (`_duplicate_key` answers for YAML)."""
    found: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in items]
        if not found and len(set(keys)) < len(keys):
            found.append(next(k for i, k in enumerate(keys) if k in keys[:i]))
        return dict(items)

    json.loads(text.removeprefix("\ufeff"), object_pairs_hook=pairs)  # a byte order mark, as json_value allows
    return found[0] if found else None


def json_lines(text: str, where: str, *, hint: str) -> Iterator[tuple[int, Any]]:
    """(line number, value) for each non-blank line; the first bad line is one sentence with its number."""
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield n, json_value(line, in_line=True)
        except UnsafeValue as e:
            raise BadInputError(f"Line {n} of {where} cannot be read: {e}.", hint=hint) from None


def read_text(path: str | Path, where: str, *, hint: str, max_bytes: int = MAX_FILE_BYTES) -> str:
    """A regular file's text: one sentence for a file that is missing, not a regular file (a folder,
    a FIFO, a device such as /dev/zero), larger than `max_bytes`, unreadable or not UTF-8."""
    data = read_bytes(path, where, hint=hint, max_bytes=max_bytes)
    try:
        return decode_utf8(data)
    except UnsafeValue as e:
        raise BadInputError(f"{_capital(where)} {_short(str(Path(path)), 120)} cannot be read: {e}.", hint=hint) from None


def read_bytes(path: str | Path, where: str, *, hint: str, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """A regular file's bytes: one sentence for a file that is missing, not a regular file (a folder,
    a FIFO, a device such as /dev/zero, read forever), larger than `max_bytes` or unreadable."""
    p = Path(path)
    shown = _short(str(p), 120)
    try:
        info = p.stat()
    except OSError as e:
        raise BadInputError(f"Cannot read {where} {shown}: {e.strerror or e}.", hint=hint) from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise BadInputError(f"{_capital(where)} {shown} is {kind}.", hint=hint)
    if info.st_size > max_bytes:
        raise BadInputError(f"{_capital(where)} {shown} is {info.st_size:,} bytes, more than the {max_bytes:,} gpulens reads.", hint=hint)
    try:
        with p.open("rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise BadInputError(f"Cannot read {where} {shown}: {e.strerror or e}.", hint=hint) from None
    if len(data) > max_bytes:
        raise BadInputError(f"{_capital(where)} {shown} grew past the {max_bytes:,} bytes gpulens reads.", hint=hint)
    return data


def finite(value: float, what: str) -> float:
    """`value` when it is a finite number, else UnsafeValue ("--rate is nan, not a finite number")."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise UnsafeValue(f"{what} is {value!r}, not a finite number")
    return float(value)


def sqlite_int(value: int, what: str) -> int:
    """`value` when a SQLite INTEGER can hold it, else UnsafeValue."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise UnsafeValue(f"{what} is {value!r}, not a whole number")
    if not SQLITE_INT_MIN <= value <= SQLITE_INT_MAX:
        raise UnsafeValue(f"{what} is {_short(str(value))}, beyond the largest whole number a store holds ({SQLITE_INT_MAX})")
    return value


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


# ---------------------------------------------------------------- YAML

MAX_YAML_NODES = 200_000  # nodes after aliases are expanded: a "billion laughs" file is refused, not walked
MAX_YAML_DEPTH = 64  # counted as the composer descends, so the refusal never depends on the stack left


class UnsafeYaml(UnsafeValue):
    """An UnsafeValue from a YAML document; `line` (1-based) when the reader knows it."""

    def __init__(self, reason: str, line: int | None = None):
        super().__init__(reason)
        self.line = line


def _expanded_nodes_within(root: Any, limit: int) -> str | None:
    """None if the node graph, with every alias expanded where it is used, has at most `limit`
    nodes; else why not: the document itself holds more, or its aliases expand it past `limit`."""
    import yaml

    seen, stack, distinct = 0, [root], set()
    while stack:
        node = stack.pop()
        seen += 1
        distinct.add(id(node))
        if seen > limit:
            # a plan.yaml of 200,000 prices has no alias: "its aliases expand" was untrue there
            if len(distinct) > limit:
                return f"it holds more than {limit:,} values (keys and values counted)"
            return f"its aliases expand to more than {limit:,} values"
        if isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                stack.extend((k, v))
    return None


def _duplicate_key(root: Any) -> UnsafeYaml | None:
    """The first mapping key given twice in one mapping, as a refusal: YAML forbids it and a reader
    would keep only the last silently (Prometheus's own readers refuse it too)."""
    import yaml

    seen_nodes: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen_nodes:
            continue  # an alias: walked once
        seen_nodes.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            lines: dict[tuple[str, str], int] = {}
            for k, v in node.value:
                stack.append(v)
                if not isinstance(k, yaml.ScalarNode) or k.tag == "tag:yaml.org,2002:merge":
                    continue
                line = k.start_mark.line + 1
                if (k.tag, k.value) in lines:
                    first = lines[(k.tag, k.value)]
                    where = f"lines {first} and {line}" if first != line else f"line {line}"
                    return UnsafeYaml(f"the key {shown(k.value)} is given twice ({where})", line)
                lines[(k.tag, k.value)] = line
    return None


def _bound_depth(ld: Any, limit: int) -> None:
    """Refuse nesting past `limit` inside the (recursive) composer, before it can run out of stack."""
    compose = ld.compose_node
    depth = 0

    def bounded(parent: Any, index: Any) -> Any:
        nonlocal depth
        depth += 1
        try:
            if depth > limit:
                mark = ld.peek_event().start_mark
                raise UnsafeYaml(f"it nests deeper than {limit} levels (line {mark.line + 1})", mark.line + 1)
            return compose(parent, index)
        finally:
            depth -= 1

    ld.compose_node = bounded


def yaml_value(text: str, *, loader: Any = None, max_nodes: int = MAX_YAML_NODES) -> Any:
    """One YAML document with a safe loader (`loader`: a SafeLoader subclass): UnsafeYaml for bad YAML
    (with its line), a nesting too deep for the reader, a document whose aliases expand past
    `max_nodes` nodes, or keys that cannot be keys (a list as a key)."""
    import yaml

    ld = None
    try:
        ld = (loader or yaml.SafeLoader)(text)
        _bound_depth(ld, MAX_YAML_DEPTH)
        node = ld.get_single_node()
        if node is None:
            return None
        too_many = _expanded_nodes_within(node, max_nodes)
        if too_many is not None:
            raise UnsafeYaml(too_many)
        duplicate = _duplicate_key(node)
        if duplicate is not None:
            raise duplicate
        return ld.construct_document(node)
    except UnsafeValue:
        raise
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else None
        raise UnsafeYaml(f"it is not valid YAML{f' at line {line}' if line else ''} ({e.problem or e.context})", line) from None
    except yaml.YAMLError as e:  # e.g. a control character the reader refuses
        raise UnsafeYaml(f"it is not valid YAML ({_short(' '.join(str(e).split()), 120)})") from None
    except RecursionError:
        raise UnsafeYaml("it nests deeper than the YAML reader follows") from None
    except (TypeError, ValueError) as e:  # a list as a mapping key; a date or number YAML cannot build
        raise UnsafeYaml(f"it holds a value YAML cannot build ({_short(str(e), 80)})") from None
    finally:
        if ld is not None:
            ld.dispose()


def load_yaml(text: str, where: str, *, hint: str, loader: Any = None) -> Any:
    """`yaml_value`, or one sentence naming `where` ("the plan config /x/plan.yaml")."""
    try:
        return yaml_value(text, loader=loader)
    except UnsafeValue as e:
        raise BadInputError(f"{_capital(where)} cannot be read: {e}.", hint=hint) from None
