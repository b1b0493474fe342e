"""`diagnose --slo`: the text names each objective a service missed, what was measured and its bound,
as a cause of its own and as the symptom of another finding; the JSON keeps its `missed` records."""

from __future__ import annotations

import json
import shutil

import pytest

from gpulens.cli.main import main
from gpulens.diagnose import DiagnoseScope, diagnose
from gpulens.diagnose.inference import set_slos
from gpulens.vocab import names as N
from gpulens.vocab.slo import parse_slo


def _text(capsys) -> str:  # type: ignore[no-untyped-def]
    return " ".join(capsys.readouterr().out.split())  # rich folds lines at 80 columns


def test_a_missed_slo_under_its_cause_names_each_objective_value_and_bound(replayed_store, tmp_path, capsys):
    """The H200 session's serving is latency-bound; its SLO miss is that finding's symptom."""
    db = tmp_path / "h200.db"
    shutil.copy(replayed_store, db)
    slos = ["--slo", "p99_latency<=2s", "--slo", "p95_ttft<=300ms"]
    assert main(["diagnose", "--store", str(db), *slos]) == 0
    text = _text(capsys)
    assert "Service h200-demo: missed p99 latency 2.84 s (objective ≤ 2 s) and p95 TTFT 1.73 s (≤ 300 ms) over 106 requests, " \
           "because of latency bound low utilization" in text, text

    assert main(["diagnose", "--store", str(db), "--format", "json"]) == 0  # the objectives were kept
    (slo,) = [f for f in json.loads(capsys.readouterr().out) if f["kind"] == "slo_violation"]
    assert slo["role"] == "symptom" and slo["summary"] in text
    assert [(m["slo"], m["bound"]) for m in slo["evidence"]["missed"]] == [("p99_latency<=2s", 2.0), ("p95_ttft<=300ms", 0.3)]
    assert [round(m["value"], 2) for m in slo["evidence"]["missed"]] == [2.84, 1.73]
    assert slo["evidence_text"]["missed"] == "p99_latency<=2s: 2.84 s; p95_ttft<=300ms: 1.73 s"


def test_a_missed_slo_on_its_own_names_each_objective_value_and_bound(store, capsys):
    """Nothing else is found to explain the miss: the finding's own summary says it all."""
    for i in range(100):  # 0.2 s requests, nothing else recorded
        t = 1000 + i * 0.5
        store.event(N.EV_REQUEST, t, {"service": "svc", "model": "m", "host": "h"},
                    {"arrival": t - 0.2, "start": t - 0.2, "end": t, "status": "ok"})
    set_slos(store, ["p99_latency<=150ms", "error_rate<=5%", "p50_latency<=0.1s"])
    store.flush()
    (slo,) = diagnose(store, DiagnoseScope(service="svc"))
    assert slo.summary == ("The service missed 2 of its objectives: p99 latency 200 ms (objective ≤ 150 ms) "
                           "and p50 latency 200 ms (≤ 100 ms).")
    assert main(["diagnose", "--store", str(store.path)]) == 0
    assert slo.summary in _text(capsys)


@pytest.mark.parametrize(("slo", "value", "words"), [
    ("p99_latency<=2s", 2.837, ("p99 latency", "2.84 s", "≤ 2 s")),
    ("p95_ttft<=300ms", 0.3004, ("p95 TTFT", "300.4 ms", "≤ 300 ms")),  # just over: never "300 ms (≤ 300 ms)"
    ("p99.9_itl<50us", 0.00012, ("p99.9 ITL", "120 µs", "< 50 µs")),
    ("mean_tpot<=50ms", 1234.5, ("mean TPOT", "1,234 s", "≤ 50 ms")),
    ("error_rate<1%", 0.0123, ("error rate", "1.23%", "< 1%")),
])
def test_an_objective_in_words(slo, value, words):
    s = parse_slo(slo)
    assert (s.name, *s.measured_and_bound(value)) == words
