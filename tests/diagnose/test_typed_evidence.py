"""Evidence values carry their units (diagnose.evidence): every surface formats them from the type."""

from __future__ import annotations

import json

from gpulens.diagnose import diagnose
from gpulens.diagnose.evidence import Bytes, Quantity, Ratio, Seconds, format_value, unit_of


def test_quantities_are_numbers_that_know_their_unit():
    s = Seconds(0.25)
    assert s == 0.25 and s * 2 == 0.5 and json.dumps({"x": s}) == '{"x": 0.25}'
    assert (s.unit, format_value(s)) == ("seconds", "250 ms") or format_value(s).endswith("s")
    assert format_value(Ratio(0.42)) == "42%" and format_value(Bytes(2**30)).endswith("GiB")
    assert format_value(0.5) == "0.5"  # a bare number is not guessed into a unit
    assert unit_of({"0": Seconds(1.0), "1": Seconds(2.0)}) == "seconds" and unit_of(3) is None


def test_every_number_with_a_unit_suffix_in_the_h200_findings_is_typed(replayed_store):
    from gpulens.store import Store

    with Store(replayed_store, readonly=True) as st:
        findings = diagnose(st)
    assert findings
    suffixes = ("_seconds", "_bytes", "_ratio", "_share", "_hz", "_celsius")
    for f in findings:
        d = f.to_dict()
        for k, v in f.evidence.items():
            if k.endswith(suffixes) and isinstance(v, int | float) and not isinstance(v, bool):
                assert isinstance(v, Quantity), (f.kind, k, v)
                assert d["evidence_units"][k] == v.unit and d["evidence_text"][k] == v.text()
        json.dumps(d)  # JSON-ready


def test_a_missing_value_never_reads_none_or_nan():
    """'steps since previous checkpoint: None' reached the report."""
    from gpulens.diagnose.evidence import format_value

    assert format_value(None) == "–" and format_value(float("nan")) == "–"
    assert format_value(True) == "yes" and format_value({"a": None}) == "a: –"


def test_a_label_does_not_say_the_unit_its_value_shows():
    """'sm clock before hz: 1,980 MHz' (QA): the key's unit is dropped where the value shows one,
    kept where the value is a bare number, and a key that is only a unit word stays whole."""
    from gpulens.diagnose.base import Finding
    from gpulens.diagnose.evidence import Hertz, evidence_label

    assert evidence_label("sm_clock_before_hz", Hertz(1.98e9)) == "sm clock before"
    assert evidence_label("cut_seconds", Seconds(91.0)) == "cut" and evidence_label("seconds", Seconds(3.0)) == "seconds"
    assert evidence_label("data_wait_share", Ratio(0.4)) == "data wait share"  # a word, not a unit suffix
    assert evidence_label("rows_bytes", 12) == "rows bytes"  # an untyped number: the key says the unit
    f = Finding(kind="gpu_clock_cut", severity="critical", workload="gpu", summary="s", start=0.0, end=1.0,
                evidence={"sm_clock_before_hz": Hertz(1.98e9)})
    assert f.to_dict()["evidence_labels"] == {"sm_clock_before_hz": "sm clock before"}
