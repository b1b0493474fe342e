"""The planner's check before a trial: will this setting fit in the GPU's memory?

When the user names the model (`--model llama-3.2-1b --gpu l4 --seq 2048`), each setting's
micro-batch, accumulation, precision and activation checkpointing are handed to `gpulens.plan`;
a change it predicts will not fit is skipped (and said so) instead of spending a trial on an OOM.
A baseline predicted not to fit still runs (the planner can be wrong), with a note.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpulens.tune.command import CommandTemplate, fill_values
from gpulens.tune.knobs import ACCUMULATION_NAMES, BUILTIN, Knob

_PRECISIONS = {"bf16": "amp_bf16", "amp_bf16": "amp_bf16", "fp16": "amp_fp16", "amp_fp16": "amp_fp16", "fp32": "fp32",
               "float32": "fp32", "bfloat16": "amp_bf16", "float16": "amp_fp16", "pure_bf16": "bf16"}
_TRUE = ("1", "true", "yes", "on")


@dataclass(frozen=True)
class FitVerdict:
    fits: bool
    peak_bytes: int
    capacity_bytes: int

    @property
    def text(self) -> str:
        gib = 2**30
        return (f"the planner predicts a peak of {self.peak_bytes / gib:.1f} GiB on a {self.capacity_bytes / gib:.0f} GiB GPU"
                + ("" if self.fits else ", which does not fit"))


@dataclass(frozen=True)
class FitCheck:
    model: str
    gpu: str
    seq: int = 2048
    gpus: int = 1

    def validate(self) -> None:
        from gpulens.plan import find_gpu, load_model

        find_gpu(self.gpu)
        load_model(self.model)

    def check(self, template: CommandTemplate, knobs: Sequence[Knob], setting: Mapping[str, str]) -> FitVerdict:
        from gpulens.plan import PlanRequest, plan

        defaults = {n: d for n, d in template.placeholders().items() if d is not None}
        values = {**defaults, **fill_values(template, knobs, setting, None)}
        kw: dict = {}
        for name, v in values.items():
            meaning = BUILTIN.get(name.lower())
            if meaning is BUILTIN["batch"] and v.isdigit():
                kw["batch"] = int(v)
            elif meaning is BUILTIN["precision"] and v.lower() in _PRECISIONS:
                kw["precision"] = _PRECISIONS[v.lower()]
            elif meaning is BUILTIN["checkpointing"]:
                kw["grad_ckpt"] = v.lower() in _TRUE
            elif name in ACCUMULATION_NAMES and v.isdigit():
                kw["grad_accum"] = int(v)
        res = plan(PlanRequest(model=self.model, workload="train", gpu=self.gpu, gpus=self.gpus, seq=self.seq, **kw))
        return FitVerdict(res.fits, res.memory.peak_bytes, res.memory.capacity_bytes)
