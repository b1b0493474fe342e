"""A trace import skips what it cannot read (by line number), imports exactly once, and never
lets a broken line or file out as a traceback (issue 18, points 1 to 3)."""

from __future__ import annotations

import json

import pytest
from tracelib import h200_lines, sample_rows, write_trace

from gpulens import ReplayBackend, TraceError
from gpulens.pipeline.ingest import import_trace
from gpulens.store import Store

# Each line breaks one field the way the issue found it breaking the whole import.
BAD_LINES = {
    "temp_c is text": lambda d: {**d, "temp_c": "hot"},
    "time past float range": lambda d: {**d, "t": 10**400},
    "float clock mask": lambda d: {**d, "clk_reasons": 4.5},
    "NaN time": lambda d: {**d, "t": float("nan")},
    "infinite time": lambda d: {**d, "t": float("inf")},
    "time 1e300": lambda d: {**d, "t": 1e300},
    "negative time": lambda d: {**d, "t": -5.0},
    "infinite power": lambda d: {**d, "power_mw": float("inf")},
    "procs with text pid": lambda d: {**d, "procs": [{"pid": "x", "name": "p"}]},
    "errs not an object": lambda d: {**d, "errs": [1, 2]},
    "bool as a number": lambda d: {**d, "gpu_util": True},
}


def _bad(line: str, how) -> str:
    # json.dumps writes NaN/Infinity, which json.loads reads back: the trace says what it says
    return json.dumps(how(json.loads(line)))


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_a_bad_field_skips_its_line_only(tmp_path, h200_trace, case):
    good = h200_lines(h200_trace, 9)
    lines = good[:4] + [_bad(good[4], BAD_LINES[case])] + good[5:]
    folder = write_trace(tmp_path / "t", lines, h200_trace)
    with Store(tmp_path / "s.db") as st:
        summary = import_trace(folder, st)
        assert summary.gpu_frames == 8
        assert summary.skipped_lines == 1
        assert summary.skipped[0].line == 5
        assert sample_rows(st, "gpu_up") == 8
        rng = st.time_range()
    assert rng is not None and rng[1] < 4e9  # nothing absurd reached the store


def test_deep_nesting_and_non_objects_are_skipped(tmp_path, h200_trace):
    good = h200_lines(h200_trace, 3)
    lines = [good[0], "[" * 100_000 + "]" * 100_000, "42", '"text"', "{broken", good[1], good[2]]
    rb = ReplayBackend(write_trace(tmp_path / "t", lines))
    n = 0
    while not rb.exhausted:
        n += len(rb.sample())
    assert n == 3
    assert [s.line for s in rb.skipped] == [2, 3, 4, 5]


@pytest.mark.parametrize("content", [
    bytes(range(256)) * 50,
    "\n".join(['{"t": 1}'] * 3).encode("utf-16"),
    b"\x00\x01garbage\n" * 1000,
], ids=["binary", "utf16", "nul-garbage"])
def test_a_file_that_yields_nothing_is_a_clear_error(tmp_path, content):
    (tmp_path / "telemetry.jsonl").write_bytes(content)
    with pytest.raises(TraceError) as err, Store(tmp_path / "s.db") as st:
        import_trace(tmp_path, st)
    assert err.value.exit_code == 2
    assert "UTF-16" in str(err.value) or "no readable sample" in str(err.value)


def test_garbage_says_what_its_first_bad_lines_were(tmp_path):
    (tmp_path / "telemetry.jsonl").write_text('{"t": "soon"}\n{"t": 1e999}\nnot json\n')
    with pytest.raises(TraceError, match=r"line 1: t is 'soon'.*line 2: t is inf.*line 3: not a JSON object"):
        ReplayBackend(tmp_path)


def test_an_events_file_given_as_the_trace_is_refused_not_read_as_gpus(tmp_path, h200_trace):
    """events.jsonl handed over as the telemetry: its lines have a time, which made each of them a
    GPU sample with no readings (an invented GPU that was up) and the import said it succeeded."""
    with pytest.raises(TraceError, match="a file of workload events") as err, Store(tmp_path / "s.db") as st:
        import_trace(h200_trace / "events.jsonl", st)
    assert err.value.exit_code == 2 and "telemetry.jsonl" in str(err.value)
    (tmp_path / "t.jsonl").write_text('{"t": 1796002115.4}\n{"t": 1796002116.4, "mem_total": 1e9}\n')
    with pytest.raises(TraceError, match="line 1: no GPU reading"):
        ReplayBackend(tmp_path / "t.jsonl")


