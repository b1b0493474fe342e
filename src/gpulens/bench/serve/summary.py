"""Worker results -> one `LoadSummary`: merged histograms, counts, goodput, SLO verdicts, and the
warnings a user needs (the client was the bottleneck, every request failed, the run was cut short)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from gpulens.bench.serve.client import RequestRecord
from gpulens.bench.serve.runner import CANCELLED_ERROR, DIST_NAMES, LoadSpec, WorkerResult
from gpulens.bench.serve.stats import (
    DEFAULT_MAX_ERROR_RATIO,
    Concurrency,
    Distribution,
    LoadSummary,
    RequestCounts,
    RequestRates,
    SloResult,
)
from gpulens.vocab.slo import Slo

# Sends later than this against the schedule mean the client, not the server, set the pace.
CLIENT_LAG_P99_SECONDS = 0.010
CLIENT_CPU_BUSY_RATIO = 0.9


@dataclass
class LoadResult:
    summary: LoadSummary
    records: list[RequestRecord]
    wall_start_unix: float  # the run's start on the wall clock, for the store and the CSV
    # Each process's own account (CPU time, time waiting for a CPU), records and histograms aside.
    workers: list[WorkerCpu] = field(default_factory=list)


@dataclass(frozen=True)
class WorkerCpu:
    worker: int
    ok: int
    cpu_seconds: float
    wall_seconds: float
    cpu_wait_seconds: float | None
    started_perf: float


def _request_value(rec: RequestRecord, metric: str) -> float | None:
    if metric == "latency":
        return rec.latency
    if metric == "ttft":
        return rec.ttft
    if metric == "tpot":
        return rec.tpot
    if metric == "itl":
        return rec.itl_mean
    return None


def request_meets(rec: RequestRecord, slos: list[Slo]) -> bool:
    """A request counts toward goodput when it succeeded and each of its own values is in bound."""
    if rec.status != "ok":
        return False
    for s in slos:
        if s.metric == "error_rate":
            continue
        v = _request_value(rec, s.metric)
        if v is not None and not s.holds(v):
            return False
    return True


def run_windows(spec: LoadSpec, records: list[RequestRecord], interrupted: bool, wall_seconds: float) -> tuple[float, float]:
    """(send window, run window) in seconds, both from the first intended send.

    The send window ends with `--duration`, or, when `--requests` ended the schedule first, after
    N requests at the rate (N gaps of 1/rate, not the N − 1 between the first and the last send);
    a closed loop bounded by requests alone ends with its last send, a stopped run when it stopped.
    The run window ends at the later of the send window's end and the last completion."""
    if not records:
        return 0.0, 0.0
    first = min(rec.intended for rec in records)
    last_end = max((rec.end for rec in records if rec.end is not None), default=first)
    last_sent = max((rec.sent if rec.sent is not None else rec.intended) for rec in records)
    capped = spec.max_requests is not None and len(records) >= spec.max_requests
    if interrupted:
        send_end = max(last_sent, wall_seconds)
    elif capped and spec.mode == "open" and spec.rate:
        send_end = first + len(records) / spec.rate
        if spec.duration_seconds is not None:
            send_end = min(send_end, spec.duration_seconds)
    elif spec.duration_seconds is not None and not capped:
        send_end = spec.duration_seconds
    else:
        send_end = last_sent
    send_window = max(send_end - first, 1e-9)
    run_window = max(max(send_end, last_end) - first, 1e-9)
    return send_window, run_window


