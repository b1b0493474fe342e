"""`gpulens quant check` end to end on CPU: a tiny model trained here until it is accurate, quantized
to int8 with torchao (passes the gate) and damaged by 2-bit round-to-nearest of every Linear (fails
it), each evaluated by lm-eval on a local task. Nothing is downloaded. About a minute."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lm_eval_rig import adder_task, trained_adder_model

from gpulens.cli.main import main
from gpulens.evals.quant import quant_check
from gpulens.runs.registry import get_run
from gpulens.store import Store

pytest.importorskip("lm_eval", reason="needs lm-evaluation-harness (the quant extra)")
pytest.importorskip("torchao", reason="needs torchao (the quant extra)")

EXAMPLES = 100
MARGIN = "0.05"  # five points: with 100 examples, one flipped example is one point


@pytest.fixture(scope="module")
def model_and_task(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("quant")
    return trained_adder_model(root / "model"), adder_task(root / "task")


def rtn_2bit(model) -> str:
    """Round every Linear's weights to 4 levels with one scale per matrix: a quantization that damages."""
    import torch

    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                w = m.weight
                scale = w.abs().max().clamp(min=1e-8) / 2
                m.weight.copy_(torch.clamp(torch.round(w / scale), -2, 1) * scale)
    return "2-bit round-to-nearest"


@pytest.mark.slow
def test_int8_passes_the_gate_and_is_recorded(model_and_task, tmp_path: Path, capsys) -> None:
    model, task = model_and_task
    db = tmp_path / "runs.db"
    rc = main(["quant", "check", "--model", str(model), "--to", "int8", "--task", "adder", "--include-path", str(task),
               "--margin", MARGIN, "--store", str(db), "--format", "json"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0, out
    assert out["verdict"] == "pass" and out["baseline"]["mean"] == 1.0 and out["examples"] == EXAMPLES
    assert out["quantized_with"].startswith("torchao int8")
    assert out["memory_ratio"] < 0.6  # int8 Linear weights; embeddings stay fp32
    with Store(db, readonly=True) as st:
        base, quant = (get_run(st, i) for i in out["run_ids"])
    assert base.kind == quant.kind == "quant-check"
    assert quant.summary["weights_bytes"] == out["quantized"]["weights_bytes"] and len(quant.samples["acc"]) == EXAMPLES


@pytest.mark.slow
def test_a_damaging_quantization_fails_the_gate(model_and_task) -> None:
    model, task = model_and_task
    res = quant_check(model, "2bit", rtn_2bit, task="adder", include_path=task, margin=float(MARGIN))
    assert res.result.baseline_mean == 1.0 and res.result.regressed >= 5
    assert not res.result.passed and res.result.verdict == "regression"


def test_bad_input_is_one_sentence(tmp_path: Path, capsys) -> None:
    assert main(["quant", "check", "--model", str(tmp_path), "--to", "int3", "--task", "t", "--no-record"]) == 2
    assert "--to must be one of int8, int4, fp8" in capsys.readouterr().err
    assert main(["quant", "check", "--model", str(tmp_path), "--to", "int8", "--task", "t", "--no-record"]) == 2
    assert "not a Hugging Face model folder" in " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize("to", ["int8", "int4", "fp8"])
def test_each_target_quantizes_and_still_runs(tmp_path: Path, to: str) -> None:
    """torchao where it can, optimum-quanto where it cannot (int4 without mslk): the weights shrink
    and the speed measurement runs on the quantized model."""
    from lm_eval_rig import tiny_model

    from gpulens.evals.quant import _speed, load_model, weights_bytes
    from gpulens.evals.quantize import quantizer_for

    model, _ = load_model(tiny_model(tmp_path / "m"), "cpu")
    before = weights_bytes(model)
    used = quantizer_for(to)(model)
    assert used.startswith(("torchao", "optimum-quanto"))
    assert weights_bytes(model) < before
    seconds, tokens_per_second = _speed(model, int(model.config.vocab_size), "cpu")
    assert seconds > 0 and tokens_per_second > 0


# The user's own evaluation (issue 26: `quant check --eval-cmd`): a script that loads the model folder
# it is given the way any harness does (from_pretrained) and writes one line per example.
ADDER_EVAL = """
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
model_dir, out = sys.argv[1], sys.argv[2]
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32").eval()
tok = AutoTokenizer.from_pretrained(model_dir)
pairs = [(a, b) for a in range(10) for b in range(10)]
x = torch.tensor([tok.convert_tokens_to_ids([str(a), "+", str(b), "="]) for a, b in pairs])
with torch.no_grad():
    got = model(x).logits[:, -1, :].argmax(-1).tolist()
with open(out, "w") as f:
    for (a, b), g in zip(pairs, got):
        f.write(json.dumps({"id": f"{a}+{b}", "acc": int(tok.convert_ids_to_tokens(g) == str((a + b) % 10))}) + "\\n")
"""


@pytest.mark.slow
def test_eval_cmd_scores_both_model_folders(model_and_task, tmp_path: Path, capsys) -> None:
    import sys

    model, _task = model_and_task
    script = tmp_path / "adder_eval.py"
    script.write_text(ADDER_EVAL)
    rc = main(["quant", "check", "--model", str(model), "--to", "int8", "--eval-cmd", f"{sys.executable} {script} {{model}} {{out}}",
               "--margin", MARGIN, "--no-record", "--format", "json"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0, out
    assert out["examples"] == 100 and out["baseline"]["mean"] == 1.0 and out["verdict"] == "pass"
    assert out["quantized_with"].startswith("torchao int8") and out["memory_ratio"] < 0.6  # the folder it evaluated is int8


def test_eval_cmd_mistakes_are_one_sentence(model_and_task, tmp_path: Path, capsys) -> None:
    import sys

    model, _task = model_and_task
    cases = [
        (["--task", "adder", "--eval-cmd", "python e.py {model} {out}"], "one of --task"),
        ([], "one of --task"),
        (["--eval-cmd", "python e.py {model}"], "must name {out}"),
        (["--eval-cmd", "python 'e.py {model} {out}"], "Cannot read --eval-cmd"),
        (["--eval-cmd", "no-such-program-xyz {model} {out}"], "was not found"),
        (["--eval-cmd", f"{sys.executable} -c 'import sys; sys.exit(3)' {{model}} {{out}}"], "failed on the baseline model (exit code 3)"),
        (["--eval-cmd", f"{sys.executable} -c pass {{model}} {{out}}"], "wrote nothing"),
        (["--eval-cmd", f"{sys.executable} -c 'import sys, json; open(sys.argv[2], \"w\").write(json.dumps(dict(id=1, acc=7)))'"
                        " {model} {out}"], "acc is a 0-1 score, but example"),
    ]
    for extra, said in cases:
        rc = main(["quant", "check", "--model", str(model), "--to", "int8", "--no-record", *extra])
        err = " ".join(capsys.readouterr().err.split())
        assert rc == 2 and said in err and "Traceback" not in err, (extra, err)
