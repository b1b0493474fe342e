"""Knobs: the settings a tune run changes, one at a time.

A knob is `NAME=V1,V2,...` on the command line; the first value is the baseline's. Names gpulens
knows (data-loader workers, pinned memory, micro-batch, activation checkpointing, precision,
compile, DDP bucket size) carry a meaning: which bottleneck they address and where they sit in
the order the guides give fixes in (input pipeline, then batch size, then memory tricks, then
compute, then communication). Any other name is just a value, tried after the known ones.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from gpulens.errors import BadInputError, shown

# The guides' order of fixes: a lower stage is tried first.
STAGES = ("input", "batch", "memory", "compute", "comm", "other")


@dataclass(frozen=True, slots=True)
class Meaning:
    """What a known knob does: its stage and the findings (`diagnose` kinds) it addresses."""

    stage: str
    addresses: tuple[str, ...]
    what: str  # one line for the report
    kind: str = "value"  # int, bool, choice or value: how beginner mode proposes values

    @property
    def order(self) -> int:
        return STAGES.index(self.stage)


_INPUT = Meaning("input", ("input_bound",), "data-loader worker processes", "int")
_PIN = Meaning("input", ("input_bound",), "pinned host memory for batch copies", "bool")
_PREFETCH = Meaning("input", ("input_bound",), "batches each worker prepares ahead", "int")
_BATCH = Meaning("batch", ("underutilized", "oom", "memory_pressure"), "micro-batch size (accumulation kept matching)", "int")
_CKPT = Meaning("memory", ("oom", "memory_pressure"), "activation checkpointing", "bool")
_PRECISION = Meaning("compute", ("underutilized", "oom", "memory_pressure"), "numeric precision", "choice")
_COMPILE = Meaning("compute", ("underutilized",), "torch.compile", "bool")
_BUCKET = Meaning("comm", ("comm_bound",), "DDP gradient bucket size (MB)", "int")

BUILTIN: dict[str, Meaning] = {
    **dict.fromkeys(("workers", "num_workers", "dataloader_workers", "loader_workers"), _INPUT),
    **dict.fromkeys(("pin_memory", "pin"), _PIN),
    **dict.fromkeys(("prefetch", "prefetch_factor"), _PREFETCH),
    **dict.fromkeys(("batch", "batch_size", "micro_batch", "micro_batch_size", "mbs"), _BATCH),
    **dict.fromkeys(("checkpointing", "activation_checkpointing", "grad_ckpt", "gradient_checkpointing"), _CKPT),
    **dict.fromkeys(("precision", "dtype", "amp"), _PRECISION),
    **dict.fromkeys(("compile", "torch_compile"), _COMPILE),
    **dict.fromkeys(("bucket_cap_mb", "bucket_mb"), _BUCKET),
}
# Placeholders that follow the micro-batch so the effective batch stays the same.
ACCUMULATION_NAMES = ("accum", "grad_accum", "accumulation", "gradient_accumulation_steps", "accum_steps")

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Knob:
    name: str
    values: tuple[str, ...]  # values[0] is the baseline's
    meaning: Meaning | None = None
    proposed: bool = False  # True when beginner mode chose the values

    @property
    def baseline(self) -> str:
        return self.values[0]

    @property
    def order(self) -> int:
        return self.meaning.order if self.meaning else len(STAGES) - 1

    def addresses(self, finding_kind: str) -> bool:
        return self.meaning is not None and finding_kind in self.meaning.addresses


def meaning_of(name: str) -> Meaning | None:
    return BUILTIN.get(name.lower())


def parse_knob(text: str) -> Knob:
    """`NAME=V1,V2,...` -> a Knob; the first value is the baseline's."""
    name, sep, rest = text.partition("=")
    name = name.strip()
    values = tuple(v.strip() for v in rest.split(",")) if sep else ()
    if not sep or not _NAME.match(name) or not values or any(not v for v in values):
        raise BadInputError(f"Cannot read --knob {shown(text)}.",
                            hint="Write NAME=V1,V2,... with the baseline's value first, e.g. --knob workers=0,2,4.")
    if len(set(values)) != len(values):
        raise BadInputError(f"--knob {shown(text)} lists a value twice.", hint="List each value once, the baseline's first.")
    return Knob(name, values, meaning_of(name))


def parse_knobs(texts: list[str] | tuple[str, ...]) -> list[Knob]:
    knobs = [parse_knob(t) for t in texts]
    seen: set[str] = set()
    for k in knobs:
        if k.name in seen:
            raise BadInputError(f"The knob {k.name!r} is given twice.", hint=f"Give all its values in one --knob {k.name}=V1,V2.")
        seen.add(k.name)
    return knobs


