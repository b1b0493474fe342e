"""Terminal output at 80 columns and in a pipe: numbers whole (never "705.…"), no column dropped, no ANSI
codes, and --help examples one per line. Each runs the installed CLI with stdout a pipe and COLUMNS=80."""

from __future__ import annotations

import io
import re

import pytest
from clirun import run_gpulens
from rich.console import Console
from rich.table import Table

from gpulens.render import print_table

ANSI = "\x1b["


def _assert_plain_and_whole(out: str, width: int = 80) -> None:
    assert ANSI not in out, "a pipe must get plain text"
    assert "…" not in out, out
    too_wide = [line for line in out.splitlines() if len(line) > width]
    assert not too_wide, too_wide


def test_bench_serve_table_keeps_every_number_and_the_n_column(tmp_path):
    from local_server import slow_server

    with slow_server() as base:
        # ~100 ms answers, 1000 requests: six-character percentiles and a four-digit n, which made the
        # table 83 wide and rich cut it to "126.…" and "10…" at 80 columns
        r = run_gpulens("bench", "serve", "--url", f"{base}/slow?s=0.1", "--concurrency", "100",
                        "--requests", "1000", "--store", str(tmp_path / "b.db"), timeout=120)
    assert r.returncode == 0, r.stderr
    _assert_plain_and_whole(r.stdout)
    latency = next(t for t in (line.split() for line in r.stdout.splitlines()) if t[:1] == ["latency"] and len(t) == 9)
    assert latency[-1] == "1000"  # the n column is there, whole
    assert all(re.fullmatch(r"\d+\.\d\d", v) for v in latency[1:-1]), latency  # p50 … max, each whole
    header = next(line for line in r.stdout.splitlines() if "p99.9" in line).split()
    assert header == ["p50", "p90", "p95", "p99", "p99.9", "mean", "max", "n"]

    # the run it stored, listed: its name and summary whole (rich cut them to "127.0.0.1…", "achieved_…")
    runs = run_gpulens("runs", "list", "--store", str(tmp_path / "b.db"))
    assert runs.returncode == 0, runs.stderr
    assert ANSI not in runs.stdout and "…" not in runs.stdout, runs.stdout
    assert re.search(r"127\.0\.0\.1:\d+/slow", runs.stdout) and "achieved_rate=" in runs.stdout, runs.stdout


def test_plan_gpus_in_a_pipe_shows_every_column():
    r = run_gpulens("plan", "gpus")
    assert r.returncode == 0, r.stderr
    _assert_plain_and_whole(r.stdout)
    header = r.stdout.splitlines()[0].split()
    assert header == ["GPU", "GiB", "GB/s", "BF16", "FP8", "INT8", "interconnect", "TDP", "W", "price/h"]
    h200 = next(line for line in r.stdout.splitlines() if line.startswith("H200 "))
    assert "4,800" in h200 or re.search(r"\b\d,\d{3}\b", h200), h200  # bandwidth in full


def test_plan_models_in_a_pipe():
    r = run_gpulens("plan", "models")
    assert r.returncode == 0, r.stderr
    _assert_plain_and_whole(r.stdout)
    assert "32,000" in r.stdout and "heads" in r.stdout


def test_top_at_80_columns_keeps_util_temperature_and_clock():
    r = run_gpulens("top", "--backend", "fake:2", "--duration", "1", timeout=60)
    assert r.returncode == 0, r.stderr
    _assert_plain_and_whole(r.stdout)
    assert re.search(r"\b\d{1,3} %", r.stdout), r.stdout  # util
    assert re.search(r"\b\d{2,3} °C", r.stdout), r.stdout  # temperature, with its unit on the same line
    assert re.search(r"\b\d{3,4} MHz", r.stdout), r.stdout  # SM clock


def _examples_by_command() -> list[tuple[list[str], list[str]]]:
    import typer.main

    from gpulens.cli.main import app

    found = []

    def walk(cmd, path):
        lines = (cmd.help or "").splitlines()
        examples = [ln.strip().lstrip("•* ").strip() for ln in lines if ln.strip().lstrip("•*` ").startswith("gpulens ")]
        examples = [e.replace("`", "") for e in examples]
        if examples:
            found.append((path, examples))
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return found


@pytest.mark.parametrize(("path", "examples"), _examples_by_command(), ids=[" ".join(p) or "gpulens" for p, _ in _examples_by_command()])
def test_help_examples_keep_their_lines(path, examples):
    r = run_gpulens(*path, "--help")
    assert r.returncode == 0, r.stderr
    starts = [" ".join(line.strip().lstrip("•* ").split()) for line in r.stdout.splitlines()]
    for example in examples:
        head = " ".join(example.split()[:3])  # the first words; the rest may wrap at 80 columns
        assert any(s.startswith(head) for s in starts), (example, r.stdout)
    # and no line holds two examples run together
    assert not [s for s in starts if s.startswith("gpulens ") and s.count("gpulens ") > 1], r.stdout


def test_agent_help_spells_out_the_fault_syntax():
    r = run_gpulens("agent", "--help", columns=200)
    text = " ".join(r.stdout.replace("│", " ").split())
    assert "KIND[:ARG]@SECONDS[:gpu=N]" in text and "ecc:corrected=N" in text and "unsupported:FIELD" in text


def test_print_table_is_wider_than_the_console_rather_than_cut():
    """Numbers alone need 9 x 8 characters: at 40 columns the table must keep them all, not crop."""
    out = io.StringIO()
    console = Console(file=out, width=40, color_system=None)
    t = Table()
    t.add_column("what")
    for i in range(8):
        t.add_column(f"c{i}", justify="right")
    t.add_row("a long label that may fold", *[f"{1234567 + i:,}" for i in range(8)])
    print_table(console, t)
    text = out.getvalue()
    assert "…" not in text
    for i in range(8):
        assert f"{1234567 + i:,}" in text
