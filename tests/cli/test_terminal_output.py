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
    assert not re.search(r"\S…", out), out  # a cut cell ("126.…", "defaul…"); " … " joins an interval
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


def test_an_interval_of_extreme_values_folds_after_its_separator_to_fit_80():
    """Two tiny CPU runs on a loaded machine compare at -98.5 % and +1718.9 %: kept on one line, the
    interval "+1089.7% … +15210.5%" made `gpulens compare` wider than 80 columns."""
    out = io.StringIO()
    console = Console(file=out, width=80, color_system=None)
    t = Table()
    for col in ("metric", "A median n=6", "B median n=6", "change", "95 % CI", "p", "verdict"):
        t.add_column(col, justify="right" if col not in ("metric", "verdict") else "left")
    t.add_row("step_seconds ↓ better", "0.2516", "0.003893", "-98.5%", "-99.4% … -58.4%", "0.0022", "improvement")
    t.add_row("tokens_per_second ↑ better", "906", "16,479", "+1718.9%", "+1089.7% … +15210.5%", "0.0022", "improvement")
    print_table(console, t)
    _assert_plain_and_whole(out.getvalue())
    lines = out.getvalue().splitlines()
    assert any(line.rstrip().endswith("+1089.7% … 0.0022 improvement") for line in lines), lines
    assert any(line.split() == ["↑", "better", "+15210.5%"] for line in lines), lines


# ---------------------------------------------------------------- every surface, one test each (issue 26)
TINY_TRAIN = ["--size", "tiny", "--seq-len", "32", "--batch-size", "2", "--warmup", "1", "--steps", "6",
              "--precision", "fp32", "--device", "cpu"]
PYTHON_LEAKS = [
    (re.compile(r"\bNone\b"), "Python's None"),
    (re.compile(r"\{'"), "a dict repr"),
    (re.compile(r"\bnan\b", re.I), "nan"),
    (re.compile(r"\d\.\d{5,}"), "an unformatted long float"),
]


@pytest.fixture(scope="module")
def session_store(tmp_path_factory):
    """The bundled H200 session imported as `gpulens demo` does, with its summary printed."""
    db = tmp_path_factory.mktemp("session") / "s.db"
    demo = run_gpulens("demo", "--store", str(db), "--duration", "1s", "--dashboard", "off", "--listen", "127.0.0.1:0",
                       timeout=180)
    assert demo.returncode == 0, demo.stderr
    return db, demo.stdout


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    # the CLI jobs of .ci/run install no torch; `make test` has it and runs these
    pytest.importorskip("torch", reason="two training runs need the torch extra")
    db = tmp_path_factory.mktemp("runs") / "r.db"
    for name in ("base", "second"):
        r = run_gpulens("bench", "train", *TINY_TRAIN, "--store", str(db), "--name", name, timeout=180)
        assert r.returncode == 0, r.stderr
    return db


def _surfaces(db, tmp):
    report = tmp / "x.md"
    return {
        "diagnose": ["diagnose", "--store", str(db)],
        "report": ["report", "--store", str(db), "--out", str(report)],
        "query": ["query", "gpu_utilization_ratio", "--store", str(db), "--max-points", "5"],
        "runs list": ["runs", "list", "--store", str(db)],
        "plan": ["plan", "--model", "llama-3-8b", "--workload", "train", "--gpu", "h100-sxm", "--batch", "4", "--seq", "4096"],
        "energy": ["energy", "--store", str(db)],
        "scale": ["scale", "--store", str(db)],
    }, report


def test_no_none_dict_repr_nan_or_long_float_reaches_a_person(session_store, tmp_path):
    """'steps since previous checkpoint: None' reached the report; grep every surface's output."""
    db, demo_out = session_store
    surfaces, report = _surfaces(db, tmp_path)
    outputs = {"demo summary": demo_out}
    for name, args in surfaces.items():
        r = run_gpulens(*args, timeout=120)
        assert r.returncode in (0, 1), (name, r.stderr)
        outputs[name] = r.stdout + r.stderr
    outputs["report --out x.md"] = report.read_text()
    found = [(name, what, m.group(0), text[max(0, m.start() - 60):m.end() + 20])
             for name, text in outputs.items() for rx, what in PYTHON_LEAKS for m in [rx.search(text)] if m]
    assert not found, found


