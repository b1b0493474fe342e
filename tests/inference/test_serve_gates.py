"""`gpulens bench serve` gates that gate (exit 1 on a missed SLO or too many failures, `--no-fail`),
rates over the run window, sweeps that never failed, and captions that say what each row is."""

from __future__ import annotations

import csv
import json

import pytest

from gpulens.bench.serve import LoadSpec, Target, run_load
from gpulens.cli.main import main


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_missed_slo_exits_1_and_no_fail_exits_0(timed_server, capsys, tmp_path):
    base = ["bench", "serve", "--url", f"{timed_server}/fixed/gate?ms=20", "--rate", "20", "--duration", "500ms",
            "--store", str(tmp_path / "g.db")]
    args = [*base, "--slo", "p99_latency<=1ms"]
    assert main(args) == 1
    captured = capsys.readouterr()
    assert "missed" in captured.out
    err = _flat(captured.err)
    assert "SLO p99_latency<=1ms missed" in err and "--no-fail" in err and "Traceback" not in err
    assert main([*args, "--no-fail"]) == 0
    assert "missed" in capsys.readouterr().out
    assert main([*base, "--slo", "p99_latency<=2s"]) == 0


def test_timeouts_above_the_error_ratio_fail_the_run(timed_server, capsys, tmp_path):
    """A 0.6 s stall against a 200 ms timeout: the requests sent in its first 0.4 s time out
    (about 8 of 20), far above the default 1 %, with no SLO given."""
    def run(key: str, *extra: str) -> tuple[int, dict, str]:
        rc = main(["bench", "serve", "--url", f"{timed_server}/fixed/{key}?ms=5&at=0.3&dur=0.6", "--rate", "20",
                   "--duration", "1s", "--timeout", "200ms", "--format", "json", "--no-store", *extra])
        captured = capsys.readouterr()
        return rc, json.loads(captured.out), _flat(captured.err)

    rc, report, err = run("to-a")
    assert rc == 1, err
    assert 4 <= report["requests"]["timeout"] <= 12 and report["requests"]["ok"] > 0
    assert report["error_ratio"] == pytest.approx(report["requests"]["timeout"] / report["requests"]["total"])
    assert report["passed"] is False and "--max-error-ratio 0.01" in err
    rc, report, err = run("to-b", "--max-error-ratio", "0.7")
    assert rc == 0 and report["passed"] is True and report["requests"]["timeout"] >= 4, err
    assert main(["bench", "serve", "--url", f"{timed_server}/", "--rate", "5", "--max-error-ratio", "2", "--no-store"]) == 2
    assert "--max-error-ratio must be from 0 to 1" in _flat(capsys.readouterr().err)


def test_achieved_rate_is_ok_completions_over_the_run_window(timed_server, test_server):
    """--rate 2 --duration 2s: four requests over two seconds is 2 req/s (it was 4 / 1.5 s = 2.7).

    The run window ends at the send window's end or at the last answer, whichever is later: a loaded
    machine that answers the last request late can only lengthen it, so each window is bounded
    tightly below and with half a second to spare above (each rate the other way round). The send
    windows come from the schedule alone and stay exact."""
    s = run_load(LoadSpec(Target(f"{timed_server}/fixed/rate?ms=5"), rate=2, duration_seconds=2)).summary
    assert s.requests.ok == 4
    assert 2.0 - 0.01 <= s.duration_seconds <= 2.0 + 0.5
    assert 4 / 2.5 <= s.achieved_rate <= 2.0 * 1.01 and s.sent_rate == pytest.approx(2.0, rel=0.01)
    # --requests alone: five sends at 10 req/s fill half a second (the last answer is due at 0.405 s)
    s = run_load(LoadSpec(Target(f"{timed_server}/fixed/req?ms=5"), rate=10, duration_seconds=None, max_requests=5)).summary
    assert 5 / 1.0 <= s.achieved_rate <= 10.0 * 1.01 and s.sent_rate == pytest.approx(10.0, rel=0.01)
    # errors are not completions: none succeeded, four errors per second
    s = run_load(LoadSpec(Target(f"{test_server}/error"), rate=4, duration_seconds=1)).summary
    assert s.requests.error == 4 and s.achieved_rate == 0.0
    assert 4 / 1.5 <= s.rates_per_second.error <= 4.0 * 1.02 and s.rates_per_second.ok == 0.0


def test_sweep_that_never_failed_says_at_least_and_writes_its_csv(timed_server, capsys, tmp_path):
    out = tmp_path / "sweep.csv"
    base = ["bench", "serve", "--url", f"{timed_server}/fixed/sw?ms=2", "--sweep", "--rate", "10",
            "--slo", "p99_latency<=500ms", "--duration", "300ms", "--no-store"]
    assert main([*base, "--max-rate", "20", "--csv", str(out)]) == 0
    text = _flat(capsys.readouterr().out)
    assert "At least 20 req/s" in text and "limit was not found" in text and "raise --max-rate" in text
    assert "Highest req/s meeting every SLO" not in text
    rows = list(csv.DictReader(out.open()))
    assert [r["value"] for r in rows] == ["10", "20"] and all(r["passed"] == "true" for r in rows)
    assert {r["limit_found"] for r in rows} == {"false"} and rows[0]["best"] == "20"
    assert main([*base, "--max-rate", "20", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["limit_found"] is False and report["stopped_by"] == "max_value" and report["best"] == 20
    assert main([*base, "--max-rate", "5"]) == 2
    assert "--max-rate 5 is below the sweep's start, --rate 10" in _flat(capsys.readouterr().err)


def test_sweep_where_no_load_meets_the_slos_exits_1(timed_server, capsys):
    args = ["bench", "serve", "--url", f"{timed_server}/fixed/none?ms=20", "--sweep", "--rate", "10",
            "--slo", "p99_latency<=1ms", "--duration", "200ms", "--max-probes", "2", "--no-store"]
    assert main(args) == 1
    assert "No load tried met every SLO" in _flat(capsys.readouterr().err)
    assert main([*args, "--no-fail"]) == 0


def test_from_send_row_includes_a_stall_and_its_caption_says_so(timed_server, capsys):
    """Sent on time into a 0.5 s stall, requests wait for it from their actual send too: 'from
    send' is not what a closed-loop tool would report, and the caption must not claim it is."""
    s = run_load(LoadSpec(Target(f"{timed_server}/fixed/cap-a?ms=5&at=0.2&dur=0.5"), rate=40, duration_seconds=1)).summary
    assert s.latency_uncorrected.p99 > 0.3 and s.latency.p99 > 0.3
    assert main(["bench", "serve", "--url", f"{timed_server}/fixed/cap-b?ms=5", "--rate", "20",
                 "--duration", "300ms", "--no-store"]) == 0
    text = _flat(capsys.readouterr().out)
    assert "as a closed-loop tool would report" not in text
    assert "includes queueing behind a stall" in text and "A closed-loop tool sends fewer requests into a stall" in text
    assert "first intended send to end of run" in text and "req/s ok" in text
