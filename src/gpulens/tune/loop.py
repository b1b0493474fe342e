"""What both tune loops share: which change to try next, the budget, and the observer that a
surface (the CLI's live view, a test) plugs in to watch and to approve each trial."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from gpulens.tune.knobs import Knob
from gpulens.tune.result import Trial
from gpulens.tune.stats import Estimate


@dataclass(frozen=True)
class Change:
    """One knob set to one value, against the best setting so far."""

    knob: Knob
    value: str
    finding: str | None  # the finding kind it addresses, when one does

    @property
    def text(self) -> str:
        return f"{self.knob.name}={self.value}"


def next_changes(knobs: Sequence[Knob], best: dict[str, str], tried: set[tuple[str, str]], findings: Sequence[str]) -> list[Change]:
    """Untried single changes from `best`, best first: those addressing the earliest finding
    first, then in the guides' order (input pipeline, batch, memory, compute, communication), then
    in the order the user gave knobs and values."""
    ranked = []
    for ki, k in enumerate(knobs):
        hit = next((i for i, f in enumerate(findings) if k.addresses(f)), None)
        for vi, v in enumerate(k.values):
            if v == best.get(k.name) or (k.name, v) in tried:
                continue
            key = (len(findings) if hit is None else hit, k.order, ki, vi)
            ranked.append((key, Change(k, v, findings[hit] if hit is not None else None)))
    return [c for _, c in sorted(ranked, key=lambda kc: kc[0])]


class Budget:
    """Wall-clock budget of a tune, on the monotonic clock."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self._t0 = time.monotonic()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    @property
    def left(self) -> float:
        return max(0.0, self.seconds - self.elapsed)

    def fits(self, expected_seconds: float) -> bool:
        return self.left >= expected_seconds

    def stop_reason(self, trial_seconds: list[float]) -> str | None:
        """Why the loop must stop before another trial (one more would not fit), or None."""
        expected = sum(trial_seconds) / max(1, len(trial_seconds))
        if self.fits(expected):
            return None
        return f"the budget is spent ({self.left:.0f} s left, a trial takes about {expected:.0f} s)"


class Observer:
    """Hooks a surface overrides; the defaults watch nothing and approve every trial."""

    def trial_started(self, index: int, knobs: dict[str, str], change: Change | None) -> None:
        """A trial (index 0: the baseline) is about to run."""

    def progress(self, index: int, done: int, wanted: int, estimate: Estimate | None) -> None:
        """Steps (or probes) done so far in the running trial, with the running estimate."""

    def trial_finished(self, trial: Trial) -> None:
        """A trial ended with its verdict."""

    def approve(self, change: Change, reason: str) -> bool:
        """Beginner mode asks here before each trial; False skips the change."""
        return True


def finding_brief(f: dict) -> dict:
    """A diagnosis finding as the report shows it: kind, severity, summary, evidence, the first fixes."""
    out = {k: f.get(k) for k in ("kind", "severity", "summary", "evidence")}
    out["advice"] = list(f.get("advice") or [])[:3]
    if "after_trial" in f:
        out["after_trial"] = f["after_trial"]
    return out
