"""What a tune run returns and records: its trials, the best setting and the findings behind it.
The JSON shape (`TuneResult.to_dict`) is the `--format json` contract in docs/tune.md."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from gpulens.tune.stats import Estimate

Verdict = Literal["baseline", "kept", "rolled_back", "failed"]


@dataclass
class Trial:
    """One configuration, measured. `samples` are per-step (training) or per-probe values."""

    index: int  # 0 is the baseline
    knobs: dict[str, str]
    changed: dict[str, str]  # the one change against the best so far (empty for the baseline)
    verdict: Verdict
    reason: str
    metric: str
    estimate: Estimate
    samples: list[float] = field(default_factory=list)
    speedup: float | None = None  # against the best so far when it was tried
    speedup_ci: tuple[float, float] | None = None
    speedup_at_least: bool = False  # `speedup` is a lower bound (the setting's limit was not reached)
    p_value: float | None = None
    command: str = ""
    run_id: int | None = None
    finding: str | None = None  # the finding kind this change addressed
    processes: int = 0  # runs of the command pooled into this trial
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)  # serve: cold start, capacity interval, probes

    def to_dict(self) -> dict[str, Any]:
        e = self.estimate
        d: dict[str, Any] = {
            "index": self.index, "knobs": self.knobs, "changed": self.changed, "verdict": self.verdict,
            "reason": self.reason, "metric": self.metric, self.metric: e.median,
            "ci": [e.ci95_low, e.ci95_high] if e.ci95_low is not None else None, "n": e.n,
            "speedup": self.speedup, "speedup_ci": list(self.speedup_ci) if self.speedup_ci else None,
            "speedup_at_least": self.speedup_at_least, "p_value": self.p_value, "command": self.command, "run_id": self.run_id, "finding": self.finding,
            "processes": self.processes, "seconds": round(self.seconds, 3),
        }
        d.setdefault("tokens_per_second", None)
        d.update(self.extra)
        return d


@dataclass
class TuneResult:
    mode: Literal["train", "serve"]
    name: str
    metric: str
    baseline: Trial
    trials: list[Trial]  # after the baseline, in the order tried
    best: Trial
    speedup: float | None  # best against the baseline
    speedup_ci: tuple[float, float] | None
    findings: list[dict[str, Any]]  # the diagnosis of the baseline (and of each kept setting)
    stop_reason: str
    reproduce_best: str
    reproduce_baseline: str
    run_id: int | None = None  # the tune's own run in the store
    skipped: list[dict[str, str]] = field(default_factory=list)  # changes the user declined
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    speedup_at_least: bool = False  # a lower bound: the best setting met every SLO up to the last rate tried

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode, "name": self.name, "metric": self.metric,
            "baseline": self.baseline.to_dict(),
            "trials": [t.to_dict() for t in self.trials],
            "best": {"knobs": self.best.knobs, "index": self.best.index, self.metric: self.best.estimate.median,
                     "speedup": self.speedup, "ci": list(self.speedup_ci) if self.speedup_ci else None,
                     "speedup_at_least": self.speedup_at_least, "run_id": self.best.run_id},
            "findings": self.findings,
            "stop_reason": self.stop_reason,
            "reproduce": {"best": self.reproduce_best, "baseline": self.reproduce_baseline},
            "run_id": self.run_id, "skipped": self.skipped, "notes": self.notes, "seconds": round(self.seconds, 3),
        }

