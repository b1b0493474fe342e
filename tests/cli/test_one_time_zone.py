"""One zone for every time a command prints: UTC, labelled, whatever the machine's TZ. It is the zone a
time typed without one is read in, so a time copied from one output means the same instant in another
and when typed back. Each command runs as a subprocess under a zone other than UTC and under UTC."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import pytest
from clirun import run_gpulens

from gpulens.cli.main import main
from gpulens.runs import save_run
from gpulens.store import Store

# A POSIX TZ string needs no zone database, so the local clock differs from UTC on any host; the
# half hour (local = UTC - 5:30) also catches a time that would only be off by whole hours.
OTHER_ZONE = "XST+05:30"
DAY_SECOND = "%Y-%m-%d %H:%M:%S"


def _utc(t: float, fmt: str = DAY_SECOND) -> str:
    return datetime.fromtimestamp(t, UTC).strftime(fmt)


@pytest.fixture(scope="module")
def replayed(tmp_path_factory, h200_trace):
    """The bundled H200 session with its alerts, and a run that ended at the model's cold start:
    one instant (the cold start) that diagnose, query and runs list all print."""
    db = tmp_path_factory.mktemp("one-zone") / "s.db"
    assert main(["replay", str(h200_trace), "--store", str(db), "--speed", "max", "--learn", "3s"]) == 0
    with Store(db) as st:
        (cold,) = st.query("infer_cold_start_seconds")
        t = float(cold.t[0])
        save_run(st, "bench-train", "small", {"batch": 8}, {"step_seconds_median": 0.2}, fingerprint={}, started=t - 60, ended=t)
    return db, t


def _out(*args: str, tz: str) -> str:
    r = run_gpulens(*args, columns=200, extra_env={"TZ": tz})
    assert r.returncode == 0, (args, r.stderr)
    return r.stdout


@pytest.mark.parametrize("command", [("diagnose",), ("alerts", "list"), ("runs", "list"), ("query", "infer_cold_start_seconds")],
                         ids=" ".join)
def test_a_command_prints_the_same_text_in_any_local_zone(replayed, command):
    db, _ = replayed
    assert _out(*command, "--store", str(db), tz=OTHER_ZONE) == _out(*command, "--store", str(db), tz="UTC")


def test_one_instant_reads_alike_in_every_command_with_its_zone(replayed):
    db, t = replayed
    store = ("--store", str(db))

    diag = _out("diagnose", *store, tz=OTHER_ZONE)
    (cold,) = [f for f in json.loads(_out("diagnose", *store, "--format", "json", tz=OTHER_ZONE)) if f["kind"] == "cold_start"]
    assert cold["end"] == pytest.approx(t)  # JSON keeps unix seconds
    assert f"{_utc(cold['start'])} → {_utc(t, '%H:%M:%S')} UTC (" in diag, diag

    query = _out("query", "infer_cold_start_seconds", *store, tz=OTHER_ZONE)
    assert "time (UTC)" in query and _utc(t, DAY_SECOND + ".%f")[:-3] in query, query

    runs = _out("runs", "list", *store, tz=OTHER_ZONE)
    assert "when (UTC)" in runs and _utc(t, "%Y-%m-%d %H:%M") in runs, runs

    alerts = _out("alerts", "list", *store, tz=OTHER_ZONE)
    first = json.loads(_out("alerts", "list", *store, "--format", "json", tz=OTHER_ZONE))[0]
    assert f"{_utc(first['fired_at'])} → {_utc(first['resolved_at'], '%H:%M:%S')} UTC" in alerts, alerts


def test_a_time_typed_without_a_zone_is_printed_back_as_typed(replayed):
    """`--start 2026-11-30T01:29:00` is read as UTC; what diagnose prints then starts there, not 5:30 away."""
    db, _ = replayed
    diag = _out("diagnose", "--store", str(db), "--start", "2026-11-30T01:29:00", tz=OTHER_ZONE)
    spans = re.findall(r"^ {3}(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)( → [\d:]+)? UTC", diag, re.M)
    assert spans and all("2026-11-30 01:29:00" <= start < "2026-11-30 01:31" for start, _ in spans), diag
