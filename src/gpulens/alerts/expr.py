"""Rule expressions: a small subset of PromQL, parsed once, evaluated locally and written back as PromQL.

The subset is what the built-in packs need and what Prometheus can run unchanged:

    selectors       gpu_up{gpu="0", reason=~"hw_.*"}      range: name{...}[5m]
    arithmetic      + - * /   comparisons  > < >= <= == !=  (filter, as in PromQL)
    set operators   and, or, unless
    functions       increase rate delta avg_over_time max_over_time min_over_time
                    count_over_time last_over_time quantile_over_time(q, range)
    aggregations    sum|max|min|avg|count [by|without (labels)] (expr)
    baselines       upper_band(selector[, quantile]) / lower_band(...)  (gpulens only: learned thresholds)
    events          count_events_over_time(kind[5m])                     (gpulens only: store events)

Using the same language on both sides is what lets `gpulens alerts export` hand Prometheus the rules
the agent evaluates. String literals and durations are read and written by gpulens.promql, so a
rule's label values mean the same here and on Prometheus.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from gpulens import promql as P
from gpulens.errors import BadInputError
from gpulens.promql import duration_seconds
from gpulens.vocab.names import EV_TRAIN_NAN

RANGE_FUNCTIONS = {
    "increase", "rate", "delta", "avg_over_time", "max_over_time", "min_over_time",
    "count_over_time", "last_over_time", "quantile_over_time",
}
BAND_FUNCTIONS = {"upper_band", "lower_band"}
EVENT_FUNCTIONS = {"count_events_over_time"}
AGGREGATIONS = {"sum", "max", "min", "avg", "count"}
COMPARISONS = {">", "<", ">=", "<=", "==", "!="}
# Bounds on what a rule file may ask for: the parser and every walk of the tree recurse, and the lexer
# rescans the rest of the text per token; no real rule is near either.
MAX_EXPR_CHARS = 4096
MAX_EXPR_DEPTH = 40  # nested parentheses, functions, negations and operators, counted together
SET_OPS = {"and", "or", "unless"}


class ExprError(BadInputError):
    """An expression that cannot be parsed; `column` is 1-based."""

    def __init__(self, message: str, column: int):
        super().__init__(message)
        self.column = column


# ------------------------------------------------------------------ AST
@dataclass(frozen=True)
class Matcher(P.Matcher):
    """A label matcher (= != =~ !~) that can also test a series' labels locally."""

    def matches(self, labels: dict[str, str]) -> bool:
        v = labels.get(self.label, "")
        if self.op == "=":
            return v == self.value
        if self.op == "!=":
            return v != self.value
        hit = re.fullmatch(self.value, v) is not None
        return hit if self.op == "=~" else not hit


@dataclass(frozen=True)
class Selector:
    name: str
    matchers: tuple[Matcher, ...] = ()
    range_seconds: float | None = None  # set for name{...}[5m]

    def with_matchers(self, extra: tuple[Matcher, ...]) -> Selector:
        return Selector(self.name, self.matchers + extra, self.range_seconds)


@dataclass(frozen=True)
class Number:
    value: float


@dataclass(frozen=True)
class Call:
    func: str
    args: tuple[Node, ...]


@dataclass(frozen=True)
class Aggregate:
    op: str
    expr: Node
    by: tuple[str, ...] | None = None
    without: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Binary:
    op: str
    left: Node
    right: Node


@dataclass(frozen=True)
class Neg:
    expr: Node


Node = Selector | Number | Call | Aggregate | Binary | Neg


@dataclass
class ParsedExpr:
    text: str
    root: Node
    metrics: set[str] = field(default_factory=set)  # every metric name a selector names
    event_kinds: set[str] = field(default_factory=set)

    @property
    def learned(self) -> bool:
        return any(c.func in BAND_FUNCTIONS for c in walk(self.root, Call))  # type: ignore[attr-defined]

    @property
    def local_only(self) -> bool:
        """True when Prometheus cannot run it (it reads store events)."""
        return any(c.func in EVENT_FUNCTIONS for c in walk(self.root, Call))  # type: ignore[attr-defined]


