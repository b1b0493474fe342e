"""The load engine: open-loop schedules (a rate) and closed-loop workers (a concurrency) on one
asyncio loop per process, with latency measured from each request's *intended* send time.

Why the intended time: a closed-loop client that waits for each response never sends the requests
a stalled server would have received, so a 1 s stall is charged to one request instead of to the
hundreds that should have been sent during it (coordinated omission; wrk2 measures the same way).
Here the schedule runs regardless of the responses, and each request's clock starts when it was
*meant* to leave. How late it actually left is reported as `send_lag`: when that grows, the client
itself is the bottleneck and the report says so.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from gpulens.bench.serve import precise_loop
from gpulens.bench.serve.client import CANCELLED_ERROR, RequestRecord, Target, check_target_url, send_one
from gpulens.bench.serve.cpu_wait import runnable_wait_seconds
from gpulens.bench.serve.gc_pauses import ShortGcPauses
from gpulens.bench.serve.http1 import ConnectionPool
from gpulens.bench.serve.plain_engine import PlainEngine
from gpulens.bench.serve.schedule import Arrival, intended_times
from gpulens.bench.serve.stats import Distribution
from gpulens.bench.serve.workload import Workload
from gpulens.errors import BadInputError, GpulensError, UnavailableError

SEND_LEAD_SECONDS = 0.005  # open loop: create each send's task this early, so it only has to wake
DIST_NAMES = ("latency", "latency_uncorrected", "send_lag", "ttft", "itl", "tpot")
# The most one load run may ask for: past these a schedule or a user pool is never built in any
# useful time (a rate of 1e300 is an endless loop planning the first microsecond; a billion users a
# billion tasks), and no single client machine sends that much anyway.
MAX_RATE_PER_SECOND = 1_000_000.0
MAX_CONCURRENCY = 100_000
MAX_WORKERS = 256  # load processes: more than any one machine has cores
WORKER_START_MARGIN_SECONDS = 0.1  # from "all workers ready" to their common start: time to read it
WORKER_READY_TIMEOUT_SECONDS = 120.0  # a worker gives up waiting for the others after this
# The longest schedule a recording may set (--replay-arrivals, after --speed and --duration).
MAX_REPLAY_SECONDS = 7 * 86400.0


class TargetUnreachableError(UnavailableError):
    """The load tester cannot open a connection to the target at all."""


@dataclass(frozen=True)
class LoadSpec:
    """One load run. Exactly one of `rate` (open loop) and `concurrency` (closed loop) is set."""

    target: Target
    rate: float | None = None
    concurrency: int | None = None
    arrival: Arrival = "constant"
    burstiness: float = 1.0
    ramp_to: float | None = None
    duration_seconds: float | None = 10.0
    max_requests: int | None = None
    timeout_seconds: float = 30.0
    max_connections: int = 1000
    seed: int | None = None
    workers: int = 1
    verify_tls: bool = True  # https: check the server's certificate (--insecure turns it off)
    # What each request sends (shaped traffic, a dataset); None: every request sends target.body.
    workload: Workload | None = None
    # A recording's send times, seconds from the run's start (`--replay-arrivals`): an open loop
    # on these instead of a rate. Request i sends the workload's request i.
    arrivals: tuple[float, ...] | None = None

    @property
    def mode(self) -> Literal["open", "closed"]:
        return "open" if self.rate is not None or self.arrivals is not None else "closed"

    def validate(self) -> None:
        if self.arrivals is not None:
            if self.rate is not None or self.concurrency is not None or self.ramp_to is not None:
                raise BadInputError("--replay-arrivals sets the schedule itself: leave out --rate, --concurrency and --ramp-to.",
                                    hint="Use --speed 2 to replay it twice as fast.")
            if not self.arrivals:
                raise BadInputError("The recording has no request arrivals to replay.", hint="Give a recording with request events.")
        elif (self.rate is None) == (self.concurrency is None):
            raise BadInputError("Give either --rate (open loop) or --concurrency (closed loop), not both or neither.",
                                hint="E.g. --rate 100 for 100 requests per second, or --concurrency 8.")
        if self.rate is not None and not self.rate > 0:
            raise BadInputError(f"The rate must be above zero requests per second, not {self.rate:g}.",
                                hint="Give --rate 10 or more; use --concurrency for a fixed number of users.")
        if self.ramp_to is not None and not self.ramp_to > 0:
            raise BadInputError(f"The ramp's end rate must be above zero, not {self.ramp_to:g}.", hint="Give --ramp-to 200, say.")
        for name, r in (("--rate", self.rate), ("--ramp-to", self.ramp_to)):
            if r is not None and not r <= MAX_RATE_PER_SECOND:  # also inf
                raise BadInputError(f"{name} {r:g} is more than the {MAX_RATE_PER_SECOND:,.0f} requests per second one load run can send.",
                                    hint=f"Give at most {name} {MAX_RATE_PER_SECOND:.0f}; for more, run several clients.")
        if self.concurrency is not None and self.concurrency > MAX_CONCURRENCY:
            raise BadInputError(f"--concurrency {self.concurrency} is more than the {MAX_CONCURRENCY:,} users one load run can hold.",
                                hint=f"Give at most --concurrency {MAX_CONCURRENCY}; for more, run several clients.")
        if self.arrivals is not None:
            span = self.arrivals[-1] - self.arrivals[0]
            if not span <= MAX_REPLAY_SECONDS:
                raise BadInputError(f"The recorded arrivals span {span:.3g} s, more than the {MAX_REPLAY_SECONDS / 86400:g} days one replay may run.",
                                    hint="Replay a part of it with --duration, or faster with --speed.")
        if self.ramp_to is not None and self.rate is None:
            raise BadInputError("--ramp-to needs a starting --rate.", hint="E.g. --rate 10 --ramp-to 200 --duration 60s.")
        if self.ramp_to is not None and self.duration_seconds is None:
            raise BadInputError("A ramp needs a --duration to ramp over.", hint="E.g. --rate 10 --ramp-to 200 --duration 60s.")
        if self.concurrency is not None and self.concurrency < 1:
            raise BadInputError(f"The concurrency must be at least 1, not {self.concurrency}.", hint="Give --concurrency 1 or more.")
        if self.duration_seconds is None and self.max_requests is None and self.arrivals is None:
            raise BadInputError("A run needs a bound: --duration, --requests or both.", hint="E.g. --duration 30s.")
        if self.max_requests is not None and self.max_requests < 1:
            raise BadInputError(f"--requests must be at least 1, not {self.max_requests}.", hint="Give --requests 100, say.")
        if not self.burstiness > 0:
            raise BadInputError(f"The burstiness must be above zero, not {self.burstiness:g}.",
                                hint="1 is Poisson; below 1 is burstier, above 1 is smoother.")
        if self.workers < 1:
            raise BadInputError(f"--workers must be at least 1, not {self.workers}.", hint="Give --workers 1 or more.")
        if self.workers > MAX_WORKERS:
            raise BadInputError(f"--workers {self.workers} is more than the {MAX_WORKERS} load processes one machine can run.",
                                hint="Give about one --workers per CPU core.")
        if self.concurrency is not None and self.workers > self.concurrency:
            raise BadInputError(f"{self.workers} workers cannot share a concurrency of {self.concurrency}.",
                                hint="Use at most as many --workers as --concurrency.")
        if not self.timeout_seconds > 0:
            raise BadInputError("The request timeout must be above zero.", hint="Give --timeout 30s, say.")
        check_target_url(self.target.url)
        if self.target.method == "HEAD":
            raise BadInputError("HEAD requests are not supported: their answers carry no body to time.",
                                hint="Use --method GET against the same URL.")
        try:
            self.target.request_bytes()
        except ValueError as e:
            raise BadInputError(f"Cannot build the request: {e}.", hint="Give each --header as 'Name: value' on one line.") from None


@dataclass
class Progress:
    """Live counters, read by the progress view while the run writes them."""

    sent: int = 0
    done: int = 0
    in_flight: int = 0
    by_status: dict[str, int] = field(default_factory=lambda: {"ok": 0, "error": 0, "timeout": 0, "rejected": 0})
    started_at: float | None = None  # perf_counter
    planned: int | None = None
    latency: Distribution | None = None  # single-process runs only

    def add(self, other: Progress) -> None:
        self.sent += other.sent
        self.done += other.done
        self.in_flight += other.in_flight
        for k, v in other.by_status.items():
            self.by_status[k] = self.by_status.get(k, 0) + v


@dataclass
class WorkerResult:
    """What one process measured. Distributions travel encoded between processes."""

    worker: int
    records: list[RequestRecord]
    dists: dict[str, Distribution]
    not_sent: int = 0
    interrupted: bool = False
    cpu_seconds: float = 0.0
    wall_seconds: float = 0.0
    # Runnable but waiting for a CPU during the run (cpu_wait.py); None where the kernel does not say.
    cpu_wait_seconds: float | None = None
    started_perf: float = 0.0  # the run's t0 on the host's monotonic clock (perf_counter), shared by processes

    def to_wire(self) -> dict:
        return {**self.__dict__, "dists": {k: d.encode() for k, d in self.dists.items()}}

    @classmethod
    def from_wire(cls, d: dict) -> WorkerResult:
        dists = {}
        for k, text in d["dists"].items():
            dists[k] = Distribution()
            dists[k].merge_encoded(text)
        return cls(**{**d, "dists": dists})


async def check_reachable(url: str, timeout: float = 5.0) -> None:
    """Open (and close) one TCP connection, so an unreachable target fails in a second with a clear
    message instead of producing a run of connection errors. Sends nothing: no side effects."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        _r, w = await asyncio.wait_for(asyncio.open_connection(parts.hostname, port), timeout)
        w.close()
    except (OSError, TimeoutError) as e:
        if isinstance(e, TimeoutError):
            why = f"no answer within {timeout:g} s"
        elif isinstance(e, socket.gaierror):  # its errno is a resolver code, not an OS one
            why = f"the host name does not resolve: {(e.strerror or str(e)).lower()}"
        else:
            why = os.strerror(e.errno).lower() if e.errno else str(e)
        raise TargetUnreachableError(
            f"Cannot reach {parts.hostname}:{port} ({why}).",
            hint="Check that the server is running and that the URL's host and port are right.",
        ) from None


