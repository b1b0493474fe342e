"""`gpulens replay`: import a recorded trace into a store as if it had been sampled live.

The same sampling loop and sinks as a live agent (`pipeline.node`), fed by a replay at full speed on
the recorded timeline: the store, the trace's workload events in time order, the co-location watch and
the alert rules evaluated every `evaluate_seconds` of recorded time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpulens.errors import StoreError, TraceError
from gpulens.gpu.replay import MAX_LINE_BYTES, RECORDING_FORMAT, ReplayBackend, event_hosts, resolve_trace
from gpulens.gpu.trace_fields import SkippedLine
from gpulens.pipeline.loop import Frame, StopEvent
from gpulens.pipeline.node import AlertsConfig, NodeConfig, build_node
from gpulens.pipeline.sinks import (
    Evaluator,
    SinkBase,
)
from gpulens.store import Store, trace_claims
from gpulens.workload.importers import REPLAY_HOST, ImportContext, event_time

log = logging.getLogger(__name__)


class _Discarding:
    """A store that keeps nothing: what the importers of already-stored events write is thrown away,
    while the state they keep (the model now serving, request counters, a job's parameter count for
    its MFU) is rebuilt as a whole import would have it."""

    path = Path("(priming)")

    def write(self, *_a: object, **_k: object) -> None: ...
    def write_id(self, *_a: object, **_k: object) -> None: ...
    def write_many(self, *_a: object, **_k: object) -> None: ...
    def event(self, *_a: object, **_k: object) -> None: ...
    def flush(self, *_a: object, **_k: object) -> int: return 0

    def series_id(self, *_a: object, **_k: object) -> int:
        return 0


def _prime(stored_events: list[dict], ctx: ImportContext) -> None:
    """Feed the importers the events an earlier (interrupted) import already stored, writing
    nothing, so the rest imports with the same labels and counters as one whole import: without it,
    a resumed import lost the served model's label and the MFU of steps before the job's size."""
    from gpulens.workload.importers import import_event

    counts, skipped = dict(ctx.counts), ctx.skipped_events
    for record in stored_events:
        import_event(record, _Discarding(), ctx)  # type: ignore[arg-type]
    ctx.counts, ctx.skipped_events = counts, skipped  # this import's summary counts what it stored
    ctx.series_ids.clear()  # ids the discarding store handed out are none of the real store's


@dataclass
class ImportSummary:
    trace: str
    gpu_frames: int = 0
    gpu_values: int = 0
    skipped_lines: int = 0
    skipped: list[SkippedLine] = field(default_factory=list)  # the first few, with line numbers and reasons
    skipped_events: int = 0  # workload records without a sane time or unreadable by their importer
    events: dict[str, int] = field(default_factory=dict)
    start: float | None = None
    end: float | None = None
    already_imported: bool = False  # nothing new: every sample and event of the trace was stored before
    lines_already_imported: int = 0  # samples and XIDs of the trace an earlier import stored (skipped now)
    shorter_than_imported: bool = False  # the beginning of a longer copy imported before (e.g. `head -50` of it)
    gpus: list[str] = field(default_factory=list)

    @property
    def duration_seconds(self) -> float:
        return (self.end - self.start) if self.start is not None and self.end is not None else 0.0


def _sha256(path: Path, nbytes: int | None = None) -> str:
    """sha256 of the file's first `nbytes` bytes (all of it when None)."""
    h = hashlib.sha256()
    left = nbytes
    with path.open("rb") as f:
        while left is None or left > 0:
            chunk = f.read(1 << 20 if left is None else min(1 << 20, left))
            if not chunk:
                break
            h.update(chunk)
            if left is not None:
                left -= len(chunk)
    return h.hexdigest()


def trace_identity(telemetry_path: Path) -> str:
    """What a trace is known by in the store: its first line that carries a time (the first sample;
    after a `gpulens record` header, which every recording of one machine shares, the header and
    the line after it), so a copy of it, or the file after lines were appended, is the same trace."""
    h = hashlib.sha256()
    with telemetry_path.open("rb") as f:
        first = f.readline(MAX_LINE_BYTES)
        h.update(first)
        if RECORDING_FORMAT.encode() in first:
            for line in f:
                if line.strip():
                    h.update(line[:MAX_LINE_BYTES])
                    break
    return h.hexdigest()