@pytest.mark.parametrize("header", [
    {"format": "gpulens-recording", "version": 1, "gpus": "eight"},
    {"format": "gpulens-recording", "version": 1, "gpus": [{"index": "zero", "uuid": "u", "name": "n"}]},
    {"format": "gpulens-recording", "version": 1, "gpus": [7]},
])
def test_a_broken_recording_header_is_a_clear_error(tmp_path, header):
    path = tmp_path / "rec.jsonl"
    path.write_text(json.dumps(header) + "\n" + json.dumps({"type": "sample", "t": 1.0, "gpu": 0}) + "\n")
    with pytest.raises(TraceError, match="header"):
        ReplayBackend(path)


def test_recording_fields_are_checked_against_their_types(tmp_path):
    head = {"format": "gpulens-recording", "version": 1, "gpus": [{"index": 0, "uuid": "u", "name": "n"}]}
    rows = [
        {"type": "sample", "t": 100.0, "gpu": 0, "temperature_celsius": 50},
        {"type": "sample", "t": 101.0, "gpu": 0, "temperature_celsius": "hot"},
        {"type": "sample", "t": 102.0, "gpu": 0, "clock_event_mask": 1.5},
        {"type": "sample", "t": 103.0, "gpu": 0, "processes": [{"pid": 1, "name": "a", "used_memory_bytes": 5}]},
        {"type": "xid", "t": 104.0, "gpu": 0, "xid": "79"},
        {"type": "xid", "t": 105.0, "gpu": 0, "xid": 79},
    ]
    path = tmp_path / "rec.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [head, *rows]) + "\n")
    rb = ReplayBackend(path)
    got = []
    while not rb.exhausted:
        got.extend(rb.sample())
    assert [s.t for s in got] == [100.0, 103.0]
    assert got[1].processes[0].pid == 1
    assert [s.line for s in rb.skipped] == [3, 4, 6]
    assert [x.xid for x in rb.drain_xid_events()] == [79]


def test_bad_workload_records_are_skipped_and_counted(tmp_path, h200_trace):
    good = h200_lines(h200_trace, 5)
    t0 = json.loads(good[0])["t"]
    events = [
        {"kind": "phase", "name": "idle", "t": t0},
        {"kind": "phase", "name": "x", "t": float("inf")},
        {"kind": "phase", "name": "y", "t": 10**400},
        {"kind": "phase", "name": "z", "t": True},
        {"kind": "train_step", "t": t0 + 0.1, "step": "one", "t_start": "then", "t_end": t0 + 0.2},
    ]
    folder = write_trace(tmp_path / "t", good, h200_trace, events=events)
    with Store(tmp_path / "s.db") as st:
        summary = import_trace(folder, st)
        assert summary.events.get("phase") == 1
        assert summary.skipped_events >= 3
        assert all(e.t < 4e9 for e in st.events())


def test_workload_values_no_store_keeps_skip_their_record_not_a_sample(tmp_path, h200_trace):
    """A cold start of -1e300 s passed the importer; the store then dropped its sample with a
    timestamped warning, and the summary counted nothing. Now the record is skipped and counted, and
    a count no step can have (a batch of -2**63 - 1) is read as not measured."""
    good = h200_lines(h200_trace, 5)
    t0 = json.loads(good[0])["t"]
    events = [
        {"kind": "cold_start", "model": "m", "seconds": -1e300, "t": t0},
        {"kind": "mem", "t": t0, "alloc": 1e400},
        {"kind": "infer_gauges", "t": t0, "in_flight": -1e30},
        {"kind": "train_eval", "t": t0, "seconds": -3},
        {"kind": "train_step", "t_start": t0, "t_end": t0 + 0.5, "step": 1, "batch": -9223372036854775809, "tokens": 8192},
    ]
    folder = write_trace(tmp_path / "t", good, h200_trace, events=events)
    with Store(tmp_path / "s.db") as st:
        summary = import_trace(folder, st)
        assert summary.skipped_events == 4 and summary.events.get("train_step") == 1
        assert st.refused_count == 0
        assert not st.series("infer_cold_start_seconds") and st.series("train_step_seconds")


