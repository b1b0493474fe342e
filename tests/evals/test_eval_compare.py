"""`gpulens eval compare`: paired non-inferiority on synthetic paired examples of each metric type,
and the files it reads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gpulens.cli.main import main
from gpulens.errors import BadInputError
from gpulens.evals import compare_files, compare_paired
from gpulens.evals.paired import _tango_interval
from gpulens.vocab.directions import HIGHER, LOWER

N = 3000


def _binary(acc: float, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).random(N) < acc).astype(float)


def _flip(values: np.ndarray, right_to_wrong: int, wrong_to_right: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = values.copy()
    out[rng.choice(np.flatnonzero(values == 1), right_to_wrong, replace=False)] = 0
    out[rng.choice(np.flatnonzero(values == 0), wrong_to_right, replace=False)] = 1
    return out


def _write(path: Path, metric: str, values, ids=None) -> Path:
    ids = range(len(values)) if ids is None else ids
    path.write_text("".join(json.dumps({"id": i, metric: float(v)}) + "\n" for i, v in zip(ids, values, strict=True)))
    return path


def test_accuracy_that_differs_only_by_noise_passes() -> None:
    base = _binary(0.7, 1)
    cand = _flip(base, 30, 30, 2)  # 60 examples flipped, as many each way: same accuracy
    r = compare_paired("accuracy", HIGHER, base, cand, margin=0.01)
    assert r.method == "exact_mcnemar"
    assert (r.improved, r.regressed) == (30, 30) and r.difference == 0
    assert r.difference_low < 0 < r.difference_high and r.difference_low > -0.01
    assert r.p_value == pytest.approx(1.0) and r.passed and r.verdict == "pass"


def test_accuracy_with_a_real_drop_fails_as_a_regression() -> None:
    base = _binary(0.7, 3)
    cand = _flip(base, 200, 50, 4)  # 5 points lower
    r = compare_paired("accuracy", HIGHER, base, cand, margin=0.01)
    assert r.difference == pytest.approx(-150 / N)
    assert r.difference_high < 0 and not r.passed and r.verdict == "regression"
    assert r.p_value < 1e-10


def test_a_drop_inside_the_interval_but_too_few_examples_is_inconclusive() -> None:
    base = np.array([1.0] * 70 + [0.0] * 30)
    cand = _flip(base, 3, 2, 5)
    r = compare_paired("accuracy", HIGHER, base, cand, margin=0.01)
    assert not r.passed and r.verdict == "inconclusive"


def test_tango_matches_the_textbook_interval() -> None:
    # Cavo et al. 2012 in Fagerland, Lydersen & Laake, "Statistical Analysis of Contingency Tables",
    # chapter 8: 6 and 16 discordant pairs among 161, Tango's score interval -0.1240 to -0.0054
    lo, hi = _tango_interval(6, 16, 161)
    assert (round(lo, 4), round(hi, 4)) == (-0.1240, -0.0054)
    assert _tango_interval(0, 5, 5)[0] == -1.0 and _tango_interval(5, 0, 5)[1] == 1.0
    lo, hi = _tango_interval(0, 0, 100)  # no flips: about ±z²/(n + z²), not the point 0
    assert lo == pytest.approx(-3.8415 / 103.8415, abs=1e-4) and hi == pytest.approx(-lo)


@pytest.mark.parametrize("n", [2, 3])
def test_a_few_identical_examples_do_not_pass(tmp_path: Path, capsys, n: int) -> None:
    """2 or 3 examples scored the same by both models: no flips, but no evidence either."""
    a = _write(tmp_path / "a.jsonl", "acc", [1, 0, 1][:n])
    assert main(["eval", "compare", str(a), str(a), "--metric", "acc"]) == 1
    captured = capsys.readouterr()
    out, err = " ".join(captured.out.split()), " ".join(captured.err.split())
    assert "PASS" not in out and "FAIL: cannot show it is no worse" in out and "95 % interval [0, 0]" not in out
    assert f"{n} examples are too few" in out and "about 381 would narrow the interval inside the margin 0.01" in out
    assert "inconclusive" in err and "about 381" in err
    r = compare_paired("acc", HIGHER, [1.0, 0.0, 1.0][:n], [1.0, 0.0, 1.0][:n], margin=0.01)
    assert r.verdict == "inconclusive" and r.examples_needed == 381 and r.difference_low < -0.5 < 0.5 < r.difference_high


def test_no_flips_on_an_adequate_sample_passes_and_the_count_needed_is_where_it_starts_to() -> None:
    base = _binary(0.7, 15)
    assert compare_paired("accuracy", HIGHER, base[:381], base[:381], margin=0.01).passed
    small = compare_paired("accuracy", HIGHER, base[:380], base[:380], margin=0.01)
    assert not small.passed and small.examples_needed == 381
    assert compare_paired("accuracy", HIGHER, base, base, margin=0.01).verdict == "pass"  # 3000 examples


def test_one_flip_in_a_hundred_is_not_shown_within_five_points() -> None:
    # the conditional interval (given the 1 flip) said -0.01 and passed; one flip in 100 allows ~5 %
    base = np.ones(100)
    cand = base.copy()
    cand[0] = 0
    r = compare_paired("accuracy", HIGHER, base, cand, margin=0.05)
    assert r.verdict == "inconclusive" and r.difference_low < -0.05 and r.examples_needed > 100


def test_a_continuous_metric_whose_differences_are_all_equal_is_not_a_point_interval() -> None:
    base = [3.0, 5.0]
    r = compare_paired("perplexity", LOWER, base, base, margin=0.2)
    assert r.verdict == "inconclusive" and r.difference_low < -0.2 and r.difference_high > 0.2
    assert r.examples_needed is not None and r.examples_needed > 2
    same = compare_paired("perplexity", LOWER, [4.0, 4.0, 4.0], [4.0, 4.0, 4.0], margin=0.2)
    assert not same.passed and "cannot decide" in same.reason
    many = _perplexity(16)
    assert compare_paired("perplexity", LOWER, many, many, margin=0.2).passed  # 3000 unchanged examples


def _perplexity(seed: int) -> np.ndarray:
    return np.exp(np.random.default_rng(seed).normal(2.0, 0.5, N))


def test_perplexity_with_noise_passes_and_with_a_real_rise_fails() -> None:
    base = _perplexity(6)
    rng = np.random.default_rng(7)
    noisy = base * np.exp(rng.normal(0.0, 0.03, N))  # ±3 % per example, no shift
    worse = base * 1.10  # 10 % higher perplexity everywhere
    ok = compare_paired("perplexity", LOWER, base, noisy, margin=0.2)
    bad = compare_paired("perplexity", LOWER, base, worse, margin=0.2)
    assert ok.method == "paired_bootstrap" and ok.passed
    assert bad.difference_low > 0.2 and not bad.passed and bad.verdict == "regression"
    assert bad.regressed == N and bad.improved == 0


def test_lower_is_better_counts_a_fall_as_an_improvement() -> None:
    base = _perplexity(8)
    r = compare_paired("perplexity", LOWER, base, base * 0.9, margin=0.0)
    assert r.passed and r.improved == N and r.difference < 0


def test_the_bootstrap_is_reproducible_with_its_seed() -> None:
    base = _perplexity(9)
    cand = base + np.random.default_rng(10).normal(0, 0.1, N)
    a = compare_paired("perplexity", LOWER, base, cand, margin=0.1, seed=3)
    b = compare_paired("perplexity", LOWER, base, cand, margin=0.1, seed=3)
    assert (a.difference_low, a.difference_high) == (b.difference_low, b.difference_high)


def test_an_unknown_direction_is_refused() -> None:
    with pytest.raises(BadInputError, match="better higher or lower"):
        compare_paired("judge_score", "unknown", [1.0, 2.0], [1.0, 2.0], margin=0.1)


def test_cli_pass_fail_and_json(tmp_path: Path, capsys) -> None:
    base = _binary(0.7, 11)
    a = _write(tmp_path / "a.jsonl", "accuracy", base)
    same = _write(tmp_path / "same.jsonl", "accuracy", _flip(base, 20, 20, 12))
    drop = _write(tmp_path / "drop.jsonl", "accuracy", _flip(base, 150, 0, 13))
    assert main(["eval", "compare", str(a), str(same), "--metric", "accuracy"]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "20 better, 20 worse" in out
    assert main(["eval", "compare", str(a), str(drop), "--metric", "accuracy", "--format", "json"]) == 1
    captured = capsys.readouterr()
    j = json.loads(captured.out)  # the gate's sentence goes to stderr: stdout stays one JSON document
    assert "error: The candidate failed the gate on accuracy: regression" in " ".join(captured.err.split())
    assert j["verdict"] == "regression" and j["regressed"] == 150 and j["improved"] == 0
    assert j["baseline"]["mean"] == pytest.approx(base.mean())
    assert j["difference_ci95"][1] < 0


def test_cli_a_user_direction_and_margin_for_a_metric_of_its_own(tmp_path: Path) -> None:
    base = np.random.default_rng(14).uniform(1, 10, N)
    a = _write(tmp_path / "a.jsonl", "judge_score", base)
    b = _write(tmp_path / "b.jsonl", "judge_score", base - 1.0)
    args = ["eval", "compare", str(a), str(b), "--metric", "judge_score"]
    assert main(args) == 2  # neither a direction nor a margin
    assert main([*args, "--margin", "0.5"]) == 2  # no direction
    assert main([*args, "--margin", "0.5", "--direction", "judge_score=higher"]) == 1
    assert main([*args, "--margin", "1.5", "--direction", "judge_score=higher"]) == 0


def test_a_metric_the_files_lack_is_said_before_any_margin(tmp_path: Path, capsys) -> None:
    a = _write(tmp_path / "a.jsonl", "accuracy", [1, 0, 1])
    assert main(["eval", "compare", str(a), str(a), "--metric", "nosuch"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "has no metric 'nosuch'" in err and "margin" not in err


def test_mismatched_example_sets_are_refused(tmp_path: Path, capsys) -> None:
    a = _write(tmp_path / "a.jsonl", "accuracy", [1, 0, 1], ids=["q1", "q2", "q3"])
    b = _write(tmp_path / "b.jsonl", "accuracy", [1, 0, 1], ids=["q1", "q2", "q4"])
    assert main(["eval", "compare", str(a), str(b), "--metric", "accuracy"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "1 only in the baseline (e.g. q3)" in err and "1 only in the candidate (e.g. q4)" in err


@pytest.mark.parametrize(("text", "needle"), [
    ('{"id": 1, "accuracy": 1}\nnot json\n', "Line 2"),
    ('{"id": 1, "accuracy": 1}\n{"id": 1, "accuracy": 0}\n', "repeats example id '1'"),
    ('{"id": 1, "acc": 1}\n', "has no metric 'accuracy'"),
    ('{"accuracy": 1}\n', "has no 'id' field"),
    ('{"id": 1, "accuracy": "yes"}\n', "not a number"),
    ('{"id": 1, "accuracy": 1}\n{"id": 2, "accuracy": 7}\n', "accuracy is a 0-1 score, but example '2' of .* has 7"),
    ('{"id": 1, "accuracy": -5}\n', "has -5"),
    ("", "has no examples"),
])
def test_bad_files_get_one_sentence(tmp_path: Path, text: str, needle: str) -> None:
    p = tmp_path / "r.jsonl"
    p.write_text(text)
    with pytest.raises(BadInputError, match=needle):
        compare_files(p, p, "accuracy")


def _lm_eval_line(doc_id: int, acc: float, flt: str = "none") -> str:
    return json.dumps({"doc_id": doc_id, "doc": {"q": f"q{doc_id}"}, "target": "1", "arguments": {}, "resps": [], "filtered_resps": [],
                       "filter": flt, "metrics": ["acc"], "doc_hash": "x", "acc": acc}) + "\n"


def test_a_folder_of_lm_eval_samples_needs_a_task_and_a_filter_when_ambiguous(tmp_path: Path) -> None:
    for side in ("base", "cand"):
        d = tmp_path / side / "model"
        d.mkdir(parents=True)
        (d / "samples_taska_2026-12-01T09-00-00.jsonl").write_text("".join(_lm_eval_line(i, i % 2) for i in range(10)))
        (d / "samples_taskb_2026-12-01T09-00-00.jsonl").write_text(
            "".join(_lm_eval_line(i, 1, f) for i in range(10) for f in ("strict", "flexible")))
    with pytest.raises(BadInputError, match="holds 2 lm-eval samples files"):
        compare_files(tmp_path / "base", tmp_path / "cand", "acc")
    r = compare_files(tmp_path / "base", tmp_path / "cand", "acc", task="taska")
    assert r.baseline.format == "lm-eval" and r.result.examples == 10 and r.result.difference == 0
    with pytest.raises(BadInputError, match="under 2 lm-eval filters"):
        compare_files(tmp_path / "base", tmp_path / "cand", "acc", task="taskb")
    assert compare_files(tmp_path / "base", tmp_path / "cand", "acc", task="taskb", filter_name="strict").result.examples == 10
