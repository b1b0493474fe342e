"""Hypothesis with structured generators (issue 27 item 5): JSON, JSON lines, YAML, rule expressions
(PromQL-ish), durations and URLs built the way a user or an attacker writes them, then bent (NaN,
1e400, 5,000 digits, nesting past the limits, aliases, bad bytes). Each parser either accepts, and
then gives back what was written, or refuses with its one-sentence error; nothing else escapes.
test_fuzz_parsers.py fuzzes the same parsers with flat text; GPULENS_FUZZ_EXAMPLES sets the counts."""

from __future__ import annotations

import json
import math
import os

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulens.errors import GpulensError
from gpulens.safe_parse import (
    MAX_INT_DIGITS,
    MAX_JSON_DEPTH,
    UnsafeValue,
    UnsafeYaml,
    json_lines,
    json_value,
    yaml_value,
)

EXAMPLES = int(os.environ.get("GPULENS_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ------------------------------------------------------------------ JSON

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**18), max_value=10**18),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12),
)
json_docs = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                         max_leaves=20)

# what a hostile writer puts where a number goes, and whether the strict reader must refuse it
HOSTILE_NUMBERS = {
    "NaN": True, "Infinity": True, "-Infinity": True, "1e400": True, "-1E+400": True, "1" * 5000: True,
    "7" * (MAX_INT_DIGITS + 1): True, "1e-400": False, "1e308": False, "-0": False, "7" * MAX_INT_DIGITS: False,
}


def _depth(v) -> int:
    if isinstance(v, dict):
        return 1 + max((_depth(x) for x in v.values()), default=0)
    if isinstance(v, list):
        return 1 + max((_depth(x) for x in v), default=0)
    return 0


@FUZZ
@given(doc=json_docs)
def test_json_that_is_within_the_limits_reads_back_as_written(doc):
    text = json.dumps(doc)
    assert json_value(text) == doc
    assert json_value(text.encode()) == doc


@FUZZ
@given(doc=json_docs, token=st.sampled_from(sorted(HOSTILE_NUMBERS)), where=st.sampled_from(["list", "key", "top"]))
def test_a_hostile_number_anywhere_is_refused(doc, token, where):
    text = {"list": f"[{json.dumps(doc)}, {token}]", "key": f'{{"d": {json.dumps(doc)}, "x": {token}}}', "top": token}[where]
    if HOSTILE_NUMBERS[token]:
        with pytest.raises(UnsafeValue) as e:
            json_value(text)
        assert "line 1" in str(e.value) or "digits" in str(e.value)
    else:
        v = json_value(text)
        assert all(math.isfinite(x) for x in _numbers(v))


def _numbers(v):
    if isinstance(v, dict):
        v = list(v.values())
    if isinstance(v, list):
        for x in v:
            yield from _numbers(x)
    elif isinstance(v, int | float) and not isinstance(v, bool):
        yield float(v)


@FUZZ
@given(depth=st.integers(min_value=1, max_value=3 * MAX_JSON_DEPTH), opener=st.sampled_from(["[", '{"k":']),
       huge=st.booleans())
def test_nesting_is_refused_past_the_limit_and_only_there(depth, opener, huge):
    depth = depth * 1000 if huge else depth
    closer = "]" if opener == "[" else "}"
    text = opener * depth + "1" + closer * depth
    if depth > MAX_JSON_DEPTH:
        with pytest.raises(UnsafeValue, match="nests deeper"):
            json_value(text)
    else:
        assert _depth(json_value(text)) == depth


@FUZZ
@given(lines=st.lists(json_docs.map(json.dumps), min_size=1, max_size=6), bad_at=st.integers(min_value=0, max_value=6),
       bad=st.sampled_from(["NaN", "[" * 5000, "{", "1e999", "\"\\ud800\"x", "9" * 400]))
def test_json_lines_name_the_first_bad_line(lines, bad_at, bad):
    bad_at = min(bad_at, len(lines))
    text = "\n".join([*lines[:bad_at], bad, *lines[bad_at:]])
    with pytest.raises(GpulensError) as e:
        list(json_lines(text, "the fuzz file", hint="Fix it."))
    assert e.value.exit_code == 2 and f"Line {bad_at + 1} of the fuzz file" in str(e.value)