_COPY_KEY = "trace-copy:"  # meta key (+ the imported file's sha) -> the path of the copy imported


def _check_shorter(store: Store, path: Path, size: int, sha: str, claim: trace_claims.TraceClaim) -> None:
    """A trace shorter than the copy imported before (`head -50` of it, say): its import goes on
    (and stores only what the earlier one did not, by recorded time) when it is that copy's beginning,
    line for line; it is refused when it is not, or when that copy is no longer there to tell."""
    try:
        imported = json.loads(store.get_meta(_COPY_KEY + claim.prefix_sha[:16]) or "null")
    except ValueError:
        imported = None
    copy = Path(imported) if isinstance(imported, str) and imported else None
    same_file = copy is not None and copy == path.resolve()
    if copy is not None and not same_file:
        try:
            if copy.stat().st_size >= claim.prefix_bytes and _sha256(copy, claim.prefix_bytes) == claim.prefix_sha:
                if _sha256(copy, size) == sha:
                    return  # the beginning of what was imported
                raise TraceError(
                    f"The trace {path} is shorter than the copy imported into this store before ({copy}), and its lines "
                    "differ from that copy's; nothing was imported.",
                    hint="Use --force to import all of it (samples it shares with the earlier import are then stored twice), "
                         "or use another --store.")
        except OSError:
            pass  # the copy cannot be read: told below
    where = ("it was cut since" if same_file
             else f"the copy imported ({copy}) is gone or changed since" if copy is not None
             else "this store does not say where the copy imported was")
    raise TraceError(
        f"The trace {path} is shorter than the copy imported into this store before ({size} of {claim.prefix_bytes} bytes) "
        f"and {where}, so whether its lines are the ones stored cannot be told; nothing was imported.",
        hint="If it is the beginning of that copy, its lines are stored already; --force imports all of it again "
             "(samples it shares with the earlier import are then stored twice).")


class _Progress(SinkBase):
    def __init__(self, on_progress: Callable[[int], None] | None):
        self.on_progress = on_progress
        self.frames = 0

    def on_frame(self, frame: Frame) -> None:
        self.frames += 1
        if self.on_progress and self.frames % 100 == 0:
            self.on_progress(self.frames)


def map_recorded_host(ctx: ImportContext, backend: ReplayBackend) -> None:
    """One host for a recording's GPU samples and its workload: `ctx.host` (`--host`) if set, else
    the host the recording names (its header's, or the one host all its events name), else
    "replay"; the named host maps onto it. Events naming other hosts keep theirs."""
    hosts = event_hosts(backend.events_path)
    own = backend.recorded_host or (next(iter(hosts)) if len(hosts) == 1 else None)
    ctx.host = ctx.host or own or REPLAY_HOST
    if own:
        ctx.host_map.setdefault(own, ctx.host)


class _WholeFrames(SinkBase):
    """The last sink: a frame every sink has seen is whole. It is marked committable in the store
    (never half a frame), and a batch is committed once it holds `max_rows` rows or `max_seconds`
    of work, so a long import holds the store's write lock only in short commits (another writer,
    the agent, waits one commit at most, never the whole import)."""

    def __init__(self, store: Store, commit: Callable[[], None], max_rows: int, max_seconds: float):
        self.store = store
        self.commit = commit
        self.max_rows = max_rows
        self.max_seconds = max_seconds
        self.last_t: float | None = None  # recorded time of the last whole frame
        self.samples = 0  # GPU samples in whole frames
        self.last_commit = time.monotonic()

    def on_frame(self, frame: Frame) -> None:
        self.last_t = frame.source_time if frame.source_time is not None else frame.t
        self.samples += len(frame.samples)
        self.store.mark()
        if self.store.pending_count >= self.max_rows or time.monotonic() - self.last_commit >= self.max_seconds:
            self.commit()


# A batch of an import: at most this many rows, or this much wall time, between commits.
IMPORT_BATCH_ROWS = 5_000
IMPORT_BATCH_SECONDS = 0.25
CLAIM_POLL_SECONDS = 0.2


