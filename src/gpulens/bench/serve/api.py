"""Entry points of the load tester: `run_load` (one run) and `sweep` (the highest rate or
concurrency at which every SLO holds, by bracketing then bisection)."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from gpulens.bench.serve.runner import (
    MAX_CONCURRENCY,
    MAX_RATE_PER_SECOND,
    LoadSpec,
    Progress,
    check_reachable,
    run_processes,
    run_worker,
)
from gpulens.bench.serve.stats import DEFAULT_MAX_ERROR_RATIO
from gpulens.bench.serve.summary import LoadResult, summarize
from gpulens.errors import BadInputError
from gpulens.vocab.slo import Slo

F = TypeVar("F", bound=Callable[..., Any])


def _blocking_even_inside_a_loop(fn: F) -> F:
    """Called where an event loop already runs on this thread (a Jupyter cell, an async app), the
    load tester's own loops could not start: asyncio.run() refuses to nest. There the call runs on
    a thread of its own, and blocks until it ends, as it does everywhere else."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return fn(*args, **kwargs)
        with ThreadPoolExecutor(1, thread_name_prefix="gpulens-load") as pool:
            return pool.submit(fn, *args, **kwargs).result()

    return call  # type: ignore[return-value]


@_blocking_even_inside_a_loop
def run_load(
    spec: LoadSpec,
    slos: list[Slo] | None = None,
    *,
    progress: Progress | None = None,
    on_tick: Callable[[], None] | None = None,
    check_target: bool = True,
    max_error_ratio: float = DEFAULT_MAX_ERROR_RATIO,
    min_goodput_ratio: float | None = None,
) -> LoadResult:
    """Run one load test and summarize it. Raises TargetUnreachableError (exit 3) when no connection
    to the target can be opened; every other failure of the server is in the result, and
    `summary.failures` says which gates (SLOs, `max_error_ratio` of failed requests) it failed."""
    spec.validate()
    _check_ratio(max_error_ratio)
    _check_goodput(min_goodput_ratio, slos)
    if check_target:
        asyncio.run(check_reachable(spec.target.url))
    progress = progress or Progress()
    if spec.arrivals is not None:
        progress.planned = len(spec.arrivals)
    elif spec.duration_seconds is not None and spec.rate is not None:
        mean_rate = spec.rate if spec.ramp_to is None else (spec.rate + spec.ramp_to) / 2
        progress.planned = int(mean_rate * spec.duration_seconds)
        if spec.max_requests is not None:
            progress.planned = min(progress.planned, spec.max_requests)
    elif spec.max_requests is not None:
        progress.planned = spec.max_requests
    wall_start = time.time()
    if spec.workers == 1:
        results = [run_worker(spec, 0, 1, progress)]
    else:
        results = run_processes(spec, progress, on_tick)
    return summarize(spec, results, slos or [], wall_start, max_error_ratio, min_goodput_ratio)


def _check_ratio(ratio: float) -> None:
    if not 0 <= ratio <= 1:
        raise BadInputError(f"--max-error-ratio must be from 0 to 1, not {ratio:g}.",
                            hint="Give e.g. --max-error-ratio 0.01 for at most 1 % failed requests.")


def _check_goodput(ratio: float | None, slos: list[Slo] | None) -> None:
    if ratio is None:
        return
    if not 0 < ratio <= 1:
        raise BadInputError(f"--goodput must be above 0 and at most 1, not {ratio:g}.",
                            hint="Give e.g. --goodput 0.99: 99 % of requests must meet every SLO.")
    if not any(s.metric != "error_rate" for s in slos or []):
        raise BadInputError("--goodput needs a per-request objective to count against.",
                            hint='Add e.g. --slo "ttft<=500ms" --slo "tpot<=50ms".')


@dataclass
class Probe:
    """One step of a sweep: the load offered and whether every SLO held."""

    value: float  # rate (requests/s) or concurrency
    passed: bool
    result: LoadResult
    failed_slos: list[str] = field(default_factory=list)
    slos: list[Slo] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        from gpulens.bench.serve.vllm_compat import vllm_scalars

        s = self.result.summary
        return {
            "value": self.value, "passed": self.passed, "failed_slos": self.failed_slos,
            "achieved_rate": s.achieved_rate, "goodput": s.goodput, "goodput_ratio": s.goodput_ratio,
            "client_bound": s.client_bound,
            "latency": s.latency.to_dict() if s.latency else None,
            "ttft": s.ttft.to_dict() if s.ttft else None,
            "requests": s.requests.to_dict(), "error_ratio": s.error_ratio,
            "slo_results": [r.to_dict() for r in s.slo_results],
            "input_tokens_per_second": s.input_tokens_per_second, "output_tokens_per_second": s.output_tokens_per_second,
            "concurrency": s.concurrency.to_dict() if s.concurrency else None,
            # the `vllm bench serve` figures of this probe (its per-request lists left out)
            **vllm_scalars(self.result.records, s.duration_seconds, slos=self.slos),
        }


@dataclass
class SweepResult:
    mode: str  # "open" (rates) or "closed" (concurrencies)
    slos: list[str]
    best: float | None  # highest value that passed; None when even the lowest probe failed
    lowest_failing: float | None  # lowest value that failed; None when no probe failed
    probes: list[Probe]
    note: str | None = None
    # Why the sweep stopped without a failing probe: "max_value" (it reached --max-rate or
    # --max-concurrency) or "max_probes"; None when a probe failed.
    stopped_by: str | None = None

    @property
    def limit_found(self) -> bool:
        """False when every probe passed: `best` is then only a lower bound of the capacity."""
        return self.lowest_failing is not None

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "slos": self.slos, "best": self.best, "lowest_failing": self.lowest_failing,
                "limit_found": self.limit_found, "stopped_by": self.stopped_by,
                "note": self.note, "probes": [p.to_dict() for p in self.probes]}


