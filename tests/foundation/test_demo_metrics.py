"""`make run` (gpulens demo) without a GPU: its /metrics carries the bundled session's training and
inference series, because the live replay feeds the trace's workload events in step with telemetry."""

from __future__ import annotations

import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families
from testlib import free_port, wait_http

pytestmark = pytest.mark.slow


def test_demo_metrics_carry_training_and_inference_series(tmp_path):
    port = free_port()
    # 50x the recorded pace: the 100 s session passes in 2 s (the same code path as `make run`)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpulens.cli.main", "demo", "--listen", f"127.0.0.1:{port}", "--dashboard", "off",
         "--speed", "50", "--duration", "30", "--backend", "replay"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        wanted = {"train_step_seconds", "infer_request_latency_seconds", "infer_requests", "train_mfu_ratio"}

        def families(body: bytes) -> dict:
            return {f.name: f for f in text_string_to_metric_families(body.decode())}

        body = wait_http(f"http://127.0.0.1:{port}/metrics", proc, 60, interval=0.5, until=lambda b: wanted <= set(families(b)))
        fams = families(body)
        names = set(fams)
        assert wanted <= names, (sorted(names), proc.poll())
        assert fams["train_step_seconds"].type == "histogram" and fams["infer_requests"].type == "counter"
        steps = {s.labels["train_job"] for s in fams["train_step_seconds"].samples}
        assert steps == {"h200-demo"}
        assert "gpu_power_watts" in names
        # the replayed workload is the node's: the GPUs' host, and an MFU from the recorded GPU's peak
        hosts = {s.labels.get("host") for f in fams.values() if f.name.startswith(("gpu_", "train_", "infer_")) for s in f.samples}
        assert len(hosts) == 1 and None not in hosts, hosts
        assert all(0 < s.value < 1 for s in fams["train_mfu_ratio"].samples)
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=20)
    assert proc.returncode in (0, -15), err[-2000:]


@pytest.mark.parametrize("flag", ["--listen", "--dashboard"])
def test_a_taken_port_is_said_before_the_import(tmp_path, flag):
    """The demo imported the whole session and printed its summary before failing on a taken port
    (QA): both addresses are bound first, and the sentence names the flag to change."""
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = f"127.0.0.1:{held.getsockname()[1]}"
        other = "127.0.0.1:0"
        argv = ["--listen", taken, "--dashboard", other] if flag == "--listen" else ["--listen", other, "--dashboard", taken]
        r = subprocess.run([sys.executable, "-m", "gpulens.cli.main", "demo", *argv, "--backend", "replay", "--duration", "5"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    said = " ".join(r.stderr.split())
    assert r.returncode == 2 and "already in use" in said and f"{flag} " in said and "Traceback" not in said, said
    assert "replaying the recorded H200 session" not in r.stdout and not (tmp_path / ".gpulens" / "gpulens.db").exists()