def _claim(store: Store, trace_id: str, path: Path, owner: str,
           on_wait: Callable[[str], None] | None) -> trace_claims.TraceClaim:
    """Take the trace's claim, waiting while another live import holds it (Ctrl-C ends the wait)."""
    told = False
    while True:
        got = trace_claims.take(store, trace_id, str(path), owner)
        if isinstance(got, trace_claims.TraceClaim):
            return got
        if not told and on_wait is not None:
            on_wait(trace_claims.owner_pid(got))
            told = True
        time.sleep(CLAIM_POLL_SECONDS)


def import_trace(
    path: str | Path,
    store: Store,
    *,
    speed: float | None = None,
    ctx: ImportContext | None = None,
    force: bool = False,
    on_progress: Callable[[int], None] | None = None,
    on_wait: Callable[[str], None] | None = None,
    alerts: AlertsConfig | None = None,
    evaluators: list[Evaluator] | None = None,
    evaluate_seconds: float = 1.0,
    batch_rows: int = IMPORT_BATCH_ROWS,
    batch_seconds: float = IMPORT_BATCH_SECONDS,
    max_gap_seconds: float | None = None,
    stop_event: StopEvent | None = None,
) -> ImportSummary:
    """Import a trace's GPU telemetry and workload events, keeping their recorded times.

    Telemetry and events are merged in time order, and the alert rules (`alerts`, or `evaluators` the
    caller holds and closes) run every `evaluate_seconds` of recorded time, so alerts on a replay are
    the ones a live agent would raise.

    Each sample is stored once, whatever runs at the same time: the import claims the trace in the
    store (`store.trace_claims`) and commits in batches of whole frames, each with the claim's new
    position in the same transaction. A second import of the same trace waits for the first
    (`on_wait` is told the pid); a trace imported before imports nothing again, a grown one only its
    new tail, a shorter copy (its beginning, verified against the copy imported) only what that
    import had not stored yet, and an import stopped midway (Ctrl-C, kill -9) is continued by the next. `force`
    imports all of the trace again (its samples are then stored twice). A set `stop_event` (SIGTERM,
    SIGINT) ends the import at once, keeping the whole frames it committed; a replay never waits
    longer than `max_gap_seconds` between frames (`gpu.replay_pacing`)."""
    telemetry_path, _ = resolve_trace(path)
    trace_id = trace_identity(telemetry_path)
    owner = trace_claims.this_owner()
    claim = _claim(store, trace_id, telemetry_path, owner, on_wait)
    try:
        return _import_claimed(path, store, claim, owner, speed=speed, ctx=ctx, force=force, on_progress=on_progress,
                               alerts=alerts, evaluators=evaluators, evaluate_seconds=evaluate_seconds,
                               batch_rows=batch_rows, batch_seconds=batch_seconds, max_gap_seconds=max_gap_seconds,
                               stop_event=stop_event)
    finally:
        try:
            trace_claims.release(store, trace_id, owner)
        except StoreError:
            log.debug("the claim on %s could not be released; the next import takes it over", telemetry_path)


