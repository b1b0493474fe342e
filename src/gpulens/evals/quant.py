"""`gpulens quant check`: quantize a Hugging Face model in a local folder, evaluate the baseline and
the quantized model on the same examples, measure memory and speed of both, record both as runs,
and end with the `eval compare` verdict (docs/eval.md)."""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulens.errors import BackendUnavailableError, BadInputError, shown
from gpulens.evals.compare import DEFAULT_SCORE_MARGIN, check_unit_scores
from gpulens.evals.eval_cmd import EvalCommand
from gpulens.evals.lm_eval_run import per_example_metrics
from gpulens.evals.paired import PairedResult, compare_paired
from gpulens.evals.quantize import Quantizer
from gpulens.evals.samples import ExampleScores, paired, read_scores, scores_from_rows
from gpulens.vocab.directions import lookup

SPEED_REPEATS = 5
SPEED_BATCH, SPEED_SEQ = 8, 32

# The devices the models run on here (torch.device names): the CPU, or an NVIDIA GPU by CUDA index.
DEVICE_PATTERN = re.compile(r"cpu|cuda(:\d+)?")
FOLDER_HINT = "Point --model at a folder written by save_pretrained (config.json, weights, tokenizer)."
# The weights from_pretrained reads, in the order it looks for them.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
# Any of these is a tokenizer AutoTokenizer may load (tokenizer_config.json alone: a tokenizer without vocabulary files).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json", "vocab.txt", "spiece.model")
# safetensors refuses a header larger than this (safetensors' MAX_HEADER_SIZE).
MAX_SAFETENSORS_HEADER = 100_000_000
MAX_INDEX_BYTES = 64 * 2**20


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
                "passed": r.passed, "reason": r.reason, "examples_needed": r.examples_needed, "run_ids": list(self.run_ids) if self.run_ids else None}


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


def check_device(device: str) -> None:
    """--device is one the models can run on here: cpu, cuda or cuda:N (before anything is loaded)."""
    if not DEVICE_PATTERN.fullmatch(device):
        raise BadInputError(f"--device must be cpu, cuda or cuda:N, not {shown(device)}.",
                            hint="quant check runs both models with PyTorch, on the CPU or an NVIDIA GPU.")


def _cuda_present(device: str) -> None:
    """A cuda device that PyTorch sees (torch imported by now): exit 3 without one, as bench train."""
    if not device.startswith("cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        raise BackendUnavailableError(f"--device {device} was asked for but PyTorch sees no CUDA GPU.",
                                      hint="Use --device cpu, or install a CUDA build of torch on a machine with an NVIDIA driver.")
    index = int(device.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        raise BadInputError(f"--device {device} names a GPU this machine does not have (PyTorch sees {torch.cuda.device_count()}).",
                            hint="Use --device cuda, or cuda:N with N below that count.")


def _damaged(model_dir: Path, name: str, why: str) -> BadInputError:
    return BadInputError(f"The model folder {model_dir} has a damaged {name}: {why}.",
                         hint="Save the model again (save_pretrained), or copy the file whole.")


def _check_safetensors(model_dir: Path, path: Path) -> None:
    """A safetensors file whose header can be read and whose tensors fill the file exactly: what
    safetensors checks when it opens one, read here without torch (8 bytes of length, a JSON header)."""
    name = str(path.relative_to(model_dir))
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else 0
            if len(head) < 8 or n < 2 or n > MAX_SAFETENSORS_HEADER or 8 + n > size:
                raise _damaged(model_dir, name, f"it does not start with a safetensors header ({size:,} bytes, first bytes "
                                                f"{shown(head.decode('latin-1'))})")
            raw = f.read(n)
    except OSError as e:
        raise BadInputError(f"Cannot read {path} of the model folder {model_dir}: {e.strerror or e}.", hint=FOLDER_HINT) from None
    from gpulens.safe_parse import json_value

    try:
        header = json_value(raw)
    except ValueError as e:
        raise _damaged(model_dir, name, f"its header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise _damaged(model_dir, name, "its header is not a JSON object")
    end = 0
    for key, info in header.items():
        if key == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) and o >= 0 for o in offsets)):
            raise _damaged(model_dir, name, f"its header gives tensor {shown(key)} no data offsets")
        end = max(end, offsets[1])
    if 8 + n + end != size:
        raise _damaged(model_dir, name, f"its tensors need {8 + n + end:,} bytes but the file holds {size:,}"
                                        + (" (cut short)" if size < 8 + n + end else ""))