def test_the_demo_import_line_adds_up_to_its_total(session_store):
    """'291 workload records' beside a breakdown that added to 232."""
    _, out = session_store
    text = " ".join(out.split())
    m = re.search(r"imported ([\d,]+) GPU samples and ([\d,]+) workload records \(([^)]*)\)", text)
    assert m, out
    parts = [int(p.split()[0].replace(",", "")) for p in m.group(3).split(", ")]
    assert sum(parts) == int(m.group(2).replace(",", ""))


def test_query_json_names_each_aggregate_and_matches_a_hand_computation(session_store):
    """`--since 15m --format json` gave one point labelled 1m whose value was the mean of three minutes."""
    db, _ = session_store
    r = run_gpulens("query", "train_step_seconds", "--store", str(db), "--since", "15m", "--max-points", "3",
                    "--format", "json")
    assert r.returncode == 0, r.stderr
    import json

    from gpulens.store import Store

    (series,) = json.loads(r.stdout)
    agg = series["aggregate"]
    assert agg["function"] == "mean" and agg["window_seconds"] > 0 and agg["read_from"]
    with Store(db, readonly=True) as st:
        (raw,) = st.query("train_step_seconds")
    assert len(series["points"]) == 3  # the data's span in three windows, not one wide bucket
    assert agg["window_seconds"] == pytest.approx((raw.t[-1] - raw.t[0]) / 3, abs=1e-3)
    # by hand: each window's mean and count from the raw samples
    assert sum(series["samples"]) == len(raw)
    total = sum(m * n for (_, m), n in zip(series["points"], series["samples"], strict=True))
    assert total == pytest.approx(sum(raw.value), rel=1e-9)
    raw_only = json.loads(run_gpulens("query", "train_step_seconds", "--store", str(db), "--format", "json").stdout)
    assert raw_only[0]["aggregate"] is None and len(raw_only[0]["points"]) == len(raw)


def test_a_folder_as_store_is_one_sentence_naming_the_file(session_store):
    db, _ = session_store
    r = run_gpulens("diagnose", "--store", str(db.parent))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "is a folder" in r.stderr and str(db) in r.stderr.replace("\n", "") and "I/O" not in r.stderr, r.stderr


WIDE_TABLES = {
    "plan compare": ["plan", "compare", "--model", "qwen2.5-7b", "--workload", "infer", "--gpu", "a100-80gb",
                     "--gpu", "h100-sxm", "--gpu", "l40s"],
    # the replica plan under latency targets, with a GPU that cannot meet them (its reason line too)
    "plan compare replicas": ["plan", "compare", "--model", "qwen2.5-7b", "--workload", "infer", "--runtime", "vllm",
                              "--gpu", "a100-80gb", "--gpu", "h100-sxm", "--gpu", "l40s", "--gpu", "l4",
                              "--target-rps", "20", "--ttft-target", "40ms", "--tpot-target", "30ms"],
    "plan calibrate": ["plan", "calibrate", "--measurements", "bundled", "--dry-run"],
    "runs list": ["runs", "list", "--store", "{runs}"],
    "compare": ["compare", "1", "2", "--store", "{runs}", "--no-record"],
}


@pytest.mark.parametrize("name", list(WIDE_TABLES))
def test_every_table_fits_80_columns_in_a_pipe(name, two_runs):
    """plan compare was 94–96 wide, runs list 103, compare 84 with its interval over three lines,
    plan calibrate cut headers to 'defaul…'."""
    r = run_gpulens(*[a.replace("{runs}", str(two_runs)) for a in WIDE_TABLES[name]], timeout=120)
    assert r.returncode in (0, 1), r.stderr
    _assert_plain_and_whole(r.stdout)
    if name == "compare":
        assert re.search(r"[-+]\d+\.\d% … [-+]\d+\.\d%", r.stdout), r.stdout  # the interval on one line
    if name == "plan calibrate":
        assert "defaults" in r.stdout
    if name == "plan compare replicas":
        assert "Replica plan" in r.stdout and "bound by" in r.stdout and "L4: cannot meet" in r.stdout


def test_top_at_60_columns_says_which_columns_it_hid():
    r = run_gpulens("top", "--backend", "fake:2", "--duration", "1", columns=60, timeout=60)
    assert r.returncode == 0, r.stderr
    _assert_plain_and_whole(r.stdout, width=60)
    assert re.search(r"\b\d{1,3} %", r.stdout) and re.search(r"\b\d{2,3} °C", r.stdout), r.stdout
    caption = " ".join(r.stdout.split())
    assert "hidden at 60 columns: history (util)" in caption, r.stdout
