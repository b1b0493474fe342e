"""ReplayBackend: plays a recorded trace back as if it were being sampled.

Two formats are read:
- the H200 session format (`telemetry.jsonl`, optionally with `nvml_probe.json` beside it for the
  GPU's static facts; see the bundled trace's README), one GPU per line;
- gpulens's own recording (`gpulens record`): a header line, then one line per GPU sample or XID.

A malformed line is skipped and counted (`skipped_lines`), never fatal: the rest is still played.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

from gpulens.errors import TraceError
from gpulens.gpu.types import GpuInfo, GpuProcess, GpuSample, MigInstanceSample, XidEvent

log = logging.getLogger(__name__)

RECORDING_FORMAT = "gpulens-recording"
_SAMPLE_FIELDS = {f.name for f in fields(GpuSample)}
_INFO_FIELDS = {f.name for f in fields(GpuInfo)}


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
    return p, None


def _probe_info(folder: Path) -> GpuInfo | None:
    """Static facts of the recorded GPU from nvml_probe.json, when it is there."""
    probe_path = folder / "nvml_probe.json"
    if not probe_path.is_file():
        return None
    try:
        probe = json.loads(probe_path.read_text())
    except (OSError, ValueError):
        return None

    def val(key: str) -> Any:
        entry = probe.get(key) or {}
        return entry.get("value") if entry.get("ok") else None

    mem = val("memory_info") or {}
    pci = val("pci_info") or {}
    limit_mw = val("enforced_power_limit_mw") or val("power_limit_mw")
    return GpuInfo(
        index=0,
        uuid=val("uuid") or "GPU-replay-0",
        name=val("name") or "replayed GPU",
        memory_total_bytes=mem.get("total"),
        temperature_slowdown_celsius=val("temp_threshold_slowdown"),
        temperature_shutdown_celsius=val("temp_threshold_shutdown"),
        sm_clock_max_hz=(val("max_clock_sm") or 0) * 1e6 or None,
        memory_clock_max_hz=(val("max_clock_mem") or 0) * 1e6 or None,
        power_limit_watts=limit_mw / 1000 if limit_mw else None,
        pci_bus_id=pci.get("busId") or pci.get("busIdLegacy"),
    )


def _pct(v: Any) -> float | None:
    return None if v is None else float(v) / 100.0


def _h200_line_to_sample(d: dict[str, Any], info: GpuInfo) -> GpuSample:
    """One line of the H200 session format -> GpuSample (units converted to base units)."""
    t = float(d["t"])
    procs = d.get("procs")
    processes = None
    if isinstance(procs, list):
        processes = [GpuProcess(pid=int(p["pid"]), name=str(p.get("name", "")), used_memory_bytes=p.get("used_bytes")) for p in procs]
    s = GpuSample(
        t=t,
        gpu=info.index,
        uuid=info.uuid,
        name=info.name,
        utilization_gpu_ratio=_pct(d.get("gpu_util")),
        utilization_memory_copy_ratio=_pct(d.get("mem_util")),
        memory_used_bytes=d.get("mem_used"),
        memory_total_bytes=d.get("mem_total", info.memory_total_bytes),
        temperature_celsius=d.get("temp_c"),
        temperature_slowdown_celsius=info.temperature_slowdown_celsius,
        temperature_shutdown_celsius=info.temperature_shutdown_celsius,
        power_watts=None if d.get("power_mw") is None else d["power_mw"] / 1000.0,
        power_limit_watts=info.power_limit_watts,
        energy_joules=None if d.get("energy_mj") is None else d["energy_mj"] / 1000.0,
        sm_clock_hz=None if d.get("sm_mhz") is None else d["sm_mhz"] * 1e6,
        memory_clock_hz=None if d.get("mem_mhz") is None else d["mem_mhz"] * 1e6,
        sm_clock_max_hz=info.sm_clock_max_hz,
        memory_clock_max_hz=info.memory_clock_max_hz,
        clock_event_mask=d.get("clk_reasons"),
        performance_state=d.get("pstate"),
        pcie_tx_bytes_per_second=None if d.get("pcie_tx_kbs") is None else d["pcie_tx_kbs"] * 1024.0,
        pcie_rx_bytes_per_second=None if d.get("pcie_rx_kbs") is None else d["pcie_rx_kbs"] * 1024.0,
        sm_active_ratio=_pct(d.get("gpm_sm_util")),
        sm_occupancy_ratio=_pct(d.get("gpm_sm_occupancy")),
        tensor_active_ratio=_pct(d.get("gpm_any_tensor_util")),
        dram_active_ratio=_pct(d.get("gpm_dram_bw_util")),
        compute_process_count=d.get("nproc") if processes is None else len(processes),
        processes=processes,
        errors=dict(d.get("errs") or {}),
    )
    return s


class ReplayBackend:
    """Plays a trace. `speed=None` plays as fast as possible; `speed=1.0` at the recorded pace, 2.0 twice
    as fast. With `rebase=True` sample times are shifted so the trace starts now (for a live agent);
    otherwise they keep the recorded times (for importing). With `loop=True` it starts over at the end."""

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
    ):
        self.telemetry_path, self.events_path = resolve_trace(path)
        if speed is not None and speed <= 0:
            raise TraceError(f"A replay speed must be above zero, not {speed}.", hint="Use --speed max or a factor such as 1 or 10.")
        self.speed = speed
        self.rebase = rebase
        self.loop = loop
        self._clock = clock
        self._sleep = sleep
        self.skipped_lines = 0
        self.samples_read = 0
        self._xids: list[XidEvent] = []
        self._infos: list[GpuInfo] = []
        self._format = self._sniff()
        self._frames = self._frames_forever() if loop else self._read_frames()
        self._next: list[GpuSample] | None = None
        self._done = False
        self._wall0: float | None = None
        self._rec0: float | None = None
        self.last_recorded_t: float | None = None  # recorded time of the frame last returned
        self.pass_offset_seconds = 0.0  # with loop=True: how far the current pass is shifted from the recording
        self._next_offset = 0.0
        self._advance()

    # ------------------------------------------------------------ reading
    def _sniff(self) -> str:
        try:
            with self.telemetry_path.open("r", encoding="utf-8") as f:
                first = f.readline()
        except OSError as e:
            raise TraceError(f"Cannot read the trace {self.telemetry_path}: {e.strerror}.", hint="Check the path and its permissions.") from None
        try:
            head = json.loads(first) if first.strip() else {}
        except ValueError:
            head = {}
        if isinstance(head, dict) and head.get("format") == RECORDING_FORMAT:
            self._infos = [GpuInfo(**{k: v for k, v in g.items() if k in _INFO_FIELDS}) for g in head.get("gpus", [])]
            return "gpulens"
        info = _probe_info(self.telemetry_path.parent) or GpuInfo(index=0, uuid="GPU-replay-0", name="replayed GPU")
        self._infos = [info]
        if not first.strip():
            raise TraceError(f"The trace {self.telemetry_path} is empty.", hint="Record one with `gpulens record` or use the bundled trace.")
        return "h200"

    def _lines(self) -> Iterator[dict[str, Any]]:
        with self.telemetry_path.open("r", encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    d = json.loads(line)
                    if not isinstance(d, dict):
                        raise ValueError("not an object")
                except ValueError:
                    self.skipped_lines += 1
                    log.debug("skipped malformed line %d of %s", lineno, self.telemetry_path)
                    continue
                yield d

    def _read_frames(self) -> Iterator[list[GpuSample]]:
        """Frames: the samples of every GPU at one moment."""
        frame: list[GpuSample] = []
        for d in self._lines():
            try:
                if self._format == "gpulens":
                    kind = d.get("type")
                    if kind == "header" or d.get("format") == RECORDING_FORMAT:
                        continue
                    if kind == "xid":
                        self._xids.append(XidEvent(t=float(d["t"]), gpu=int(d["gpu"]), uuid=str(d.get("uuid", "")), xid=int(d["xid"])))
                        continue
                    if kind != "sample":
                        continue
                    procs = d.get("processes")
                    migs = d.get("mig_instances")
                    s = GpuSample(**{k: v for k, v in d.items() if k in _SAMPLE_FIELDS and k not in ("processes", "mig_instances")})
                    if procs is not None:
                        s.processes = [GpuProcess(**p) for p in procs]
                    if migs is not None:
                        s.mig_instances = [MigInstanceSample(**m) for m in migs]
                    s.t = float(s.t)
                else:
                    s = _h200_line_to_sample(d, self._infos[0])
            except (KeyError, TypeError, ValueError):
                self.skipped_lines += 1
                continue
            if frame and s.t != frame[0].t:
                yield frame
                frame = []
            frame.append(s)
        if frame:
            yield frame

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
        """The next recorded frame (waiting for its moment when a speed is set). [] at the end."""
        if self._done or self._next is None:
            return []
        frame = self._next
        rec_t = frame[0].t
        self.last_recorded_t = rec_t
        self.pass_offset_seconds = self._offset_of_next
        if self._rec0 is None:
            self._rec0 = rec_t
            self._wall0 = self._clock()
        if self.speed is not None:
            due = self._wall0 + (rec_t - self._rec0) / self.speed  # type: ignore[operator]
            delay = due - self._clock()
            if delay > 0:
                self._sleep(delay)
        if self.rebase:
            scale = 1.0 / self.speed if self.speed else 1.0
            for s in frame:
                s.t = self._wall0 + (s.t - self._rec0) * scale  # type: ignore[operator]
        self.samples_read += len(frame)
        self._advance()
        return frame

    def live_time(self, recorded_t: float) -> float:
        """Where a recorded moment (pass offset included) lands on the sample timeline: itself unless
        rebased, else shifted (and scaled by the speed) like the frames."""
        if not self.rebase or self._rec0 is None:
            return recorded_t
        scale = 1.0 / self.speed if self.speed else 1.0
        return self._wall0 + (recorded_t - self._rec0) * scale  # type: ignore[operator]

    def drain_xid_events(self) -> list[XidEvent]:
        out, self._xids = self._xids, []
        return out

    def close(self) -> None:
        self._done = True


def iter_events(events_path: Path | None) -> Iterator[dict[str, Any]]:
    """The workload records beside a trace (events.jsonl), malformed lines skipped."""
    if events_path is None:
        return
    with events_path.open("r", encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if isinstance(d, dict) and "kind" in d:
                yield d