def walk(node: Node, kind: type | None = None):
    """Every node under `node` (of type `kind`), depth first."""
    if kind is None or isinstance(node, kind):
        yield node
    children: tuple[Node, ...] = ()
    if isinstance(node, Call):
        children = node.args
    elif isinstance(node, Aggregate | Neg):
        children = (node.expr,)
    elif isinstance(node, Binary):
        children = (node.left, node.right)
    for c in children:
        yield from walk(c, kind)


def _depth(root: Node) -> int:
    """The tree's depth, counted without recursion."""
    deepest, stack = 0, [(root, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        if isinstance(node, Call):
            stack.extend((c, d + 1) for c in node.args)
        elif isinstance(node, Aggregate | Neg):
            stack.append((node.expr, d + 1))
        elif isinstance(node, Binary):
            stack.extend(((node.left, d + 1), (node.right, d + 1)))
    return deepest


# ------------------------------------------------------------------ lexer
_TOKEN = re.compile(
    r"""\s*(?:
    (?P<duration>\d+(?:\.\d+)?(?:ms|s|m|h|d|w)(?:\d+(?:ms|s|m|h|d|w))*(?=\]))
  | (?P<number>\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)
  | (?P<string>"(?:[^"\\]|\\.)*")
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<op>=~|!~|>=|<=|==|!=|[-+*/(){}\[\],<>=])
    )""",
    re.X,
)


@dataclass
class _Tok:
    kind: str
    text: str
    col: int


def _lex(text: str) -> list[_Tok]:
    toks, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            col = pos + len(text[pos:]) - len(text[pos:].lstrip()) + 1
            raise ExprError(f"unexpected character {text[col - 1]!r} at column {col}", col)
        kind = m.lastgroup or ""
        toks.append(_Tok(kind, m.group(kind), m.start(kind) + 1))
        pos = m.end()
    toks.append(_Tok("end", "", len(text) + 1))
    return toks


# ------------------------------------------------------------------ parser
_PRECEDENCE = [("or",), ("and", "unless"), tuple(COMPARISONS), ("+", "-"), ("*", "/")]


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.toks = _lex(text)
        self.i = 0
        self.nesting = 0
        self.metrics: set[str] = set()
        self.event_kinds: set[str] = set()

    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def fail(self, msg: str, tok: _Tok | None = None) -> ExprError:
        tok = tok or self.tok
        return ExprError(f"{msg} at column {tok.col}", tok.col)

    def take(self, text: str | None = None, kind: str | None = None) -> _Tok:
        t = self.tok
        if (text is not None and t.text != text) or (kind is not None and t.kind != kind):
            want = repr(text) if text else kind
            got = repr(t.text) if t.kind != "end" else "the end"
            raise self.fail(f"expected {want} but found {got}")
        self.i += 1
        return t

    def parse(self) -> Node:
        node = self.binary(0)
        if self.tok.kind != "end":
            raise self.fail(f"unexpected {self.tok.text!r}")
        if _depth(node) > MAX_EXPR_DEPTH:  # a long chain of operators builds a deep tree without nesting
            raise ExprError(f"the expression nests deeper than {MAX_EXPR_DEPTH} levels (split it into rules)", 1)
        self._no_bare_ranges(node)
        return node

    def _no_bare_ranges(self, node: Node) -> None:
        """A range (m[5m]) is only an argument of a function; elsewhere it has no single value."""
        if isinstance(node, Selector):
            if node.range_seconds is not None:
                raise ExprError(f"the range {node.name}[...] needs a function around it, e.g. avg_over_time({node.name}[5m])", 1)
        elif isinstance(node, Call):
            for arg in node.args:
                if not isinstance(arg, Selector):  # a function's own range argument was checked in _check_call
                    self._no_bare_ranges(arg)
        elif isinstance(node, Aggregate | Neg):
            self._no_bare_ranges(node.expr)
        elif isinstance(node, Binary):
            self._no_bare_ranges(node.left)
            self._no_bare_ranges(node.right)

    def binary(self, level: int) -> Node:
        if level == len(_PRECEDENCE):
            return self.unary()
        left = self.binary(level + 1)
        while self.tok.text in _PRECEDENCE[level] and self.tok.kind in ("op", "ident"):
            op = self.take().text
            right = self.binary(level + 1)
            if op in SET_OPS and (isinstance(left, Number) or isinstance(right, Number)):
                raise self.fail(f"'{op}' needs a vector on both sides")
            left = Binary(op, left, right)
        return left

    def unary(self) -> Node:
        # every nested sub-expression (parentheses, a function's or an aggregation's argument, a
        # negation) passes here: refuse it before the recursion runs out of stack
        self.nesting += 1
        try:
            if self.nesting > MAX_EXPR_DEPTH:
                raise self.fail(f"the expression nests deeper than {MAX_EXPR_DEPTH} levels")
            if self.tok.text == "-":
                self.take()
                return Neg(self.unary())
            return self.primary()
        finally:
            self.nesting -= 1

    def primary(self) -> Node:
        t = self.tok
        if t.kind == "number":
            self.take()
            value = float(t.text)
            if not math.isfinite(value):
                raise self.fail(f"the number {t.text[:24]} is too large", t)
            return Number(value)
        if t.text == "(":
            self.take("(")
            node = self.binary(0)
            self.take(")")
            return node
        if t.kind != "ident":
            raise self.fail("expected a metric, a number or a function" + ("" if t.kind != "end" else ", found the end"))
        if t.text in AGGREGATIONS and self.toks[self.i + 1].text in ("(", "by", "without"):
            return self.aggregate()
        if self.toks[self.i + 1].text == "(":
            return self.call()
        return self.selector()

    def aggregate(self) -> Node:
        op = self.take().text
        by = without = None
        if self.tok.text in ("by", "without"):
            which = self.take().text
            labels = self.label_list()
            by, without = (labels, None) if which == "by" else (None, labels)
        self.take("(")
        inner = self.binary(0)
        self.take(")")
        if by is None and without is None and self.tok.text in ("by", "without"):
            which = self.take().text
            labels = self.label_list()
            by, without = (labels, None) if which == "by" else (None, labels)
        return Aggregate(op, inner, by, without)

    def label_list(self) -> tuple[str, ...]:
        self.take("(")
        out = []
        while self.tok.text != ")":
            out.append(self.take(kind="ident").text)
            if self.tok.text == ",":
                self.take(",")
        self.take(")")
        return tuple(out)

    def call(self) -> Node:
        name_tok = self.take()
        func = name_tok.text
        known = RANGE_FUNCTIONS | BAND_FUNCTIONS | EVENT_FUNCTIONS
        if func not in known:
            raise self.fail(f"unknown function {func!r} (known: {', '.join(sorted(known))})", name_tok)
        self.take("(")
        args: list[Node] = []
        while self.tok.text != ")":
            args.append(self.binary(0))
            if self.tok.text == ",":
                self.take(",")
            elif self.tok.text != ")":
                raise self.fail("expected ',' or ')'")
        self.take(")")
        self._check_call(func, args, name_tok)
        return Call(func, tuple(args))

    def _check_call(self, func: str, args: list[Node], tok: _Tok) -> None:
        def is_range(a: Node) -> bool:
            return isinstance(a, Selector) and a.range_seconds is not None

        if func == "quantile_over_time":
            if len(args) != 2 or not isinstance(args[0], Number) or not is_range(args[1]):
                raise self.fail("quantile_over_time takes a number and a range such as m[5m]", tok)
            if not 0 <= args[0].value <= 1:  # type: ignore[union-attr]
                raise self.fail("the quantile of quantile_over_time must be between 0 and 1", tok)
        elif func in RANGE_FUNCTIONS:
            if len(args) != 1 or not is_range(args[0]):
                raise self.fail(f"{func} takes one range such as metric[5m]", tok)
        elif func in BAND_FUNCTIONS:
            ok = 1 <= len(args) <= 2 and isinstance(args[0], Selector) and args[0].range_seconds is None
            if ok and len(args) == 2:
                ok = isinstance(args[1], Number) and 0 < args[1].value < 1  # type: ignore[union-attr]
            if not ok:
                raise self.fail(f"{func} takes a metric and optionally a quantile between 0 and 1, e.g. {func}(m, 0.95)", tok)
        elif func in EVENT_FUNCTIONS:
            if len(args) != 1 or not is_range(args[0]):
                raise self.fail(f"{func} takes an event kind with a range, e.g. {func}({EV_TRAIN_NAN}[5m])", tok)
            sel = args[0]
            assert isinstance(sel, Selector)
            self.metrics.discard(sel.name)
            self.event_kinds.add(sel.name)

    def selector(self) -> Node:
        name = self.take(kind="ident").text
        if name in SET_OPS or name in ("by", "without"):
            raise self.fail(f"{name!r} needs an expression before it")
        matchers: list[Matcher] = []
        if self.tok.text == "{":
            self.take("{")
            while self.tok.text != "}":
                label = self.take(kind="ident").text
                op = self.tok.text
                if op not in ("=", "!=", "=~", "!~"):
                    raise self.fail("expected =, !=, =~ or !~ after a label name")
                self.take()
                raw = self.take(kind="string")
                try:
                    value = P.unquote(raw.text)
                except BadInputError as e:
                    raise ExprError(f"{e.message[:-1]} at column {raw.col}", raw.col) from None
                if op in ("=~", "!~"):
                    try:
                        re.compile(value)
                    except re.error as e:
                        raise self.fail(f"bad regular expression {value!r}: {e}") from None
                matchers.append(Matcher(label, op, value))
                if self.tok.text == ",":
                    self.take(",")
            self.take("}")
        rng = None
        if self.tok.text == "[":
            self.take("[")
            d = self.tok
            if d.kind != "duration":
                raise self.fail("expected a duration such as 5m inside [ ]")
            self.take()
            rng = duration_seconds(d.text)
            if rng <= 0:
                raise self.fail("a range must be longer than zero", d)
            self.take("]")
        self.metrics.add(name)
        return Selector(name, tuple(matchers), rng)


def parse_expr(text: str) -> ParsedExpr:
    """Parse a rule expression. Raises ExprError (with the column) when it cannot be read."""
    if not isinstance(text, str) or not text.strip():
        raise ExprError("the expression is empty", 1)
    if len(text) > MAX_EXPR_CHARS:
        raise ExprError(f"the expression is {len(text):,} characters long (at most {MAX_EXPR_CHARS:,})", 1)
    p = _Parser(text)
    root = p.parse()
    return ParsedExpr(text=text, root=root, metrics=p.metrics, event_kinds=p.event_kinds)


# ------------------------------------------------------------------ PromQL rendering
def to_promql(node: Node) -> str:
    """PromQL for a node, written by gpulens.promql. `increase` keeps the local meaning (a counter
    that appears inside the window counts from zero), which plain PromQL `increase` would miss on a
    new series."""
    if isinstance(node, Number):
        return P.number(node.value)
    if isinstance(node, Selector):
        s = P.selector(node.name, extra=node.matchers)
        return s if node.range_seconds is None else P.ranged(s, node.range_seconds)
    if isinstance(node, Neg):
        return f"-{_paren(node.expr)}"
    if isinstance(node, Aggregate):
        return P.aggregate(node.op, to_promql(node.expr), by=node.by, without=node.without)
    if isinstance(node, Call):
        if node.func in BAND_FUNCTIONS or node.func in EVENT_FUNCTIONS:
            raise BadInputError(f"{node.func} has no PromQL form; export it with learned constants.")
        hist = _histogram_promql(node)
        if hist is not None:
            return hist
        if node.func == "increase":
            sel = node.args[0]
            assert isinstance(sel, Selector) and sel.range_seconds is not None
            inst = to_promql(Selector(sel.name, sel.matchers))
            # A series that appeared inside the window counts from zero: its value. PromQL's
            # increase() of such a series is 0 once it has two samples, so it must not mask the
            # new-series branch (`or` keeps the left side's label sets): take it out first.
            new = P.paren(f"{inst} unless {inst} offset {P.duration(sel.range_seconds)}")
            kept = P.paren(f"{P.increase(inst, sel.range_seconds)} unless {new}")
            return P.paren(f"{kept} or {new}")
        return P.call(node.func, *(to_promql(a) for a in node.args))
    if isinstance(node, Binary):
        return f"{_paren(node.left)} {node.op} {_paren(node.right)}"
    raise TypeError(node)


def _histogram_promql(node: Call) -> str | None:
    """A per-event series over a window, as Prometheus sees it: the histogram the agent exports
    (docs/metrics.md). The store keeps every event, so a rule evaluated by gpulens reads the events;
    exported, the same rule reads the buckets, as exact as their bounds. Per series, as in the store
    (histogram_quantile keeps every label but `le`: no sum)."""
    from gpulens.vocab.names import HISTOGRAM_BUCKETS

    sel = node.args[-1] if node.args else None
    if not isinstance(sel, Selector) or sel.range_seconds is None or sel.name not in HISTOGRAM_BUCKETS:
        return None
    w, m = sel.range_seconds, sel.matchers

    def part(suffix: str) -> str:
        return P.selector(sel.name + suffix, extra=m)

    if node.func == "quantile_over_time":
        return P.histogram_quantile(to_promql(node.args[0]), sel.name, w, by=None, extra=m)
    if node.func == "max_over_time":  # the upper bound of the highest bucket an event fell in
        return P.histogram_quantile(1, sel.name, w, by=None, extra=m)
    if node.func == "min_over_time":
        return P.histogram_quantile(0, sel.name, w, by=None, extra=m)
    if node.func == "avg_over_time":
        return P.paren(P.histogram_mean(sel.name, w, extra=m))
    if node.func == "count_over_time":
        return P.increase(part("_count"), w)
    if node.func == "sum_over_time":
        return P.increase(part("_sum"), w)
    return None


def _paren(node: Node) -> str:
    s = to_promql(node)
    return f"({s})" if isinstance(node, Binary) else s


def map_nodes(node: Node, fn: Callable[[Node], Node | None]) -> Node:
    """Rebuild `node` bottom-up, letting `fn` replace any sub-node (None: keep walking)."""
    got = fn(node)
    if got is not None:
        return got
    if isinstance(node, Call):
        return Call(node.func, tuple(map_nodes(a, fn) for a in node.args))
    if isinstance(node, Aggregate):
        return Aggregate(node.op, map_nodes(node.expr, fn), node.by, node.without)
    if isinstance(node, Neg):
        return Neg(map_nodes(node.expr, fn))
    if isinstance(node, Binary):
        return Binary(node.op, map_nodes(node.left, fn), map_nodes(node.right, fn))
    return node


def cap_ranges(node: Node, max_seconds: float) -> Node:
    """The same expression with every range shortened to at most `max_seconds`."""

    def cap(n: Node) -> Node | None:
        if isinstance(n, Selector) and n.range_seconds is not None and n.range_seconds > max_seconds:
            return Selector(n.name, n.matchers, max_seconds)
        return None

    return map_nodes(node, cap)


def is_staleness(node: Node) -> bool:
    """A rule of the form `last_over_time(m[long]) unless last_over_time(m[short])`: series of `m`
    that had a sample within the long range but none within the short one (they went silent)."""
    if not (isinstance(node, Binary) and node.op == "unless"):
        return False
    sides = (node.left, node.right)
    if not all(isinstance(c, Call) and c.func == "last_over_time" for c in sides):
        return False
    long_sel, short_sel = (c.args[0] for c in sides)  # type: ignore[union-attr]
    return (isinstance(long_sel, Selector) and isinstance(short_sel, Selector) and long_sel.name == short_sel.name
            and long_sel.matchers == short_sel.matchers and (long_sel.range_seconds or 0) > (short_sel.range_seconds or 0))


def band_selectors(node: Node) -> list[Selector]:
    """The selectors whose baselines an expression reads (arguments of upper_band/lower_band)."""
    return [c.args[0] for c in walk(node, Call) if c.func in BAND_FUNCTIONS]  # type: ignore[attr-defined,misc]