class _Run:
    def __init__(self, spec: LoadSpec, worker: int, workers: int, progress: Progress):
        self.spec, self.worker, self.workers, self.progress = spec, worker, workers, progress
        self.records: list[RequestRecord] = []
        self.dists = {k: Distribution() for k in DIST_NAMES}
        progress.latency = self.dists["latency"] if workers == 1 else None
        self.stop = asyncio.Event()
        self.t0 = 0.0
        self.not_sent = 0
        self.raw = spec.target.request_bytes()
        # Shaped traffic: every request's bytes made now, so a send only indexes a list.
        w = spec.workload
        self.plans = None if w is None else [
            (spec.target.request_bytes(p.body), p.input_tokens, p.output_tokens) for p in w.requests]

    def _finish(self, rec: RequestRecord, itl: list[float]) -> None:
        p = self.progress
        p.done += 1
        p.in_flight -= 1
        p.by_status[rec.status] = p.by_status.get(rec.status, 0) + 1
        d = self.dists
        if rec.sent is not None:
            d["send_lag"].record(max(rec.sent - rec.intended, 0.0))
        if rec.status in ("ok", "timeout") and rec.end is not None:
            d["latency"].record(rec.end - rec.intended)
            if rec.sent is not None:
                d["latency_uncorrected"].record(rec.end - rec.sent)
        if rec.status == "ok":
            if rec.ttft is not None:
                d["ttft"].record(rec.ttft)
            if rec.tpot is not None:
                d["tpot"].record(rec.tpot)
            if itl:
                rec.itls = itl
                for gap in itl:
                    d["itl"].record(gap)

    async def _one(self, pool: ConnectionPool, index: int, intended: float, at: float | None = None,
                   plan: int | None = None) -> None:
        if at is not None:
            # Created ahead of time, the task only has to wake at `at`: one hop from the timer to
            # the send, instead of waking the scheduler that would then create the task.
            await _sleep_until(at)
            if self.stop.is_set():
                self.not_sent += 1
                return
        rec = RequestRecord(index=index, worker=self.worker, intended=intended)
        raw = self.raw
        if self.plans is not None:
            raw, rec.input_tokens, rec.planned_output_tokens = self.plans[(index if plan is None else plan) % len(self.plans)]
        self.records.append(rec)
        self.progress.sent += 1
        self.progress.in_flight += 1
        itl: list[float] = []
        try:
            await send_one(pool, self.spec.target, raw, rec, self.t0, self.spec.timeout_seconds, itl)
        finally:
            if rec.end is None and rec.error is None:
                rec.error = CANCELLED_ERROR
            self._finish(rec, itl)

    async def _open_loop(self, pool: ConnectionPool) -> None:
        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task] = set()
        schedule = self._schedule()
        index = 0
        for rel in schedule:
            target = self.t0 + rel
            # Long waits also watch for a stop; the task itself is created SEND_LEAD_SECONDS early
            # and waits for its exact time on the precise loop's timer.
            while target - time.perf_counter() > 0.25 and not self.stop.is_set():
                await _sleep_until(min(target - 0.05, time.perf_counter() + 0.2))
            await _sleep_until(target - SEND_LEAD_SECONDS)
            if self.stop.is_set():
                self.not_sent += 1 + sum(1 for _ in schedule)
                break
            task = loop.create_task(self._one(pool, index * self.workers + self.worker, rel, target))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            index += 1
        await self._drain(tasks)

    def _plain(self) -> bool:
        """Plain HTTP without conversations runs on the callback engine; streamed completions and
        multi-turn workloads on a task per request."""
        w = self.spec.workload
        return self.spec.target.kind == "http" and not (w is not None and w.conversations)

    def _schedule(self) -> Iterator[float]:
        spec = self.spec
        return iter(spec.arrivals[self.worker::self.workers]) if spec.arrivals is not None else intended_times(
            spec.rate or 0.0, arrival=spec.arrival, burstiness=spec.burstiness, ramp_to=spec.ramp_to,
            duration=spec.duration_seconds,
            max_requests=None if spec.max_requests is None else _share(spec.max_requests, self.worker, self.workers),
            seed=None if spec.seed is None else spec.seed + self.worker,
            phase=self.worker / self.workers, share=self.workers,
        )

    async def _plain_loop(self) -> None:
        spec = self.spec
        engine = PlainEngine(self)
        if spec.mode == "open":
            await engine.open_loop(self._schedule())
        else:
            await engine.closed_loop(
                _share(spec.concurrency or 1, self.worker, self.workers),
                None if spec.max_requests is None else _share(spec.max_requests, self.worker, self.workers),
                None if spec.duration_seconds is None else self.t0 + spec.duration_seconds)

    async def _closed_loop(self, pool: ConnectionPool) -> None:
        spec = self.spec
        users = _share(spec.concurrency or 1, self.worker, self.workers)
        budget = [None if spec.max_requests is None else _share(spec.max_requests, self.worker, self.workers)]
        end_at = None if spec.duration_seconds is None else self.t0 + spec.duration_seconds
        counter = [0]
        # Multi-turn: each user plays whole conversations, a turn after the previous answer.
        convs = spec.workload.conversations if spec.workload is not None else None
        next_conv = [self.worker]

        async def user() -> None:
            turns: list[int] = []
            while not self.stop.is_set():
                if end_at is not None and time.perf_counter() >= end_at:
                    return
                if budget[0] is not None:
                    if budget[0] <= 0:
                        return
                    budget[0] -= 1
                i = counter[0]
                counter[0] += 1
                plan = None
                if convs:
                    if not turns:
                        turns.extend(convs[next_conv[0] % len(convs)])
                        next_conv[0] += self.workers
                    plan = turns.pop(0)
                # A closed loop sends when the previous answer arrives: that *is* its intended time.
                await self._one(pool, i * self.workers + self.worker, time.perf_counter() - self.t0, plan=plan)

        tasks = {asyncio.ensure_future(user()) for _ in range(users)}
        await self._drain(tasks)

    async def _drain(self, tasks: set[asyncio.Task]) -> None:
        """Wait for requests still in flight: each has its own timeout, so this is bounded."""
        pending = set(tasks)
        while pending:
            stop_wait = asyncio.ensure_future(self.stop.wait())
            done, pending = await asyncio.wait(pending | {stop_wait}, timeout=self.spec.timeout_seconds + 5,
                                               return_when=asyncio.FIRST_COMPLETED)
            pending.discard(stop_wait)
            if stop_wait in done or not done:
                stop_wait.cancel()
                for t in pending:
                    t.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                return
            stop_wait.cancel()

    async def run(self, start_at_perf: float | None) -> WorkerResult:
        spec = self.spec
        loop = asyncio.get_running_loop()
        installed = False
        if threading.current_thread() is threading.main_thread():
            try:
                loop.add_signal_handler(signal.SIGINT, self.stop.set)
                installed = True
            except (NotImplementedError, RuntimeError):
                pass
        pool = ConnectionPool(spec.target.url, max_connections=spec.max_connections,
                              connect_timeout_seconds=spec.timeout_seconds, verify_tls=spec.verify_tls)
        gc_pauses = ShortGcPauses(loop)
        gc_pauses.start()
        cpu0 = time.process_time()
        wait0: float | None = None
        try:
            if start_at_perf is not None:
                await _sleep_until(start_at_perf)
            wait0 = runnable_wait_seconds()
            self.t0 = time.perf_counter()
            self.progress.started_at = self.t0
            if self._plain():
                await self._plain_loop()
            elif spec.mode == "open":
                await self._open_loop(pool)
            else:
                await self._closed_loop(pool)
        finally:
            gc_pauses.stop()
            pool.close()
            if installed:
                loop.remove_signal_handler(signal.SIGINT)
        wait1 = runnable_wait_seconds()
        return WorkerResult(
            worker=self.worker, records=self.records, dists=self.dists, not_sent=self.not_sent,
            interrupted=self.stop.is_set(), cpu_seconds=time.process_time() - cpu0,
            wall_seconds=time.perf_counter() - self.t0,
            cpu_wait_seconds=None if wait0 is None or wait1 is None else wait1 - wait0, started_perf=self.t0,
        )


