"""`gpulens quant check`: quantize a Hugging Face model in a local folder, evaluate the baseline and
the quantized model on the same examples, measure memory and speed of both, record both as runs,
and end with the `eval compare` verdict (docs/eval.md)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulens.errors import BadInputError
from gpulens.evals.compare import DEFAULT_SCORE_MARGIN
from gpulens.evals.eval_cmd import EvalCommand
from gpulens.evals.lm_eval_run import per_example_metrics
from gpulens.evals.paired import PairedResult, compare_paired
from gpulens.evals.quantize import Quantizer
from gpulens.evals.samples import ExampleScores, paired, read_scores, scores_from_rows
from gpulens.vocab.directions import lookup

SPEED_REPEATS = 5
SPEED_BATCH, SPEED_SEQ = 8, 32


@dataclass(frozen=True)
class ModelMeasure:
    weights_bytes: int  # parameters and buffers as stored (quantized tensors at their packed size)
    forward_seconds: float  # median of SPEED_REPEATS forwards of SPEED_BATCH × SPEED_SEQ tokens
    tokens_per_second: float
    scores: ExampleScores


@dataclass(frozen=True)
class QuantCheck:
    model: str
    to: str
    quantized_with: str
    baseline: ModelMeasure
    quantized: ModelMeasure
    result: PairedResult
    run_ids: tuple[int, int] | None = None

    @property
    def memory_ratio(self) -> float:
        return self.quantized.weights_bytes / self.baseline.weights_bytes

    @property
    def speed_ratio(self) -> float:
        return self.quantized.tokens_per_second / self.baseline.tokens_per_second

    def to_json(self) -> dict[str, Any]:
        r = self.result

        def m(x: ModelMeasure) -> dict[str, Any]:
            return {"weights_bytes": x.weights_bytes, "forward_seconds": x.forward_seconds, "tokens_per_second": x.tokens_per_second}

        return {"model": self.model, "to": self.to, "quantized_with": self.quantized_with,
                "baseline": {**m(self.baseline), "mean": r.baseline_mean}, "quantized": {**m(self.quantized), "mean": r.candidate_mean},
                "memory_ratio": self.memory_ratio, "speed_ratio": self.speed_ratio, "metric": r.metric, "examples": r.examples,
                "difference": r.difference, "difference_ci95": [r.difference_low, r.difference_high], "margin": r.margin,
                "improved": r.improved, "regressed": r.regressed, "p_value": r.p_value, "verdict": r.verdict,
                "passed": r.passed, "run_ids": list(self.run_ids) if self.run_ids else None}


def weights_bytes(model: Any) -> int:
    try:
        from torchao.utils import (
            get_model_size_in_bytes,  # counts torchao/quanto tensor subclasses at their packed size
        )

        return int(get_model_size_in_bytes(model))
    except ImportError:
        return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def _speed(model: Any, vocab_size: int, device: str) -> tuple[float, float]:
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab_size, (SPEED_BATCH, SPEED_SEQ), generator=g).to(device)
    times = []
    with torch.no_grad():  # not inference_mode: optimum-quanto's weights refuse inference tensors
        model(x)  # warm-up
        for _ in range(SPEED_REPEATS):
            t0 = time.perf_counter()
            model(x)
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    return med, SPEED_BATCH * SPEED_SEQ / med


def _measure(model: Any, tokenizer: Any, label: str, evaluate: Callable[[Any, Any], list[dict]], metric: str,
             filter_name: str | None, device: str) -> ModelMeasure:
    rows = evaluate(model, tokenizer)
    scores = scores_from_rows(list(enumerate(rows, 1)), metric, Path(label), filter_name=filter_name)
    return _with_speed(model, scores, device)


def _with_speed(model: Any, scores: ExampleScores, device: str) -> ModelMeasure:
    fwd, tps = _speed(model, int(model.config.vocab_size), device)
    return ModelMeasure(weights_bytes(model), fwd, tps, scores)


def load_model(model_dir: Path, device: str) -> tuple[Any, Any]:
    if not (model_dir / "config.json").is_file():
        raise BadInputError(f"{model_dir} is not a Hugging Face model folder (no config.json).",
                            hint="Point --model at a folder written by save_pretrained (config.json, weights, tokenizer).")
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise BadInputError("transformers is not installed.", hint="Install the extra: pip install 'gpulens[quant]'.") from None
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32").to(device).eval()
    return model, AutoTokenizer.from_pretrained(model_dir)


def quant_check(model_dir: Path, to: str, quantizer: Quantizer, *, task: str | None, include_path: Path | None,
                metric: str = "acc", margin: float | None = None, limit: int | None = None, filter_name: str | None = None,
                device: str = "cpu", store: Any = None, eval_cmd: EvalCommand | None = None) -> QuantCheck:
    """The whole loop. `quantizer` quantizes a model in place (`quantize.quantizer_for(to)`, or the
    caller's own); `store`, when given, gets both as runs of kind `quant-check`. With `eval_cmd` the
    user's own evaluation scores both model folders (the quantized one written by
    `quantize.save_quantized`) instead of lm-eval's `task`."""
    info = lookup(metric)
    if margin is None:
        if not info.score:
            raise BadInputError(f"{metric} is not a 0-1 score, so there is no default margin.", hint="Give --margin in its units.")
        margin = DEFAULT_SCORE_MARGIN
    if eval_cmd is not None:
        base, quant, used = _measure_with_command(model_dir, to, eval_cmd, metric, filter_name, device)
    else:
        if task is None:
            raise BadInputError("quant check needs --task (an lm-eval task) or --eval-cmd (your own evaluation).")

        def evaluate(m: Any, tok: Any) -> list[dict]:
            return per_example_metrics(m, tok, task, include_path, limit=limit, device=device)

        model, tok = load_model(model_dir, device)
        base = _measure(model, tok, f"{model_dir} (baseline)", evaluate, metric, filter_name, device)
        used = quantizer(model)
        quant = _measure(model, tok, f"{model_dir} ({to})", evaluate, metric, filter_name, device)
    _, va, vb = paired(base.scores, quant.scores)
    result = compare_paired(metric, info.direction, va, vb, margin=margin)
    check = QuantCheck(str(model_dir), to, used, base, quant, result)
    if store is not None:
        from gpulens.runs.registry import save_run

        ids = []
        for label, m in (("baseline", base), (to, quant)):
            ids.append(save_run(store, "quant-check", f"{model_dir.name}-{label}",
                                {"model": str(model_dir), "precision": label, "task": task,
                                 "eval_cmd": " ".join(eval_cmd.argv) if eval_cmd else None, "quantized_with": used if m is quant else None},
                                {"weights_bytes": m.weights_bytes, "tokens_per_second": m.tokens_per_second,
                                 metric: sum(m.scores.values.values()) / len(m.scores)},
                                samples={"forward_seconds": [m.forward_seconds], metric: list(m.scores.values.values())}))
        check = QuantCheck(str(model_dir), to, used, base, quant, result, (ids[0], ids[1]))
    return check


def _measure_with_command(model_dir: Path, to: str, eval_cmd: EvalCommand, metric: str, filter_name: str | None,
                          device: str) -> tuple[ModelMeasure, ModelMeasure, str]:
    """Both models scored by the user's command, each on its own folder; speed and size measured
    here on the same folders, loaded as the command loads them."""
    import tempfile

    from gpulens.evals.quantize import save_quantized

    load_model(model_dir, device)  # a folder that is no model is one sentence before anything runs
    with tempfile.TemporaryDirectory(prefix="gpulens-quant-") as tmp_s:
        tmp = Path(tmp_s)
        quant_dir = tmp / f"model-{to}"
        used = save_quantized(model_dir, to, quant_dir)
        measures = []
        for label, folder in (("baseline", model_dir), (to, quant_dir)):
            out = tmp / f"scores-{label}.jsonl"
            eval_cmd.run(folder, out, label)
            scores = read_scores(out, metric, filter_name=filter_name)
            model, _ = load_model(folder, device)
            measures.append(_with_speed(model, scores, device))
    return measures[0], measures[1], used