class _Interrupt(BaseException):
    pass


@pytest.mark.parametrize("stop", [KeyboardInterrupt, _Interrupt])
def test_an_interrupted_import_keeps_whole_frames_and_a_rerun_imports_the_rest_once(tmp_path, h200_trace, stop):
    """Batches committed along the way used to stay behind while the marker did not: the rerun
    then stored them twice. Now each batch commits with the trace claim's position: the frames
    before the interruption stay (never half of the one it cut), and the rerun adds only the rest."""
    db = tmp_path / "s.db"
    with Store(db) as st:
        full = import_trace(h200_trace, st)
        want_up, want_events = sample_rows(st, "gpu_up"), len(st.events())
    want_series = _every_series(db)
    db.unlink()

    def interrupt(frames: int) -> None:
        if frames >= 300:
            raise stop()

    with Store(db, batch_size=200) as st:  # several batches flushed before the interruption
        with pytest.raises(stop):
            import_trace(h200_trace, st, on_progress=interrupt)
        assert sample_rows(st, "gpu_up") == 299  # frame 300 was cut short by the interruption: none of it
    with Store(db, batch_size=200) as st:
        again = import_trace(h200_trace, st)
        assert again.gpu_frames == full.gpu_frames - 299
        assert again.lines_already_imported == 299
        assert sample_rows(st, "gpu_up") == want_up
        assert len(st.events()) == want_events
        assert import_trace(h200_trace, st).already_imported
    # the same store as one whole import: every series with its labels (the served model's, taken
    # from a cold start before the cut), its sample count and sum (MFU needs the job's size, also
    # stated before the cut)
    assert _every_series(db) == want_series


def _every_series(db) -> list[tuple]:  # noqa: ANN001
    import sqlite3

    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT s.name, s.labels, count(*), round(sum(x.value), 6) FROM samples x "
                            "JOIN series s ON s.id = x.series_id GROUP BY s.name, s.labels ORDER BY s.name, s.labels").fetchall()


def test_a_stopped_import_is_said_and_continued_by_the_next(tmp_path, h200_trace):
    """A signal handler that stops the loop (rather than raising) must not leave the trace marked
    as imported: the import says it stopped, and the next one imports the rest, once."""
    from gpulens.pipeline import node as node_mod

    real_build = node_mod.build_node

    def build_and_stop(config, **kw):
        n = real_build(config, **kw)
        original = n.loop.tick

        def tick():
            frame = original()
            if n.loop.stats.ticks >= 50:
                n.loop.stop()
            return frame

        n.loop.tick = tick
        return n

    import gpulens.pipeline.ingest as ingest

    ingest.build_node = build_and_stop
    try:
        with Store(tmp_path / "s.db") as st, pytest.raises(TraceError, match="stopped before its end"):
            import_trace(h200_trace, st)
    finally:
        ingest.build_node = real_build
    with Store(tmp_path / "s.db") as st:
        assert sample_rows(st, "gpu_up") == 50
        rest = import_trace(h200_trace, st)
        assert not rest.already_imported and rest.gpu_frames == 995 - 50
        assert sample_rows(st, "gpu_up") == 995


def test_a_byte_order_mark_is_not_a_bad_first_line(tmp_path, h200_trace):
    """Windows editors start a UTF-8 file with a BOM: the first sample was skipped as 'not a JSON object'."""
    lines = h200_lines(h200_trace, 30)
    folder = write_trace(tmp_path / "t", lines, h200_trace)
    tel = folder / "telemetry.jsonl"
    tel.write_bytes(b"\xef\xbb\xbf" + tel.read_bytes())
    with Store(tmp_path / "s.db") as st:
        summary = import_trace(folder, st)
    assert summary.skipped_lines == 0 and summary.gpu_frames == 30
