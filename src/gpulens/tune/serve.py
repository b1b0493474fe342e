"""`gpulens tune serve`: find the server (or client) configuration with the highest request rate
that meets every SLO.

With a server command (`vllm serve ... --max-num-seqs {max_num_seqs}`), each configuration is
started, waited for (its cold start recorded), swept with `bench serve`'s SLO sweep, and stopped.
Without one, only the client's knobs (`max_connections`, `stream`) are tuned against the running
server. A sweep brackets the capacity: the highest rate that passed and the lowest that failed.
A change is kept only when it passes a rate at which the best so far failed, i.e. beyond the
sweep's resolution; the per-request latencies at the highest rate both were probed at are
compared as `compare` does (bootstrap CI, Mann-Whitney) and reported beside the verdict.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from gpulens.bench.compare import compare_samples
from gpulens.bench.serve import LoadSpec, Probe, Slo, SweepResult, TargetUnreachableError, sweep
from gpulens.diagnose import DiagnoseScope, Finding, diagnose
from gpulens.errors import BadInputError
from gpulens.http_client import redact_url
from gpulens.runs import save_run, set_verdict
from gpulens.store import Store
from gpulens.tune.command import CommandTemplate, shell_line
from gpulens.tune.knobs import SERVING_MEMORY_FINDINGS, Knob, propose_serving
from gpulens.tune.loop import Budget, Change, Observer, TuneSteps, run_loop, setting_text
from gpulens.tune.result import Trial, TuneResult
from gpulens.tune.server import start_server
from gpulens.tune.stats import Estimate
from gpulens.workload.training.monitor import ENV_RUN, ENV_STORE
from gpulens.workload.wire import ENV_AGENT

RUN_KIND = "tune-serve"
TUNE_KIND = "tune"
METRIC = "requests_per_second"  # the highest offered rate at which every SLO held
CLIENT_KNOBS = ("max_connections", "stream")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass
class ServeTuneSpec:
    load: LoadSpec  # the load of one probe; its rate is where each sweep starts
    slos: list[Slo]
    knobs: list[Knob]
    server_command: CommandTemplate | None = None
    budget_seconds: float = 1200.0
    max_rate: float | None = None
    tolerance_ratio: float = 0.1
    max_probes: int = 10
    ready_timeout_seconds: float = 600.0
    ready_url: str | None = None  # default: the load's URL
    name: str = "serve"
    notes: list[str] = field(default_factory=list)
    propose: bool = False  # beginner mode: knobs from the server command's {NAME=VALUE} placeholders

    def proposable(self) -> list[tuple[str, str]]:
        """Placeholders of the server command with a baseline value that beginner mode can change."""
        if self.server_command is None:
            return []
        return [(n, d) for n, d in self.server_command.placeholders().items()
                if d is not None and propose_serving(n, d) is not None]

    def validate(self) -> None:
        if not self.slos:
            raise BadInputError("tune serve needs at least one --slo to tune against.", hint='E.g. --slo "p99_latency<=2s".')
        if self.load.rate is None:
            raise BadInputError("tune serve sweeps request rates; give the rate to start at.", hint="E.g. --rate 5.")
        self.load.validate()
        client = [k for k in self.knobs if k.name in CLIENT_KNOBS]
        for k in client:
            _client_value(k.name, k.baseline)
            for v in k.values:
                _client_value(k.name, v)
        server = [k for k in self.knobs if k.name not in CLIENT_KNOBS]
        if self.server_command is None:
            if server:
                raise BadInputError(f"Without --server-cmd only the client's knobs ({', '.join(CLIENT_KNOBS)}) can be tuned, "
                                    f"not {', '.join(k.name for k in server)}.",
                                    hint="Give the command that starts the server, with {NAME} placeholders for its knobs.")
            if not client:
                raise BadInputError("There is nothing to tune: no --knob was given (beginner mode needs --server-cmd).",
                                    hint="Give e.g. --knob max_connections=8,32,128, or --server-cmd with --knob max_num_seqs=64,128,256.")
        else:
            self.server_command.check(server, provided=("port",) if _port(self.load.target.url) else ())
            if self.propose and not self.knobs and not self.proposable():
                raise BadInputError("There is nothing to tune: no --knob was given and the server command has no batching "
                                    "limit written with its value.",
                                    hint="Write e.g. --max-num-seqs {max_num_seqs=256} in --server-cmd, or give --knob max_num_seqs=128,256.")
        if not self.budget_seconds > 0:
            raise BadInputError("The budget must be above zero.", hint="Give e.g. --budget 20m.")


def _port(url: str) -> str | None:
    try:
        port = urlsplit(url).port
    except ValueError:
        return None
    return str(port) if port else None


def _client_value(name: str, value: str) -> Any:
    if name == "max_connections":
        if not value.isdigit() or int(value) < 1:
            raise BadInputError(f"max_connections={value} is not a whole number of connections.", hint="E.g. --knob max_connections=8,32.")
        return int(value)
    low = value.lower()
    if low not in _TRUE + _FALSE:
        raise BadInputError(f"stream={value} is neither true nor false.", hint="E.g. --knob stream=true,false.")
    return low in _TRUE


def _client_load(base: LoadSpec, setting: dict[str, str]) -> LoadSpec:
    spec = base
    if "max_connections" in setting:
        spec = replace(spec, max_connections=_client_value("max_connections", setting["max_connections"]))
    if "stream" in setting:
        stream = _client_value("stream", setting["stream"])
        target = replace(spec.target, stream=stream)
        if target.body and target.kind != "http":  # an OpenAI body says whether to stream
            body = json.loads(target.body)
            body["stream"] = stream
            if stream:
                body["stream_options"] = {"include_usage": True}
            else:
                body.pop("stream_options", None)
            target = replace(target, body=json.dumps(body).encode())
        spec = replace(spec, target=target)
    return spec


def _latencies(p: Probe) -> list[float]:
    return [r.latency for r in p.result.records if r.latency is not None and r.status in ("ok", "timeout")]


def _probe_brief(p: Probe) -> dict[str, Any]:
    lat = p.result.summary.latency
    return {"rate": p.value, "passed": p.passed, "failed_slos": p.failed_slos,
            "p99_latency_seconds": getattr(lat, "p99", None), "achieved_rate": p.result.summary.achieved_rate}


class _ServeSteps(TuneSteps):
    rank_by_findings = False  # serve knobs are tried in the order given
    rerun_hint = "Start it by hand to see why"

    def __init__(self, spec: ServeTuneSpec, store: Store, observer: Observer):
        super().__init__(Budget(spec.budget_seconds), observer)
        self.spec, self.store = spec, store
        self.tag = f"tune-{uuid.uuid4().hex[:8]}"
        self.sweeps: dict[int, SweepResult] = {}
        self.windows: dict[int, tuple[float, float]] = {}  # unix seconds of each trial's sweep
        self.proposing = spec.propose and not spec.knobs
        self.notes: list[str] = list(spec.notes)

    def baseline_setting(self) -> dict[str, str]:
        return dict(self.spec.proposable()) if self.proposing else {k.name: k.baseline for k in self.spec.knobs}

    def knobs(self, baseline_findings: list[Finding]) -> list[Knob]:
        if not self.proposing:
            return [Knob(k.name, k.values) for k in self.spec.knobs]  # no meaning: tried in the order given
        # beginner mode: the values follow from the baseline's diagnosis
        kinds = [f.kind for f in baseline_findings]
        knobs = [k for n, d in self.baseline_setting().items() if (k := propose_serving(n, d, kinds)) is not None]
        self.notes.append("beginner mode: proposed " + "; ".join(f"{k.name}={','.join(k.values)}" for k in knobs)
                          + (" (smaller first: the diagnosis found the server short of memory)"
                             if any(k in SERVING_MEMORY_FINDINGS for k in kinds) else ""))
        return knobs

    def why(self, change: Change) -> str:
        return "a larger batch raises the rate a server sustains" if self.proposing else "the next knob value"

    def declined(self, why: str) -> str:
        return "you declined it"

    def findings(self, trial: Trial) -> list[Finding]:
        """What `diagnose` says about the server during a trial's sweep (from its middleware's records)."""
        if trial.index not in self.windows:
            return []
        start, end = self.windows[trial.index]
        return [f for f in diagnose(self.store, DiagnoseScope(start=start, end=end)) if f.workload == "inference"]

    def server_argv(self, setting: dict[str, str]) -> list[str] | None:
        if self.spec.server_command is None:
            return None
        values = {k: v for k, v in setting.items() if k not in CLIENT_KNOBS}
        port = _port(self.spec.load.target.url)
        if port:
            values.setdefault("port", port)
        return self.spec.server_command.render(values)

    def measure(self, index: int, setting: dict[str, str], change: Change | None) -> Trial:
        spec = self.spec
        t0 = time.monotonic()
        argv = self.server_argv(setting)
        extra: dict[str, Any] = {}
        failure = None
        sw = None
        server = None
        if argv is not None:
            server = start_server(argv, spec.ready_url or spec.load.target.url, timeout_seconds=min(spec.ready_timeout_seconds, max(self.budget.left, 1.0)),
                                  env={ENV_STORE: str(self.store.path), ENV_RUN: f"{self.tag}-t{index}", ENV_AGENT: "off"})
            extra["cold_start_seconds"] = server.cold_start_seconds
            failure = server.failure
        try:
            if failure is None:
                done = []

                def on_probe(p: Probe) -> None:
                    done.append(p)
                    self.obs.progress(index, len(done), spec.max_probes, Estimate(len(done), max((q.value for q in done if q.passed), default=None), None, None))

                w0 = time.time()
                sw = sweep(_client_load(spec.load, setting), spec.slos, tolerance_ratio=spec.tolerance_ratio,
                           max_probes=spec.max_probes, max_value=spec.max_rate, on_probe=on_probe)
                self.windows[index] = (w0, time.time())
            if server is not None and (died := server.died()) is not None:
                failure = died + " during the sweep (an out-of-memory error under load, say)"  # its probes measured nothing
        except TargetUnreachableError as e:
            failure = f"the server could not be reached: {e.message.rstrip('.')}"
            extra["unreachable"] = True  # an outside system, not the user's input: exit 3 if it is the baseline
        finally:
            if server is not None:
                server.stop()
        if failure is not None:
            sw = None  # a dead server's probes measured nothing
        if sw is not None:
            self.sweeps[index] = sw
            extra.update(capacity_interval=[sw.best, sw.lowest_failing], limit_found=sw.limit_found,
                         probes=[_probe_brief(p) for p in sw.probes], sweep_note=sw.note)
        est = Estimate(len(sw.probes), sw.best, sw.best, sw.lowest_failing) if sw is not None else Estimate(0, None, None, None)
        line = shell_line(argv) if argv is not None else f"gpulens bench serve --url {redact_url(spec.load.target.url)}"
        return Trial(index=index, knobs=dict(setting), changed={change.knob.name: change.value} if change else {},
                     verdict="failed" if failure else "baseline", reason=failure or "", metric=METRIC, estimate=est,
                     samples=[sw.best] if sw is not None and sw.best is not None else [], command=line,
                     processes=1 if argv else 0, seconds=time.monotonic() - t0, extra=extra)

    def judge(self, best: Trial, trial: Trial) -> bool:
        """Kept only beyond the sweep's resolution; never a regression (a capacity has no noise model)."""
        cur, new = self.sweeps[best.index], self.sweeps[trial.index]
        if cur.best and new.best:
            if new.lowest_failing is None:
                # The new setting met every SLO up to the last rate offered: its capacity is only a
                # lower bound, so the speed-up is one too, and only against the baseline's failing rate.
                trial.speedup = new.best / cur.lowest_failing if cur.lowest_failing else None
                trial.speedup_ci, trial.speedup_at_least = None, True
            else:
                trial.speedup = new.best / cur.best
                lo = new.best / cur.lowest_failing if cur.lowest_failing else None
                hi = new.lowest_failing / cur.best
                trial.speedup_ci = (lo, hi) if lo is not None else None
        evidence = self._latency_evidence(cur, new, trial)
        if new.best is None:
            trial.verdict, why = "rolled_back", "no rate it was offered met every SLO"
        elif cur.best is None:
            trial.verdict, why = "kept", f"it meets every SLO up to {new.best:g} req/s, where the best so far met them at no rate"
        elif cur.lowest_failing is not None and new.best >= cur.lowest_failing:
            trial.verdict, why = "kept", (f"it meets every SLO at {new.best:g} req/s, where the best so far failed "
                                          f"from {cur.lowest_failing:g} req/s")
        elif cur.lowest_failing is None:
            trial.verdict, why = "rolled_back", (f"the best so far met every SLO at every rate up to the limit ({cur.best:g} req/s), "
                                                 "so no gain can be shown; raise --max-rate")
        else:
            trial.verdict, why = "rolled_back", (f"its capacity ({new.best:g} req/s) is not beyond the best so far's bracket "
                                                 f"({cur.best:g}–{cur.lowest_failing:g} req/s)")
        trial.reason = f"{setting_text(trial.changed)}: {why}" + (f"; {evidence}" if evidence else "") + "."
        return False

    def _latency_evidence(self, cur: SweepResult, new: SweepResult, trial: Trial) -> str:
        """Per-request latency at the highest rate both sweeps probed, compared as `compare` does."""
        a = {p.value: p for p in cur.probes}
        common = sorted(set(a) & {p.value for p in new.probes})
        if not common:
            return ""
        rate = common[-1]
        b = next(p for p in new.probes if p.value == rate)
        cmp = compare_samples("latency_seconds", _latencies(a[rate]), _latencies(b), seed=trial.index)
        trial.p_value = cmp.p_value
        trial.extra["latency_at_common_rate"] = {"rate": rate, "verdict": cmp.verdict, "change_ratio": cmp.change_ratio,
                                                 "ci": [cmp.ci95_low_ratio, cmp.ci95_high_ratio], "p_value": cmp.p_value}
        return f"at {rate:g} req/s its latency {cmp.reason.rstrip('.')}"

    def record(self, trial: Trial, *, regression: bool = False) -> None:
        sw = self.sweeps.get(trial.index)
        best_probe = next((p for p in (sw.probes if sw else []) if p.value == sw.best), None) if sw else None
        trial.run_id = save_run(
            self.store, RUN_KIND, self.spec.name,
            config={"command": trial.command, "knobs": trial.knobs, "changed": trial.changed, "tune": self.tag, "trial": trial.index,
                    "url": redact_url(self.spec.load.target.url), "slos": [s.text for s in self.spec.slos]},
            summary={"verdict": trial.verdict, "reason": trial.reason, METRIC: trial.estimate.median,
                     "capacity_interval": trial.extra.get("capacity_interval"), "cold_start_seconds": trial.extra.get("cold_start_seconds")},
            samples={"latency_seconds": _latencies(best_probe)} if best_probe is not None else None,
        )
        if trial.verdict in ("baseline", "kept"):
            set_verdict(self.store, trial.run_id, "good")


