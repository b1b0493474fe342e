"""One builder of PromQL text, for the alert rules, the panels, the recording rules and the Prometheus reader.

What it guarantees, so no emitter has to think about it again:
- a label value (`=`, `!=`) or a regular expression (`=~`, `!~`) becomes one PromQL string literal
  whatever it holds: backslashes, double quotes, newlines and every other control or unprintable
  character are escaped, so the literal decodes (`unquote`) back to exactly that value and nothing
  in it can close the string or the selector; a value PromQL cannot hold (a lone surrogate) is refused;
- metric and label names are checked against PromQL's grammar rather than pasted in;
- a duration has one spelling, `duration()`: the largest units first, exact to the millisecond
  (90 s -> "1m30s", 0.25 s -> "250ms");
- the functions and aggregations have one spelling: `sum(x)`, `sum by (a, b) (x)`, `rate(m[1m])`,
  `histogram_quantile(q, sum by (le) (rate(m_bucket[w])))`.
A window is seconds or a Grafana variable such as `$__rate_interval`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpulens.errors import BadInputError, shown

_METRIC = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_VARIABLE = re.compile(r"^\$\{?__?[a-zA-Z_][a-zA-Z0-9_]*\}?$")  # $__rate_interval, $__range
MATCH_OPS = ("=", "!=", "=~", "!~")
AGGREGATIONS = ("sum", "avg", "max", "min", "count")
_UNITS_MS = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1))
_DUR_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")
_DUR_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31_536_000}
_SIMPLE_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_DECODE = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", '"': '"', "'": "'"}
_REGEX_SPECIAL = set("\\.+*?()|[]{}^$")

Window = float | str  # seconds, or a Grafana variable ("$__rate_interval")


# ------------------------------------------------------------------ literals
def quote(value: str) -> str:
    """`value` as a double-quoted PromQL string literal that decodes back to exactly `value`."""
    out = []
    for ch in str(value):
        if ch in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[ch])
        elif 0xD800 <= ord(ch) <= 0xDFFF:
            raise BadInputError(f"The label value {value!r} holds a lone surrogate, which PromQL cannot hold.")
        elif ch.isprintable() and ch not in "\u2028\u2029":
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return '"' + "".join(out) + '"'


def unquote(literal: str) -> str:
    """The value of a PromQL string literal ("..." or '...'; backquoted: raw), by PromQL's (Go's) escape rules."""
    if len(literal) < 2 or literal[0] != literal[-1] or literal[0] not in "\"'`":
        raise BadInputError(f"{literal!r} is not a quoted PromQL string.")
    q, body = literal[0], literal[1:-1]
    if q == "`":
        if "`" in body:
            raise BadInputError(f"{literal!r} holds a backquote inside its backquotes.")
        return body
    out, i = [], 0
    while i < len(body):
        ch = body[i]
        if ch == "\n" or (ch == q):
            raise BadInputError(f"The string {literal!r} holds an unescaped {ch!r}.")
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        esc = body[i + 1 : i + 2]
        if esc in _DECODE and (esc not in "'\"" or esc == q):
            out.append(_DECODE[esc])
            i += 2
            continue
        width = {"x": 2, "u": 4, "U": 8}.get(esc)
        digits = body[i + 2 : i + 2 + width] if width else body[i + 1 : i + 4]
        base = 16 if width else 8
        if (width and len(digits) == width and all(c in "0123456789abcdefABCDEF" for c in digits)) or \
                (not width and len(digits) == 3 and all(c in "01234567" for c in digits)):
            code = int(digits, base)
            # a byte escape above 0x7f would be one byte of UTF-8, not a character: refused
            if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF or (esc in "x01234567" and code > 0x7F):
                raise BadInputError(f"The string {literal!r} has an escape out of range: \\{esc}{digits}.")
            out.append(chr(code))
            i += 1 + (1 + width if width else 3)
            continue
        raise BadInputError(f"The string {literal!r} has an unknown escape \\{esc}.")
    return "".join(out)


def regex_any(values: Iterable[str]) -> str:
    """An RE2 alternation that matches exactly one of `values` (its metacharacters escaped)."""
    return "|".join("".join("\\" + c if c in _REGEX_SPECIAL else c for c in v) for v in values)


# ------------------------------------------------------------------ durations
def duration(seconds: float) -> str:
    """Seconds as a PromQL duration, largest units first, to the millisecond: 90 -> "1m30s", 0.25 -> "250ms"."""
    if not isinstance(seconds, int | float) or not math.isfinite(seconds) or seconds <= 0:
        raise BadInputError(f"A PromQL duration must be a positive number of seconds, not {seconds!r}.")
    ms = max(1, round(seconds * 1000))
    out = ""
    for unit, size in _UNITS_MS:
        n, ms = divmod(ms, size)
        if n:
            out += f"{n}{unit}"
    return out


def duration_seconds(text: str) -> float:
    """A PromQL duration ("1m30s", "250ms") in seconds."""
    return sum(float(n) * _DUR_SECONDS[u] for n, u in _DUR_PART.findall(text))


def window_text(window: Window) -> str:
    """A range's text: a duration from seconds, or a Grafana variable kept as it is."""
    if isinstance(window, str):
        if not _VARIABLE.match(window):
            raise BadInputError(f"The window {window!r} is neither seconds nor a Grafana variable such as $__rate_interval.")
        return window
    return duration(window)


