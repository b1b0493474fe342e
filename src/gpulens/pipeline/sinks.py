"""The sinks a node's sampling loop feeds: the store, the exporter's readings, a recording, the alert
rules, the co-location watch, engine scrapers, and a trace's workload events (replays).

Each is small and knows one outside thing; `pipeline.node.build_node` decides which a door gets.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import IO, Any, Protocol

from gpulens.exporter.readings import LatestReadings
from gpulens.gpu.backend import GpuBackend
from gpulens.pipeline.loop import Frame
from gpulens.pipeline.writer import SampleWriter
from gpulens.store import Store

log = logging.getLogger(__name__)


class SinkBase:
    """No-op defaults: a sink overrides what it needs."""

    ticks = False  # True: on_tick runs on the evaluation cadence
    reads_unflushed = False  # True: on_tick needs no commit first (see loop.Sink)

    def on_frame(self, frame: Frame) -> None:
        pass

    def on_tick(self, now: float) -> None:
        pass

    def close(self) -> None:
        pass


class StoreSink(SinkBase):
    """GPU samples and XID events into the store; raw-sample retention on a slow cadence (live only)."""

    def __init__(
        self,
        store: Store,
        *,
        host: str | None = None,
        keep_seconds: Mapping[str, float] | None = None,
        retention_check_seconds: float = 3600.0,
        clock: Callable[[], float] = time.time,
        gpu_models: Mapping[int, str] | None = None,
    ):
        self.store = store
        self.writer = SampleWriter(store, host=host)
        self.keep_seconds = keep_seconds  # per table: raw, rollup_1m, rollup_1h, events (store defaults otherwise)
        self.retention_check_seconds = retention_check_seconds
        self.clock = clock
        self.gpu_models = dict(gpu_models or {})
        self.values_written = 0
        self._last_retention = time.monotonic()

    def on_frame(self, frame: Frame) -> None:
        self.values_written += self.writer.write_samples(frame.samples)
        for ev in frame.xids:
            self.writer.write_xid(ev, self.gpu_models.get(ev.gpu, ""))
        if frame.source_time is None and time.monotonic() - self._last_retention >= self.retention_check_seconds:
            self._last_retention = time.monotonic()
            self.store.apply_retention(self.clock(), self.keep_seconds)


class ReadingsSink(SinkBase):
    """The newest frame and XID counts for `/metrics` (read by the exporter at each scrape)."""

    def __init__(self, readings: LatestReadings):
        self.readings = readings

    def on_frame(self, frame: Frame) -> None:
        # For a replay, the exporter also shows the recorded time of what it serves.
        self.readings.update(frame.samples, source_time=frame.source_time)
        for ev in frame.xids:
            self.readings.add_xid(ev.gpu, ev.xid)

    def on_store_health(self, writable: bool, message: str, now: float) -> None:
        self.readings.store_write_failing = not writable  # gpulens_store_write_failing on /metrics, and /ready
        self.readings.store_write_error = message


class RecorderSink(SinkBase):
    """Every frame into a gpulens recording (replayable with `--backend replay:FILE`)."""

    def __init__(self, out: IO[str], backend: GpuBackend):
        from gpulens.gpu.record import Recorder

        self.recorder = Recorder(out, backend)
        self.error: OSError | None = None  # the write that failed (a full disk): recording stops there
        self.on_error: Callable[[], None] | None = None  # e.g. the loop's stop

    def on_frame(self, frame: Frame) -> None:
        if self.error is not None:
            return
        try:
            self.recorder.write_samples(frame.samples)
            for ev in frame.xids:
                self.recorder.write_xid(ev)
        except OSError as e:
            self.error = e
            log.error("the recording cannot be written (%s); it stops here", e.strerror or e)
            if self.on_error is not None:
                self.on_error()


class ViewSink(SinkBase):
    """Hands each frame to a callback (the `top` view)."""

    def __init__(self, show: Callable[[Frame], None]):
        self.show = show

    def on_frame(self, frame: Frame) -> None:
        self.show(frame)


class Evaluator(Protocol):
    """The alert runtime's shape: evaluate at a time, close at the end."""

    def evaluate(self, now: float) -> object: ...

    def close(self) -> None: ...


class EvaluatorSink(SinkBase):
    """Runs an evaluator (the alert rules) on the loop's evaluation cadence."""

    ticks = True

    def __init__(self, evaluator: Evaluator, *, owned: bool = True):
        self.evaluator = evaluator
        self.owned = owned  # False: the caller closes it
        # The alert runtime with a feed reads the store's buffer (AlertRuntime.reads_unflushed).
        self.reads_unflushed = bool(getattr(evaluator, "reads_unflushed", False))

    def on_tick(self, now: float) -> None:
        self.evaluator.evaluate(now)

    def on_store_health(self, writable: bool, message: str, now: float) -> None:
        tell = getattr(self.evaluator, "store_health", None)  # the alert runtime: GpulensStoreWriteFailing
        if tell is not None:
            tell(writable, message, now)

    def close(self) -> None:
        if self.owned:
            self.evaluator.close()


class _Every(SinkBase):
    """A sink that acts every `every_seconds` of the loop's (sample) time, at most."""

    ticks = True

    def __init__(self, every_seconds: float):
        self.every_seconds = every_seconds
        self._last: float | None = None

    def due(self, now: float) -> bool:
        if self._last is not None and now - self._last < self.every_seconds:
            return False
        self._last = now
        return True