def _failed(res: LoadResult) -> list[str]:
    return [r.slo for r in res.summary.slo_results if not r.met and r.gating]


@_blocking_even_inside_a_loop
def sweep(
    spec: LoadSpec,
    slos: list[Slo],
    *,
    tolerance_ratio: float = 0.05,
    max_probes: int = 14,
    max_value: float | None = None,
    on_probe: Callable[[Probe], None] | None = None,
    progress_factory: Callable[[], Progress] | None = None,
    on_tick: Callable[[], None] | None = None,
    max_error_ratio: float = DEFAULT_MAX_ERROR_RATIO,
    min_goodput_ratio: float | None = None,
) -> SweepResult:
    """Find the highest rate (open loop) or concurrency (closed loop) at which every SLO holds.

    Start at the spec's rate/concurrency; double while probes pass (or halve while they fail) to
    bracket the boundary, then bisect until the bracket is within `tolerance_ratio`. Each probe is
    a full run of `spec.duration_seconds`, so the answer is for sustained load, not a burst."""
    if not slos:
        raise BadInputError("--sweep needs at least one --slo to sweep against.", hint='E.g. --slo "p99_latency<=500ms".')
    spec.validate()
    _check_ratio(max_error_ratio)
    _check_goodput(min_goodput_ratio, slos)
    if spec.arrivals is not None:
        raise BadInputError("--sweep cannot change the rate of a replayed recording.",
                            hint="Replay it at several --speed values instead, or sweep with --rate.")
    if max_value is not None and not max_value > 0:
        raise BadInputError(f"The sweep's upper limit must be above zero, not {max_value:g}.", hint="Give e.g. --max-rate 1000.")
    closed = spec.mode == "closed"
    # the doubling stops at what one load run can send (LoadSpec.validate refuses more)
    limit = float(MAX_CONCURRENCY) if closed else MAX_RATE_PER_SECOND
    if max_value is not None and not max_value <= limit:
        name = "--max-concurrency" if closed else "--max-rate"
        raise BadInputError(f"{name} {max_value:g} is more than one load run can send ({limit:,.0f}).",
                            hint=f"Give at most {name} {limit:.0f}.")
    max_value = limit if max_value is None else max_value
    asyncio.run(check_reachable(spec.target.url))
    probes: list[Probe] = []

    def probe(value: float) -> bool:
        s = replace(spec, concurrency=int(value)) if closed else replace(spec, rate=value, ramp_to=None)
        if closed and spec.workers > int(value):
            s = replace(s, workers=max(1, int(value)))
        def once() -> LoadResult:
            return run_load(s, slos, progress=progress_factory() if progress_factory else None, on_tick=on_tick,
                            check_target=False, max_error_ratio=max_error_ratio,
                            min_goodput_ratio=min_goodput_ratio)

        res = once()
        failed = _failed(res)
        if failed and res.summary.client_bound:
            # The client, not the server, missed the schedule: measure that load again before
            # concluding the server cannot take it.
            res = once()
            failed = _failed(res)
        p = Probe(value, not failed, res, failed, slos)
        probes.append(p)
        if on_probe:
            on_probe(p)
        return p.passed

    start = float(spec.concurrency if closed else spec.rate)  # type: ignore[arg-type]
    if max_value is not None and max_value < start:
        what = ("--max-concurrency", "--concurrency") if closed else ("--max-rate", "--rate")
        raise BadInputError(f"{what[0]} {max_value:g} is below the sweep's start, {what[1]} {start:g}.",
                            hint=f"Give a {what[0]} at or above {start:g}, or start lower.")
    lo: float | None = None
    hi: float | None = None
    x = start
    note = None
    # bracket
    while len(probes) < max_probes:
        if probe(x):
            lo = x
            if hi is not None:
                break
            if max_value is not None and x >= max_value:
                note = f"every probe up to the limit {max_value:g} passed"
                break
            x = x * 2 if max_value is None else min(x * 2, max_value)
        else:
            hi = x
            if lo is not None:
                break
            nxt = x / 2
            if (closed and nxt < 1) or (not closed and nxt < start / 64):
                note = "even the lowest load tried failed the SLOs"
                break
            x = max(1.0, float(int(nxt))) if closed else nxt
            if closed and x == hi:
                note = "even one concurrent request fails the SLOs"
                break
    # bisect
    while lo is not None and hi is not None and len(probes) < max_probes:
        if closed:
            if hi - lo <= 1:
                break
            mid = float((int(lo) + int(hi)) // 2)
        else:
            if hi <= lo * (1 + tolerance_ratio):
                break
            mid = (lo + hi) / 2
        if probe(mid):
            lo = mid
        else:
            hi = mid
    if lo is not None and hi is not None and len(probes) >= max_probes and note is None:
        note = f"stopped after {max_probes} probes; the boundary lies between {lo:g} and {hi:g}"
    stopped_by = None
    if hi is None and lo is not None:  # never failed: the capacity is above every probe
        reached_max = max_value is not None and lo >= max_value
        stopped_by = "max_value" if reached_max else "max_probes"
        note = None if reached_max else note
    if any(p.passed and p.result.summary.client_bound for p in probes):
        note = (note + "; " if note else "") + "the client was the bottleneck in some probes: add --workers"
    return SweepResult("closed" if closed else "open", [s.text for s in slos], lo, hi, probes, note, stopped_by)