def check_model_folder(model_dir: Path) -> None:
    """One sentence naming `model_dir` and what it lacks, or what is damaged, before torch or
    transformers are imported: a config.json that is a JSON object, weights (a safetensors file
    read as far as its header and size, or a sharded index whose shards are all there) and a tokenizer."""
    from gpulens.safe_parse import load_json, read_text

    if not model_dir.exists():
        raise BadInputError(f"The model folder {model_dir} does not exist.", hint=FOLDER_HINT)
    if not model_dir.is_dir():
        raise BadInputError(f"--model {model_dir} is a file, not a Hugging Face model folder.", hint=FOLDER_HINT)
    if not (model_dir / "config.json").is_file():
        raise BadInputError(f"{model_dir} is not a Hugging Face model folder (no config.json).", hint=FOLDER_HINT)
    config = load_json(read_text(model_dir / "config.json", "the model config", hint=FOLDER_HINT),
                       f"the model config {model_dir / 'config.json'}", hint=FOLDER_HINT)
    if not isinstance(config, dict):
        raise BadInputError(f"The model config {model_dir / 'config.json'} is not a JSON object.", hint=FOLDER_HINT)
    weights = next((name for name in WEIGHT_FILES if (model_dir / name).is_file()), None)
    if weights is None:
        raise BadInputError(f"The model folder {model_dir} has no weights (no model.safetensors or pytorch_model.bin, "
                            "nor a sharded index of either).", hint=FOLDER_HINT)
    if weights == "model.safetensors":
        _check_safetensors(model_dir, model_dir / weights)
    elif weights.endswith(".index.json"):
        index = load_json(read_text(model_dir / weights, "the weights index", hint=FOLDER_HINT, max_bytes=MAX_INDEX_BYTES),
                          f"the weights index {model_dir / weights}", hint=FOLDER_HINT)
        shards = index.get("weight_map") if isinstance(index, dict) else None
        if not (isinstance(shards, dict) and shards and all(isinstance(v, str) for v in shards.values())):
            raise _damaged(model_dir, weights, "it has no weight_map of tensor names to shard files")
        for shard in sorted(set(shards.values())):
            path = model_dir / shard
            if Path(shard).is_absolute() or ".." in Path(shard).parts or not path.is_file():
                raise BadInputError(f"The model folder {model_dir} lacks the weights shard {shown(shard)} that {weights} names.",
                                    hint=FOLDER_HINT)
            if shard.endswith(".safetensors"):
                _check_safetensors(model_dir, path)
    elif (model_dir / weights).stat().st_size == 0:
        raise _damaged(model_dir, weights, "it is empty")
    if not any((model_dir / name).is_file() for name in TOKENIZER_FILES):
        raise BadInputError(f"The model folder {model_dir} has no tokenizer (no tokenizer.json, tokenizer.model or "
                            "tokenizer_config.json).", hint="Save the tokenizer beside the model: tokenizer.save_pretrained(folder).")


# What transformers raises for a folder it cannot load (a file missing or damaged past the checks above,
# a config it does not know, tensors of the wrong shapes), as opposed to a bug.
_LOAD_ERRORS: tuple[type[BaseException], ...] = (OSError, ValueError, KeyError, TypeError, RuntimeError, EOFError, ImportError)


def _load_errors() -> tuple[type[BaseException], ...]:
    try:
        from safetensors import SafetensorError
    except ImportError:
        return _LOAD_ERRORS
    return (*_LOAD_ERRORS, SafetensorError)


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' load report and progress bars held back while a folder loads: what went wrong
    is said in one sentence here instead of a table on stderr before it."""
    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def _misfit(model_dir: Path, info: dict[str, Any]) -> BadInputError | None:
    """Weights that do not fit the config (other shapes, or missing, so freshly initialized): a quant
    check of that model would measure random weights, so it is refused naming the first of them."""
    mismatched = sorted(info.get("mismatched_keys") or (), key=lambda k: str(k[0]))
    missing = sorted(info.get("missing_keys") or ())
    if not mismatched and not missing:
        return None
    parts = []
    if mismatched:
        name, in_file, in_config = (*mismatched[0], None, None)[:3]
        shapes = f" ({name}: {list(in_file)} in the file, {list(in_config)} by the config)" if in_file is not None else f" ({name})"
        parts.append(f"{len(mismatched)} tensor{'s have' if len(mismatched) > 1 else ' has'} another shape{shapes}")
    if missing:
        parts.append(f"{len(missing)} tensor{'s are' if len(missing) > 1 else ' is'} missing ({shown(', '.join(missing[:3]), 120, quote=False)})")
    return BadInputError(f"The weights in the model folder {model_dir} do not fit its config.json: {' and '.join(parts)}.",
                         hint="Save the model and its config together (save_pretrained), or point --model at the folder they came from.")


def load_model(model_dir: Path, device: str) -> tuple[Any, Any]:
    check_device(device)
    check_model_folder(model_dir)
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise BadInputError("transformers is not installed.", hint="Install the extra: pip install 'gpulens[quant]'.") from None
    _cuda_present(device)
    try:
        with _quiet_transformers():
            model, info = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32", output_loading_info=True,
                                                               ignore_mismatched_sizes=True)  # said by _misfit, not raised
    except _load_errors() as e:
        raise BadInputError(f"transformers cannot load the model in {model_dir} ({type(e).__name__}: "
                            f"{shown(' '.join(str(e).split()), 200, quote=False)}).", hint=FOLDER_HINT) from None
    if (misfit := _misfit(model_dir, info)) is not None:
        raise misfit
    model = model.to(device).eval()
    try:
        with _quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except _load_errors() as e:
        raise BadInputError(f"transformers cannot load the tokenizer in {model_dir} ({type(e).__name__}: "
                            f"{shown(' '.join(str(e).split()), 200, quote=False)}).",
                            hint="Save the tokenizer beside the model: tokenizer.save_pretrained(folder).") from None
    return model, tokenizer


def quant_check(model_dir: Path, to: str, quantizer: Quantizer, *, task: str | None, include_path: Path | None,
                metric: str = "acc", margin: float | None = None, limit: int | None = None, filter_name: str | None = None,
                device: str = "cpu", store: Any = None, eval_cmd: EvalCommand | None = None) -> QuantCheck:
    """The whole loop. `quantizer` quantizes a model in place (`quantize.quantizer_for(to)`, or the
    caller's own); `store`, when given, gets both as runs of kind `quant-check`. With `eval_cmd` the
    user's own evaluation scores both model folders (the quantized one written by
    `quantize.save_quantized`) instead of lm-eval's `task`."""
    check_device(device)
    check_model_folder(model_dir)  # before torch is imported: a folder that is no model is one sentence at once
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
    if info.score:  # as eval compare refuses them: an "accuracy" of 7 makes the paired test meaningless
        check_unit_scores(base.scores)
        check_unit_scores(quant.scores)
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
