"""`gpulens diagnose --prometheus`: bad input is one sentence and exit 2, an unreachable server exit 3,
both before any analysis runs (no Prometheus needed here; tests/diagnose/test_fleet_prometheus.py
runs the diagnosis against a real one)."""

from __future__ import annotations

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
    p = subprocess.run([sys.executable, "-m", "gpulens", "diagnose", "--store", str(tmp_path / "none.db"), *args],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr and words in p.stderr and p.stderr.startswith("error: "), p.stderr
