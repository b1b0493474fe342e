"""ReplayBackend: plays a recorded trace back as if it were being sampled.

Two formats are read:
- the H200 session format (`telemetry.jsonl`, optionally with `nvml_probe.json` beside it for the
  GPU's static facts; see the bundled trace's README), one GPU per line;
- gpulens's own recording (`gpulens record`): a header line, then one line per GPU sample or XID.

A malformed line is skipped and counted (`skipped_lines`), never fatal: the rest is still played; so
is a line whose time jumps out of the recording's timeline (see `replay_pacing`: a replay never
waits longer than `max_gap_seconds` between frames, and a stop ends any wait at once).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gpulens.errors import TraceError, refuse_special_file
from gpulens.gpu.replay_pacing import (
    DEFAULT_MAX_GAP_SECONDS,
    Pacer,
    RawFrame,
    Wait,
    check_max_gap,
    guard_frames,
)
from gpulens.gpu.trace_fields import (
    BadLine,
    SkippedLine,
    check_sample,
    errors_map,
    info_from_fields,
    integer,
    number,
    sample_from_fields,
    text,
    time_seconds,
)
from gpulens.gpu.trace_fields import processes as tf_processes
from gpulens.gpu.types import GpuInfo, GpuSample, XidEvent
from gpulens.safe_parse import UnsafeValue, json_value
from gpulens.vocab import gpu_fields as F

log = logging.getLogger(__name__)

RECORDING_FORMAT = "gpulens-recording"
RECORDING_VERSION = 1  # the newest recording format this gpulens reads (`gpulens record` writes it)
MAX_SKIPPED_KEPT = 20  # skipped lines remembered with their reasons (all are counted)
MAX_LINE_BYTES = 1 << 20  # the header is read up to this much
_UNREADABLE = object()
UNREADABLE_EVENT = "unreadable"  # the kind iter_events gives a line it cannot read (no time: skipped, counted)


def _parse(line: str) -> Any:
    """One JSON line, or _UNREADABLE (bad JSON, NaN, nesting too deep, a number too long). Each field's
    number is checked where it is read (trace_fields.number), so the per-number checks are left out here."""
    try:
        return json_value(line, check_numbers=False) if line.strip() else _UNREADABLE
    except UnsafeValue:
        return _UNREADABLE


def resolve_trace(path: str | Path) -> tuple[Path, Path | None]:
    """(telemetry file, events file or None) for a trace folder or file."""
    p = Path(path)
    if not p.exists():
        raise TraceError(f"The trace {p} does not exist.", hint="Give a trace folder (with telemetry.jsonl) or a .jsonl file written by `gpulens record`.")
    if p.is_dir():
        for name in ("telemetry.jsonl", "recording.jsonl", "coloc_telemetry.jsonl"):
            if (p / name).is_file():
                tel = p / name
                break
        else:
            raise TraceError(f"The folder {p} holds no telemetry.jsonl.", hint="Point at a trace folder such as the bundled h200-trace, or at a recording file.")
        events = next((p / n for n in ("events.jsonl", "coloc_events.jsonl") if (p / n).is_file()), None)
        return tel, events
    refuse_special_file(p, "the trace", hint="Give a trace folder or a .jsonl file written by `gpulens record`.", error=TraceError)
    return p, None


def _probe_info(folder: Path) -> GpuInfo | None:
    """Static facts of the recorded GPU from nvml_probe.json, when it is there."""
    probe_path = folder / "nvml_probe.json"
    if not probe_path.is_file():
        return None
    try:
        probe = json_value(probe_path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, UnsafeValue):
        return None
    if not isinstance(probe, dict):
        return None

    def val(key: str) -> Any:
        entry = probe.get(key)
        return entry.get("value") if isinstance(entry, dict) and entry.get("ok") else None

    try:  # a probe that says something odd is ignored as a whole: its facts are optional
        mem = val("memory_info") or {}
        pci = val("pci_info") or {}
        limit_mw = val("enforced_power_limit_mw") or val("power_limit_mw")
        return info_from_fields({
            "index": 0,
            "uuid": val("uuid") or "GPU-replay-0",
            "name": val("name") or "replayed GPU",
            F.MEMORY_TOTAL_BYTES: mem.get("total"),
            F.TEMPERATURE_SLOWDOWN_CELSIUS: number(val("temp_threshold_slowdown"), "temp_threshold_slowdown"),
            F.TEMPERATURE_SHUTDOWN_CELSIUS: number(val("temp_threshold_shutdown"), "temp_threshold_shutdown"),
            F.SM_CLOCK_MAX_HZ: (number(val("max_clock_sm"), "max_clock_sm") or 0) * 1e6 or None,
            F.MEMORY_CLOCK_MAX_HZ: (number(val("max_clock_mem"), "max_clock_mem") or 0) * 1e6 or None,
            F.POWER_LIMIT_WATTS: limit_mw / 1000 if number(limit_mw, "power_limit_mw") else None,
            "pci_bus_id": pci.get("busId") or pci.get("busIdLegacy"),
        }, 0)
    except (BadLine, AttributeError, TypeError):
        log.warning("ignored %s: it does not read as an NVML probe", probe_path)
        return None


def _scaled(d: dict[str, Any], key: str, factor: float) -> float | None:
    """A raw field times its unit factor, checked first (a string or a non-finite value is refused)."""
    v = number(d.get(key), key)
    return None if v is None else v * factor


# what makes a line of the H200 session format a GPU sample: at least one reading (a line with only a
# time, such as an events.jsonl line handed over as the telemetry, would otherwise become a GPU that is up)
EVENT_LINE = "an event line"
H200_READING_KEYS = ("gpu_util", "mem_util", "mem_used", "temp_c", "power_mw", "energy_mj", "sm_mhz", "mem_mhz",
                     "clk_reasons", "pstate", "pcie_tx_kbs", "pcie_rx_kbs", "gpm_sm_util", "gpm_sm_occupancy",
                     "gpm_any_tensor_util", "gpm_dram_bw_util", "nproc", "procs", "errs")


def _h200_line_to_sample(d: dict[str, Any], info: GpuInfo) -> GpuSample:
    """One line of the H200 session format -> GpuSample (units converted to base units)."""
    readings = any(k in d for k in H200_READING_KEYS)
    if not readings and "kind" in d:
        raise BadLine(f"{EVENT_LINE} (kind {str(d['kind'])[:20]!r}), not a GPU sample")
    t = time_seconds(d.get("t"))
    if not readings:
        raise BadLine("no GPU reading (none of gpu_util, mem_used, temp_c, power_mw, sm_mhz …)")
    procs = d.get("procs")
    processes = tf_processes(procs) if isinstance(procs, list) else None
    nproc = integer(d.get("nproc"), "nproc")
    s = GpuSample(
        t=t,
        gpu=info.index,
        uuid=info.uuid,
        name=info.name,
        utilization_gpu_ratio=_scaled(d, "gpu_util", 0.01),
        utilization_memory_copy_ratio=_scaled(d, "mem_util", 0.01),
        memory_used_bytes=number(d.get("mem_used"), "mem_used"),
        memory_total_bytes=number(d.get("mem_total", info.memory_total_bytes), "mem_total"),
        temperature_celsius=number(d.get("temp_c"), "temp_c"),
        temperature_slowdown_celsius=info.temperature_slowdown_celsius,
        temperature_shutdown_celsius=info.temperature_shutdown_celsius,
        power_watts=_scaled(d, "power_mw", 1e-3),
        power_limit_watts=info.power_limit_watts,
        energy_joules=_scaled(d, "energy_mj", 1e-3),
        sm_clock_hz=_scaled(d, "sm_mhz", 1e6),
        memory_clock_hz=_scaled(d, "mem_mhz", 1e6),
        sm_clock_max_hz=info.sm_clock_max_hz,
        memory_clock_max_hz=info.memory_clock_max_hz,
        clock_event_mask=integer(d.get("clk_reasons"), "clk_reasons"),
        performance_state=integer(d.get("pstate"), "pstate", hi=32),
        pcie_tx_bytes_per_second=_scaled(d, "pcie_tx_kbs", 1024.0),
        pcie_rx_bytes_per_second=_scaled(d, "pcie_rx_kbs", 1024.0),
        sm_active_ratio=_scaled(d, "gpm_sm_util", 0.01),
        sm_occupancy_ratio=_scaled(d, "gpm_sm_occupancy", 0.01),
        tensor_active_ratio=_scaled(d, "gpm_any_tensor_util", 0.01),
        dram_active_ratio=_scaled(d, "gpm_dram_bw_util", 0.01),
        compute_process_count=nproc if processes is None else len(processes),
        processes=processes,
        errors=errors_map(d.get("errs")),
    )
    return check_sample(s)


class ReplayBackend:
    """Plays a trace. `speed=None` plays as fast as possible; `speed=1.0` at the recorded pace, 2.0 twice
    as fast. With `rebase=True` sample times are shifted so the trace starts now (for a live agent);
    otherwise they keep the recorded times (for importing). With `loop=True` it starts over at the end.

    A recorded gap longer than `max_gap_seconds` is played as that long; a frame that far from both its
    neighbours is skipped and counted, and so is one that far before the latest frame played (a clock
    that went back). A recording's header is checked (its format version, one entry per GPU index), and
    a sample or XID of a GPU it does not list is skipped and counted. Waits go through `wait_with(wait)`
    (the sampling loop hands its stop-aware wait), else `sleep`."""

    name = "replay"

    def __init__(
        self,
        path: str | Path,
        *,
        speed: float | None = None,
        rebase: bool = False,
        loop: bool = False,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        resume_after: float | None = None,
        max_gap_seconds: float = DEFAULT_MAX_GAP_SECONDS,
        pace_clock: Callable[[], float] | None = None,
    ):
        self.telemetry_path, self.events_path = resolve_trace(path)
        # an import that continues a trace stored before: samples and XIDs recorded at or before this are skipped
        self.resume_after = resume_after
        self.lines_already_imported = 0
        if speed is not None and speed <= 0:
            raise TraceError(f"A replay speed must be above zero, not {speed}.", hint="Use --speed max or a factor such as 1 or 10.")
        self.speed = speed
        self.rebase = rebase
        self.loop = loop
        self._clock = clock
        self._sleep = sleep
        self.max_gap_seconds = check_max_gap(max_gap_seconds)
        # pacing runs on a monotonic clock (a wall-clock step must not stretch a wait), unless a test drives the clock
        self._pacer = Pacer(speed, self.max_gap_seconds, pace_clock or (time.monotonic if clock is time.time else clock))
        self._wait: Wait = self._sleep_wait
        self.skipped_lines = 0
        self.skipped: list[SkippedLine] = []  # the first MAX_SKIPPED_KEPT, with their line numbers
        self.lines_read = 0  # sample lines read (not counting skipped ones)
        self.samples_read = 0
        self._xids: list[XidEvent] = []
        self._infos: list[GpuInfo] = []
        self.recorded_host: str | None = None  # the host a recording's header names
        self._header_gpus: dict[int, GpuInfo] = {}  # a recording's GPUs by index: a sample names one of them
        # the earliest and latest recorded time of the frames played (a recording's clock may step back)
        self.first_recorded_t: float | None = None
        self.latest_recorded_t: float | None = None
        self._format = self._sniff()
        self._frames = self._frames_forever() if loop else self._read_frames()
        self._next: list[GpuSample] | None = None
        self._done = False
        self._wall0: float | None = None
        self._played_at: tuple[float, float] | None = None  # (recorded t, played seconds) of the frame waited for
        self.last_recorded_t: float | None = None  # recorded time of the frame last returned
        self.pass_offset_seconds = 0.0  # with loop=True: how far the current pass is shifted from the recording
        self._next_offset = 0.0
        self._advance()
        if self._done and self.skipped and all(k.reason.startswith(EVENT_LINE) for k in self.skipped):
            raise TraceError(f"The trace {self.telemetry_path} is a file of workload events (each line has a kind), "
                             "not GPU telemetry.",
                             hint="Give the trace folder (its telemetry.jsonl is read with the events.jsonl beside it), "
                                  "or its telemetry.jsonl.")
        if self._done and self.skipped_lines:
            raise TraceError(
                f"The trace {self.telemetry_path} holds no readable sample: {self.skipped_lines} line(s) skipped, "
                + "; ".join(str(s) for s in self.skipped[:3]) + ".",
                hint="Check that it is a telemetry.jsonl or a `gpulens record` file (UTF-8 JSON lines).",
            )

    def require_samples(self) -> None:
        """For an import: a recording with its header and no sample line is refused (a header alone
        still describes the machine's GPUs, for `plan --gpu local`)."""
        if self._done and self._format == "gpulens" and not self.lines_already_imported:
            raise TraceError(f"The recording {self.telemetry_path} holds a header and no samples: the recording was "
                             "stopped before its first sample.",
                             hint="Record again with a --duration longer than its --interval, or give another recording.")

    # ------------------------------------------------------------ reading
    def _skip(self, lineno: int, reason: str) -> None:
        self.skipped_lines += 1
        if len(self.skipped) < MAX_SKIPPED_KEPT:
            self.skipped.append(SkippedLine(lineno, reason))
        log.debug("skipped line %d of %s: %s", lineno, self.telemetry_path, reason)

    def _sniff(self) -> str:
        try:
            with self.telemetry_path.open("rb") as f:
                raw = f.readline(MAX_LINE_BYTES)
        except OSError as e:
            raise TraceError(f"Cannot read the trace {self.telemetry_path}: {e.strerror}.", hint="Check the path and its permissions.") from None
        if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
            raise TraceError(f"The trace {self.telemetry_path} is UTF-16 text; gpulens reads UTF-8 JSON lines.",
                             hint="Convert it, e.g. `iconv -f UTF-16 -t UTF-8`.")
        first = raw.decode("utf-8", errors="replace")
        head = _parse(first)
        if isinstance(head, dict) and head.get("format") == RECORDING_FORMAT:
            gpus = head.get("gpus", [])
            if not isinstance(gpus, list):
                raise TraceError(f"The recording {self.telemetry_path} has a header whose gpus is not a list.",
                                 hint="Record it again with `gpulens record`.")
            self._check_version(head.get("version"))
            try:
                self._infos = [info_from_fields(g, i) for i, g in enumerate(gpus)]
            except BadLine as e:
                raise TraceError(f"The recording {self.telemetry_path} has a broken header: {e}.",
                                 hint="Record it again with `gpulens record`.") from None
            for info in self._infos:
                if info.index in self._header_gpus:
                    raise TraceError(f"The recording {self.telemetry_path} has a broken header: it lists GPU index "
                                     f"{info.index} twice, so its samples cannot be told apart.",
                                     hint="Record it again with `gpulens record`, or give each GPU of the header its own index.")
                self._header_gpus[info.index] = info
            host = head.get("host")
            self.recorded_host = host if isinstance(host, str) and host else None
            return "gpulens"
        info = _probe_info(self.telemetry_path.parent) or GpuInfo(index=0, uuid="GPU-replay-0", name="replayed GPU")
        self._infos = [info]
        if not first.strip():
            raise TraceError(f"The trace {self.telemetry_path} is empty.", hint="Record one with `gpulens record` or use the bundled trace.")
        return "h200"

    def _check_version(self, version: Any) -> None:
        """A recording's format version: a whole number from 1 to the newest this gpulens reads (a
        header without one is read as version 1, the only one there has been)."""
        if version is None:
            return
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            shown = repr(version) if len(repr(version)) <= 40 else repr(version)[:37] + "..."
            raise TraceError(f"The recording {self.telemetry_path} has a broken header: its format version is {shown}, "
                             "not a whole number from 1.",
                             hint="Record it again with `gpulens record`.")
        if version > RECORDING_VERSION:
            shown = str(version) if len(str(version)) <= 20 else str(version)[:17] + "..."
            raise TraceError(f"The recording {self.telemetry_path} was written by a newer gpulens (format version "
                             f"{shown}; this one reads {RECORDING_VERSION}): upgrade gpulens.",
                             hint="Install a newer gpulens (pip install -U gpulens) to read it.")

    def _header_gpu(self, gpu: int) -> int:
        """A GPU index a sample or XID names, which the recording's header must list."""
        if gpu not in self._header_gpus:
            listed = ", ".join(str(i) for i in self._header_gpus) or "none"
            raise BadLine(f"gpu {gpu} is not in the recording's header ({listed})")
        return gpu

    def _lines(self) -> Iterator[tuple[int, dict[str, Any]]]:
        with self.telemetry_path.open("r", encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                d = _parse(line)
                if not isinstance(d, dict):
                    self._skip(lineno, "not a JSON object" if d is _UNREADABLE else "a JSON value that is not an object")
                    continue
                yield lineno, d

    def _parse_line(self, d: dict[str, Any]) -> GpuSample | XidEvent | None:
        """A sample, an XID, or None for lines that carry neither (a header). BadLine when broken."""
        if self._format != "gpulens":
            return _h200_line_to_sample(d, self._infos[0])
        kind = d.get("type")
        if kind == "header" or d.get("format") == RECORDING_FORMAT:
            return None
        if kind == "xid":
            return XidEvent(t=time_seconds(d.get("t")), gpu=self._header_gpu(integer(d.get("gpu"), "gpu") or 0),
                            uuid=text(d.get("uuid", ""), "uuid"), xid=integer(d.get("xid"), "xid") or 0)
        if kind != "sample":
            raise BadLine(f"type is {str(kind)[:20]!r}, not sample or xid")
        s = sample_from_fields(d)
        self._header_gpu(s.gpu)
        return s

    def _raw_frames(self) -> Iterator[RawFrame]:
        """Frames as read: the lines of every GPU at one moment, with the XIDs read meanwhile."""
        frame = RawFrame([])
        for lineno, d in self._lines():
            try:
                s = self._parse_line(d)
            except BadLine as e:
                self._skip(lineno, str(e))
                continue
            except Exception as e:  # noqa: BLE001 - any other surprise in one line skips that line only
                self._skip(lineno, f"unreadable ({type(e).__name__})")
                continue
            if s is None:
                continue
            if self.resume_after is not None and s.t <= self.resume_after:
                self.lines_already_imported += 1
                continue
            if isinstance(s, XidEvent):
                frame.xids.append((lineno, s))
                continue
            if frame.samples and s.t != frame.t:
                yield frame
                frame = RawFrame([])
            frame.samples.append((lineno, s))
        if frame.samples or frame.xids:
            yield frame

    def _read_frames(self) -> Iterator[list[GpuSample]]:
        """Frames: the samples of every GPU at one moment; frames out of the timeline skipped, and so
        are frames more than the max gap before the latest one kept (a clock that went back, or a
        second recording appended: stored, they would end before they begin, and an import continued
        after an interruption could not tell them from what it stored)."""
        t_ref: float | None = None
        t_max: float | None = None
        for raw in guard_frames(self._raw_frames(), self.max_gap_seconds, self._skip):
            if raw.samples and t_max is not None and t_max - raw.t > self.max_gap_seconds:
                for lineno, s in raw.samples:
                    self._skip(lineno, f"t is {s.t:.0f}, {t_max - s.t:.0f} s back in time from the lines before it "
                                       f"(more than the max gap of {self.max_gap_seconds:g} s)")
                raw.samples = []
            if raw.samples:
                t_max = raw.t if t_max is None else max(t_max, raw.t)
            t_ref = raw.t if raw.samples else t_ref
            for lineno, x in raw.xids:
                if t_ref is not None and abs(x.t - t_ref) > self.max_gap_seconds:
                    self._skip(lineno, f"t is {x.t:.0f}, more than the max gap of {self.max_gap_seconds:g} s from the samples beside it")
                else:
                    self._xids.append(x)
            if raw.samples:
                self.lines_read += len(raw.samples)
                yield [s for _, s in raw.samples]

    def _frames_forever(self) -> Iterator[list[GpuSample]]:
        span = 0.0
        while True:
            first_t = last_t = None
            count = 0
            for frame in self._read_frames():
                count += 1
                first_t = frame[0].t if first_t is None else first_t
                last_t = frame[0].t
                for s in frame:
                    s.t += span
                self._next_offset = span
                yield frame
            if not count:
                return
            # the next pass continues the timeline one (mean) sample period after the last frame
            length = last_t - first_t  # type: ignore[operator]
            span += length + (length / (count - 1) if count > 1 else 1.0)

    def _advance(self) -> None:
        self._next = next(self._frames, None)
        self._offset_of_next = self._next_offset  # set by the generator just before it yielded _next
        if self._next is None:
            self._done = True

    # ------------------------------------------------------------ pacing
    def _sleep_wait(self, seconds: float) -> bool:
        self._sleep(seconds)
        return False

    def wait_with(self, wait: Wait) -> None:
        """Wait for each recorded moment through `wait(seconds)`, which returns True to stop (the sampling
        loop's: it wakes on SIGTERM, SIGINT and the end of --duration)."""
        self._wait = wait

    # ------------------------------------------------------------ backend
    def gpus(self) -> list[GpuInfo]:
        return list(self._infos)

    @property
    def exhausted(self) -> bool:
        return self._done

    @property
    def paced(self) -> bool:
        return True

    @property
    def source_time(self) -> float | None:
        return self.last_recorded_t

    def sample(self) -> list[GpuSample]:
        """The next recorded frame (waiting for its moment when a speed is set). [] at the end, and []
        when the wait was told to stop (the frame is kept for the next call)."""
        if self._done or self._next is None:
            return []
        frame = self._next
        rec_t = frame[0].t
        if self._wall0 is None:
            self._wall0 = self._clock()
        if self._pacer.wait_for(self._played_seconds(rec_t), self._wait):
            return []
        self._played_at = None
        self.last_recorded_t = rec_t
        self.pass_offset_seconds = self._offset_of_next
        if self.rebase:
            scale = 1.0 / self.speed if self.speed else 1.0
            for s in frame:
                s.t = self._wall0 + self._pacer_time(s.t) * scale
        self.samples_read += len(frame)
        self.first_recorded_t = rec_t if self.first_recorded_t is None else min(self.first_recorded_t, rec_t)
        self.latest_recorded_t = rec_t if self.latest_recorded_t is None else max(self.latest_recorded_t, rec_t)
        self._advance()
        return frame

    def _played_seconds(self, rec_t: float) -> float:
        """The frame's place on the played timeline, computed once per frame (a stopped wait retries it)."""
        if self._played_at is None or self._played_at[0] != rec_t:
            self._played_at = (rec_t, self._pacer.timeline(rec_t))
        return self._played_at[1]

    def _pacer_time(self, recorded_t: float) -> float:
        return recorded_t - (self._pacer.rec0 or 0.0) - self._pacer.removed_seconds

    def live_time(self, recorded_t: float) -> float:
        """Where a recorded moment (pass offset included) lands on the sample timeline: itself unless
        rebased, else shifted (and scaled by the speed) like the frames, long gaps shortened."""
        if not self.rebase or self._pacer.rec0 is None or self._wall0 is None:
            return recorded_t
        scale = 1.0 / self.speed if self.speed else 1.0
        return self._wall0 + self._pacer_time(recorded_t) * scale

    def drain_xid_events(self) -> list[XidEvent]:
        out, self._xids = self._xids, []
        return out

    def close(self) -> None:
        self._done = True


def iter_events(events_path: Path | None) -> Iterator[dict[str, Any]]:
    """The workload records beside a trace (events.jsonl). A line that is not JSON, or that the parsing
    discipline refuses (NaN, a nesting or number past the limits), comes as a record with neither a
    kind nor a time, so that the import skips it and counts it with the records it cannot read."""
    if events_path is None:
        return
    with events_path.open("r", encoding="utf-8", errors="replace") as f:
        for line in f:
            d = _parse(line)
            if isinstance(d, dict) and isinstance(d.get("kind"), str):
                yield d
            elif d is _UNREADABLE and line.strip():
                yield {"kind": UNREADABLE_EVENT}


def event_hosts(events_path: Path | None) -> set[str]:
    """The hosts the workload records beside a trace name (only lines that mention one are parsed)."""
    out: set[str] = set()
    if events_path is None:
        return out
    with events_path.open("r", encoding="utf-8", errors="replace") as f:
        for line in f:
            if '"host"' not in line:
                continue
            d = _parse(line)
            if isinstance(d, dict) and isinstance(d.get("host"), str) and d["host"]:
                out.add(d["host"])
    return out