@FUZZ
@given(data=st.binary(max_size=64))
def test_bytes_are_text_or_one_reason(data):
    try:
        json_value(data)
    except UnsafeValue as e:
        assert str(e) and "\n" not in str(e)


# ------------------------------------------------------------------ YAML

yaml_docs = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**9), max_value=10**9), st.text(max_size=10)),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20,
)


@FUZZ
@given(doc=yaml_docs)
def test_yaml_within_the_limits_reads_as_safe_load_does(doc):
    text = yaml.safe_dump(doc, allow_unicode=True)
    assert yaml_value(text) == yaml.safe_load(text)


@FUZZ
@given(fan=st.integers(min_value=2, max_value=12), levels=st.integers(min_value=1, max_value=9))
def test_alias_expansion_is_bounded(fan, levels):
    """A 'billion laughs' document: refused when it expands past the node bound, read when it does not."""
    from gpulens.safe_parse import MAX_YAML_NODES

    lines = [f"l0: &l0 [{', '.join(['x'] * fan)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * fan)}]" for i in range(1, levels)]
    text = "\n".join(lines) + "\n"
    expanded = sum(fan ** (i + 1) for i in range(levels)) * 2  # values and their lists, roughly
    try:
        yaml_value(text)
    except UnsafeYaml as e:
        assert "aliases expand" in str(e)
        assert expanded > MAX_YAML_NODES / 4  # never a document a rule file would hold
    else:
        assert expanded <= MAX_YAML_NODES * 4


@FUZZ
@given(doc=yaml_docs, junk=st.sampled_from(["\x00", "\t- x", "*nowhere", "!!python/name:os.system", "? [1]\n: 2", "[" * 3000, "&a [*a]"]))
def test_hostile_yaml_is_refused_with_one_reason(doc, junk):
    text = yaml.safe_dump({"d": doc}) + f"e: {junk}\n"
    try:
        yaml_value(text)
    except UnsafeYaml as e:
        assert str(e) and "\n" not in str(e)


# ------------------------------------------------------------------ rule expressions (PromQL-ish)

METRICS = ["gpu_up", "gpu_temperature_celsius", "gpu_xid_total", "dcgm_fi_dev_gpu_util"]
selectors = st.builds(
    lambda m, lbl, op, v: f"{m}{{{lbl}{op}\"{v}\"}}" if lbl else m,
    st.sampled_from(METRICS), st.sampled_from(["", "gpu", "host"]), st.sampled_from(["=", "!=", "=~", "!~"]),
    st.text(alphabet="abc019|.*", max_size=5),
)
numbers = st.one_of(st.integers(min_value=0, max_value=10**6).map(str), st.floats(0, 1e6).map(lambda f: f"{f:g}"),
                    st.sampled_from(["1e400", "1e-400", "0.5", ".5", "1" * 400]))
ranges = st.builds(lambda s, d: f"{s}[{d}]", selectors, st.sampled_from(["5m", "30s", "1h", "1h30m", "0s", "99999999d"]))


def _combine(inner):
    return st.one_of(
        st.builds(lambda a, op, b: f"{a} {op} {b}", inner, st.sampled_from(["+", "-", "*", "/", ">", "<=", "==", "!="]), inner),
        st.builds(lambda a, op, b: f"{a} {op} {b}", selectors, st.sampled_from(["and", "or", "unless"]), selectors),
        inner.map(lambda a: f"({a})"),
        inner.map(lambda a: f"-{a}"),
        st.builds(lambda f, r: f"{f}({r})", st.sampled_from(["rate", "increase", "avg_over_time", "max_over_time", "delta"]), ranges),
        st.builds(lambda agg, by, a: f"{agg}{by}({a})", st.sampled_from(["sum", "max", "avg", "count"]),
                  st.sampled_from(["", " by (gpu)", " without (host)"]), inner),
    )


exprs = st.recursive(st.one_of(selectors, numbers), lambda inner: _combine(inner), max_leaves=12)