# ------------------------------------------------------------------ selectors
@dataclass(frozen=True)
class Matcher:
    """One label matcher; `value` is the decoded value (a regular expression for =~ and !~)."""

    label: str
    op: str
    value: str

    def promql(self) -> str:
        if not _LABEL.match(self.label):
            raise BadInputError(f"{self.label!r} is not a PromQL label name.")
        if self.op not in MATCH_OPS:
            raise BadInputError(f"{self.op!r} is not a PromQL matcher (use {', '.join(MATCH_OPS)}).")
        return f"{self.label}{self.op}{quote(self.value)}"


def matchers(match: Mapping[str, str] | None = None, regex: Mapping[str, str] | None = None) -> tuple[Matcher, ...]:
    """Equality matchers from `match`, then regex matchers from `regex`, each sorted by label."""
    eq = tuple(Matcher(k, "=", v) for k, v in sorted((match or {}).items()))
    return eq + tuple(Matcher(k, "=~", v) for k, v in sorted((regex or {}).items()))


_MATCHER_HEAD = re.compile(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*")
_STRING_LITERAL = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'|`[^`]*`')


def parse_matchers(text: str) -> tuple[Matcher, ...]:
    """The matchers of a label selector as a user writes it: `{cluster="a", region=~"eu-.*"}` (the
    braces may be left out); values decoded by PromQL's rules (`unquote`). Bad input: one sentence."""
    body = text.strip()
    if body.startswith("{") and body.endswith("}"):
        body = body[1:-1]
    out: list[Matcher] = []
    pos = 0
    while body[pos:].strip():
        head = _MATCHER_HEAD.match(body, pos)
        lit = _STRING_LITERAL.match(body, head.end()) if head else None
        if head is None or lit is None:
            raise BadInputError(f"Cannot read the label selector {shown(text)} at {body[pos:].strip()[:20]!r}.",
                                hint='Write it as {label="value", other=~"regex"}.')
        out.append(Matcher(head.group(1), head.group(2), unquote(lit.group(0))))
        pos = lit.end()
        rest = body[pos:].lstrip()
        if rest.startswith(","):
            pos = len(body) - len(rest) + 1
        elif rest:
            raise BadInputError(f"Cannot read the label selector {shown(text)}: a comma must separate {rest[:20]!r} from the matcher before it.",
                                hint='Write it as {label="value", other=~"regex"}.')
    return tuple(out)


def metric_name(name: str) -> str:
    if not _METRIC.match(name):
        raise BadInputError(f"{name!r} is not a PromQL metric name.")
    return name


def selector(metric: str, match: Mapping[str, str] | None = None, regex: Mapping[str, str] | None = None,
             extra: Sequence[Matcher] = ()) -> str:
    """metric{k="v", k2=~"re", ...}; bare `metric` without matchers."""
    ms = matchers(match, regex) + tuple(extra)
    name = metric_name(metric)
    return f"{name}{{{', '.join(m.promql() for m in ms)}}}" if ms else name


def series_selector(ms: Sequence[Matcher]) -> str:
    """A selector of any metric name, by its matchers alone: {cluster="a", host=~"n.*"} (for the
    `match[]` of the series and label-values APIs). At least one matcher, since Prometheus refuses
    a bare {}."""
    if not ms:
        raise BadInputError("A selector of any metric needs at least one label matcher.")
    return "{" + ", ".join(m.promql() for m in ms) + "}"


def ranged(sel: str, window: Window) -> str:
    """A range vector: sel[window]."""
    return f"{sel}[{window_text(window)}]"


def subquery(expr: str, window: Window, step: Window) -> str:
    """A subquery: expr evaluated every `step` over `window`, as a range vector: (expr)[window:step]."""
    return f"({expr})[{window_text(window)}:{window_text(step)}]"


