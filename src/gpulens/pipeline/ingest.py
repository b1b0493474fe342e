"""`gpulens replay`: import a recorded trace into a store as if it had been sampled live.

The same sampling loop and sinks as a live agent (`pipeline.node`), fed by a replay at full speed on
the recorded timeline: the store, the trace's workload events in time order, the co-location watch and
the alert rules evaluated every `evaluate_seconds` of recorded time.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpulens.errors import TraceError
from gpulens.gpu.replay import ReplayBackend, event_hosts
from gpulens.gpu.trace_fields import SkippedLine
from gpulens.pipeline.loop import Frame
from gpulens.pipeline.node import AlertsConfig, NodeConfig, build_node
from gpulens.pipeline.sinks import (
    Evaluator,
    SinkBase,
)
from gpulens.store import Store
from gpulens.workload.importers import REPLAY_HOST, ImportContext


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
    already_imported: bool = False
    gpus: list[str] = field(default_factory=list)

    @property
    def duration_seconds(self) -> float:
        return (self.end - self.start) if self.start is not None and self.end is not None else 0.0


def _fingerprint(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


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


def import_trace(
    path: str | Path,
    store: Store,
    *,
    speed: float | None = None,
    ctx: ImportContext | None = None,
    force: bool = False,
    on_progress: Callable[[int], None] | None = None,
    alerts: AlertsConfig | None = None,
    evaluators: list[Evaluator] | None = None,
    evaluate_seconds: float = 1.0,
    max_gap_seconds: float | None = None,
    stop_event: threading.Event | None = None,
) -> ImportSummary:
    """Import a trace's GPU telemetry and workload events, keeping their recorded times.

    Telemetry and events are merged in time order, and the alert rules (`alerts`, or `evaluators` the
    caller holds and closes) run every `evaluate_seconds` of recorded time, so alerts on a replay are
    the ones a live agent would raise. A trace already imported into this store is not imported twice
    (unless `force`), so running `make run` again does not double every sample. A set `stop_event`
    (SIGTERM, SIGINT) ends the import at once, keeping nothing of it."""
    gap = {} if max_gap_seconds is None else {"max_gap_seconds": max_gap_seconds}
    backend = ReplayBackend(path, speed=speed, rebase=False, **gap)
    ctx = ctx or ImportContext()
    summary = ImportSummary(trace=str(backend.telemetry_path), gpus=[g.name for g in backend.gpus()])
    key = f"imported:{_fingerprint(backend.telemetry_path)}"
    if store.get_meta(key) and not force:
        backend.close()
        summary.already_imported = True
        rng = store.time_range()
        if rng:
            summary.start, summary.end = rng
        return summary
    map_recorded_host(ctx, backend)
    ctx.gpu_model = ctx.gpu_model or next((g.name for g in backend.gpus()), "")  # the GPU's model, for peaks such as MFU's
    progress = _Progress(on_progress)
    # One transaction per trace, its marker included: a kill or Ctrl-C midway leaves nothing
    # behind, so the rerun imports it whole, once.
    with store.atomic():
        node = build_node(
            NodeConfig(backend=backend, host=ctx.host, alerts=alerts, evaluators=list(evaluators or ()), import_context=ctx,
                       evaluate_seconds=evaluate_seconds, view=progress.on_frame, stop_event=stop_event),
            store=store,
        )
        try:
            stats = node.run()
            if not backend.exhausted:  # stopped (a signal) before the end: keep nothing of it
                raise TraceError(f"The import of {backend.telemetry_path} was stopped before its end; nothing of it was kept.",
                                 hint="Run it again.")
            events = node.trace_events
            last_event = events.last_event_t if events is not None else None
            end = max((x for x in (stats.last_sample_t, last_event) if x is not None), default=None)
            if end is not None:
                node.loop.evaluate(end)  # the rules see the workload that outlasted the telemetry
        finally:
            node.close()
        store.set_meta(key, f"{time.time():.0f} {backend.telemetry_path}")
    summary.gpu_frames = progress.frames
    summary.gpu_values = stats.values_written
    summary.start, summary.end = stats.first_sample_t, stats.last_sample_t
    summary.events = dict(ctx.counts)
    summary.skipped_lines = backend.skipped_lines
    summary.skipped = list(backend.skipped)
    summary.skipped_events = ctx.skipped_events
    return summary
