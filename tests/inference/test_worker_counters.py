"""The workers of one pre-fork service (gunicorn --preload) each count their own requests: every
worker's `infer_requests_total` and `infer_in_flight` are their own series (a `pid` label), and what
reads them adds the workers up: the dashboard's rates, /metrics, the local alert rules. Before, the
workers' counts went into one series, interleaved, and each drop read as a restart."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpulens.alerts.evaluate import Evaluator
from gpulens.alerts.rules import load_rules
from gpulens.alerts.source import StoreSource
from gpulens.exporter.prometheus import make_registry
from gpulens.exporter.readings import LatestReadings
from gpulens.reader.counters import summed_counter
from gpulens.reader.store import StoreReader
from gpulens.store import Store
from gpulens.store.types import SeriesData, SeriesKey
from gpulens.vocab import names as N

REPO = Path(__file__).resolve().parents[2]

# Two workers forked from the master that made the monitor, serving at the same time.
PREFORK_SERVER = """
import os, sys, time
from gpulens.workload.inference import InferenceMonitor

serving = InferenceMonitor(service="chat", store="job.db")
with serving.request():
    pass
print("master", os.getpid(), flush=True)
plans = {"a": ["ok", "error", "ok", "ok", "error", "ok"], "b": ["error", "error", "ok", "error"]}
children = []
for name, statuses in plans.items():
    pid = os.fork()
    if pid == 0:
        for status in statuses:
            h = serving.start_request()
            time.sleep(0.02)  # the two workers' requests interleave in time
            h.finish(status)
        print(name, os.getpid(), flush=True)
        sys.exit(0)
    children.append(pid)
for pid in children:
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    d = tmp_path_factory.mktemp("prefork")
    (d / "server.py").write_text(PREFORK_SERVER)
    done = subprocess.run([sys.executable, "server.py"], cwd=d, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    pids = {line.split()[0]: line.split()[1] for line in done.stdout.splitlines()}
    assert set(pids) == {"master", "a", "b"}, done.stdout
    return d / "job.db", pids


def test_each_worker_counts_in_its_own_series(served):
    path, pids = served
    with Store(path, readonly=True) as st:
        totals = {(d.key.labels[N.PID_LABEL], d.key.labels["status"]): d.value for d in st.query(N.INFER_REQUESTS_TOTAL)}
        in_flight = {d.key.labels[N.PID_LABEL]: d.value for d in st.query(N.INFER_IN_FLIGHT)}
    a, b, master = pids["a"], pids["b"], pids["master"]
    assert totals == {(master, "ok"): [1.0], (a, "ok"): [1.0, 2.0, 3.0, 4.0], (a, "error"): [1.0, 2.0],
                      (b, "error"): [1.0, 2.0, 3.0], (b, "ok"): [1.0]}
    assert {pid: v[-1] for pid, v in in_flight.items()} == {master: 0.0, a: 0.0, b: 0.0}


def test_the_dashboard_rate_adds_the_workers_up(served):
    path, _ = served
    errors = {"service": "chat", "status": "error"}
    with StoreReader(path) as r:
        start, end = r.data_range()
        lines = r.rate(N.INFER_REQUESTS_TOTAL, errors, start - 1, end + 1, 500)
        first = min(d.t[0] for d in r.store.query(N.INFER_REQUESTS_TOTAL, errors))
    assert len(lines) == 1 and N.PID_LABEL not in lines[0].labels and lines[0].labels["status"] == "error"
    ln = lines[0]
    assert all(v is not None and v >= 0 for v in ln.value)
    # the errors each worker counted after its first: 2 - 1 and 3 - 1 (a counter's first sample has
    # nothing to rise from); one interleaved series read 1, 1, 2, 2, 3 as two restarts and made it 4
    counted = sum(v * (t1 - t0) for t0, t1, v in zip([first, *ln.t], ln.t, ln.value, strict=False))  # type: ignore[operator]
    assert counted == pytest.approx(3.0)


def test_metrics_count_every_request_once_without_a_series_per_pid(served):
    path, _ = served
    with Store(path, readonly=True) as st:
        text = generate_latest(make_registry(LatestReadings("h"), store=st)).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    requests = {s.labels["status"]: s.value for s in fams["infer_requests"].samples if s.name == "infer_requests_total"}
    assert requests == {"ok": 6.0, "error": 5.0, "timeout": 0.0, "rejected": 0.0, "aborted": 0.0}
    assert all(N.PID_LABEL not in s.labels for f in fams.values() for s in f.samples if s.name.startswith("infer_"))
    assert [s.value for s in fams[N.INFER_IN_FLIGHT].samples] == [0.0]


def test_the_error_rate_rule_reads_the_service_not_each_worker(served):
    path, _ = served
    rule = next(r for r in load_rules(packs=("inference",)).rules if r.name == "InferErrorRateHigh")
    with Store(path, readonly=True) as st:
        source = StoreSource(st)
        source.refresh()
        _, end = st.time_range()
        got = Evaluator(source).vector(rule.expr.root.left, end + 1)
    # one ratio for the service (the workers' errors over all their requests), not one per worker
    assert len(got) == 1 and all(k != N.PID_LABEL for k, _ in next(iter(got)))
    assert next(iter(got.values())) == pytest.approx(5 / 11)  # every request is in the window, counted from 0


def test_in_flight_on_metrics_is_the_sum_of_the_workers(tmp_path):
    now = time.time()
    with Store(tmp_path / "s.db") as st:
        for pid, n in (("101", 2.0), ("102", 3.0)):
            st.write(N.INFER_IN_FLIGHT, {"service": "chat", "model": "m", "host": "h", N.PID_LABEL: pid}, now, n)
        st.write(N.INFER_IN_FLIGHT, {"service": "embed", "model": "e", "host": "h", N.PID_LABEL: "103"}, now, 1.0)
        st.flush()
        text = generate_latest(make_registry(LatestReadings("h"), store=st)).decode()
    fam = next(f for f in text_string_to_metric_families(text) if f.name == N.INFER_IN_FLIGHT)
    assert {s.labels["service"]: s.value for s in fam.samples} == {"chat": 5.0, "embed": 1.0}


def _series(t: list[float], v: list[float]) -> SeriesData:
    return SeriesData(SeriesKey("c", {}), "raw", t, v, v, v, [1] * len(t))  # type: ignore[arg-type]


def test_summed_counter_adds_rises_across_restarts():
    # worker 1 restarts at t=4 (its counter starts over at 1); worker 2 starts later
    total_t, total = summed_counter([_series([1, 2, 4, 5], [3, 5, 1, 2]), _series([3, 6], [7, 9])])
    assert total_t == [1, 2, 4, 5, 6] and total == [0.0, 2.0, 3.0, 4.0, 6.0]
