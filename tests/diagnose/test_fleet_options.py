"""`gpulens diagnose --prometheus`: bad input is one sentence and exit 2, an unreachable server exit 3,
both before any analysis runs (no Prometheus needed here; tests/diagnose/test_fleet_prometheus.py
runs the diagnosis against a real one)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from testlib import free_port

UNREACHABLE = f"http://127.0.0.1:{free_port()}"

CASES = [
    (["--match", '{cluster="a"}'], 2, "needs --prometheus"),
    (["--window", "1h"], 2, "needs --prometheus"),
    (["--prometheus", UNREACHABLE, "--slo", "p99_latency<=1s"], 2, "per-request records"),
    (["--prometheus", UNREACHABLE, "--match", "{cluster=a}"], 2, "label selector"),
    (["--prometheus", UNREACHABLE, "--window", "1h", "--start", "1796198000"], 2, "not both"),
    (["--prometheus", UNREACHABLE, "--start", "1796198000", "--end", "1796197000"], 2, "not after"),
    (["--prometheus", "ftp://x"], 2, "Prometheus URL"),
    # urlsplit raises on these (a traceback before): an unclosed or non-IP [bracket], a port not a number
    (["--prometheus", "http://[::1"], 2, "Prometheus URL"),
    (["--prometheus", "http://[zz]:9090"], 2, "Prometheus URL"),
    (["--prometheus", "http://127.0.0.1:abc"], 2, "Cannot read the Prometheus URL 'http://127.0.0.1:abc'"),
    (["--prometheus", UNREACHABLE], 3, "Cannot reach Prometheus"),
]


@pytest.mark.parametrize(("args", "code", "words"), CASES, ids=[" ".join(a).replace(UNREACHABLE, "http://UNREACHABLE") for a, _, _ in CASES])  # the same ids in every xdist worker
def test_one_sentence_and_its_exit_code(tmp_path, args, code, words):
    # the store set once in the environment: typed beside --prometheus it would be refused for that
    env = {**os.environ, "GPULENS_STORE": str(tmp_path / "none.db")}
    p = subprocess.run([sys.executable, "-m", "gpulens", "diagnose", *args], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr and words in p.stderr and p.stderr.startswith("error: "), p.stderr


@pytest.mark.parametrize("command", [["diagnose"], ["energy"], ["scale"], ["report", "--out", "REPORT"]], ids=lambda c: c[0])
def test_store_and_prometheus_typed_together_are_refused(tmp_path, capsys, monkeypatch, command):
    """One source at a time, as the dashboard says: --store was silently ignored beside --prometheus.
    A store set once in GPULENS_STORE is not a typed --store, so it does not stand in the way."""
    from gpulens.cli.main import main

    command = [str(tmp_path / "r.html") if a == "REPORT" else a for a in command]
    closed = "http://127.0.0.1:9"  # nothing listens: reaching it is exit 3
    assert main([*command, "--store", str(tmp_path / "s.db"), "--prometheus", closed]) == 2
    assert "Give --store or --prometheus, not both." in capsys.readouterr().err
    monkeypatch.setenv("GPULENS_STORE", str(tmp_path / "s.db"))
    assert main([*command, "--prometheus", closed]) == 3
    assert "Cannot reach Prometheus" in capsys.readouterr().err
