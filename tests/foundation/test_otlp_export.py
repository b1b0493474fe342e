"""`gpulens agent --otlp URL` pushes what /metrics shows to an OpenTelemetry Collector (issue 24, item 3).

Real parts: a running agent (fake GPUs, a store) and a local HTTP server standing in for the
Collector's OTLP/HTTP receiver, which decodes each body as the Collector does
(`ExportMetricsServiceRequest`). A `TrainingMonitor` in this process writes steps into the agent's store.
"""

from __future__ import annotations

import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from testlib import free_port, import_or_skip, wait_until

from gpulens.store import Store
from gpulens.vocab import names as N
from gpulens.vocab.gpu import GPU_TEMPERATURE_CELSIUS

import_or_skip("opentelemetry.sdk.metrics", "the OTLP export needs gpulens[otel]")
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest  # noqa: E402

SRC = Path(__file__).resolve().parents[2] / "src"
SECRET = "Bearer otlpS3CRETtoken"


class _Receiver(BaseHTTPRequestHandler):
    """A Collector's OTLP/HTTP receiver: decodes each export and answers 200 (or `status`)."""

    got: list[tuple[str | None, ExportMetricsServiceRequest]]
    status = 200

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        req = ExportMetricsServiceRequest()
        req.ParseFromString(body)
        if self.path == "/v1/metrics":
            self.got.append((self.headers.get("Authorization"), req))
        self.send_response(self.status)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def collector():
    got: list = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("R", (_Receiver,), {"got": got}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/metrics", got
    server.shutdown()
    server.server_close()


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    for k in [k for k in env if k.startswith("OTEL_") or k == "GPULENS_AGENT"]:
        env.pop(k)
    return env


def _agent(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, Path, Path]:
    log, out = tmp_path / "agent.log", tmp_path / "agent.out"
    proc = subprocess.Popen([sys.executable, "-m", "gpulens", "-v", "agent", "--backend", "fake:2", "--store",
                             str(tmp_path / "node.db"), "--interval", "200ms", "--ingest", "off", *args],
                            env=_env(), cwd=tmp_path, stdout=out.open("wb"), stderr=log.open("wb"))
    return proc, log, out


# How long the agent may take to stop after SIGTERM: its last export is bounded at 2 s (a Collector
# that is away), the rest is a process's shutdown, which a loaded runner can stretch to seconds.
STOP_WITHIN_SECONDS = 10.0


def _stop(proc: subprocess.Popen, log: Path | None = None) -> float:
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        # where it hangs, for whoever reads the failure: the agent's last log lines (with -v, its steps)
        tail = log.read_text()[-3000:] if log is not None and log.exists() else "(no log)"
        raise AssertionError(f"the agent did not exit within 30 s of SIGTERM; its log ends:\n{tail}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    return time.monotonic() - t0


def _metrics(req: ExportMetricsServiceRequest) -> dict[str, object]:
    return {m.name: m for rm in req.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


def _attrs(point) -> dict[str, str]:  # noqa: ANN001
    return {a.key: a.value.string_value for a in point.attributes}


def _prom_histogram(text: str, name: str, labels: str) -> tuple[list[tuple[float, float]], float, float]:
    """(cumulative buckets, sum, count) of one /metrics histogram whose label text contains `labels`."""
    buckets, total, count = [], math.nan, math.nan
    for line in text.splitlines():
        if not line.startswith(name) or labels not in line:
            continue
        value = float(line.rsplit(" ", 1)[1])
        if line.startswith(f"{name}_bucket"):
            le = re.search(r'le="([^"]+)"', line).group(1)
            buckets.append((float(le), value))
        elif line.startswith(f"{name}_sum"):
            total = value
        elif line.startswith(f"{name}_count"):
            count = value
    return buckets, total, count


def test_the_agent_exports_the_same_histograms_and_gpu_gauges_as_metrics_over_otlp(tmp_path, collector):
    url, got = collector
    port = free_port()
    proc, log, out = _agent(tmp_path, "--listen", f"127.0.0.1:{port}", "--otlp", url, "--otlp-interval", "300ms",
                            "--otlp-header", f"Authorization={SECRET}")
    try:
        wait_until(lambda: got or proc.poll() is not None, 30, "the first OTLP export")
        assert proc.poll() is None, log.read_text()[-2000:]
        from gpulens.workload.training.monitor import TrainingMonitor

        steps = 37
        mon = TrainingMonitor(job="otlp-job", store=tmp_path / "node.db", rank=0, world_size=1, host="node-a",
                              flush_interval_seconds=0.05, cuda_timing=False)
        for i in range(steps):
            with mon.step(samples=4, tokens=64):
                time.sleep(0.001 * (1 + i % 5))
        mon.close()

        def step_histogram():
            for _auth, req in reversed(got):
                m = _metrics(req).get(N.TRAIN_STEP_SECONDS)
                if m is not None and any(p.count == steps for p in m.histogram.data_points):
                    return m
            return None

        hist = wait_until(step_histogram, 30, f"an OTLP export holding all {steps} steps")
        # the exporter's /metrics for the same records
        def scraped() -> str | None:
            t = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            return t if _prom_histogram(t, N.TRAIN_STEP_SECONDS, 'train_job="otlp-job"')[2] == steps else None

        text = wait_until(scraped, 30, "/metrics to count every step")
    finally:
        took = _stop(proc, log)
    assert took < STOP_WITHIN_SECONDS, f"the agent took {took:.1f} s to stop"

    (point,) = hist.histogram.data_points
    assert hist.histogram.aggregation_temporality == 2  # AGGREGATION_TEMPORALITY_CUMULATIVE
    assert list(point.explicit_bounds) == list(N.STEP_BUCKETS_SECONDS)
    assert _attrs(point) == {"host": "node-a", "rank": "0", "train_job": "otlp-job"}
    buckets, total, count = _prom_histogram(text, N.TRAIN_STEP_SECONDS, 'train_job="otlp-job"')
    assert point.count == count == steps
    assert point.sum == pytest.approx(total, rel=1e-9, abs=1e-12)
    # OTLP buckets hold their own counts; /metrics' are cumulative: the same distribution either way
    cumulative = [sum(point.bucket_counts[: i + 1]) for i in range(len(point.bucket_counts))]
    assert [c for _le, c in buckets] == cumulative
    assert [le for le, _c in buckets[:-1]] == list(N.STEP_BUCKETS_SECONDS)

    last = _metrics(got[-1][1])
    for name, m in last.items():  # every distribution that arrived carries the vocabulary's bounds
        if m.WhichOneof("data") == "histogram":
            assert all(list(p.explicit_bounds) == list(N.HISTOGRAM_BUCKETS[name]) for p in m.histogram.data_points), name
    temps = last[GPU_TEMPERATURE_CELSIUS].gauge.data_points
    assert sorted(_attrs(p)["gpu"] for p in temps) == ["0", "1"]
    assert all(_attrs(p)["host"] and _attrs(p)["uuid"] for p in temps)

    assert all(auth == SECRET for auth, _ in got), "the --otlp-header arrives with every export"
    shown = log.read_text() + out.read_text()
    assert "otlpS3CRETtoken" not in shown
    assert "header Authorization" in shown  # the start line names the header, not its value


@pytest.mark.parametrize("dead", ["refused", "silent"])
def test_a_dead_collector_leaves_the_agent_sampling_logs_once_and_stops_on_sigterm(tmp_path, dead):
    holder = None
    if dead == "refused":
        url = f"http://127.0.0.1:{free_port()}/v1/metrics"  # nothing listens there
    else:  # listens, never answers: each export runs into its timeout
        holder = socket.socket()
        holder.bind(("127.0.0.1", 0))
        holder.listen(64)
        url = f"http://127.0.0.1:{holder.getsockname()[1]}/v1/metrics?token=deadT0KEN"
    proc, log, _out = _agent(tmp_path, "--listen", "off", "--otlp", url, "--otlp-interval", "300ms")
    try:
        def newest() -> float:
            assert proc.poll() is None, log.read_text()[-2000:]
            try:
                with Store(tmp_path / "node.db", readonly=True) as s:
                    return max((v.t for v in s.latest(GPU_TEMPERATURE_CELSIUS)), default=0.0)
            except Exception:  # not created yet
                return 0.0

        wait_until(lambda: "OTLP export to" in log.read_text(), 30, "the failed export to be logged")
        t0 = wait_until(newest, 30, "the first stored sample")
        # several export intervals later, the store has kept growing...
        wait_until(lambda: newest() > t0 + 2.0, 30, "sampling to go on while the Collector is away")
    finally:
        took = _stop(proc, log)
        if holder is not None:
            holder.close()
    assert took < STOP_WITHIN_SECONDS, f"the agent took {took:.1f} s to stop"
    text = log.read_text()
    failures = [line for line in text.splitlines() if "OTLP export to" in line]
    assert len(failures) == 1, failures  # ...and the failure was said once, not once per export
    assert ("refused" if dead == "refused" else "no answer within") in failures[0]
    assert "Traceback" not in text and "deadT0KEN" not in text
    assert "Failed to export" not in text and "Transient error" not in text  # the SDK's per-export lines


@pytest.mark.parametrize("args, said", [
    (["--otlp", "ftp://collector/v1/metrics"], "is not an http(s) URL"),
    (["--otlp", "http://127.0.0.1:4318/v1/metrics", "--otlp-header", "Authorization"], "NAME=VALUE"),
    (["--otlp-header", "X-Token=abc"], "needs --otlp URL"),
    (["--otlp", "http://127.0.0.1:4318/v1/metrics", "--otlp-interval", "soon"], "--otlp-interval"),
])
def test_bad_otlp_flags_are_one_sentence_and_exit_2(tmp_path, args, said):
    r = subprocess.run([sys.executable, "-m", "gpulens", "agent", "--backend", "fake:1", "--store", str(tmp_path / "s.db"),
                        "--listen", "off", "--ingest", "off", "--duration", "1s", *args],
                       env=_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert said in r.stderr and "Traceback" not in r.stderr
    assert "abc" not in r.stderr


def test_without_the_sdk_the_agent_names_the_otel_extra(tmp_path):
    blocked = "import sys; sys.modules['opentelemetry.sdk'] = None; import runpy; runpy.run_module('gpulens', run_name='__main__')"
    r = subprocess.run([sys.executable, "-c", blocked, "agent", "--backend", "fake:1", "--store", str(tmp_path / "s.db"),
                        "--listen", "off", "--ingest", "off", "--otlp", "http://127.0.0.1:4318/v1/metrics"],
                       env=_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 3, r.stderr
    assert "gpulens[otel]" in r.stderr and "Traceback" not in r.stderr