def _import_claimed(
    path: str | Path, store: Store, claim: trace_claims.TraceClaim, owner: str, *, speed: float | None,
    ctx: ImportContext | None, force: bool, on_progress: Callable[[int], None] | None, alerts: AlertsConfig | None,
    evaluators: list[Evaluator] | None, evaluate_seconds: float, batch_rows: int, batch_seconds: float,
    max_gap_seconds: float | None, stop_event: StopEvent | None,
) -> ImportSummary:
    telemetry_path, _ = resolve_trace(path)
    size = telemetry_path.stat().st_size
    sha = _sha256(telemetry_path, size)
    summary = ImportSummary(trace=str(telemetry_path))
    prefix_bytes, prefix_sha = size, sha  # what a later import of this trace must begin with
    if not force:
        if claim.prefix_bytes and size < claim.prefix_bytes:
            _check_shorter(store, telemetry_path, size, sha, claim)
            summary.shorter_than_imported = True
            prefix_bytes, prefix_sha = claim.prefix_bytes, claim.prefix_sha  # the longer copy's lines stay the claim's
        elif claim.prefix_bytes and _sha256(telemetry_path, claim.prefix_bytes) != claim.prefix_sha:
            raise TraceError(
                f"The trace {telemetry_path} begins like one imported into this store before, but its earlier lines "
                "differ from what was imported; nothing was imported.",
                hint="Use --force to import all of it again (samples it shares with the earlier import are then stored twice), "
                     "or use another --store.",
            )
        # a store from before trace claims marked a whole-file import in meta
        if claim.position_t is None and store.get_meta(f"imported:{sha[:16]}"):
            summary.already_imported = True
            return summary
    resume_after = None if force else claim.position_t
    gap = {} if max_gap_seconds is None else {"max_gap_seconds": max_gap_seconds}
    backend = ReplayBackend(path, speed=speed, rebase=False, resume_after=resume_after, **gap)
    backend.require_samples()
    trace_claims.begin(store, claim.trace_id, owner, prefix_bytes=prefix_bytes, prefix_sha=prefix_sha, restart=force)
    if prefix_sha == sha:
        # where a shorter copy is compared with (JSON: a path need not be UTF-8)
        store.set_meta(_COPY_KEY + sha[:16], json.dumps(str(telemetry_path.resolve())))
    summary.gpus = [g.name for g in backend.gpus()]
    ctx = ctx or ImportContext()
    map_recorded_host(ctx, backend)
    ctx.gpu_model = ctx.gpu_model or next((g.name for g in backend.gpus()), "")  # the GPU's model, for peaks such as MFU's
    progress = _Progress(on_progress)
    store.flush()  # what was buffered before is not this trace's
    base_samples = 0 if force else claim.samples
    node = None
    whole: _WholeFrames | None = None

    def progress_now() -> tuple[float | None, int]:
        if whole is None:
            return None, base_samples
        whole.last_commit = time.monotonic()
        return whole.last_t, base_samples + whole.samples

    store.commit_marked_only(True)
    store.commit_hook = trace_claims.commit_hook(claim.trace_id, owner, progress_now)
    try:
        node = build_node(
            NodeConfig(backend=backend, host=ctx.host, alerts=alerts, evaluators=list(evaluators or ()), import_context=ctx,
                       evaluate_seconds=evaluate_seconds, view=progress.on_frame, stop_event=stop_event),
            store=store,
        )
        whole = _WholeFrames(store, node.loop.flush, batch_rows, batch_seconds)
        node.loop.sinks.append(whole)  # after every other sink: a frame is whole when it gets there
        events = node.trace_events
        if events is not None and resume_after is not None:
            stored = [r for r in events.events if event_time(r) <= resume_after]  # type: ignore[operator]
            events.events = events.events[len(stored):]  # sorted by time: the rest is what is not stored yet
            _prime(stored, ctx)
        stats = node.run()
        if not backend.exhausted:  # stopped (a signal) before the end
            raise TraceError(
                f"The import of {backend.telemetry_path} was stopped before its end; what it stored is kept, "
                "and running it again imports the rest (each sample once).",
                hint="Run it again.")
        last_event = events.last_event_t if events is not None else None
        end = max((x for x in (stats.last_sample_t, last_event) if x is not None), default=None)
        if end is not None:
            whole.last_t = max(end, whole.last_t or end)  # the workload that outlasted the telemetry is whole too
            store.mark()
            node.loop.evaluate(end)  # the rules see the workload that outlasted the telemetry
        node.loop.flush(force=True)
        if store.pending_count:
            store.flush()  # a failure to write the end of the trace is the import's failure, not a warning
    finally:
        try:
            if node is not None:
                node.close()
        finally:
            store.commit_hook = None
            store.commit_marked_only(False)  # a frame cut short by an interruption is not stored
    summary.gpu_frames = progress.frames
    summary.gpu_values = stats.values_written
    # the earliest and latest sample stored (a recording's clock may step back within the max gap)
    summary.start, summary.end = backend.first_recorded_t, backend.latest_recorded_t
    summary.events = dict(ctx.counts)
    summary.skipped_lines = backend.skipped_lines
    summary.skipped = list(backend.skipped)
    summary.skipped_events = ctx.skipped_events
    summary.lines_already_imported = backend.lines_already_imported
    if resume_after is not None and not summary.gpu_frames and not summary.events:
        summary.already_imported = True
    return summary
