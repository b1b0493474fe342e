"""SLO expressions, `gpulens bench serve` end to end (JSON, CSV, the stored run) and its bad input."""

from __future__ import annotations

import csv
import json

import pytest

from gpulens.bench.serve import parse_slo
from gpulens.cli.main import main
from gpulens.errors import BadInputError
from gpulens.store import Store


@pytest.mark.parametrize(("text", "metric", "stat", "bound"), [
    ("p99_latency<=500ms", "latency", "p99", 0.5),
    ("p95_ttft <= 200ms", "ttft", "p95", 0.2),
    ("p99.9_latency<2s", "latency", "p99_9", 2.0),
    ("mean_tpot<=50ms", "tpot", "mean", 0.05),
    ("max_itl<=250us", "itl", "max", 250e-6),
    ("latency<=1", "latency", "p99", 1.0),
    ("error_rate<=1%", "error_rate", None, 0.01),
])
def test_slo_parser(text, metric, stat, bound):
    s = parse_slo(text)
    assert (s.metric, s.stat) == (metric, stat)
    assert s.bound == pytest.approx(bound)
    assert s.holds(bound * 0.99) and not s.holds(bound * 1.01)


@pytest.mark.parametrize("text", ["p99_latency>=500ms", "p99_lat<=1s", "p42x_latency<=1s", "p99_latency<=",
                                  "p99_latency<=500%", "p99_error_rate<=1%", "error_rate<=150%", "p99_latency<=0ms", ""])
def test_malformed_slo_is_one_clear_sentence(text):
    with pytest.raises(BadInputError) as e:
        parse_slo(text)
    assert "SLO" in str(e.value) or "error-rate" in str(e.value) or "bound" in str(e.value)


def test_bench_serve_json_csv_and_stored_run(test_server, tmp_path, capsys):
    db, out = tmp_path / "g.db", tmp_path / "req.csv"
    url = f"{test_server}/v1/completions?ttft_ms=30&itl_ms=5"
    # an SLO that a loaded machine's delays cannot miss (a 30 ms TTFT was once measured at 135 ms): met, not timed
    rc = main(["bench", "serve", "--url", url, "--rate", "20", "--duration", "1s", "--max-tokens", "8",
               "--slo", "p99_ttft<=10s", "--format", "json", "--csv", str(out), "--store", str(db)])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    for key in ("latency", "ttft", "itl", "tpot"):
        assert set(report[key]) >= {"p50", "p90", "p95", "p99", "p99_9", "mean", "max"}
    assert report["requests"]["ok"] == 20 and report["achieved_rate"] > 0
    counts = ["ok", "error", "timeout", "rejected", "total", "not_sent"]  # the JSON's keys, in its order
    assert list(report["requests"]) == counts and list(report["rates_per_second"]) == counts[:4]
    assert list(report["slo_results"][0]) == ["slo", "metric", "stat", "bound", "value", "met", "gating"]
    assert list(report["concurrency"]) == ["mean", "p50", "p90", "p99", "max"]
    assert set(report["send_lag"]) >= {"p50", "p99", "max"}
    assert report["slo_met"] is True and report["goodput"] > 0
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 20 and rows[0]["status"] == "ok" and float(rows[0]["ttft_s"]) > 0.025
    from gpulens.runs import get_run

    with Store(db) as s:
        run = get_run(s, report["run_id"])
    assert run.kind == "bench-serve" and len(run.samples["latency_seconds"]) == 20
    assert run.summary["requests"]["ok"] == 20
    assert {k: run.summary[k] for k in ("requests", "slo_results", "concurrency", "rates_per_second")} == {
        k: report[k] for k in ("requests", "slo_results", "concurrency", "rates_per_second")}


def test_sweep_json(timed_server, capsys, tmp_path):
    # Every time twice what it was (100 ms a request, a 600 ms SLO, 1.2 s probes) and every rate half:
    # the same sweep, but a loaded machine must now delay a request 500 ms, not 250, to fail a probe.
    rc = main(["bench", "serve", "--url", f"{timed_server}/capacity/cli?ms=100", "--sweep", "--rate", "7.5",
               "--slo", "p99_latency<=600ms", "--duration", "1200ms", "--tolerance", "0.3", "--max-probes", "5",
               "--format", "json", "--store", str(tmp_path / "g.db")])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert report["best"] is not None and 7.5 <= report["best"] <= 15  # capacity 10 req/s, coarse sweep
    assert report["lowest_failing"] > report["best"]
    assert all({"value", "passed", "goodput", "latency"} <= set(p) for p in report["probes"])


