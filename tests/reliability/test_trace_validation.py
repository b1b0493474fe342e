"""What a recorded trace claims is checked before it is believed: a recording from a newer gpulens,
a header naming one GPU index twice, a sample of a GPU the header does not list, a recording with
no sample, times that run backwards, a step or a request that ends before it starts, a value past
the store's bound, a shorter copy of a trace imported before. Each is one sentence and exit 2, or
one line (record) skipped and counted, never silently wrong data and never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tracelib import h200_lines, sample_rows, write_trace

from gpulens import ReplayBackend, TraceError
from gpulens.pipeline.ingest import import_trace
from gpulens.store import Store

T0 = 1_796_002_115.0
HEAD = {"format": "gpulens-recording", "version": 1, "host": "node-a",
        "gpus": [{"index": 0, "uuid": "GPU-0", "name": "NVIDIA H200"}, {"index": 1, "uuid": "GPU-1", "name": "NVIDIA H200"}]}


def _samples(frames: int, step: float = 0.1, t0: float = T0) -> list[dict]:
    return [{"type": "sample", "t": t0 + i * step, "gpu": g, "uuid": f"GPU-{g}", "name": "NVIDIA H200",
             "temperature_celsius": 50.0 + i % 7, "power_watts": 300.0 + i}
            for i in range(frames) for g in (0, 1)]


def _recording(path: Path, head: dict, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in [head, *rows]), encoding="utf-8")
    return path


def _replay(*args: str) -> tuple[int, str]:
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1"}
    r = subprocess.run([sys.executable, "-m", "gpulens.cli.main", "replay", *args], capture_output=True, text=True,
                       env=env, timeout=120)
    out = r.stdout + r.stderr
    assert "Traceback" not in out, out
    return r.returncode, " ".join(out.split())


# ------------------------------------------------------------------ 1, 2, 4: the header


@pytest.mark.parametrize(("version", "said"), [
    (99, "was written by a newer gpulens (format version 99; this one reads 1): upgrade gpulens"),
    (0, "its format version is 0, not a whole number from 1"),
    (-3, "its format version is -3, not a whole number from 1"),
    ("1", "its format version is '1', not a whole number from 1"),
    (1.5, "its format version is 1.5, not a whole number from 1"),
    (True, "its format version is True, not a whole number from 1"),
])
def test_a_recording_version_this_gpulens_cannot_read_is_refused(tmp_path, version, said):
    rec = _recording(tmp_path / "r.jsonl", {**HEAD, "version": version}, _samples(5))
    with pytest.raises(TraceError, match="newer gpulens|broken header") as err:
        ReplayBackend(rec)
    assert err.value.exit_code == 2 and said in str(err.value)


def test_a_newer_recording_is_one_sentence_and_exit_2_on_the_command_line(tmp_path):
    rec = _recording(tmp_path / "r.jsonl", {**HEAD, "version": 99}, _samples(5))
    rc, out = _replay(str(rec), "--store", str(tmp_path / "s.db"))
    assert rc == 2 and "format version 99; this one reads 1): upgrade gpulens" in out, out


def test_a_header_that_lists_one_gpu_index_twice_is_refused_naming_it(tmp_path):
    head = {**HEAD, "gpus": [HEAD["gpus"][0], {**HEAD["gpus"][1], "index": 0}]}
    rec = _recording(tmp_path / "r.jsonl", head, _samples(5))
    rc, out = _replay(str(rec), "--store", str(tmp_path / "s.db"))
    assert rc == 2 and "lists GPU index 0 twice" in out, out


def test_a_recording_with_a_header_and_no_sample_is_refused(tmp_path):
    rec = _recording(tmp_path / "r.jsonl", HEAD, [])
    rc, out = _replay(str(rec), "--store", str(tmp_path / "s.db"))
    assert rc == 2, out
    assert "holds a header and no samples: the recording was stopped before its first sample" in out
    assert "imported 0" not in out


# ------------------------------------------------------------------ 3: a GPU the header does not list


def test_a_sample_or_xid_of_a_gpu_not_in_the_header_is_skipped_and_counted(tmp_path):
    rows = _samples(10)
    rows[4] = {**rows[4], "gpu": 77}  # line 6 (after the header)
    rows.insert(8, {"type": "xid", "t": T0 + 0.35, "gpu": 9, "uuid": "GPU-9", "xid": 79})  # line 10
    rec = _recording(tmp_path / "r.jsonl", HEAD, rows)
    with Store(tmp_path / "s.db") as st:
        summary = import_trace(rec, st)
        assert summary.skipped_lines == 2
        assert [str(s) for s in summary.skipped] == ["line 6: gpu 77 is not in the recording's header (0, 1)",
                                                    "line 10: gpu 9 is not in the recording's header (0, 1)"]
        assert sample_rows(st, "gpu_up") == 19
        assert not st.events("xid")


# ------------------------------------------------------------------ 6: times that run backwards


def test_lines_gone_back_in_time_past_the_max_gap_are_skipped_and_the_duration_is_never_negative(tmp_path):
    rows = _samples(20)
    for r in rows[6:]:  # from frame 3 on the clock stepped back four months, for good
        r["t"] -= 11_000_000
    rec = _recording(tmp_path / "r.jsonl", HEAD, rows)
    with Store(tmp_path / "s.db") as st:
        summary = import_trace(rec, st)
        assert summary.gpu_frames == 3 and summary.skipped_lines == 34
        assert summary.skipped[0].line == 8 and "back in time" in summary.skipped[0].reason
        assert summary.start == T0 and summary.end == pytest.approx(T0 + 0.2)
        assert summary.duration_seconds >= 0
        rng = st.time_range()
    assert rng is not None and rng[0] >= T0 - 1  # nothing of the jump back was stored
    rc, out = _replay(str(rec), "--store", str(tmp_path / "s2.db"))
    assert rc == 0 and "over -" not in out and "skipped 34 malformed line(s) (line 8: t is" in out, out


def test_a_step_back_within_the_max_gap_is_kept_and_the_summary_spans_what_was_stored(tmp_path):
    rows = _samples(20)
    for r in rows[10:]:  # back 11 s, less than the 60 s max gap: kept, stored at its own times
        r["t"] -= 11
    rec = _recording(tmp_path / "r.jsonl", HEAD, rows)
    with Store(tmp_path / "s.db") as st:
        summary = import_trace(rec, st)
    assert summary.gpu_frames == 20 and summary.skipped_lines == 0
    assert summary.start == pytest.approx(T0 + 0.5 - 11) and summary.end == pytest.approx(T0 + 0.4)
    assert summary.duration_seconds == pytest.approx(10.9)


# ------------------------------------------------------------------ 5: steps and requests that end before they start


def test_steps_and_requests_whose_times_cannot_be_are_skipped_and_counted(tmp_path, h200_trace):
    good = h200_lines(h200_trace, 60)
    t0 = json.loads(good[0])["t"]
    events = [
        {"kind": "train_step", "t_start": t0 + 1, "t_end": t0 + 2, "step": 1, "tokens": 100},
        {"kind": "train_step", "t_start": t0 + 5, "t_end": t0 + 3, "step": 2, "tokens": 100},  # ends before it starts
        {"kind": "train_step", "t_end": t0 + 4, "step": 3},  # no start and no step_s: no span
        {"kind": "request", "arrival": t0 + 1, "start": t0 + 1.1, "first_token": t0 + 1.2, "end": t0 + 2, "output_tokens": 5},
        {"kind": "request", "arrival": t0 + 1, "start": t0 + 3, "end": t0 + 2, "output_tokens": 5},  # end before start
        {"kind": "request", "arrival": t0 + 6, "end": t0 + 5, "output_tokens": 5},  # end before arrival
        {"kind": "request", "arrival": t0 + 4, "start": t0 + 4, "first_token": t0 + 3.5, "end": t0 + 5},  # token before start
        {"kind": "request", "arrival": t0 + 4, "start": t0 + 4, "first_token": t0 + 5.5, "end": t0 + 5},  # token after end
        {"kind": "request", "arrival": t0 + 4, "start": t0 + 4, "status": "ok"},  # no end
    ]
    folder = write_trace(tmp_path / "t", good, h200_trace, events=events)
    with Store(tmp_path / "s.db") as st:
        summary = import_trace(folder, st)
        assert summary.events == {"train_step": 1, "request": 1}
        assert summary.skipped_events == 7
        steps = st.events("train_step")
        assert len(steps) == 1 and steps[0].data["t_end"] >= steps[0].data["t_start"]
        for e in st.events("request"):
            assert e.data["end"] >= e.data["start"] >= e.data["arrival"]
        assert st.refused_count == 0


def test_workload_values_past_the_stores_bound_skip_their_record_not_a_warning(tmp_path, h200_trace):
    good = h200_lines(h200_trace, 30)
    t0 = json.loads(good[0])["t"]
    events = [
        {"kind": "train_step", "t_start": t0 + 1, "t_end": t0 + 2, "step": 1, "loss": 1e308},
        {"kind": "request", "arrival": t0 + 1, "start": t0 + 1, "end": t0 + 2, "tpot_s": 1e308, "output_tokens": 3},
        {"kind": "train_step", "t_start": t0 + 3, "t_end": t0 + 4, "step": 2, "loss": 2.5},
    ]
    folder = write_trace(tmp_path / "t", good, h200_trace, events=events)
    with Store(tmp_path / "s.db") as st:
        summary = import_trace(folder, st)
        assert summary.skipped_events == 2 and summary.events == {"train_step": 1}
        assert st.refused_count == 0  # the store was never handed a value it refuses (its warning said "values finite")


# ------------------------------------------------------------------ 7: the bound a reading is refused past


def test_a_reading_past_the_bound_says_the_bound_not_finite(tmp_path):
    rows = _samples(5)
    rows[3] = {**rows[3], "power_watts": 1e308}
    rows[5] = {**rows[5], "temperature_celsius": -1e19}
    rec = _recording(tmp_path / "r.jsonl", HEAD, rows)
    with Store(tmp_path / "s.db") as st:
        summary = import_trace(rec, st)
    assert [str(s) for s in summary.skipped] == [
        "line 5: power_watts is 1e+308, beyond ±1e18, which no GPU reading reaches",
        "line 7: temperature_celsius is -1e+19, beyond ±1e18, which no GPU reading reaches",
    ]
    assert "finite" not in " ".join(str(s) for s in summary.skipped)


# ------------------------------------------------------------------ 8: a shorter copy of a trace imported before


def _copy_head(src: Path, dst: Path, n: int) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    lines = (src / "telemetry.jsonl").read_bytes().splitlines(keepends=True)
    (dst / "telemetry.jsonl").write_bytes(b"".join(lines[:n]))
    return dst


def _imported_and_its_head(tmp_path: Path, h200_trace: Path) -> tuple[Path, Path, Path, int]:
    """(the whole trace, imported into the store; its first 50 lines as a copy; the store; gpu_up rows)."""
    full = tmp_path / "full"
    full.mkdir()
    shutil.copy(h200_trace / "telemetry.jsonl", full / "telemetry.jsonl")
    db = tmp_path / "s.db"
    with Store(db) as st:
        import_trace(full, st)
        rows = sample_rows(st, "gpu_up")
    return full, _copy_head(full, tmp_path / "short", 50), db, rows


def test_the_beginning_of_an_imported_trace_is_already_stored_not_different(tmp_path, h200_trace):
    full, short, db, rows = _imported_and_its_head(tmp_path, h200_trace)
    rc, out = _replay(str(short), "--store", str(db))
    assert rc == 0 and "already in" in out and "differ" not in out, out
    with Store(db) as st:
        again = import_trace(short, st)
        assert again.already_imported and again.shorter_than_imported and again.gpu_frames == 0
        assert sample_rows(st, "gpu_up") == rows  # nothing stored twice
        import_trace(full, st)  # the whole copy is still the one the claim knows: nothing again
        assert sample_rows(st, "gpu_up") == rows


def test_a_shorter_copy_whose_lines_differ_is_refused_truthfully(tmp_path, h200_trace):
    full, short, db, rows = _imported_and_its_head(tmp_path, h200_trace)
    lines = (short / "telemetry.jsonl").read_text().splitlines()
    d = json.loads(lines[30])
    d["temp_c"] = 99
    lines[30] = json.dumps(d)
    (short / "telemetry.jsonl").write_text("\n".join(lines) + "\n")
    rc, out = _replay(str(short), "--store", str(db))
    assert rc == 2 and "is shorter than the copy imported into this store before" in out, out
    assert "its lines differ from that copy's; nothing was imported" in out
    # the copy imported is gone: whether the short one is its beginning cannot be told, and it says so
    (short / "telemetry.jsonl").write_bytes(b"".join((full / "telemetry.jsonl").read_bytes().splitlines(keepends=True)[:50]))
    shutil.rmtree(full)
    rc, out = _replay(str(short), "--store", str(db))
    assert rc == 2 and "is gone or changed since" in out and "cannot be told" in out, out
    with Store(db) as st:
        assert sample_rows(st, "gpu_up") == rows


def test_a_trace_cut_in_place_after_its_import_is_refused_not_called_different(tmp_path, h200_trace):
    folder = write_trace(tmp_path / "t", h200_lines(h200_trace, 100), h200_trace)
    db = tmp_path / "s.db"
    with Store(db) as st:
        import_trace(folder, st)
    _copy_head(folder, folder, 40)
    with Store(db) as st, pytest.raises(TraceError, match="it was cut since") as err:
        import_trace(folder, st)
    assert err.value.exit_code == 2 and "differ" not in str(err.value)


def test_the_beginning_of_an_interrupted_import_imports_what_is_missing_once(tmp_path, h200_trace):
    full = write_trace(tmp_path / "full", h200_lines(h200_trace, 200), h200_trace)
    db = tmp_path / "s.db"

    def interrupt(frames: int) -> None:
        if frames >= 100:
            raise KeyboardInterrupt

    with Store(db, batch_size=50) as st, pytest.raises(KeyboardInterrupt):
        import_trace(full, st, on_progress=interrupt)
    with Store(db) as st:
        stored = sample_rows(st, "gpu_up")
        assert 0 < stored < 150
    short = _copy_head(full, tmp_path / "short", 150)
    with Store(db) as st:
        part = import_trace(short, st)
        assert part.shorter_than_imported and part.gpu_frames == 150 - stored
        assert sample_rows(st, "gpu_up") == 150
        rest = import_trace(full, st)  # the whole copy continues where the short one ended
        assert rest.gpu_frames == 50
        assert sample_rows(st, "gpu_up") == 200
