"""Hostile names (rich markup, matplotlib mathtext, HTML) from a trace, NVML or a user render as
text on every surface: no MarkupError, no styling, no mathtext crash (issue 18, point 6)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from gpulens.gpu.types import GpuProcess, GpuSample

HOSTILE = "[/x][bold red]evil $\\undefinedmacro{x$ <script>alert(1)</script>"
GPU_NAME = "NVIDIA [/x] $\\undefinedmacro{x$ <b>H200</b>"


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "250", "NO_COLOR": "1", "TERM": "dumb"}
    return subprocess.run([sys.executable, "-m", "gpulens.cli.main", *args], capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def hostile_store(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    rec = d / "rec.jsonl"
    head = {"format": "gpulens-recording", "version": 1, "gpus": [{"index": 0, "uuid": "GPU-[/x]", "name": GPU_NAME}]}
    lines = [head]
    for i in range(90):
        lines.append({"type": "sample", "t": 1_700_000_000.0 + i, "gpu": 0, "uuid": "GPU-[/x]", "name": GPU_NAME,
                      "temperature_celsius": 50 + i % 5, "utilization_gpu_ratio": 0.5,
                      "processes": [{"pid": 7, "name": HOSTILE, "used_memory_bytes": 2**30}]})
        if i == 45:
            lines.append({"type": "xid", "t": 1_700_000_000.0 + i, "gpu": 0, "uuid": "GPU-[/x]", "xid": 79})
    rec.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    db = d / "s.db"
    r = _cli("replay", str(rec), "--store", str(db), "--learn", "20s", "--job", HOSTILE, "--service", HOSTILE)
    assert r.returncode == 0, r.stderr
    from gpulens.store import Store
    from gpulens.store.alert_state import AlertRow, save_alert

    with Store(db) as st:  # an alert whose every text is hostile (a custom rule file could say so)
        save_alert(st, AlertRow(rule=HOSTILE, severity=HOSTILE, labels={"alertname": HOSTILE, "gpu": "[/x]"}, state="firing",
                                active_since=1_700_000_050.0, value=1.0, summary=HOSTILE, advice=HOSTILE, fingerprint="hostile"))
    return d, db, rec


def _clean(r: subprocess.CompletedProcess) -> str:
    out = r.stdout + r.stderr
    assert "Traceback" not in out and "MarkupError" not in out and "ParseException" not in out, out
    return out


def test_alerts_list(hostile_store):
    _, db, _ = hostile_store
    r = _cli("alerts", "list", "--store", str(db))
    assert r.returncode == 0
    out = _clean(r)
    assert "GpuXid" in out and "[/x][bold red]evil" in out


def test_note_and_runs(hostile_store):
    _, db, _ = hostile_store
    r = _cli("note", HOSTILE, "--store", str(db), "--job", HOSTILE)
    assert r.returncode == 0
    assert "[/x][bold red]evil" in " ".join(_clean(r).split())


def test_baseline_show(hostile_store):
    _, db, _ = hostile_store
    r = _cli("baseline", "show", "--store", str(db))
    assert r.returncode == 0
    out = _clean(r)
    assert "No baselines yet" in out or "[/x]" in out


def test_diagnose(hostile_store):
    _, db, _ = hostile_store
    r = _cli("diagnose", "--store", str(db))
    assert r.returncode == 0
    assert "[/x]" in _clean(r)  # the GPU fault finding names the model


def test_query(hostile_store):
    _, db, _ = hostile_store
    r = _cli("query", "gpu_temperature_celsius", "--store", str(db))
    assert r.returncode == 0
    assert "[/x]" in _clean(r)


def test_report_html_and_md(hostile_store):
    d, db, _ = hostile_store
    for out in (d / "r.html", d / "r.md"):
        r = _cli("report", "--store", str(db), "--out", str(out))
        assert r.returncode == 0, r.stderr
        _clean(r)
        text = out.read_text()
        assert "<script>alert(1)</script>" not in text and "<b>H200</b>" not in text


def test_a_bad_error_message_is_still_one_sentence(tmp_path):
    r = _cli("alerts", "list", "--store", str(tmp_path / "[/x]" / "nope.db"))
    assert r.returncode == 2
    assert "[/x]" in _clean(r)


def test_top_renders_hostile_process_and_gpu_names():
    from rich.console import Console

    from gpulens.cli.top import render

    s = GpuSample(t=1.0, gpu=0, uuid="u", name=GPU_NAME, utilization_gpu_ratio=0.5,
                  processes=[GpuProcess(pid=7, name=HOSTILE, used_memory_bytes=2**30)])
    lost = GpuSample(t=1.0, gpu=1, uuid="v", name=HOSTILE, lost=True)
    console = Console(file=io.StringIO(), width=300, record=True, color_system=None)
    console.print(render([s, lost], {0: [0.5], 1: []}, host="[/x]host"))
    text = console.export_text()
    assert "[/x]" in text and "[bold red]evil" in text


def test_chart_labels_with_mathtext_draw():
    pytest.importorskip("matplotlib")
    from gpulens.report.plots import chart_png
    from gpulens.views.data import ChartOut, SeriesOut, Window

    series = SeriesOut(label=HOSTILE, metric="m", labels={"gpu": "[/x]"}, t=[1.7e9, 1.7e9 + 60], v=[1.0, 2.0])
    chart = ChartOut(id="c", title=GPU_NAME, unit="ratio", help="", series=[series])
    assert chart_png(chart, Window(1.7e9, 1.7e9 + 60)).startswith(b"\x89PNG")


ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x1b[31mred\x9b"  # retitle the window, clear the screen, colour, a C1 CSI


def test_control_characters_in_names_are_shown_not_obeyed(tmp_path):
    """A job name or a note with terminal escapes prints as caret text (^[), on every console."""
    db = tmp_path / "s.db"
    trace = os.path.join(os.path.dirname(__file__), "..", "..", "src", "gpulens", "data", "h200-trace")
    r = _cli("replay", trace, "--store", str(db), "--job", "job" + ESCAPES)
    assert r.returncode == 0, r.stderr
    for args in (("note", "changed" + ESCAPES, "--store", str(db)), ("diagnose", "--store", str(db)),
                 ("energy", "--store", str(db)), ("runs", "list", "--store", str(db))):
        r = _cli(*args)
        assert r.returncode == 0, (args, r.stderr)
        out = r.stdout + r.stderr
        assert "\x1b" not in out and "\x9b" not in out, (args, out[-400:])
    assert "^[]0;pwned" in _cli("diagnose", "--store", str(db)).stdout


def test_the_consoles_keep_their_own_styling():
    """What is hidden is text's control characters, not rich's colours on a terminal."""
    from gpulens.cli.common import _console

    c = _console(file=io.StringIO(), force_terminal=True, color_system="standard", width=80)
    c.print("[red]warm[/red] " + ESCAPES, highlight=False)
    out = c.file.getvalue()
    assert "\x1b[31m" in out and "warm" in out  # rich's style
    assert "^[]0;pwned" in out and "^[[2J" in out and "\x1b]0" not in out