def propose(name: str, baseline: str, cpu_count: int | None = None) -> Knob | None:
    """Values to try for a known knob, starting from its baseline value; None for unknown knobs
    or values gpulens cannot reason about."""
    m = meaning_of(name)
    if m is None:
        return None
    b = baseline.strip()
    cpus = cpu_count or os.cpu_count() or 2
    values: list[str] = [b]
    if m is _INPUT and b.isdigit():
        values += [str(v) for v in (2, 4, 8, 16) if v > int(b) and v <= max(2, cpus)]
    elif m is _PREFETCH and b.isdigit():
        values += [str(v) for v in (4, 8) if v > int(b)]
    elif m is _BATCH and b.isdigit() and int(b) > 0:
        values += [str(int(b) * 2), str(max(1, int(b) // 2))]
    elif m.kind == "bool" and b.lower() in ("0", "1", "true", "false", "yes", "no", "on", "off"):
        on = b.lower() in ("1", "true", "yes", "on")
        flip = {"1": "0", "0": "1", "true": "false", "false": "true", "yes": "no", "no": "yes", "on": "off", "off": "on"}
        values.append(flip[b.lower()] if b.lower() in flip else str(not on).lower())
    elif m is _PRECISION:
        values += [v for v in ("bf16", "fp16") if v != b.lower()][:1]
    elif m is _BUCKET and b.isdigit():
        values += [str(int(b) * 2), str(max(1, int(b) // 2))]
    values = list(dict.fromkeys(values))
    return Knob(name, tuple(values), m, proposed=True) if len(values) > 1 else None


# Serving engines' batching limits (vLLM, SGLang, TGI, and the bundled example's --max-batch):
# more concurrent sequences per forward pass raise the rate a server sustains until memory or
# the latency of a larger batch says stop.
SERVING_BATCH_KNOBS = ("max_num_seqs", "max_num_batched_tokens", "max_running_requests", "max_batch", "max_batch_size",
                       "max_batch_prefill_tokens", "max_batch_total_tokens", "max_concurrent_requests")
# Serving engines' share of GPU memory for weights and KV cache (vLLM --gpu-memory-utilization,
# SGLang --mem-fraction-static, TGI --cuda-memory-fraction, TensorRT-LLM's
# kv_cache_free_gpu_mem_fraction): a larger share holds more KV blocks, so more sequences run at
# once before the engine queues or preempts; a smaller one leaves room for what else needs the GPU.
SERVING_KV_FRACTION_KNOBS = ("gpu_memory_utilization", "mem_fraction_static", "cuda_memory_fraction",
                             "kv_cache_free_gpu_mem_fraction")
KV_FRACTION_STEP_UP, KV_FRACTION_STEP_DOWN = 0.05, 0.10
KV_FRACTION_CEILING, KV_FRACTION_FLOOR = 0.95, 0.50  # past 0.95 the CUDA context and activations no longer fit
# Serving findings (`diagnose` kinds) that say memory, not batching, is the limit: smaller first.
SERVING_MEMORY_FINDINGS = ("memory_headroom",)


def propose_serving(name: str, baseline: str, finding_kinds: list[str] | tuple[str, ...] = ()) -> Knob | None:
    """Beginner mode for `tune serve`: values for an engine setting written in the server command.
    A batching limit or token budget per step (`{max_num_seqs=256}`, `{max_num_batched_tokens=8192}`):
    twice and four times it, then half. A KV-cache memory share (`{gpu_memory_utilization=0.9}`):
    0.05 more (at most 0.95), then 0.1 less (at least 0.5). Smaller first when the diagnosis found the
    server short of memory. None for other names or values."""
    short_of_memory = any(k in SERVING_MEMORY_FINDINGS for k in finding_kinds)
    if name.lower() in SERVING_KV_FRACTION_KNOBS:
        return _propose_fraction(name, baseline, short_of_memory)
    if name.lower() not in SERVING_BATCH_KNOBS or not baseline.strip().isdigit() or int(baseline) < 1:
        return None
    b = int(baseline)
    bigger, smaller = [str(2 * b), str(4 * b)], [str(b // 2)] if b >= 2 else []
    order = smaller + bigger if short_of_memory else bigger + smaller
    return Knob(name, (str(b), *order), None, proposed=True)


def _propose_fraction(name: str, baseline: str, short_of_memory: bool) -> Knob | None:
    try:
        b = float(baseline)
    except ValueError:
        return None
    if not 0 < b <= 1:
        return None
    up = round(min(KV_FRACTION_CEILING, b + KV_FRACTION_STEP_UP), 2)
    down = round(max(KV_FRACTION_FLOOR, b - KV_FRACTION_STEP_DOWN), 2)
    bigger = [f"{up:g}"] if up > b else []
    smaller = [f"{down:g}"] if down < b else []
    order = smaller + bigger if short_of_memory else bigger + smaller
    return Knob(name, (baseline.strip(), *order), None, proposed=True) if order else None
