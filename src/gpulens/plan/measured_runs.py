"""The measured runs a calibration fits: one configuration each (shapes, precision, optimizer, batch,
seq, measured peak memory, step or token times), read from JSON lines in the format of
gpulens/data/h200-trace/memory_calibration.jsonl, each field checked, so a NaN step time or a 1e300-byte
peak is refused naming its line instead of reaching the fit."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulens.errors import BadInputError, shown
from gpulens.plan.memory import TrainSetup
from gpulens.plan.models import ModelSpec, from_hf_config
from gpulens.plan.serve import WEIGHT_BYTES, ServeSetup
from gpulens.plan.speed import RUNTIME_DEFAULTS
from gpulens.safe_parse import json_lines, load_json, read_text


@dataclass
class Measurement:
    """One measured configuration."""

    kind: str  # train | infer
    model: ModelSpec
    status: str = "ok"  # ok | oom | error
    gpu: str | None = None
    precision: str = "amp_bf16"
    optimizer: str = "adamw"
    batch: int = 1
    seq: int = 0
    grad_ckpt: bool = False
    dtype: str = "bf16"
    prompt: int = 0
    new_tokens: int = 0
    runtime: str = "hf"  # serving runtime the run was measured with (hf, vllm, sglang, tgi)
    peak_alloc: int | None = None
    peak_reserved: int | None = None
    mem_after_load: int | None = None
    step_s: float | None = None
    tokens_per_s: float | None = None
    prefill_s: float | None = None
    decode_token_s: float | None = None
    achieved_flops: float | None = None  # from benchmark runs: tokens/s x FLOPs per token
    mfu_ratio: float | None = None  # from the training monitor: model FLOPs / bf16 dense peak
    label: str = ""

    def train_setup(self) -> TrainSetup:
        return TrainSetup(self.precision, self.optimizer, self.batch, self.seq, grad_ckpt=self.grad_ckpt)

    def serve_setup(self) -> ServeSetup:
        return ServeSetup(dtype=self.dtype, batch=self.batch, prompt_tokens=self.prompt, new_tokens=self.new_tokens,
                          runtime=self.runtime)


# A measured figure is a number a GPU run can give, each kind within bounds: a NaN, a negative step
# time or a 1e300-byte peak crashed the fit with a traceback, or was fitted and stored, and a step of
# 1e-300 s was fitted into errors of 10^300 %. A time (a step, a prefill, a TPOT) is more than a
# microsecond (no kernel launch, let alone a step, is shorter: under that it is no measurement) and
# less than 1,000,000 s (11.6 days); a memory figure is 1 byte to 100 TiB (the largest GPU holds
# 288 GB); a throughput is 1e-6 to 1e10 tokens a second (one token in 11.6 days; a GPU's peak FLOPs
# over a small model's 2 x 20M FLOPs a token is some 1e8). A run's size (batch, seq, prompt,
# new_tokens) is a whole number up to _COUNT_MAX.
_TIB = 1 << 40
_TIME = (1e-6, 1e6, False, "a time in seconds, more than a microsecond and less than 1,000,000")
_BYTES = (1, 100 * _TIB, True, "a memory size in bytes, from 1 to 109,951,162,777,600: 100 TiB")
_FIGURES: dict[str, tuple[float, float, bool, str]] = {  # field -> (low, high, both ends included, what)
    "step_s": _TIME, "prefill_s": _TIME, "decode_token_s_median": _TIME,
    "peak_alloc": _BYTES, "peak_reserved": _BYTES, "mem_after_load": _BYTES,
    "tokens_per_s": (1e-6, 1e10, True, "a throughput in tokens a second, from 0.000001 to 10,000,000,000"),
}
_COUNT_MAX = 1 << 26


def _num(d: dict[str, Any], key: str, cast: type = float, *, where: str = "") -> Any:
    v = d.get(key)
    if v is None:
        return None
    low, high, closed, what = _FIGURES[key]
    if isinstance(v, bool) or not isinstance(v, int | float):  # "0.15" and true (1 second) had been read as numbers
        raise BadInputError(f"{where}: the field {key!r} is {shown(v)}, not a number ({what}).",
                            hint="Fix or drop that line; a run that did not measure it leaves it out.")
    x = float(v)
    if not (math.isfinite(x) and (low <= x <= high if closed else low < x < high)):
        raise BadInputError(f"{where}: the field {key!r} is {shown(v, quote=False)}, not a figure a GPU run measures "
                            f"({what}).", hint="Fix or drop that line; a run that did not measure it leaves it out.")
    return cast(x)


def _flag(d: dict[str, Any], key: str, where: str) -> bool:
    v = d.get(key)
    if v is not None and not isinstance(v, bool):  # "no" was read as true
        raise BadInputError(f"{where}: the field {key!r} is {shown(v)}, not true or false.", hint="Fix that line.")
    return bool(v)


def _count(d: dict[str, Any], key: str, default: int, *, low: int, where: str) -> int:
    v = d.get(key)
    if v is None:
        return default
    whole = isinstance(v, int) and not isinstance(v, bool) or isinstance(v, float) and math.isfinite(v) and v == int(v)
    if not whole or not low <= v <= _COUNT_MAX:
        raise BadInputError(f"{where}: the field {key!r} is {shown(v)}, not a whole number from {low} to {_COUNT_MAX:,}.",
                            hint="Fix or drop that line.")
    return int(v)


def parse_measurement(d: dict[str, Any], *, where: str) -> Measurement:
    kind = d.get("kind")
    if kind not in ("train", "infer"):
        raise BadInputError(f"{where}: 'kind' must be 'train' or 'infer', not {kind!r}.", hint="See docs/plan.md for the format.")
    shapes = d.get("shapes")
    if not isinstance(shapes, dict):
        raise BadInputError(f"{where}: the field 'shapes' (the model's config fields) is missing.",
                            hint="Give hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, vocab_size.")
    cfg = {"model_type": "llama", **shapes}
    model = from_hf_config(cfg, name=str(d.get("model") or "model"), where=where)
    try:
        m = Measurement(
            kind=kind, model=model, status=str(d.get("status") or "ok"),
            gpu=d.get("gpu") or d.get("device_name"),
            precision=str(d.get("precision") or "amp_bf16"), optimizer=str(d.get("optimizer") or "adamw"),
            batch=_count(d, "batch", 1, low=1, where=where), seq=_count(d, "seq", 0, low=0, where=where),
            grad_ckpt=_flag(d, "grad_ckpt", where),
            dtype=str(d.get("dtype") or "bf16"), prompt=_count(d, "prompt", 0, low=0, where=where),
            new_tokens=_count(d, "new_tokens", 0, low=0, where=where),
            peak_alloc=_num(d, "peak_alloc", int, where=where), peak_reserved=_num(d, "peak_reserved", int, where=where),
            mem_after_load=_num(d, "mem_after_load", int, where=where), step_s=_num(d, "step_s", where=where),
            tokens_per_s=_num(d, "tokens_per_s", where=where),
            prefill_s=_num(d, "prefill_s", where=where), decode_token_s=_num(d, "decode_token_s_median", where=where),
            runtime=str(d.get("runtime") or "hf").lower(),
            label=f"{d.get('model', 'model')} {kind} {d.get('precision') or d.get('dtype', '')} b{d.get('batch')}",
        )
    except (TypeError, ValueError) as e:
        raise BadInputError(f"{where}: a field has the wrong type ({e}).", hint="Numbers must be numbers.") from None
    if kind == "train" and m.seq <= 0:
        raise BadInputError(f"{where}: a training run needs 'seq' above zero.", hint="Add the sequence length.")
    if kind == "infer" and m.dtype not in WEIGHT_BYTES:
        raise BadInputError(f"{where}: unknown dtype {shown(m.dtype)}.", hint=f"Use one of {', '.join(WEIGHT_BYTES)}.")
    if kind == "infer" and m.runtime not in RUNTIME_DEFAULTS:
        raise BadInputError(f"{where}: unknown runtime {m.runtime!r}.", hint=f"Use one of {', '.join(RUNTIME_DEFAULTS)}.")
    if kind == "infer" and m.prompt <= 0:
        raise BadInputError(f"{where}: an inference run needs 'prompt' above zero.", hint="Add the prompt length.")
    return m


def load_measurements(path: Path) -> list[Measurement]:
    """Read a JSON-lines file (or a JSON list) of measured configurations."""
    if not path.exists():
        raise BadInputError(f"The measurements file {path} does not exist.", hint="Pass the path of a .jsonl file.")
    hint = "One JSON object per line."
    text = read_text(path, "the measurements file", hint=hint)
    rows: list[tuple[str, dict[str, Any]]] = []
    if text.lstrip().startswith("["):
        items = load_json(text, f"the measurements file {path}", hint=hint)
        rows = [(f"{path} item {i + 1}", d) for i, d in enumerate(items if isinstance(items, list) else [items])]
    else:
        rows = [(f"{path} line {n}", d) for n, d in json_lines(text, f"the measurements file {path}", hint=hint)]
    for where, d in rows:
        if not isinstance(d, dict):
            raise BadInputError(f"{where} is not a JSON object.", hint=hint)
    if not rows:
        raise BadInputError(f"{path} holds no measurements.", hint="Add one JSON object per measured configuration.")
    return [parse_measurement(d, where=w) for w, d in rows]
