"""The one tune loop that `tune train` and `tune serve` drive: baseline → next change → budget →
measure → keep or roll back, with the skipped changes, the findings and the stop reason written
once. Each mode brings its own steps (`TuneSteps`: how to measure, judge and record a trial), and a
surface (the CLI's live view, a test) plugs in an `Observer` to watch and to approve each trial."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpulens.diagnose import Finding
from gpulens.errors import BadInputError, UnavailableError
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


def setting_text(setting: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in setting.items()) or "the baseline"


def finding_brief(f: Finding, after_trial: int | None = None) -> dict[str, Any]:
    """A diagnosis finding as the report shows it: kind, severity, summary, evidence, the first fixes."""
    out: dict[str, Any] = {"kind": f.kind, "severity": f.severity, "summary": f.summary,
                           "evidence": f.to_dict()["evidence"], "advice": list(f.advice)[:3]}
    if after_trial is not None:
        out["after_trial"] = after_trial
    return out


class TuneSteps:
    """What one mode does inside the loop; the loop decides the order, the budget and the verdicts'
    consequences. Subclasses implement measure, judge, record and findings."""

    rank_by_findings = True  # try the changes that address the latest findings first
    stop_when_clear = False  # also stop when no change addresses a finding (beginner mode)
    rerun_hint = "Run it by hand to see why"  # after a baseline that could not be measured

    def __init__(self, budget: Budget, observer: Observer):
        self.budget, self.obs = budget, observer

    def measure(self, index: int, setting: dict[str, str], change: Change | None) -> Trial:
        """Run one setting; a trial that broke comes back with verdict "failed" and its reason."""
        raise NotImplementedError

    def judge(self, best: Trial, trial: Trial) -> bool:
        """Set the trial's verdict ("kept" or "rolled_back"), reason and speed-up against the best
        so far; True when it is a regression beyond noise."""
        raise NotImplementedError

    def record(self, trial: Trial, *, regression: bool = False) -> None:
        """Save the trial as a run in the store (sets `trial.run_id`)."""
        raise NotImplementedError

    def findings(self, trial: Trial) -> list[Finding]:
        """What the diagnosis says about a measured trial."""
        raise NotImplementedError

    def knobs(self, baseline_findings: list[Finding]) -> list[Knob]:
        """The knobs to tune, known once the baseline is diagnosed."""
        raise NotImplementedError

    def why(self, change: Change) -> str:
        """Why the loop tries this change next (beginner mode asks with it)."""
        return f"it addresses {change.finding}" if change.finding else "the next knob in the guides' order"

    def declined(self, why: str) -> str:
        return f"you declined it; {why}"

    def screen(self, change: Change, setting: dict[str, str]) -> str | None:
        """Why a change is skipped without a trial (the planner predicts it will not fit), or None."""
        return None


@dataclass
class LoopOutcome:
    baseline: Trial
    best: Trial
    knobs: list[Knob]
    trials: list[Trial] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)  # briefs, the baseline's first
    stop_reason: str = "every knob value was tried"


def run_loop(steps: TuneSteps, baseline_setting: dict[str, str]) -> LoopOutcome:
    """Measure the baseline, then one change at a time from the best so far until the knobs are
    exhausted, the budget is spent or the user stops it; raises BadInputError when the baseline
    itself cannot be measured (UnavailableError, exit 3, when its server could not be reached)."""
    baseline = _trial(steps, 0, baseline_setting, None)
    steps.record(baseline)
    steps.obs.trial_finished(baseline)
    if baseline.verdict == "failed":
        error = UnavailableError if baseline.extra.get("unreachable") else BadInputError
        raise error(f"The baseline could not be measured: {baseline.reason.rstrip('.')}.",
                    hint=f"{steps.rerun_hint}: {baseline.command}")
    findings = steps.findings(baseline)
    knobs = steps.knobs(findings)
    out = LoopOutcome(baseline, baseline, knobs, findings=[finding_brief(f) for f in findings])
    tried = {(k.name, k.baseline) for k in knobs}  # measured already, as the baseline
    while True:
        kinds = [f.kind for f in findings] if steps.rank_by_findings else []
        changes = next_changes(knobs, out.best.knobs, tried, kinds)
        if not changes:
            break
        if steps.stop_when_clear and not any(c.finding for c in changes):
            out.stop_reason = "no finding is left that a knob addresses" if kinds else "the diagnosis found no bottleneck left"
            break
        if (over := steps.budget.stop_reason([t.seconds for t in [baseline, *out.trials]])) is not None:
            out.stop_reason = over
            break
        change = changes[0]
        tried.add((change.knob.name, change.value))
        why = steps.why(change)
        setting = {**out.best.knobs, change.knob.name: change.value}
        if (skip := steps.screen(change, setting)) is not None:
            out.skipped.append({"change": change.text, "why": skip})
            continue
        if not steps.obs.approve(change, why):
            out.skipped.append({"change": change.text, "why": steps.declined(why)})
            continue
        try:
            trial = _trial(steps, len(out.trials) + 1, setting, change)
        except KeyboardInterrupt:  # the user stopped it: report what is done, the running trial left out
            out.stop_reason = f"you stopped it during {change.text}"
            break
        regression = False
        if trial.verdict == "failed":
            trial.reason = f"{change.text} failed: {trial.reason}; rolled back to {setting_text(out.best.knobs)}"
        else:
            regression = steps.judge(out.best, trial)
        steps.record(trial, regression=regression)
        out.trials.append(trial)
        steps.obs.trial_finished(trial)
        if trial.verdict == "kept":
            out.best = trial
            findings = steps.findings(trial)
            out.findings += [finding_brief(f, trial.index) for f in findings]
    return out


def _trial(steps: TuneSteps, index: int, setting: dict[str, str], change: Change | None) -> Trial:
    steps.obs.trial_started(index, dict(setting), change)
    return steps.measure(index, setting, change)