def tune_serve(spec: ServeTuneSpec, store: Store, observer: Observer | None = None) -> TuneResult:
    spec.validate()
    steps = _ServeSteps(spec, store, observer or Observer())
    t0 = time.monotonic()
    out = run_loop(steps, steps.baseline_setting())
    baseline, best, knobs = out.baseline, out.best, out.knobs
    speedup, ci, at_least = None, None, False
    if best is baseline:
        speedup = 1.0
    else:
        probe = Trial(best.index, best.knobs, {}, "kept", "", METRIC, best.estimate)
        steps.judge(baseline, probe)
        speedup, ci, at_least = probe.speedup, probe.speedup_ci, probe.speedup_at_least

    def line(t: Trial) -> str:
        argv = steps.server_argv(t.knobs)
        client = " ".join(_bench_flag(k, v) for k, v in t.knobs.items() if k in CLIENT_KNOBS)
        bench = (f"gpulens bench serve --url {redact_url(spec.load.target.url)} --rate {spec.load.rate:g} --sweep "
                 + " ".join(f"--slo {shell_line([s.text])}" for s in spec.slos) + (f" {client}" if client else ""))
        return (shell_line(argv) + "  # then: " + bench) if argv is not None else bench

    result = TuneResult(
        mode="serve", name=spec.name, metric=METRIC, baseline=baseline, trials=out.trials, best=best, speedup=speedup,
        speedup_ci=ci, speedup_at_least=at_least, findings=out.findings, stop_reason=out.stop_reason, reproduce_best=line(best), reproduce_baseline=line(baseline),
        skipped=out.skipped, notes=steps.notes, seconds=time.monotonic() - t0,
    )
    result.run_id = save_run(store, TUNE_KIND, spec.name, config={
        "mode": "serve", "url": redact_url(spec.load.target.url), "slos": [s.text for s in spec.slos],
        "server_command": shell_line(spec.server_command.argv) if spec.server_command else None,
        "knobs": {k.name: list(k.values) for k in knobs}, "tune": steps.tag}, summary=result.to_dict())
    return result


def _bench_flag(name: str, value: str) -> str:
    if name == "stream":
        return "--stream" if _client_value(name, value) else "--no-stream"
    return f"--{name.replace('_', '-')} {value}"