def summarize(spec: LoadSpec, results: list[WorkerResult], slos: list[Slo], wall_start_unix: float,
              max_error_ratio: float = DEFAULT_MAX_ERROR_RATIO, min_goodput_ratio: float | None = None) -> LoadResult:
    dists = {k: Distribution() for k in DIST_NAMES}
    records: list[RequestRecord] = []
    not_sent = 0
    cpu = wall = 0.0
    interrupted = False
    for r in results:
        for k, d in r.dists.items():
            dists[k].merge(d)
        records.extend(r.records)
        not_sent += r.not_sent
        cpu += r.cpu_seconds
        wall = max(wall, r.wall_seconds)
        interrupted |= r.interrupted
    records.sort(key=lambda x: (x.intended, x.index))
    requests = RequestCounts.of((rec.status for rec in records), not_sent=not_sent)
    http = Counter(str(rec.http_status) for rec in records if rec.http_status is not None)
    first_error = next((rec.error for rec in records if rec.status != "ok" and rec.error), None)

    send_window, span = run_windows(spec, records, interrupted, wall)
    tokens = sum(rec.output_tokens or 0 for rec in records if rec.status == "ok")
    in_tokens = sum(rec.input_tokens or 0 for rec in records if rec.status == "ok")
    short = sum(1 for rec in records if rec.status == "ok" and rec.planned_output_tokens is not None
                and rec.output_tokens is not None and rec.output_tokens < rec.planned_output_tokens)
    # Requests the user's stop cut off are neither the server's successes nor its failures.
    cancelled = sum(1 for rec in records if rec.error == CANCELLED_ERROR)
    judged = len(records) - cancelled
    failed = requests.failed - cancelled

    summary = LoadSummary(
        mode=spec.mode, target_rate=spec.rate, target_concurrency=spec.concurrency, target_ramp_to=spec.ramp_to,
        arrival=("replay" if spec.arrivals is not None else spec.arrival) if spec.mode == "open" else "closed",
        duration_seconds=span if records else 0.0,
        requests=requests,
        achieved_rate=requests.ok / span if records else 0.0,
        sent_rate=len(records) / send_window if records else 0.0,
        latency=dists["latency"].summary(),
        latency_uncorrected=dists["latency_uncorrected"].summary(),
        send_lag=dists["send_lag"].summary(),
        ttft=dists["ttft"].summary(), itl=dists["itl"].summary(), tpot=dists["tpot"].summary(),
        output_tokens=tokens,
        output_tokens_per_second=(tokens / span) if tokens else None,
        input_tokens=in_tokens, input_tokens_per_second=(in_tokens / span) if in_tokens else None,
        token_basis=spec.workload.token_basis if spec.workload is not None else None,
        workload=spec.workload.describe() if spec.workload is not None else None,
        concurrency=concurrency_distribution(records), output_tokens_short=short,
        http_statuses=dict(http), first_error=first_error, interrupted=interrupted,
        send_window_seconds=send_window if records else 0.0,
        rates_per_second=RequestRates.of(requests, span if records else 0.0),
        error_ratio=failed / judged if judged else 0.0,
        max_error_ratio=max_error_ratio,
    )
    _verdicts(summary, records, slos, min_goodput_ratio)
    _warnings(summary, spec, cpu, wall)
    workers = [WorkerCpu(r.worker, sum(1 for rec in r.records if rec.status == "ok"), r.cpu_seconds, r.wall_seconds,
                         r.cpu_wait_seconds, r.started_perf) for r in results]
    return LoadResult(summary, records, wall_start_unix, workers)


def concurrency_distribution(records: list[RequestRecord]) -> Concurrency | None:
    """Requests in flight (sent, not yet ended), weighted by how long each count lasted, from the
    first send to the last end: mean, p50, p90, p99 and max. Computed after the run, from the records."""
    edges: list[tuple[float, int]] = []
    for rec in records:
        if rec.sent is not None and rec.end is not None:
            edges.append((rec.sent, 1))
            edges.append((rec.end, -1))
    if not edges:
        return None
    edges.sort()
    held: dict[int, float] = {}
    level, t_prev = 0, edges[0][0]
    for t, step in edges:
        if t > t_prev:
            held[level] = held.get(level, 0.0) + (t - t_prev)
            t_prev = t
        level += step
    total = sum(held.values())
    if total <= 0:
        return Concurrency(mean=0.0, p50=0.0, p90=0.0, p99=0.0, max=float(max(1, level)))
    out = {"mean": sum(k * v for k, v in held.items()) / total, "max": float(max(held))}
    acc, levels = 0.0, sorted(held)
    marks = iter((("p50", 0.5), ("p90", 0.9), ("p99", 0.99)))
    name, q = next(marks)
    for k in levels:
        acc += held[k]
        while name and acc >= q * total - 1e-12:
            out[name] = float(k)
            name, q = next(marks, (None, 0.0))
        if name is None:
            break
    return Concurrency(mean=out["mean"], p50=out["p50"], p90=out["p90"], p99=out["p99"], max=out["max"])