class ColocationWatch(_Every):
    """Every few seconds, marks GPUs shared by a training job and a serving process. It reads what
    was committed (a minute's window, at most a flush interval behind) and leaves its marks to the
    loop's next commit; the alert rules see them at once (their feed holds what this process wrote)."""

    reads_unflushed = True

    def __init__(self, store: Store, every_seconds: float = 5.0, window_seconds: float = 60.0):
        super().__init__(every_seconds)
        self.store = store
        self.window_seconds = window_seconds
        # A pair needs two processes on one GPU within the window: the frames say when one last did,
        # so a node whose GPUs each run one process (most) skips the analysis's reads.
        self._seen: dict[int, dict[int, float]] = {}  # GPU -> pid -> last frame time it held memory
        self._marked = True  # a mark of 1 may be in the store (from an earlier run): analyse to resolve it

    def on_frame(self, frame: Frame) -> None:
        for s in frame.samples:
            if s.processes:
                seen = self._seen.setdefault(s.gpu, {})
                for p in s.processes:
                    if p.used_memory_bytes is not None:
                        seen[p.pid] = frame.t

    def _shared_lately(self, now: float) -> bool:
        edge = now - self.window_seconds - self.every_seconds  # with slack for the cadence
        for gpu, seen in list(self._seen.items()):
            for pid in [pid for pid, t in seen.items() if t < edge]:
                del seen[pid]
            if not seen:
                del self._seen[gpu]
            elif len(seen) > 1:
                return True
        return False

    def on_tick(self, now: float) -> None:
        if not self.due(now):
            return
        if not self._marked and not self._shared_lately(now):
            return  # no GPU held two processes lately and no mark is left to resolve: no pair to find
        self._marked = write_colocation_series(self.store, now, self.window_seconds, flush=False) > 0


def write_colocation_series(store: Store, now: float, window_seconds: float = 60.0, *, flush: bool = True) -> int:
    """Write the co-location marks (gpulens.diagnose.colocation.colocation_marks) at `now` and flush
    (unless `flush` is false: the caller commits): the analysis only reads, the watch writes. Returns
    how many marks were written."""
    from gpulens.diagnose.colocation import COLOCATION_SERIES, colocation_marks
    from gpulens.reader import StoreReader

    marks = colocation_marks(StoreReader(store), now, window_seconds)
    for m in marks:
        store.write(COLOCATION_SERIES, m.labels, now, m.value)
    if flush:
        store.flush()
    return len(marks)


class ScrapeSink(_Every):
    """Reads serving engines' `/metrics` every `every_seconds` into the store, in the loop's thread.
    The exporter passes their histograms through (see `export.prometheus.EngineHistogramCollector`)."""

    reads_unflushed = True  # writes only

    def __init__(self, scrapers: list[Any], every_seconds: float = 5.0):
        super().__init__(every_seconds)
        self.scrapers = scrapers

    def on_tick(self, now: float) -> None:
        if not self.due(now):
            return
        for s in self.scrapers:
            s.scrape_safely()

    def interrupt(self) -> None:
        """Cut the scrapes under way and skip later ones (the loop is stopping)."""
        for s in self.scrapers:
            s.stop()

    def close(self) -> None:
        self.interrupt()


class PodResourcesSink(_Every):
    """Asks the kubelet which pod holds which GPU every `every_seconds`, for the exporter's pod labels
    (a `gpulens.k8s.podresources.PodResourcesPoller`)."""

    reads_unflushed = True  # no store

    def __init__(self, poller: Any, every_seconds: float = 10.0):
        super().__init__(every_seconds)
        self.poller = poller

    def on_tick(self, now: float) -> None:
        if self.due(now):
            self.poller.refresh()

    def close(self) -> None:
        self.poller.close()


# Fields of a recorded workload event that are moments (shifted with the replay's timeline).
EVENT_TIME_FIELDS = ("t", "t_start", "t_end", "arrival", "intended", "start", "first_token", "end")


class TraceEventsSink(SinkBase):
    """A trace's workload events (training steps, requests, cold starts ...) into the store, each when
    the replay reaches its recorded moment, so telemetry and workload stay in step. With a rebased or
    looped replay, every moment of an event is shifted by where its end lands on the sample timeline
    (durations are kept)."""

    def __init__(self, backend: Any, store: Store, ctx: Any, events: list[dict[str, Any]]):
        from gpulens.workload.importers import event_time, load_builtin_importers

        load_builtin_importers()
        self.backend = backend
        self.store = store
        self.ctx = ctx
        self._time = event_time
        timed = [r for r in events if event_time(r) is not None]
        if hasattr(ctx, "skipped_events"):
            ctx.skipped_events += len(events) - len(timed)  # no time, or one outside 1970..2100
        self.events = sorted(timed, key=event_time)  # type: ignore[arg-type,return-value]
        self._next = 0
        self._pass_offset = 0.0
        self.last_event_t: float | None = None

    def _emit(self, record: dict[str, Any]) -> None:
        from gpulens.workload.importers import import_event

        end = self._time(record) + self._pass_offset  # type: ignore[operator]
        shift = self.backend.live_time(end) - (end - self._pass_offset)
        if shift:
            record = {k: (v + shift if k in EVENT_TIME_FIELDS and isinstance(v, int | float) else v) for k, v in record.items()}
        import_event(record, self.store, self.ctx)
        self.last_event_t = self._time(record)

    def on_frame(self, frame: Frame) -> None:
        offset = getattr(self.backend, "pass_offset_seconds", 0.0)
        if offset != self._pass_offset:  # a looped replay started over: finish the pass, then again
            self.finish()
            self._pass_offset, self._next = offset, 0
        src = frame.source_time if frame.source_time is not None else frame.t
        while self._next < len(self.events) and self._time(self.events[self._next]) + self._pass_offset <= src:  # type: ignore[operator]
            self._emit(self.events[self._next])
            self._next += 1

    def finish(self) -> None:
        """The events after the last frame (a trace's workload may outlast its telemetry)."""
        while self._next < len(self.events):
            self._emit(self.events[self._next])
            self._next += 1
