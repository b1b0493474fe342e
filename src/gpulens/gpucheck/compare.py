"""NVML's readings against nvidia-smi's, paired in time: one verdict per field."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from gpulens.gpucheck.smi import SmiField

AGREE_FRACTION = 0.9  # a non-instant field must agree in this share of the pairs


@dataclass
class FieldVerdict:
    field: str
    query: str
    verdict: str  # agree | disagree | absent-both | nvml-only | smi-only
    pairs: int = 0
    agreeing: int = 0
    median_abs_diff: float | None = None
    nvml_example: float | None = None
    smi_example: float | None = None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def agree(f: SmiField, nvml: float, smi: float) -> bool:
    diff = abs(nvml - smi)
    return diff <= f.abs_tol or (f.rel_tol > 0 and diff <= f.rel_tol * max(abs(nvml), abs(smi)))


@dataclass
class Pairs:
    """(NVML value, nvidia-smi value) per field of one GPU, in time order; None where one had none."""

    values: dict[str, list[tuple[float | None, float | None]]] = field(default_factory=dict)

    def add(self, name: str, nvml: float | None, smi: float | None) -> None:
        self.values.setdefault(name, []).append((nvml, smi))


def judge(f: SmiField, pairs: list[tuple[float | None, float | None]]) -> FieldVerdict:
    both = [(a, b) for a, b in pairs if a is not None and b is not None]
    v = FieldVerdict(field=f.field, query=f.query, verdict="absent-both", pairs=len(both))
    nvml_any = next((a for a, _ in pairs if a is not None), None)
    smi_any = next((b for _, b in pairs if b is not None), None)
    v.nvml_example, v.smi_example = nvml_any, smi_any
    if not both:
        if nvml_any is None and smi_any is None:
            v.note = "neither NVML nor nvidia-smi has it on this GPU"
        elif nvml_any is None:
            v.verdict, v.note = "smi-only", "nvidia-smi reads it, gpulens's backend does not: a backend gap"
        else:
            v.verdict, v.note = "nvml-only", "gpulens reads it, nvidia-smi says N/A"
        return v
    diffs = [abs(a - b) for a, b in both]
    v.median_abs_diff = statistics.median(diffs)
    v.agreeing = sum(agree(f, a, b) for a, b in both)
    if f.instant:
        # the two reads are some milliseconds apart and the value moves: judge the run's medians
        ok = agree(f, statistics.median(a for a, _ in both), statistics.median(b for _, b in both))
    else:
        ok = v.agreeing >= AGREE_FRACTION * len(both)
    v.verdict = "agree" if ok else "disagree"
    return v