def _pct(ratio: float) -> str:
    return f"{ratio * 100:g}%"


def _verdicts(summary: LoadSummary, records: list[RequestRecord], slos: list[Slo],
              min_goodput_ratio: float | None = None) -> None:
    """One verdict per SLO (on the run's statistic) and the error-ratio gate. With a goodput target
    (`--goodput 0.99`) the run is judged per request instead: it passes when that share of its
    requests met every SLO; the per-statistic verdicts are still reported, without gating."""
    error_ratio, bound = summary.error_ratio, summary.max_error_ratio
    per_request = min_goodput_ratio is not None
    for s in slos:
        if s.metric == "error_rate":
            value = error_ratio
        else:
            dist = getattr(summary, s.metric)
            value = None if dist is None else dist.get(s.stat or "p99")
        summary.slo_results.append(SloResult(s.text, s.metric, s.stat, s.bound, value, s.holds(value), gating=not per_request))
    explicit = any(s.metric == "error_rate" for s in slos)
    if slos and not explicit:
        summary.slo_results.append(SloResult(f"error_rate<={_pct(bound)} (implied)", "error_rate", None, bound,
                                             error_ratio, error_ratio <= bound, gating=not per_request))
    if slos:
        good = sum(1 for rec in records if request_meets(rec, slos))
        summary.goodput = good / summary.duration_seconds if summary.duration_seconds > 0 else 0.0
        judged = sum(1 for rec in records if rec.error != CANCELLED_ERROR)
        summary.goodput_ratio = good / judged if judged else 0.0
        if per_request:
            summary.slo_results.append(SloResult(f"goodput>={_pct(min_goodput_ratio)}", "goodput_ratio", None,
                                                 min_goodput_ratio, summary.goodput_ratio,
                                                 summary.goodput_ratio >= min_goodput_ratio, gating=True))
    for r in summary.slo_results:
        if not r.met and r.gating:
            summary.failures.append(f"SLO {r.slo} missed ({r.shown('nothing measured')})")
    if not explicit and not slos and error_ratio > bound:
        q = summary.requests
        summary.failures.append(f"{error_ratio:.2%} of requests failed ({q.error} errors, {q.timeout} timeouts, "
                                f"{q.rejected} rejected of {q.total}), above the {_pct(bound)} allowed "
                                f"(--max-error-ratio {bound:g})")


def _warnings(summary: LoadSummary, spec: LoadSpec, cpu: float, wall: float) -> None:
    w = summary.warnings
    lag = summary.send_lag
    busy = cpu / (wall * max(spec.workers, 1)) if wall > 0 else 0.0
    if spec.mode == "open" and lag is not None and lag.p99 > CLIENT_LAG_P99_SECONDS:
        summary.client_bound = True
        w.append(f"The client could not keep the schedule: 1 % of sends left more than {lag.p99 * 1e3:.1f} ms late "
                 f"(client CPU {busy:.0%} busy). Latencies are still measured from the intended times; "
                 "add --workers or lower the rate for a cleaner run.")
    elif busy >= CLIENT_CPU_BUSY_RATIO:
        summary.client_bound = True
        w.append(f"The client used {busy:.0%} of its CPU: it may have limited the load. Add --workers.")
    total, ok = summary.requests.total, summary.requests.ok
    if total and ok == 0:
        why = summary.first_error or "no response"
        w.append(f"Every request failed ({why}).")
    elif total and ok < total:
        failed = total - ok
        w.append(f"{failed} of {total} requests did not succeed (first: {summary.first_error or 'unknown'}).")
    if summary.requests.timeout:
        w.append(f"{summary.requests.timeout} requests timed out after {spec.timeout_seconds:g} s; they are in the "
                 "latency percentiles at that lower bound.")
    if summary.interrupted:
        w.append("The run was interrupted; these are the partial results.")
    planned = len(spec.workload.requests) if spec.workload is not None else 0
    if planned and total > planned:
        w.append(f"The run sent {total} requests from a workload of {planned} distinct ones, so some prompts were sent "
                 "again: a prefix cache serves a repeat faster than a new prompt. Give --requests (or a shorter "
                 "--duration) to plan one per request, up to 10,000.")
