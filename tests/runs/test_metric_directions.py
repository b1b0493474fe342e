"""Which way is better comes from one registry (`gpulens.vocab.directions`), and `compare` uses it:
scores get a non-inferiority test with a margin, unknown names are never called better or worse."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

import gpulens
from gpulens.bench.compare import compare_samples
from gpulens.cli.main import main
from gpulens.runs import save_run
from gpulens.store import Store
from gpulens.vocab.directions import HIGHER, LOWER, UNKNOWN, direction_of, lookup, worse_when


@pytest.mark.parametrize(("name", "direction"), [
    ("train_step_seconds", LOWER), ("train_samples_per_second", HIGHER), ("tokens_per_second", HIGHER),
    ("accuracy", HIGHER), ("exact_match", HIGHER), ("f1", HIGHER), ("eval_accuracy", HIGHER),
    ("perplexity", LOWER), ("loss", LOWER), ("val_loss", LOWER), ("latency_seconds", LOWER), ("ttft_seconds", LOWER),
    ("p99_latency", LOWER), ("requests_per_second", HIGHER), ("goodput", HIGHER), ("peak_memory_bytes", LOWER),
    ("my_custom_thing", UNKNOWN), ("widgets", UNKNOWN),
])
def test_registry_directions(name, direction):
    assert direction_of(name) == direction


def test_scores_are_marked_and_units_come_along():
    assert lookup("accuracy").score and lookup("exact_match").score and not lookup("loss").score
    assert lookup("train_step_seconds").unit == "s" and lookup("tokens_per_second").unit == "1/s"
    assert lookup("widgets", {"widgets": HIGHER}).direction == HIGHER


def test_learned_alert_rules_fire_on_the_bad_side_of_each_band():
    """Each packed rule `X > upper_band(S)` must watch a lower-is-better S, `X < lower_band(S)` a
    higher-is-better one: the packs and the registry cannot disagree about which side is bad."""
    packs = Path(gpulens.__file__).parent / "alerts" / "packs"
    found = 0
    for f in packs.glob("*.yaml"):
        for rule in yaml.safe_load(f.read_text())["rules"]:
            firing = rule["expr"].split(" unless ")[0]  # what follows `unless` only silences the rule
            for op, band, series in re.findall(r"(>|<)=?\s*(upper|lower)_band\((\w+)", firing):
                found += 1
                assert (op, band) in ((">", "upper"), ("<", "lower")), f"{rule['name']}: {op} {band}_band({series})"
                assert worse_when(series) == ("above" if band == "upper" else "below"), f"{rule['name']}: {series}"
    assert found >= 5


def test_report_baseline_rows_say_better_or_worse_from_the_registry():
    from gpulens.report.build import BaselineRow

    def row(series: str, value: float, baseline: float) -> BaselineRow:
        return BaselineRow("p", "s", "seconds", value, baseline, direction_of(series))

    assert row("train_tokens_per_second", 90.0, 100.0).verdict_text == "worse"
    assert row("train_step_seconds", 0.18, 0.20).verdict_text == "better"
    assert row("infer_request_latency_seconds", 0.3, 0.2).verdict_text == "worse"
    assert row("gpu_utilization_ratio", 0.5, 0.9).verdict_text == ""  # which way is better depends on the job
    assert row("train_step_seconds", 0.2, 0.2).verdict_text == ""


def _item_scores(correct: int, n: int) -> list[float]:
    return [1.0] * correct + [0.0] * (n - correct)


def test_accuracy_drop_is_a_regression_beyond_the_margin():
    r = compare_samples("accuracy", _item_scores(330, 500), _item_scores(300, 500))
    assert r.test == "non-inferiority" and r.verdict == "regression", r.reason
    assert r.difference == pytest.approx(-0.06) and r.ci95_low < -0.01 < r.ci95_high + 0.05
    assert "margin 0.01" in r.reason and "95 % CI" in r.reason


def test_accuracy_within_the_margin_on_a_large_eval_is_no_change():
    r = compare_samples("accuracy", _item_scores(33_000, 50_000), _item_scores(32_950, 50_000))
    assert r.verdict == "no change" and r.ci95_low > -0.01, r.reason


def test_accuracy_gain_beyond_the_margin_is_an_improvement_and_per_seed_scores_use_welch():
    rng = np.random.default_rng(2)
    a = (0.60 + rng.normal(0, 0.003, 8)).tolist()
    b = (0.66 + rng.normal(0, 0.003, 8)).tolist()
    r = compare_samples("accuracy", a, b)
    assert r.verdict == "improvement" and r.ci95_low > 0.01, r.reason
    assert compare_samples("accuracy", b, a).verdict == "regression"


def test_per_seed_scores_that_never_vary_draw_no_interval():
    """[0.7, 0.7] against [0.7, 0.7] was the interval [0, 0] and 'no change' (non-inferior): no
    spread between seeds shows nothing about how much a score varies, so there is no verdict."""
    r = compare_samples("accuracy", [0.7, 0.7], [0.7, 0.7])
    assert r.verdict == "not enough data" and r.ci95_low is None and "no interval can be drawn" in r.reason
    r = compare_samples("accuracy", [0.7, 0.7, 0.7], [0.71, 0.69, 0.7])  # one side varies: Welch has a spread
    assert r.verdict in ("no change", "regression") and r.ci95_low < r.ci95_high


def test_lower_is_better_score_uses_the_other_side():
    # perplexity is not a 0-1 score: the ordinary median test, where a rise is a regression
    a, b = [5.0, 5.1, 5.2, 5.0, 5.1, 5.05], [6.0, 6.1, 6.2, 6.0, 6.1, 6.05]
    assert compare_samples("perplexity", a, b).verdict == "regression"
    assert compare_samples("perplexity", b, a).verdict == "improvement"


def test_unknown_direction_is_never_a_regression_without_direction():
    a, b = [5.0, 5.1, 5.2, 5.0, 5.1, 5.05], [6.0, 6.1, 6.2, 6.0, 6.1, 6.05]
    r = compare_samples("widgets", a, b)
    assert r.verdict == "direction unknown" and "--direction widgets=higher" in r.reason
    assert compare_samples("widgets", a, b, direction=HIGHER).verdict == "improvement"
    assert compare_samples("widgets", a, b, direction=LOWER).verdict == "regression"


@pytest.fixture
def eval_runs(store_path):
    with Store(store_path) as st:
        a = save_run(st, "eval", "mmlu", {"quant": "bf16"}, {}, {"accuracy": _item_scores(330, 500)})
        b = save_run(st, "eval", "mmlu", {"quant": "int4"}, {}, {"accuracy": _item_scores(300, 500)})
        c = save_run(st, "eval", "mmlu", {}, {}, {"widgets": [5.0, 5.1, 5.2, 5.0, 5.1, 5.05]})
        d = save_run(st, "eval", "mmlu", {}, {}, {"widgets": [6.0, 6.1, 6.2, 6.0, 6.1, 6.05]})
    return store_path, a, b, c, d


def test_compare_cli_accuracy_drop_exits_1_with_margin_and_interval(eval_runs, capsys):
    db, a, b, _, _ = eval_runs
    assert main(["compare", str(a), str(b), "--store", str(db)]) == 1
    out = capsys.readouterr().out
    assert "regression" in out and "improvement" not in out
    assert "margin 0.01" in out and "95 % CI" in out and "-0.0600" in out
    # a wide enough margin accepts the drop
    assert main(["compare", str(a), str(b), "--store", str(db), "--margin", "0.2", "--format", "json", "--no-record"]) == 0
    m = json.loads(capsys.readouterr().out)["metrics"][0]
    assert m["test"] == "non-inferiority" and m["verdict"] == "no change" and m["margin"] == 0.2


def test_compare_cli_unknown_direction_needs_direction(eval_runs, capsys):
    db, _, _, c, d = eval_runs
    assert main(["compare", str(c), str(d), "--store", str(db), "--no-record"]) == 0
    out = capsys.readouterr().out
    assert "direction unknown" in out and "--direction widgets=higher" in out.replace("\n", "")
    assert main(["compare", str(c), str(d), "--store", str(db), "--direction", "widgets=lower", "--no-record"]) == 1
    capsys.readouterr()
    assert main(["compare", str(c), str(d), "--store", str(db), "--direction", "widgets"]) == 2
    assert "METRIC=higher" in capsys.readouterr().err
    # a mistyped name was ignored (exit 0, widgets still "direction unknown")
    assert main(["compare", str(c), str(d), "--store", str(db), "--direction", "widgts=lower", "--no-record"]) == 2
    assert "--direction names 'widgts', which neither run has samples of.\n→ Metrics they have: widgets." in capsys.readouterr().err
