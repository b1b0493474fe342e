"""What the memory model hands back: one GPU's predicted memory (`MemoryEstimate`), whether a peak
fits a card, and the estimate at the largest of a step's candidate moments."""

from __future__ import annotations

from dataclasses import dataclass, field

# Leave this share of the card free when deciding "fits" (fragmentation, other allocations).
FIT_MARGIN_RATIO = 0.02


@dataclass
class MemoryEstimate:
    """Predicted memory of one GPU. `peak_bytes` is the peak the framework allocates
    (torch.cuda.max_memory_allocated); `breakdown` itemizes it (bytes per item, summing to it)."""

    peak_bytes: int
    breakdown: dict[str, int]
    peak_at: str
    reserved_bytes: int
    cuda_context_bytes: int
    capacity_bytes: int
    fits: bool
    candidates: dict[str, int] = field(default_factory=dict)  # every candidate peak
    notes: list[str] = field(default_factory=list)
    mechanisms: dict[str, dict] = field(default_factory=dict)  # expert_parallel, optimizer_offload: their figures

    @property
    def headroom_bytes(self) -> int:
        return self.capacity_bytes - self.cuda_context_bytes - self.peak_bytes

    def to_dict(self) -> dict:
        return {
            "peak_bytes": self.peak_bytes,
            "breakdown": dict(self.breakdown),
            "peak_at": self.peak_at,
            "reserved_bytes": self.reserved_bytes,
            "cuda_context_bytes": self.cuda_context_bytes,
            "capacity_bytes": self.capacity_bytes,
            "headroom_bytes": self.headroom_bytes,
            "candidates": dict(self.candidates),
            "notes": list(self.notes),
            "mechanisms": {k: dict(v) for k, v in self.mechanisms.items()},
        }


def fits_in(peak_bytes: float, context_bytes: float, capacity_bytes: float) -> bool:
    return peak_bytes + context_bytes <= capacity_bytes * (1 - FIT_MARGIN_RATIO)


def peak_of(cands: dict[str, dict[str, float]], notes: list[str], *, reserved_ratio: float, cuda_context_bytes: int,
            capacity_bytes: int, mechanisms: dict[str, dict] | None = None) -> MemoryEstimate:
    """The estimate at the moment of a step that holds the most (each candidate: what is live then, by part)."""
    totals = {k: sum(int(x) for x in v.values()) for k, v in cands.items()}  # whole bytes, as the breakdown shows them
    peak_at = max(totals, key=lambda k: totals[k])
    breakdown = {k: int(v) for k, v in cands[peak_at].items() if v}
    peak = int(sum(breakdown.values()))
    return MemoryEstimate(peak_bytes=peak, breakdown=breakdown, peak_at=peak_at, reserved_bytes=int(peak * reserved_ratio),
                          cuda_context_bytes=cuda_context_bytes, capacity_bytes=capacity_bytes,
                          fits=fits_in(peak, cuda_context_bytes, capacity_bytes), candidates=totals, notes=notes,
                          mechanisms=mechanisms or {})
