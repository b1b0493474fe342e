"""Hypothesis fuzz of the parsers a user feeds (rule files, --fault specs, durations, --listen,
--backend fake:N, --notify, silence matchers): any text is either accepted or refused with a
GpulensError (one sentence, exit 2), never another exception. The trace parsers have their own
file (test_fuzz_traces.py). `make reliability` runs more examples (GPULENS_FUZZ_EXAMPLES)."""

from __future__ import annotations

import os

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulens.errors import GpulensError

EXAMPLES = int(os.environ.get("GPULENS_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

spec_text = st.one_of(
    st.text(max_size=40),
    st.from_regex(r"[a-z\-]{0,14}:[a-z0-9=._\-]{0,12}(@[0-9.]{0,6}(ms|s|m|h|d)?)?(:gpu=-?[0-9]{0,4})?", fullmatch=True),
)


def _refused_or_fine(fn, *args) -> None:
    try:
        fn(*args)
    except GpulensError as e:
        assert e.exit_code == 2 and str(e)


@FUZZ
@given(text=st.one_of(st.text(max_size=30), st.from_regex(r"-?[0-9]{0,25}(\.[0-9]{0,5})?(ms|s|m|h|d|w|e9|e400)?", fullmatch=True)))
def test_durations(text):
    from gpulens.units import parse_duration

    try:
        v = parse_duration(text, what="--x", allow_zero=True)
    except GpulensError:
        return
    assert 0 <= v <= 100 * 365 * 86400


@FUZZ
@given(text=st.text(max_size=40))
def test_listen_addresses(text):
    from gpulens.units import parse_listen

    _refused_or_fine(parse_listen, text)


def test_a_listen_address_is_a_host_and_a_port_or_refused():
    """'[::1' was read as host ':' port 1, and the agent then said "Cannot listen on [:]:1"."""
    import pytest

    from gpulens.units import parse_listen

    assert parse_listen("[::1]:9464") == ("::1", 9464) and parse_listen(":9464") == ("127.0.0.1", 9464)
    assert parse_listen("0.0.0.0:80") == ("0.0.0.0", 80) and parse_listen("9464") == ("127.0.0.1", 9464)
    for text in ("[::1", "::1:9464", "[]:80", "[::1]", "[::1]x:80"):
        with pytest.raises(GpulensError, match="Cannot read the listen address"):
            parse_listen(text)


@FUZZ
@given(spec=spec_text)
def test_fault_specs(spec):
    from gpulens.gpu.fake import FakeBackend, schedule_fault

    _refused_or_fine(schedule_fault, FakeBackend(gpus=2, clock=lambda: 1000.0), spec)


@FUZZ
@given(n=st.one_of(st.text(max_size=25), st.integers().map(str)))
def test_fake_specs(n):
    from gpulens.gpu.fake import parse_fake_spec

    _refused_or_fine(parse_fake_spec, f"fake:{n}")


@FUZZ
@given(spec=spec_text)
def test_notify_specs(spec):
    from gpulens.alerts.notify import build_notifier

    try:
        build_notifier([spec]).close()
    except GpulensError as e:
        assert e.exit_code == 2


@FUZZ
@given(text=st.text(max_size=40))
def test_silence_matchers(text):
    from gpulens.alerts.engine import parse_matcher

    _refused_or_fine(parse_matcher, text)


values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3), max_leaves=10,
)
rule_keys = st.sampled_from(["name", "expr", "for", "severity", "summary", "advice", "labels", "band", "rules", "groups"])
rule_docs = st.one_of(
    st.dictionaries(st.sampled_from(["rules", "band"]), st.lists(st.dictionaries(rule_keys, values, max_size=6), max_size=3) | values, max_size=2),
    values,
)


@FUZZ
@given(doc=rule_docs, raw=st.text(max_size=200))
def test_rule_files(doc, raw):
    from gpulens.alerts.rules import parse_rules

    for text in (yaml.safe_dump(doc, allow_unicode=True), raw):
        _refused_or_fine(parse_rules, text, "fuzz.yaml")


def test_json_with_a_byte_order_mark_reads_as_without():
    from gpulens.safe_parse import json_duplicate_key, json_value

    assert json_value('\ufeff{"a": 1}') == {"a": 1} == json_value(b'\xef\xbb\xbf{"a": 1}')
    assert json_duplicate_key('\ufeff{"a": 1, "a": 2}') == "a"