@FUZZ
@given(text=exprs)
def test_rule_expressions_parse_or_are_refused_with_a_column(text):
    from gpulens.alerts.expr import ExprError, parse_expr, to_promql

    try:
        parsed = parse_expr(text)
    except ExprError as e:
        assert e.exit_code == 2 and str(e)
        return
    to_promql(parsed.root)  # what parses renders (for Prometheus's rule files)


@FUZZ
@given(depth=st.integers(min_value=1, max_value=20_000), shape=st.sampled_from(["paren", "neg", "chain", "call"]))
def test_rule_expressions_deeper_than_the_bound_are_refused(depth, shape):
    from gpulens.alerts.expr import MAX_EXPR_CHARS, MAX_EXPR_DEPTH, ExprError, parse_expr

    text = {"paren": "(" * depth + "gpu_up" + ")" * depth, "neg": "-" * depth + "gpu_up",
            "chain": " + ".join(["gpu_up"] * depth), "call": "max(" * depth + "gpu_up" + ")" * depth}[shape]
    nested = depth + (1 if shape in ("neg", "call") else 0)
    if nested > MAX_EXPR_DEPTH + 1 or len(text) > MAX_EXPR_CHARS:
        with pytest.raises(ExprError):
            parse_expr(text)
    elif depth <= MAX_EXPR_DEPTH // 2:
        parse_expr(text)


# ------------------------------------------------------------------ durations

duration_numbers = st.one_of(
    st.integers(min_value=0, max_value=10**6).map(str), st.sampled_from(["nan", "inf", "1e400", "1" * 400, "-5", "0.0001", "1e2", ""]),
)


@FUZZ
@given(parts=st.lists(st.tuples(duration_numbers, st.sampled_from(["ms", "s", "m", "h", "d", "w", "", "y", "µs"])), min_size=1, max_size=3))
def test_structured_durations_are_bounded_or_refused(parts):
    from gpulens.units import parse_duration

    text = "".join(n + u for n, u in parts)
    try:
        v = parse_duration(text, what="--for", allow_zero=True)
    except GpulensError as e:
        assert e.exit_code == 2 and str(e)
        return
    assert math.isfinite(v) and 0 <= v <= 100 * 365 * 86400


# ------------------------------------------------------------------ URLs

hosts = st.one_of(st.sampled_from(["127.0.0.1", "localhost", "[::1]", "[::1", "exa mple.com", "", "::1", "h" * 300, "xn--caf-dma",
                                   "café.example", "%00", "1.2.3.4.5", "[fe80::1%eth0]"]), st.from_regex(r"[a-z0-9.\-]{1,20}", fullmatch=True))
ports = st.sampled_from(["", ":0", ":80", ":65535", ":65536", ":-1", ":port", ":99999999999999999999", ":", ":8080:9"])
urls = st.builds(
    lambda scheme, user, host, port, path, query: f"{scheme}{user}{host}{port}{path}{query}",
    st.sampled_from(["http://", "https://", "HTTP://", "ftp://", "", "http:/", "file://", "javascript:"]),
    st.sampled_from(["", "u@", "u:p@", "@", "a@b@", "%40@"]), hosts, ports,
    st.sampled_from(["", "/", "/metrics", "/a b", "/%zz", "/\x00", "/" + "x" * 5000, "/\u202e"]),
    st.sampled_from(["", "?a=1", "?token=T", "#frag", "?" + "&" * 1000]),
)


@FUZZ
@given(url=urls)
def test_structured_urls_are_accepted_or_refused_in_one_sentence(url):
    from gpulens.http_client import _check_url
    from gpulens.pipeline.node import check_scrape_url

    for check in (_check_url, check_scrape_url):
        try:
            check(url)
        except GpulensError as e:
            assert e.exit_code == 2 and str(e)
        else:  # what is accepted has a scheme, a host and a port that is a number in range
            from urllib.parse import urlsplit

            parts = urlsplit(url)
            assert parts.scheme in ("http", "https") and parts.hostname
            assert parts.port is None or 0 <= parts.port <= 65535
