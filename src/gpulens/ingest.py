"""`gpulens replay`: import a recorded trace into a store as if it had been sampled live."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gpulens.gpu.replay import ReplayBackend, iter_events
from gpulens.sampling import SampleWriter
from gpulens.store import Store
from gpulens.workload.importers import ImportContext, event_time, import_event, load_builtin_importers

if TYPE_CHECKING:
    from gpulens.agent import Evaluator


@dataclass
class ImportSummary:
    trace: str
    gpu_frames: int = 0
    gpu_values: int = 0
    skipped_lines: int = 0
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


def import_trace(
    path: str | Path,
    store: Store,
    *,
    speed: float | None = None,
    ctx: ImportContext | None = None,
    force: bool = False,
    on_progress: Callable[[int], None] | None = None,
    evaluators: list[Evaluator] | None = None,
    evaluate_seconds: float = 1.0,
) -> ImportSummary:
    """Import a trace's GPU telemetry and workload events, keeping their recorded times.

    Telemetry and events are merged in time order, and `evaluators` (the alert runtime) run every
    `evaluate_seconds` of recorded time, so alerts on a replay are the ones a live agent would raise.
    A trace already imported into this store is not imported twice (unless `force`), so running
    `make run` again does not double every sample."""
    backend = ReplayBackend(path, speed=speed, rebase=False)
    ctx = ctx or ImportContext()
    summary = ImportSummary(trace=str(backend.telemetry_path), gpus=[g.name for g in backend.gpus()])
    key = f"imported:{_fingerprint(backend.telemetry_path)}"
    if store.get_meta(key) and not force:
        summary.already_imported = True
        rng = store.time_range()
        if rng:
            summary.start, summary.end = rng
        return summary
    ctx.host = ctx.host or "replay"
    writer = SampleWriter(store, host=ctx.host)
    model = backend.gpus()[0].name if backend.gpus() else ""  # the GPU's model, for XID labels
    ctx.gpu_model = ctx.gpu_model or model
    load_builtin_importers()
    events = sorted(
        (r for r in iter_events(backend.events_path) if event_time(r) is not None), key=lambda r: event_time(r)  # type: ignore[arg-type,return-value]
    )
    next_event = 0
    last_eval: float | None = None

    def evaluate(now: float) -> None:
        store.flush()
        for ev in evaluators or ():
            ev.evaluate(now)

    while True:
        frame = backend.sample()
        if not frame:
            break
        t = frame[0].t
        while next_event < len(events) and event_time(events[next_event]) <= t:  # type: ignore[operator]
            import_event(events[next_event], store, ctx)
            next_event += 1
        summary.gpu_frames += 1
        summary.gpu_values += writer.write_samples(frame)
        summary.start = frame[0].t if summary.start is None else min(summary.start, frame[0].t)
        summary.end = frame[0].t if summary.end is None else max(summary.end, frame[0].t)
        for ev in backend.drain_xid_events():
            writer.write_xid(ev, model)
        if evaluators and (last_eval is None or t - last_eval >= evaluate_seconds):
            evaluate(t)
            last_eval = t
        if on_progress and summary.gpu_frames % 100 == 0:
            on_progress(summary.gpu_frames)
    for record in events[next_event:]:
        import_event(record, store, ctx)
    if evaluators and summary.end is not None:
        evaluate(max(summary.end, event_time(events[-1]) if events else summary.end))  # type: ignore[type-var]
    summary.events = dict(ctx.counts)
    summary.skipped_lines = backend.skipped_lines
    store.flush()
    store.set_meta(key, f"{time.time():.0f} {backend.telemetry_path}")
    return summary