def test_bad_input_is_one_sentence_and_exit_code(test_server, capsys, tmp_path, port):
    db = str(tmp_path / "g.db")
    cases = [
        (["--url", f"http://127.0.0.1:{port}/", "--rate", "5"], 3, "Cannot reach"),  # nothing listens there
        (["--url", "http://no-such-host.invalid/", "--rate", "5"], 3, "Cannot reach no-such-host.invalid"),  # never resolves
        (["--url", f"{test_server}/", "--rate", "5", "--method", "HEAD"], 2, "HEAD requests are not supported"),
        (["--url", f"{test_server}/", "--rate", "0"], 2, "rate must be above zero"),
        (["--url", f"{test_server}/", "--sweep", "--slo", "p99_latency=>1s"], 2, "Cannot read the SLO"),
        (["--url", f"{test_server}/", "--sweep"], 2, "needs at least one --slo"),
        (["--url", f"{test_server}/", "--rate", "5", "--concurrency", "2"], 2, "not both"),
        (["--url", "localhost:8000", "--rate", "5"], 2, "Cannot use the URL"),
        # urlsplit raises on these (a traceback before): an unclosed or non-IP [bracket], a bad port
        (["--url", "http://[::1", "--rate", "5"], 2, "Cannot use the URL"),
        (["--url", "http://[zz]:8000/", "--rate", "5"], 2, "Cannot use the URL"),
        (["--url", "http://127.0.0.1:abc/", "--rate", "5"], 2, "Cannot use the URL 'http://127.0.0.1:abc/'"),
        (["--url", "http://127.0.0.1:99999/", "--rate", "5"], 2, "Cannot use the URL"),
        (["--url", f"{test_server}/", "--rate", "5", "--duration", "soon"], 2, "Cannot read --duration"),
        # a device was read whole: @/dev/zero until memory ran out
        (["--url", f"{test_server}/", "--rate", "5", "--body", "@/dev/zero"], 2, "The body file /dev/zero is not a regular file."),
        (["--url", f"{test_server}/", "--rate", "5", "--body", f"@{tmp_path}"], 2, f"The body file {tmp_path} is a folder."),
    ]
    for args, code, text in cases:
        assert main(["bench", "serve", *args, "--store", db]) == code, args
        err = capsys.readouterr().err
        assert text in err.replace("\n", " ") and "Traceback" not in err


def test_error_and_hanging_servers_keep_partial_results(test_server, capsys, tmp_path):
    db, out = tmp_path / "g.db", tmp_path / "r.csv"
    rc = main(["bench", "serve", "--url", f"{test_server}/error", "--rate", "10", "--duration", "1s",
               "--store", str(db), "--csv", str(out), "--format", "json"])
    captured = capsys.readouterr()
    assert rc == 3 and "HTTP 500" in captured.err and "model crashed" in captured.err
    assert json.loads(captured.out)["requests"]["error"] == 10
    assert len(list(csv.DictReader(out.open()))) == 10
    # a server that never answers: the run ends at duration + timeout, every request a timeout
    rc = main(["bench", "serve", "--url", f"{test_server}/hang", "--rate", "4", "--duration", "1s",
               "--timeout", "500ms", "--store", str(db), "--format", "json"])
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert rc == 3 and report["requests"]["timeout"] == 4
    # 1.5 s idle (last send + the 0.5 s timeout); a run that waited on the hang, or for the default 30 s
    # timeout, could not end before 30 s; 10 s leaves a loaded machine room
    assert report["latency"]["p50"] >= 0.5 and report["duration_seconds"] < 10
    assert "timed out" in captured.err
    # rejected (429) is counted apart from errors
    rc = main(["bench", "serve", "--url", f"{test_server}/reject", "--rate", "10", "--duration", "500ms",
               "--store", str(db), "--format", "json"])
    assert json.loads(capsys.readouterr().out)["requests"]["rejected"] == 5


def test_ctrl_c_stops_the_run_and_keeps_what_was_measured(timed_server, tmp_path):
    import signal
    import subprocess
    import sys
    import urllib.request

    from testlib import wait_until

    cmd = [sys.executable, "-m", "gpulens.cli.main", "bench", "serve", "--url", f"{timed_server}/fixed/ctrl-c?ms=5",
           "--rate", "20", "--duration", "60s", "--format", "json", "--store", str(tmp_path / "g.db")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def served() -> int:
        with urllib.request.urlopen(f"{timed_server}/hits/fixed/ctrl-c", timeout=5) as r:
            return int(r.read())

    wait_until(lambda: served() >= 10 or proc.poll() is not None, 60, "the load to reach the server")  # load, not time
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err.decode()
    report = json.loads(out)
    assert report["interrupted"] is True
    assert 5 <= report["requests"]["ok"] < 200
    assert report["requests"]["not_sent"] > 1000  # the rest of the 60 s schedule
    assert "interrupted" in err.decode()


def test_distributions_merge_exactly_across_processes():
    from gpulens.bench.serve.stats import Distribution

    whole, a, b = Distribution(), Distribution(), Distribution()
    for i in range(1, 2001):
        whole.record(i / 1e4)
        (a if i % 2 else b).record(i / 1e4)
    merged = Distribution()
    merged.merge_encoded(a.encode())
    merged.merge_encoded(b.encode())
    m, w = merged.summary(), whole.summary()
    assert (m.p50, m.p90, m.p99, m.p99_9, m.max, m.count) == (w.p50, w.p90, w.p99, w.p99_9, w.max, w.count)
    assert m.mean == pytest.approx(w.mean, rel=1e-12)
    assert whole.summary().p99 == pytest.approx(0.198, rel=1e-3) and whole.summary().mean == pytest.approx(0.10005)


def test_csv_cells_that_would_start_a_formula_are_written_as_text():
    from gpulens.bench.serve.output import csv_cell

    assert csv_cell('=HYPERLINK("http://x")') == '\'=HYPERLINK("http://x")'
    assert csv_cell("+cmd|' /C calc'!A0") == "'+cmd|' /C calc'!A0" and csv_cell("@SUM(1)") == "'@SUM(1)"
    assert csv_cell("-0.25") == "-0.25" and csv_cell(-1.5) == -1.5 and csv_cell("ok") == "ok"
