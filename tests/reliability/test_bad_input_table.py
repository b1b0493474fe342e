"""The bad-input table of issue 18 (point 10; `plan` and `bench serve` cases are their owners'):
each case is one sentence and exit 2, never a traceback or a hang."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

AGENT = ["agent", "--duration", "1s", "--listen", "off"]


def _cases(tmp, write: bool = True):
    binary = tmp / "rules.bin"
    if write:
        binary.write_bytes(b"\x00\x01\xff\xfe\x80 binary")
    return {
        "interval far too long": [*AGENT, "--backend", "fake:1", "--interval", "100000000000d"],
        "interval nan": [*AGENT, "--backend", "fake:1", "--interval", "nan"],
        "fake GPUs past any machine": [*AGENT, "--backend", "fake:99999999999999999999"],
        "scrape not a URL": [*AGENT, "--backend", "fake:1", "--scrape", "notaurl"],
        "scrape with a bad port": [*AGENT, "--backend", "fake:1", "--scrape", "http://127.0.0.1:port/metrics"],
        "binary rules file": [*AGENT, "--backend", "fake:1", "--rules", str(binary)],
        "fault on a bookkeeping field": [*AGENT, "--backend", "fake:1", "--fault", "unsupported:errors"],
        # once injected, and their samples dropped by the store with a warning
        "fault xid code past any XID": [*AGENT, "--backend", "fake:1", "--fault", "xid:99999999999999999999@0"],
        "fault of negative ECC errors": [*AGENT, "--backend", "fake:1", "--fault", "ecc:uncorrected=-3@0"],
        "fault temperature inf": [*AGENT, "--backend", "fake:1", "--fault", "temp:inf@0"],
        "fault temperature nan": [*AGENT, "--backend", "fake:1", "--fault", "temp:nan@0"],
        "silence far too long": ["alerts", "silence", "alertname=x", "--for", "999999999999999999d"],
        "report start nan": ["report", "--out", str(tmp / "r.html"), "--start", "nan"],
        "report start 1e300": ["report", "--out", str(tmp / "r.html"), "--start", "1e300"],
        "report end before start": ["report", "--out", str(tmp / "r.html"), "--start", "1796002130", "--end", "1796002120"],
        "replay of binary garbage": ["replay", str(binary)],
        "webhook with a bad port": [*AGENT, "--backend", "fake:1", "--notify", "webhook:http://h:port/x"],
    }


CASES = sorted(_cases(Path("/unused"), write=False))


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_sentence_and_exit_2(case, tmp_path, replayed_store):
    import shutil

    db = tmp_path / "s.db"
    shutil.copy(replayed_store, db)
    args = [*_cases(tmp_path)[case], "--store", str(db)]
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    r = subprocess.run([sys.executable, "-m", "gpulens.cli.main", *args], capture_output=True, text=True, env=env, timeout=60)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "Traceback" not in out and "error:" in out, out
