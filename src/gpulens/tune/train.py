"""`gpulens tune train`: the guides' tuning loop, run for the user on their own training command.

baseline (N steps, warm-up dropped, repeated until the median is tight or the budget says stop)
→ `diagnose` on it → the change that addresses the top finding, one at a time, in the guides'
order → each trial compared with the best so far (bootstrap CI and Mann-Whitney, as `compare`
does) → kept only when the gain is beyond noise, else rolled back → stop when the knobs are
exhausted, the budget is spent, or (for knobs gpulens proposed) the bottleneck is gone. A trial
that runs out of memory, turns the loss NaN or crashes is recorded as failed and rolled back.
Every trial is a run in the store (kind `tune-train`) with its command, knob values and the
environment fingerprint; the tune itself is a run of kind `tune` whose summary is the report.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from gpulens.bench.compare import DEFAULT_ALPHA, DEFAULT_THRESHOLD_RATIO, MIN_SAMPLES, compare_samples
from gpulens.diagnose import DiagnoseScope, Finding, diagnose
from gpulens.errors import BadInputError
from gpulens.runs import save_run, set_verdict
from gpulens.store import Store
from gpulens.tune.command import STEPS, CommandTemplate, fill_values, shell_line
from gpulens.tune.fit import FitCheck
from gpulens.tune.knobs import Knob, propose
from gpulens.tune.loop import Budget, Change, Observer, TuneSteps, run_loop, setting_text
from gpulens.tune.process import ProcessRun, run_command
from gpulens.tune.result import Trial, TuneResult
from gpulens.tune.stats import Estimate, estimate
from gpulens.workload.training.records import StepRecord

RUN_KIND = "tune-train"
TUNE_KIND = "tune"
# Findings that say a trial broke rather than where its time goes.
FAILURE_FINDINGS = ("oom", "nan_loss")


@dataclass
class TrainTuneSpec:
    command: CommandTemplate
    knobs: list[Knob]
    steps: int = 25  # per run of the command, warm-up included
    warmup_steps: int = 5  # a prefetching loader starts with a burst of ready batches
    block_steps: int = 4  # steps per throughput sample (see block_throughputs)
    budget_seconds: float = 1200.0
    max_runs_per_trial: int = 3  # runs of the command pooled until the estimate is tight
    tight_ratio: float = 0.05  # stop repeating when the 95 % CI half-width is within this share of the median
    threshold_ratio: float = DEFAULT_THRESHOLD_RATIO  # smallest gain worth keeping
    alpha: float = DEFAULT_ALPHA
    name: str | None = None
    cwd: Path | None = None
    stop_when_clear: bool = False  # also stop when no finding is left (beginner mode)
    fit: FitCheck | None = None  # the planner's memory check, when the model is named
    notes: list[str] = field(default_factory=list)

    def validate(self) -> None:
        if self.warmup_steps < 0 or self.max_runs_per_trial < 1 or self.block_steps < 1:
            raise BadInputError("--warmup must be 0 or more, --repeats and --block 1 or more.", hint="E.g. --warmup 5 --repeats 3 --block 4.")
        need = self.warmup_steps + MIN_SAMPLES * self.block_steps
        if self.steps < need:
            raise BadInputError(f"--steps {self.steps} gives fewer than {MIN_SAMPLES} samples of {self.block_steps} steps after "
                                f"{self.warmup_steps} warm-up steps, and a verdict needs {MIN_SAMPLES}.",
                                hint=f"Give --steps {need} or more (or a smaller --block).")
        if not self.budget_seconds > 0:
            raise BadInputError("The budget must be above zero.", hint="Give e.g. --budget 20m.")
        if not 0 < self.threshold_ratio < 1:
            raise BadInputError(f"--min-gain {self.threshold_ratio:.0%} is out of range.", hint="Give e.g. --min-gain 5%.")
        self.command.check(self.knobs)
        if self.fit is not None:
            self.fit.validate()


def block_throughputs(metric: str, steps: list[StepRecord], block: int) -> list[float] | None:
    """One sample per `block` consecutive steps: work done over their summed duration. A block,
    not a step, because a prefetching loader alternates long and short waits (a batch per worker
    arrives at once), which biases a per-step median; the sum over a block does not. None when a
    step lacks the quantity the metric counts."""
    out = []
    for i in range(0, len(steps) - block + 1, block):
        part = steps[i:i + block]
        seconds = sum(s.duration_seconds for s in part)
        if metric == "tokens_per_second":
            work = [s.tokens for s in part]
        elif metric == "samples_per_second":
            work = [s.samples for s in part]
        else:
            work = [1] * len(part)
        if any(not w for w in work):
            return None
        if seconds > 0:
            out.append(sum(work) / seconds)  # type: ignore[arg-type]
    return out


def _metric_of(steps: list[StepRecord]) -> str:
    if steps and all(s.tokens for s in steps):
        return "tokens_per_second"
    if steps and all(s.samples for s in steps):
        return "samples_per_second"
    return "steps_per_second"


class _TrainSteps(TuneSteps):
    def __init__(self, spec: TrainTuneSpec, store: Store, observer: Observer):
        super().__init__(Budget(spec.budget_seconds), observer)
        self.spec, self.store = spec, store
        self.stop_when_clear = spec.stop_when_clear
        self.tag = f"tune-{uuid.uuid4().hex[:8]}"
        self.metric: str | None = None
        self.name = spec.name
        self.stop_when_done = STEPS not in spec.command.placeholders()
        self.notes: list[str] = list(spec.notes)
        self.short_warned = False
        self.runs: dict[int, list[ProcessRun]] = {}  # each trial's runs of the command

    def argv(self, setting: dict[str, str]) -> list[str]:
        return self.spec.command.render(fill_values(self.spec.command, self.spec.knobs, setting, self.spec.steps))

    def knobs(self, baseline_findings: list[Finding]) -> list[Knob]:
        return self.spec.knobs

    def screen(self, change: Change, setting: dict[str, str]) -> str | None:
        if self.spec.fit is not None and not (planned := self.spec.fit.check(self.spec.command, self.spec.knobs, setting)).fits:
            return planned.text
        return None

    def measure(self, index: int, setting: dict[str, str], change: Change | None) -> Trial:
        spec = self.spec
        argv = self.argv(setting)
        t0 = time.monotonic()
        runs: list[ProcessRun] = []
        self.runs[index] = runs
        samples: list[float] = []
        est = Estimate(0, None, None, None)
        failure = None
        while len(runs) < spec.max_runs_per_trial:
            pooled = list(samples)

            def poll(steps: list[StepRecord], pooled: list[float] = pooled) -> None:
                warm = steps[spec.warmup_steps:]
                vals = pooled + (block_throughputs(self.metric or _metric_of(warm), warm, spec.block_steps) or [])
                self.obs.progress(index, len(steps), spec.steps, estimate(vals, resamples=400) if len(vals) > 1 else None)

            run = run_command(argv, self.store, f"{self.tag}-t{index}-r{len(runs)}", steps_wanted=spec.steps,
                              stop_when_done=self.stop_when_done, timeout_seconds=max(self.budget.left, 1.0), on_poll=poll,
                              cwd=spec.cwd)
            runs.append(run)
            if run.job and self.name is None:
                self.name = run.job
            failure = run.failure
            warm = run.steps[spec.warmup_steps:]
            if failure is None and len(warm) < 2 * spec.block_steps:
                failure = (f"the command recorded {len(run.steps)} steps, too few to measure after {spec.warmup_steps} "
                           f"warm-up steps; let it run at least --steps {spec.steps}")
            if failure is not None:
                break
            if not run.stopped and len(run.steps) < spec.steps and not self.short_warned:
                self.short_warned = True
                self.notes.append(f"a run of the command ended after {len(run.steps)} of the {spec.steps} steps asked for; "
                                  "put {steps} in the command or let it run longer, so that each trial has enough samples")
            if self.metric is None:
                self.metric = _metric_of(warm)
            vals = block_throughputs(self.metric, warm, spec.block_steps)
            if vals is None:
                failure = f"its steps do not all report {self.metric.split('_per_')[0]}, which the baseline's did"
                break
            samples += vals
            est = estimate(samples)
            per_run = (time.monotonic() - t0) / len(runs)
            if est.tight(spec.tight_ratio, MIN_SAMPLES) or not self.budget.fits(per_run):
                break
        return Trial(index=index, knobs=dict(setting), changed={change.knob.name: change.value} if change else {},
                     verdict="failed" if failure else "baseline", reason=failure or "", metric=self.metric or "steps_per_second",
                     estimate=est, samples=samples, command=shell_line(argv), finding=change.finding if change else None,
                     processes=len(runs), seconds=time.monotonic() - t0)

    def judge(self, best: Trial, trial: Trial) -> bool:
        cmp = compare_samples(trial.metric, best.samples, trial.samples, threshold_ratio=self.spec.threshold_ratio,
                              alpha=self.spec.alpha, seed=trial.index)
        if cmp.change_ratio is not None:
            trial.speedup = 1 + cmp.change_ratio
            trial.speedup_ci = (1 + cmp.ci95_low_ratio, 1 + cmp.ci95_high_ratio)  # type: ignore[operator]
        trial.p_value = cmp.p_value
        trial.verdict = "kept" if cmp.verdict == "improvement" else "rolled_back"
        trial.reason = f"{setting_text(trial.changed)} against {setting_text(best.knobs)}: {cmp.reason}"
        return cmp.verdict == "regression"

    def findings(self, trial: Trial) -> list[Finding]:
        ok = [r for r in self.runs.get(trial.index, []) if r.steps]
        if not ok:
            return []
        scope = DiagnoseScope(start=min(r.started for r in ok) - 1, end=max(r.ended for r in ok) + 1, job=ok[0].job)
        return [f for f in diagnose(self.store, scope) if f.workload == "training" and f.kind not in FAILURE_FINDINGS]

    def record(self, trial: Trial, *, regression: bool = False) -> None:
        runs = self.runs.get(trial.index, [])
        steps = [s for r in runs for s in r.steps[self.spec.warmup_steps:]]
        trial.run_id = save_run(
            self.store, RUN_KIND, self.name or "train",
            config={"command": trial.command, "knobs": trial.knobs, "changed": trial.changed, "tune": self.tag, "trial": trial.index},
            summary={"verdict": trial.verdict, "reason": trial.reason, "metric": trial.metric, "median": trial.estimate.median,
                     "ci": [trial.estimate.ci95_low, trial.estimate.ci95_high], "speedup": trial.speedup},
            samples={trial.metric: trial.samples, "step_seconds": [s.duration_seconds for s in steps]} if trial.samples else None,
            started=min((r.started for r in runs), default=None), ended=max((r.ended for r in runs), default=None),
        )
        if trial.verdict in ("baseline", "kept"):
            set_verdict(self.store, trial.run_id, "good")
        elif regression:  # slower beyond noise: `runs list` and `compare` show it as a regression
            set_verdict(self.store, trial.run_id, "regression")


def tune_train(spec: TrainTuneSpec, store: Store, observer: Observer | None = None) -> TuneResult:
    """Run the loop; raises BadInputError when the baseline itself cannot be measured."""
    spec.validate()
    steps = _TrainSteps(spec, store, observer or Observer())
    t0 = time.monotonic()
    base_setting = {k.name: k.baseline for k in spec.knobs}
    if spec.fit is not None:
        planned = spec.fit.check(spec.command, spec.knobs, base_setting)
        if not planned.fits:
            steps.notes.append(f"baseline: {planned.text}; it runs anyway, as the planner can be wrong")
    out = run_loop(steps, base_setting)
    baseline, best = out.baseline, out.best
    speedup, ci = _speedup(baseline, best, spec)
    result = TuneResult(
        mode="train", name=steps.name or "train", metric=baseline.metric, baseline=baseline, trials=out.trials, best=best,
        speedup=speedup, speedup_ci=ci, findings=out.findings, stop_reason=out.stop_reason,
        reproduce_best=shell_line(steps.argv(best.knobs)), reproduce_baseline=shell_line(steps.argv(baseline.knobs)),
        skipped=out.skipped, notes=steps.notes, seconds=time.monotonic() - t0,
    )
    result.run_id = save_run(store, TUNE_KIND, result.name, config={"mode": "train", "command": shell_line(spec.command.argv),
                             "knobs": {k.name: list(k.values) for k in spec.knobs}, "tune": steps.tag},
                             summary=result.to_dict())
    return result


def _speedup(baseline: Trial, best: Trial, spec: TrainTuneSpec) -> tuple[float | None, tuple[float, float] | None]:
    if best is baseline:
        return 1.0, None
    cmp = compare_samples(baseline.metric, baseline.samples, best.samples, threshold_ratio=spec.threshold_ratio, alpha=spec.alpha)
    if cmp.change_ratio is None:
        return None, None
    return 1 + cmp.change_ratio, (1 + cmp.ci95_low_ratio, 1 + cmp.ci95_high_ratio)  # type: ignore[operator]


def proposed_knobs(command: CommandTemplate) -> list[Knob]:
    """Beginner mode: values gpulens proposes for the command's placeholders that carry a
    baseline value and a meaning it knows (`{workers=0}`, `{batch=16}`, `{precision=fp32}`...)."""
    out = []
    for name, default in command.placeholders().items():
        k = propose(name, default) if default is not None else None
        if k is not None:
            out.append(k)
    if not out:
        raise BadInputError("There is nothing to tune: no --knob was given and the command has no placeholder with a "
                            "baseline value that gpulens knows how to change.",
                            hint="Write e.g. --num-workers {workers=0} --batch-size {batch=16} in the command, "
                                 "or give --knob workers=0,2,4.")
    return out