# ------------------------------------------------------------------ functions
def call(func: str, *args: str) -> str:
    return f"{func}({', '.join(args)})"


def rate(sel: str, window: Window) -> str:
    return call("rate", ranged(sel, window))


def increase(sel: str, window: Window) -> str:
    return call("increase", ranged(sel, window))


def over_time(func: str, sel: str, window: Window, quantile: float | None = None) -> str:
    """`func`_over_time(sel[window]); quantile_over_time takes `quantile` first."""
    name = func if func.endswith("_over_time") else f"{func}_over_time"
    if name == "quantile_over_time":
        if quantile is None:
            raise BadInputError("quantile_over_time needs the quantile, a number between 0 and 1.")
        return call(name, number(quantile), ranged(sel, window))
    return call(name, ranged(sel, window))


def aggregate(op: str, expr: str, by: Sequence[str] | None = None, without: Sequence[str] | None = None) -> str:
    """sum(x), sum by (a, b) (x), sum without (a) (x)."""
    if op not in AGGREGATIONS:
        raise BadInputError(f"{op!r} is not an aggregation gpulens writes (use {', '.join(AGGREGATIONS)}).")
    for label in (*(by or ()), *(without or ())):
        if not _LABEL.match(label):
            raise BadInputError(f"{label!r} is not a PromQL label name.")
    if by is not None:
        return f"{op} by ({', '.join(by)}) ({expr})"
    if without is not None:
        return f"{op} without ({', '.join(without)}) ({expr})"
    return f"{op}({expr})"


def ratio(numerator: str, denominator: str) -> str:
    """numerator / denominator, each side as written (parenthesize a binary side with `paren`)."""
    return f"{numerator} / {denominator}"


def paren(expr: str) -> str:
    return f"({expr})"


SET_OPS = ("and", "or", "unless")
TARGET_UP = "up"  # Prometheus' own series: 1 while a scrape target answers
TARGET_LABELS = ("instance", "job")  # the labels Prometheus gives every series of a target


def set_op(left: str, op: str, right: str, on: Sequence[str] | None = None) -> str:
    """left and right, left unless on (a, b) right: each side parenthesized."""
    if op not in SET_OPS:
        raise BadInputError(f"{op!r} is not a PromQL set operator (use {', '.join(SET_OPS)}).")
    for label in on or ():
        if not _LABEL.match(label):
            raise BadInputError(f"{label!r} is not a PromQL label name.")
    match = f" on ({', '.join(on)})" if on is not None else ""
    return f"({left}) {op}{match} ({right})"


def target_up(expr: str) -> str:
    """`expr` kept only where its scrape target answers: a series that vanished because its whole
    target is down is the target's alert (up == 0), not one alert per series."""
    return set_op(expr, "and", f"{selector(TARGET_UP)} == 1", on=TARGET_LABELS)


def number(v: float) -> str:
    """A number literal: integers without a point, NaN and Inf by name."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Inf" if v > 0 else "-Inf"
    return repr(int(v)) if v == int(v) and abs(v) < 1e15 else repr(v)


# ------------------------------------------------------------------ histograms
def histogram_quantile(q: float | str, metric: str, window: Window, match: Mapping[str, str] | None = None,
                       regex: Mapping[str, str] | None = None, *, by: Sequence[str] | None = ("le",), fn: str = "rate",
                       extra: Sequence[Matcher] = ()) -> str:
    """The q-quantile of the histogram `metric` over `window`: its `_bucket` series' `fn` (rate or
    increase), summed `by` le and the labels to keep (buckets merged, never averaged); by=None keeps
    every label of each series (no sum)."""
    if fn not in ("rate", "increase"):
        raise BadInputError(f"A histogram quantile reads rate or increase of its buckets, not {fn!r}.")
    if by is not None and "le" not in by:
        by = ("le", *by)
    buckets = call(fn, ranged(selector(metric + "_bucket", match, regex, extra), window))
    inner = aggregate("sum", buckets, by=by) if by is not None else buckets
    return call("histogram_quantile", q if isinstance(q, str) else number(q), inner)


def histogram_mean(metric: str, window: Window, match: Mapping[str, str] | None = None,
                   regex: Mapping[str, str] | None = None, extra: Sequence[Matcher] = ()) -> str:
    """Mean per event over `window`, per series: rate(_sum) / rate(_count)."""
    return ratio(rate(selector(metric + "_sum", match, regex, extra), window),
                 rate(selector(metric + "_count", match, regex, extra), window))
