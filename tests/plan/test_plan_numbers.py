"""Planner numbers that read right: compare prices serving at a batch it names, fixes read as
cumulative, an MFU above 100 % is never printed plain, and the CLI's options are declared once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import typer

from gpulens.cli.main import main
from gpulens.mfu import format_mfu
from gpulens.plan import PlanRequest, compare
from gpulens.plan.request import PlanOptions


def test_compare_prices_serving_at_the_throughput_optimal_batch(isolated_plan_config: Path):
    isolated_plan_config.write_text("prices:\n  h100-sxm: 2.5\n  l40s: 1.0\n")
    req = PlanOptions(model="qwen2.5-7b", workload="infer").to_request("h100-sxm")
    at_best = compare(req, ["h100-sxm", "l40s"], batch_given=False).results
    at_one = compare(req, ["h100-sxm", "l40s"], batch_given=True).results
    for best, one in zip(at_best, at_one, strict=True):
        assert one.request.batch == 1 and "(--batch)" in one.cost_basis
        assert 1 < best.request.batch <= best.speed["max_batch_that_fits"]
        assert "throughput-optimal batch that fits" in best.cost_basis
        assert best.cost.per_million_tokens < one.cost.per_million_tokens / 10
        rows = [r for r in one.speed["by_batch"] if r["batch"] <= best.speed["max_batch_that_fits"]]
        assert best.speed["output_tokens_per_second"] >= max(r["output_tokens_per_second"] for r in rows)


def test_compare_text_names_the_batch(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    rc = main(["plan", "compare", "--model", "qwen2.5-7b", "--workload", "infer", "--gpu", "h100-sxm", "--tpot-target", "60ms"])
    out, _ = capsys.readouterr()
    assert rc == 0 and "batch" in out and "throughput-optimal batch that fits and meets the TPOT target" in out
    rc = main(["plan", "compare", "--model", "qwen2.5-7b", "--workload", "infer", "--gpu", "h100-sxm", "--batch", "4"])
    out, _ = capsys.readouterr()
    assert rc == 0 and "at batch 4 (--batch)" in out


def test_fixes_read_as_cumulative(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    rc = main(["plan", "--model", "llama-3-8b", "--gpu", "h100", "--batch", "4", "--seq", "4096"])
    out, _ = capsys.readouterr()
    assert rc == 0
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()[:2] in ("1.", "2.", "3.", "4.")]
    assert len(lines) >= 2
    assert "after" not in lines[0] and not lines[0].startswith("1. +")
    assert lines[1].startswith("2. + ") and "→ after 1–2: " in lines[1]


def test_compare_without_a_gpu_is_one_sentence(capsys):
    rc = main(["plan", "compare", "--model", "7b"])
    _, err = capsys.readouterr()
    assert rc == 2 and "No GPUs to compare" in err and "Traceback" not in err


def test_an_mfu_above_100_percent_says_it_is_impossible():
    assert format_mfu(0.42) == "42%"
    text = format_mfu(1.52)
    assert text.startswith("152%") and "impossible" in text and "FLOPs per token" in text and "peak" in text


def test_serving_on_n_gpus_of_one_replica_is_tensor_parallel_in_the_library():
    assert PlanOptions(model="7b", workload="serving", gpus=4).to_request("h100").tensor_parallel == 4
    assert PlanOptions(model="7b", workload="infer").to_request("h100").batch == 1
    assert PlanOptions(model="7b").to_request("h100").batch == 8
    assert PlanOptions(model="7b", workload="infer", tpot_target="50ms").to_request("h100").tpot_target_seconds == 0.05
    assert isinstance(PlanOptions(model="7b").to_request("h100"), PlanRequest)


def _options(cmd) -> dict[str, tuple[tuple[str, ...], str | None]]:
    return {p.name: (tuple(p.opts), p.help) for p in cmd.params if p.name in PlanOptions.names()}


def test_plan_and_compare_take_the_same_options_with_the_same_help():
    from gpulens.cli.main import app

    group = typer.main.get_command(app).commands["plan"]
    plan_opts, compare_opts = _options(group), _options(group.commands["compare"])
    assert set(plan_opts) == set(PlanOptions.names())
    assert compare_opts == plan_opts
    assert all(h for _, h in plan_opts.values())


# (sqlite3 anywhere outside store/ is refused by tests/foundation/test_store_layer.py, for every file)
@pytest.mark.parametrize("line,banned", [("from gpulens.store import Store", True), ("import gpulens.cli", True),
                                         ("from gpulens.plan.models import ModelSpec", False)])
def test_plan_may_not_import_the_store(line, banned):
    ruff = Path(sys.executable).with_name("ruff")
    if not ruff.exists():
        pytest.skip("ruff is not installed beside this Python")
    root = Path(__file__).resolve().parents[2]
    p = subprocess.run([str(ruff), "check", "--no-cache", "--select", "TID251", "--stdin-filename",
                        str(root / "src/gpulens/plan/_probe.py"), "-"], input=line + "\n", capture_output=True,
                       text=True, cwd=root, timeout=60)
    assert ("TID251" in p.stdout) is banned, p.stdout + p.stderr


def test_a_bare_size_heading_says_its_count_once(capsys):
    """'~7.00B (rough) (7.00B params)' said the count twice (QA); a preset keeps its name."""
    assert main(["plan", "--model", "7b", "--gpu", "h100-sxm"]) == 0
    head = " ".join(capsys.readouterr().out.split("\n")[:2])
    assert head.startswith("7.00B params (rough: LLaMA-like shapes guessed from the size) on") and head.count("7.00B") == 1
    assert main(["plan", "--model", "llama-3-8b", "--gpu", "h100-sxm"]) == 0
    assert capsys.readouterr().out.startswith("llama-3-8b (8.03B params) on")