async def _sleep_until(when: float) -> None:
    """Sleep until `when` on `time.perf_counter()`'s clock (the run's clock; the loop's may differ)."""
    delay = when - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


def _share(total: int, worker: int, workers: int) -> int:
    """Worker `worker`'s part of `total` when split as evenly as possible."""
    return total // workers + (1 if worker < total % workers else 0)


def run_worker(spec: LoadSpec, worker: int = 0, workers: int = 1, progress: Progress | None = None,
               start_at_perf: float | None = None, ready: Callable[[], float] | None = None) -> WorkerResult:
    """Run one process's share of the load on a fresh event loop, one whose timers keep the
    schedule to tens of microseconds (`precise_loop`). `ready`: called once the share is prepared
    (request bytes built), it blocks until every worker is, and returns their common start."""
    progress = progress or Progress()
    run = _Run(spec, worker, workers, progress)
    if ready is not None:
        start_at_perf = ready()
    return precise_loop.run(run.run(start_at_perf))


def _worker_main(spec: LoadSpec, worker: int, workers: int, start, go, queue, counters) -> None:
    progress = Progress()
    stop = threading.Event()

    def publish() -> None:  # copy the counters to shared memory for the parent's progress view
        while not stop.wait(0.2):
            _publish(progress, counters, worker)

    def ready() -> float:
        queue.put(("ready", worker))
        if not go.wait(WORKER_READY_TIMEOUT_SECONDS):
            raise TimeoutError(f"the other workers were not ready within {WORKER_READY_TIMEOUT_SECONDS:g} s")
        return start.value

    threading.Thread(target=publish, daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    try:
        result = run_worker(spec, worker, workers, progress, ready=ready)
        queue.put(("ok", result.to_wire()))
    except BaseException as e:  # reported to the parent, which raises it as one sentence
        queue.put(("error", f"{type(e).__name__}: {e}"))
    finally:
        stop.set()
        _publish(progress, counters, worker)


def _publish(p: Progress, counters, worker: int) -> None:
    base = worker * 7
    vals = (p.sent, p.done, p.in_flight, p.by_status["ok"], p.by_status["error"], p.by_status["timeout"], p.by_status["rejected"])
    for i, v in enumerate(vals):
        counters[base + i] = v


def run_processes(spec: LoadSpec, progress: Progress, on_tick: Callable[[], None] | None = None) -> list[WorkerResult]:
    """`--workers N`: N processes, each with its own event loop and a 1/N share of the load,
    started together on the shared monotonic clock."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    n = spec.workers
    counters = ctx.Array("q", n * 7, lock=False)
    queue = ctx.Queue()
    # The workers start together once all have imported and prepared their share (a spawned
    # interpreter takes from a fraction of a second to several on a busy machine): no worker runs
    # alone at the start, and nobody waits for a fixed guess.
    start, go = ctx.Value("d", 0.0, lock=False), ctx.Event()
    procs = [ctx.Process(target=_worker_main, args=(spec, i, n, start, go, queue, counters), daemon=True) for i in range(n)]
    for p in procs:
        p.start()
    results: list[WorkerResult] = []
    errors: list[str] = []
    ready = 0
    try:
        while len(results) + len(errors) < n:
            try:
                kind, payload = queue.get(timeout=0.2)
                if kind == "ready":
                    ready += 1
                elif kind == "ok":
                    results.append(WorkerResult.from_wire(payload))
                else:
                    errors.append(payload)
            except Exception:  # queue.Empty: refresh the view, notice dead workers
                if not any(p.is_alive() for p in procs) and queue.empty():
                    break
            # A worker that died before saying anything must not hold the others back.
            if not go.is_set() and ready + len(errors) + sum(not p.is_alive() for p in procs) >= n:
                start.value = time.perf_counter() + WORKER_START_MARGIN_SECONDS  # the same monotonic clock in every process
                go.set()
            _collect(progress, counters, n)
            if on_tick:
                on_tick()
    except KeyboardInterrupt:
        for p in procs:  # SIGINT to workers: ignored there; terminate keeps the partial results we have
            p.terminate()
    finally:
        for p in procs:
            p.join(timeout=1)
    if not results:
        why = errors[0] if errors else "they exited without a result"
        raise GpulensError(f"Every load worker failed ({why}).", hint="Run with --workers 1 to see the error directly.")
    return results


def _collect(progress: Progress, counters, n: int) -> None:
    vals = [sum(counters[w * 7 + i] for w in range(n)) for i in range(7)]
    progress.sent, progress.done, progress.in_flight = vals[0], vals[1], vals[2]
    progress.by_status.update(ok=vals[3], error=vals[4], timeout=vals[5], rejected=vals[6])
    if progress.started_at is None and progress.sent:
        progress.started_at = time.perf_counter()
