"""Several writers on one store (issue 27): replays of one trace at once, a trace replayed again
after it grew, and an agent sampling while a replay imports into its store.

Real subprocesses on a real store file; counts are read back with sqlite3 and checked against the
trace's own line count, so a sample stored twice (or not at all) fails.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from testlib import wait_until

CLI = [sys.executable, "-m", "gpulens.cli.main"]
ENV = {**os.environ, "NO_COLOR": "1", "COLUMNS": "400"}  # one message a line
T0 = 1_700_000_000.0


def write_recording(path: Path, frames: int, *, gpus: int = 4, step_seconds: float = 0.1, first: int = 0,
                    append: bool = False) -> int:
    """A gpulens recording of `frames` frames (from frame number `first`); appends without a header.
    Returns the sample lines written."""
    with path.open("a" if append else "w") as f:
        if not append:
            f.write(json.dumps({"format": "gpulens-recording", "version": 1,
                                "gpus": [{"index": g, "uuid": f"GPU-{g}", "name": "fake"} for g in range(gpus)]}) + "\n")
        for i in range(first, first + frames):
            for g in range(gpus):
                f.write(json.dumps({"type": "sample", "t": T0 + i * step_seconds, "gpu": g, "uuid": f"GPU-{g}", "name": "fake",
                                    "power_watts": 300.0 + i % 7, "utilization_gpu_ratio": 0.5}) + "\n")
    return frames * gpus


def _rows(db: Path, host: str | None = None) -> list[tuple[str, float]]:
    """(series labels, t) of every gpu_up sample, of one host's series when given."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        rows = conn.execute("SELECT series.labels, samples.t FROM samples JOIN series ON series.id = samples.series_id "
                            "WHERE series.name = 'gpu_up' ORDER BY samples.t").fetchall()
    finally:
        conn.close()
    return [(labels, t) for labels, t in rows if host is None or json.loads(labels).get("host") == host]


def _count(db: Path, host: str) -> int:
    """How many gpu_up samples of `host` the store holds; 0 while the agent is still creating it."""
    try:
        return len(_rows(db, host)) if db.exists() else 0
    except sqlite3.Error:
        return 0


def _replay(rec: Path, db: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([*CLI, "replay", str(rec), "--store", str(db), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)


@pytest.mark.parametrize("writers", [2, 4])
def test_concurrent_replays_of_one_trace_store_each_sample_once(tmp_path, writers):
    rec = tmp_path / "rec.jsonl"
    samples = write_recording(rec, 600)
    db = tmp_path / "s.db"
    procs = [_replay(rec, db) for _ in range(writers)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0] * writers, outs
    rows = _rows(db)
    assert len(rows) == samples  # not writers x samples
    assert len(set(rows)) == samples
    # one of them imported it; the others found it in the store, or waited for the one importing it
    said = "".join(o + e for o, e in outs)
    assert said.count("imported 600 GPU samples") == 1, said
    assert said.count("already in") == writers - 1, said


def test_a_grown_trace_imports_only_its_new_lines(tmp_path):
    rec = tmp_path / "rec.jsonl"
    first = write_recording(rec, 500)
    db = tmp_path / "s.db"
    r = subprocess.run([*CLI, "replay", str(rec), "--store", str(db)], capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 0, r.stderr
    assert len(_rows(db)) == first
    grown = write_recording(rec, 300, first=500, append=True)
    r = subprocess.run([*CLI, "replay", str(rec), "--store", str(db)], capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "imported 300 GPU samples" in r.stdout
    assert f"{first} line(s) of" in r.stdout and "imported before" in r.stdout
    rows = _rows(db)
    assert len(rows) == first + grown and len(set(rows)) == first + grown  # the old lines once, the new lines once
    r = subprocess.run([*CLI, "replay", str(rec), "--store", str(db)], capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 0 and "already in" in r.stdout, r.stdout + r.stderr
    assert len(_rows(db)) == first + grown


def test_a_trace_whose_earlier_lines_changed_is_refused_and_force_imports_it_again(tmp_path):
    from gpulens.errors import TraceError
    from gpulens.pipeline.ingest import import_trace
    from gpulens.store import Store

    rec = tmp_path / "rec.jsonl"
    n = write_recording(rec, 200)
    db = tmp_path / "s.db"
    with Store(db) as st:
        import_trace(rec, st)
    lines = rec.read_text().splitlines()
    lines[5] = lines[5].replace('"power_watts": 30', '"power_watts": 40')  # same header, another body
    rec.write_text("\n".join(lines) + "\n")
    with Store(db) as st:
        with pytest.raises(TraceError, match="earlier lines differ"):
            import_trace(rec, st)
        assert len(_rows(db)) == n  # nothing imported
        import_trace(rec, st, force=True)
    assert len(_rows(db)) == 2 * n  # --force imports all of it again, as it says


def test_two_recordings_with_the_same_header_are_two_traces(tmp_path):
    """Every recording of one machine starts with the same header: it does not name the trace."""
    from gpulens.pipeline.ingest import import_trace
    from gpulens.store import Store

    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    n = write_recording(first, 100)
    m = write_recording(second, 50, first=1000)
    assert first.read_text().splitlines()[0] == second.read_text().splitlines()[0]
    with Store(tmp_path / "s.db") as st:
        import_trace(first, st)
        assert not import_trace(second, st).already_imported
    assert len(_rows(tmp_path / "s.db")) == n + m


INTERVAL_S = 0.5


def test_an_agent_keeps_sampling_while_a_replay_imports_into_its_store(tmp_path):
    """The agent's largest gap between consecutive samples, while a 15x replay imports into its store,
    stays well under the import's length (it was the whole import: one transaction held the write lock)."""
    db = tmp_path / "s.db"
    rec = tmp_path / "rec.jsonl"
    samples = write_recording(rec, 150, gpus=2, step_seconds=1.0)  # 150 s recorded: about 10 s at 15x
    agent = subprocess.Popen([*CLI, "agent", "--backend", "fake:2", "--interval", f"{INTERVAL_S}s", "--listen", "off",
                              "--host", "agent-node", "--store", str(db)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        wait_until(lambda: _count(db, "agent-node") >= 4, 60, "the agent's first samples", interval=0.1)
        r = subprocess.run([*CLI, "replay", str(rec), "--store", str(db), "--speed", "15"],
                           capture_output=True, text=True, env=ENV, timeout=120)
        assert r.returncode == 0, r.stderr
        replay_end = max(t for _, t in _rows(db, "agent-node"))
        wait_until(lambda: max(t for _, t in _rows(db, "agent-node")) > replay_end + 2 * INTERVAL_S, 30,
                   "the agent's samples after the replay", interval=0.1)
    finally:
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=30)
    assert "database is locked" not in err, err
    gpu0 = sorted(t for labels, t in _rows(db, "agent-node") if json.loads(labels).get("gpu") == "0")
    largest_gap = max(b - a for a, b in zip(gpu0, gpu0[1:], strict=False))
    # One transaction for the import leaves a gap of the whole paced import (150 s at 15x: 10 s at least,
    # however loaded the machine); half that, 5 s against 0.5 s sampling, leaves a loaded agent room to be late.
    assert largest_gap <= 150 / 15 / 2, f"the agent went {largest_gap:.2f} s without a sample"
    assert len(_rows(db)) - len(_rows(db, "agent-node")) == samples  # and the replay stored its samples once
