"""Published figures (src/gpulens/plan/data/published_figures.jsonl) predicted with the planner's
defaults, per kind, against issue 25's bounds (median / worst absolute relative error).

`python -m gpulens.plan.published` prints the table. A kind that misses its bound is marked
xfail(strict=True) with the error measured when it was marked: nothing is fitted to these figures,
and a mechanism that brings a kind within its bound turns its xfail into a failure to update."""

from __future__ import annotations

from collections import Counter

import pytest

from gpulens.plan.accuracy import PUBLISHED_ACCURACY, measure_accuracy
from gpulens.plan.models import from_hf_config
from gpulens.plan.published import BOUNDS, FIT_KINDS, KINDS, evaluate, load_figures, summarize


@pytest.fixture(scope="module")
def figures():
    return load_figures()


@pytest.fixture(scope="module")
def outcomes(figures):
    return evaluate(figures)


def test_the_file_holds_sixty_figures_across_every_kind_each_with_its_source(figures):
    assert len(figures) >= 60
    kinds = Counter(f["kind"] for f in figures)
    assert set(KINDS) <= set(kinds), kinds
    assert len({f["id"] for f in figures}) == len(figures)
    for f in figures:
        src = f["source"]
        assert src.get("url") or (src.get("repo") and src.get("path") and len(src.get("commit", "")) == 40), f["id"]
        assert f["kind"] in KINDS + FIT_KINDS and isinstance(f["held_out"], bool) and "ran" in f
        assert f["value"] is not None
    held = [f for f in figures if f["held_out"]]
    assert held and len(held) < len(figures)
    assert {f["kind"] for f in held} >= set(KINDS)  # every kind has figures held out


def test_mpt_benchmark_shapes_give_the_row_parameter_counts(figures):
    """The GPT-2-shaped configs standing in for llm-foundry's MPT benchmark models reproduce each
    row's NumParams exactly (learned positions sized to the row's sequence length)."""
    rows = [f for f in figures if "published_params" in f["config"]]
    assert len(rows) > 100
    for f in rows:
        m = from_hf_config(f["config"]["model"], name=f["id"])
        assert m.params == f["config"]["published_params"], f["id"]


# Configurations that ran and are planned not to fit, each with why. Strict: the test fails when one
# of them comes to fit as well as when another one stops fitting. Empty since 2026-12-06: NeMo 24.07's
# four (GPT-3 20B, 175B on 128 and 512 GPUs, Llama-3 8B) fit once their rows carry the bf16 gradient
# sync the release's own H100 FP8 scripts set (a correction made after their verdicts were seen: each
# row's `correction` and `reduce_dtype_note`).
KNOWN_WRONG_VERDICTS: dict[str, str] = {}


def test_every_configuration_that_ran_is_said_to_fit_and_every_oom_is_not(outcomes):
    ran = [o for o in outcomes if o.ran and o.kind not in FIT_KINDS]
    assert len(ran) > 200
    assert sorted(o.id for o in ran if not o.fits) == sorted(KNOWN_WRONG_VERDICTS)
    ooms = [o for o in outcomes if o.kind in FIT_KINDS]
    assert len(ooms) >= 4
    assert [o.id for o in ooms if o.fits] == []  # the planner does not say everything fits


# Measured when marked (python -m gpulens.plan.published); all / held-out.
KNOWN_MISSES = {
    "training_time": "median 4.1 % / worst 42.8 % over 222 (held-out 3.2 % / 42.8 % over 109, NeMo 24.07's 12 FP8 "
                     "rows at -7.7..+13.6 %), figures over 20 %: 6, all llm-foundry's, after collectives at NCCL's "
                     "share of each link and rails for every ring (5.3 / 43.5 -> 5.0 / 43.1 % over 210), the Triton "
                     "port scaling with head_dim as Triton's kernel does (-> 4.1 / 42.7 %: the 32k-64k rows from "
                     "-15..-22 % to -4..-12 %) and Megatron's output layer on the last stage, gradient accumulation in "
                     "the wgrad epilogue and scatter/gather sends (Megatron rows -11.0..+20.7 % -> -11.0..+16.6 %); "
                     "left: MPT-70B on 64 A100-40GB at micro-batch 2 +43 %, MPT-30B on 8 GPUs at 8k tokens "
                     "+28 / +34 %, MPT-1B on 32 A100-40GB +24 % (slower than its 16-128-GPU neighbours), MPT-760M at "
                     "512-1k tokens on A100-80GB +20 / +31 % (slower than at 2k in its own table)",
    "serving_speed": "median 5.1 % / worst 55.3 % (held-out 6.0 % / 55.3 %): torchao's H100 rows planned on "
                     "Meta's 2.4 TB/s H100 (their commit's roofline_utils.py) and FP8 activations scaled at run time "
                     "(--fp8-activations) took its FP8 rows from +124 / +69 % to +55 / +17 %; left: the per-tensor FP8 "
                     "row (cuBLASLt's FP8 GEMM at one row, not priced) +55 %, gpt-fast Llama-3.1-405B int8 TP8 +34 % "
                     "and 70B bf16 TP2 +28 % (both as the README states them; 70B TP2 is slower than its own 1-GPU "
                     "int8 row), Llama-2-70B int4 -22 %, LitGPT Llama-2-13B eager -19 %",
}


# Kinds within their bound over all figures that still miss it on the held-out ones alone.
HELD_OUT_ONLY_MISSES: dict[str, str] = {}


def _check(outcomes, kind: str, held_out_only: bool) -> None:
    sel = [o for o in outcomes if o.held_out] if held_out_only else outcomes
    s = summarize(sel, kind)
    assert s is not None and s.count >= 1
    med, worst = BOUNDS[kind]
    assert s.median_abs_error <= med and s.worst_abs_error <= worst, (
        f"{kind}: median {s.median_abs_error:.1%} (bound {med:.0%}), worst {s.worst_abs_error:.1%} "
        f"(bound {worst:.0%}) at {s.worst_id}")


def _param(kind: str, held_out_only: bool = False):
    reason = (HELD_OUT_ONLY_MISSES.get(kind) if held_out_only else None) or KNOWN_MISSES.get(kind)
    if reason:
        return pytest.param(kind, marks=pytest.mark.xfail(strict=True, reason=reason))
    return kind


@pytest.mark.parametrize("kind", [_param(k) for k in KINDS])
def test_kind_within_its_bound(outcomes, kind):
    _check(outcomes, kind, held_out_only=False)


@pytest.mark.parametrize("kind", [_param(k, held_out_only=True) for k in KINDS])
def test_held_out_kind_within_its_bound(outcomes, kind):
    _check(outcomes, kind, held_out_only=True)


def test_the_accuracy_every_plan_states_is_this_files_summary(outcomes):
    """Each plan prints how its kind of prediction fared here (plan/accuracy.py keeps the summary so
    as not to plan 288 configurations per plan): a change that moves it must restate it."""
    assert measure_accuracy(outcomes) == PUBLISHED_ACCURACY
