"""GPU health findings: XIDs, uncorrectable ECC errors, row remapping, clock cuts, heat, a lost
GPU and full memory, each joined with the workloads that were on that GPU at that time.

They read the same GPU series the alert rules read (vocab/gpu.py) and the `xid` events; XID
meanings and actions come from the one catalog in vocab/xid.py. Faults that point at the hardware
(XIDs, ECC, row remapping, a lost GPU) are listed before every other finding, conditions that slow
the GPU (clock cuts, heat, full memory) right after them: a bottleneck analysis of a job on a
failing GPU is moot until the GPU is dealt with.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from gpulens.diagnose import evidence as Q
from gpulens.diagnose.base import DiagnoseScope, Finding, register_analyzer
from gpulens.diagnose.gpu_workloads import (
    LISTED,
    OTHER_PROCESS_SHARE,
    GpuRef,
    MemoryHolder,
    Occupant,
    WorkloadImpact,
    impacts,
    memory_holders,
    occupants_around,
    own_memory_peak,
    present,
    workload_labels,
)
from gpulens.reader import AnalysisReader, SeriesWindow, analysis_reader
from gpulens.store import Store
from gpulens.units import format_bytes
from gpulens.vocab import gpu as G
from gpulens.vocab import gpu_fields as F
from gpulens.vocab import names as N
from gpulens.vocab.gpu import GPU_CLOCK_EVENT_ACTIVE, GPU_PROCESS_MEMORY, GPU_UP
from gpulens.vocab.time import format_when
from gpulens.vocab.xid import xid_info

XID_EVENT = "xid"  # written by sampling.SampleWriter.write_xid
# Clock-event reasons that cut the clocks (gpu/types.py CLOCK_EVENT_LABELS), with what to say.
CLOCK_CUT_REASONS = {
    "hw_thermal": "the GPU is too hot (hardware thermal slowdown)",
    "sw_thermal": "the GPU is near its temperature limit (software thermal slowdown)",
    "hw_power_brake": "the power supply or board asserted the power brake",
    "hw_slowdown": "a hardware slowdown (thermal or power brake) cut the clocks by half or more",
    "sw_power_cap": "the GPU reached its power limit",
}
# A condition shorter than this is left out: NVML reports a reason for the period just sampled,
# and a sub-second power-cap blip while the boost clock settles under a new load is not a fault
# (the bundled H200 session opens with 0.4 s of sw_power_cap at rising clocks).
MIN_CONDITION_SECONDS = 2.0
POWER_CAP_DEEP_DROP_RATIO = 0.15  # a power cap that costs less SM clock than this is only info
TEMPERATURE_MARGIN_CELSIUS = 5.0  # as the GpuTemperatureNearSlowdown rule
MEMORY_FULL_RATIO = 0.95  # as the GpuMemoryAlmostFull rule
REFERENCE_SECONDS = 60.0  # the SM clock before a cut is read over this long
COARSE_POINTS = 500  # buckets per series in the first, downsampled look for a problem

FAULT_ORDER, CONDITION_ORDER = 0, 1  # before the workload analyzers (base.DEFAULT_ORDER)

ADVICE_HARDWARE = [
    "Keep new jobs off this GPU (cordon the node) and restart the affected jobs on other GPUs from their last checkpoint.",
    "Reset the GPU (nvidia-smi -r -i GPU, with nothing running on it) or reboot the node, then check it: nvidia-smi -q -d ECC,ROW_REMAPPER and a short burn-in (dcgmi diag -r 2).",
    "If the fault comes back after the reset, collect nvidia-bug-report.sh and RMA the GPU.",
]
ADVICE_APPLICATION = [
    "Look at the job's own log around that time: these XIDs usually come from the application, and the GPU stays healthy.",
    "If the same XID repeats on this GPU with different jobs, treat it as hardware: drain the node and reset the GPU.",
]
ADVICE_THERMAL = [
    "Check cooling first: fans, airflow, blocked inlets, the inlet temperature, and whether this GPU runs hotter than its neighbours under the same load.",
    "Watch temperature against the slowdown threshold while the job runs (nvidia-smi -q -d TEMPERATURE,PERFORMANCE).",
    "If one GPU keeps slowing down while its neighbours do not, report the node to its operators (heatsink, thermal paste, fan) and move the job.",
]
ADVICE_POWER_BRAKE = [
    "Report the node to its operators: the power brake is asserted by the board or the power supplies (a failed PSU, a node over its power budget).",
    "Move the job to another node until the power supply is checked.",
]
ADVICE_POWER_CAP = [
    "Check the enforced power limit against the default (nvidia-smi -q -d POWER): raise it back if someone lowered it.",
    "Under a steady full load a GPU at its power cap is expected; compare its clock with other nodes of the same model before acting.",
]
ADVICE_OTHER_PROCESS = [
    "Find out what that pid is (ps -o pid,user,etime,cmd -p PID): a leftover of an earlier run, a notebook kernel, another user's job.",
    "Stop it if it is stale (kill PID; a zombie holding GPU memory needs its parent killed or the GPU reset), then re-run the job.",
    "Keep jobs from sharing a GPU by accident: the scheduler's exclusive GPU allocation, or the EXCLUSIVE_PROCESS compute mode (nvidia-smi -c 3).",
]
ADVICE_MEMORY = [
    "Find who holds the memory (nvidia-smi --query-compute-apps=pid,used_memory): a stray process, or two workloads on one GPU.",
    "A serving engine pre-allocates most of the GPU: lower its memory fraction (e.g. vLLM --gpu-memory-utilization) to leave headroom.",
    "A training job: a smaller micro-batch with gradient accumulation, or activation checkpointing.",
]


@dataclass
class HealthEvent:
    """One health problem of one GPU before it is joined with workloads."""

    kind: str
    ref: GpuRef
    uuid: str
    start: float
    end: float
    severity: str
    point: bool  # an event (XID, ECC error) whose effect shows after it; else a lasting condition
    summary: str  # without the workload part
    what: str  # for "... while <what>"
    evidence: dict[str, Any]
    advice: list[str]


def time_of_day(t: float) -> str:
    """A time of day in a finding's sentence (its span, printed above it, gives the date)."""
    return format_when(t, date=False)


def _ref(labels: dict[str, str]) -> GpuRef:
    return GpuRef(labels.get("host", ""), labels.get("gpu", ""))


Finder = Callable[[SeriesWindow, float], tuple[float, float] | None]


def _series(reader: AnalysisReader, name: str, scope: DiagnoseScope, find: Finder, extra: dict[str, str] | None = None) -> list[SeriesWindow]:
    """Raw samples of each series `name` over the part of the scope where `find` says a problem
    may be: found first on a downsampled read (min and max per bucket), so that a week of healthy
    samples on a dashboard refresh is a few aggregate queries, not millions of rows."""
    rng = reader.time_range(name)
    if rng is None:
        return []
    lo = rng[0] if scope.start is None else max(scope.start, rng[0])
    hi = rng[1] if scope.end is None else min(scope.end, rng[1])
    if hi < lo:
        return []
    out = []
    for coarse in reader.series_windows(name, extra, start=lo, end=hi, max_points=COARSE_POINTS):
        where = find(coarse, hi) if coarse.t else None
        if where is not None:
            out.extend(d for d in reader.series_windows(name, coarse.labels, start=where[0], end=where[1]) if d.t and d.identity == coarse.identity)
    return out


def _threshold(on_for: Callable[[SeriesWindow], Callable[[float], bool] | None]) -> Finder:
    """From the first to the end of the last bucket whose min or max meets the series' condition."""

    def find(d: SeriesWindow, hi: float) -> tuple[float, float] | None:
        on = on_for(d)
        if on is None:
            return None
        hits = [i for i, (a, b) in enumerate(zip(d.value_min, d.value_max, strict=True)) if on(a) or on(b)]
        if not hits:
            return None
        nxt = hits[-1] + 1
        return d.t[hits[0]], d.t[nxt] if nxt < len(d.t) else hi

    return find


def _flag_set(v: float) -> bool:
    return v >= 1


def _lost(gpu_up: float) -> bool:
    return gpu_up < 0.5


def _each(on: Callable[[float], bool]) -> Callable[[SeriesWindow], Callable[[float], bool]]:
    return lambda _d: on


def _changed(d: SeriesWindow, hi: float) -> tuple[float, float] | None:
    return (d.t[0], hi) if min(d.value_min) != max(d.value_max) else None


def _stretches(d: SeriesWindow, on: Callable[[float], bool]) -> list[tuple[int, int, float]]:
    """(first, last index, seconds) of runs of samples where `on` holds. A run lasts until the next
    sample (NVML reports the period just ended), bridged over gaps of up to 3 sampling intervals."""
    if not d.t:
        return []
    dt = statistics.median([b - a for a, b in zip(d.t, d.t[1:], strict=False)]) if len(d.t) > 1 else 1.0
    out, first, last = [], None, None
    for i, (t, v) in enumerate(zip(d.t, d.value, strict=True)):
        if not on(v):
            continue
        if first is not None and last is not None and t - d.t[last] > 3 * dt:
            out.append((first, last, d.t[last] - d.t[first] + dt))
            first = None
        first = i if first is None else first
        last = i
    if first is not None and last is not None:
        out.append((first, last, d.t[last] - d.t[first] + dt))
    return out


def _latest_value(reader: AnalysisReader, name: str, ref: GpuRef) -> float | None:
    vals = reader.latest_values(name, {"host": ref.host, "gpu": ref.gpu})
    return vals[0].value if vals else None


# ------------------------------------------------------------------ faults
def xid_events(reader: AnalysisReader, scope: DiagnoseScope) -> list[HealthEvent]:
    """XIDs grouped by GPU and code: one finding each, from the first to the last occurrence."""
    groups: dict[tuple[GpuRef, int], list[Any]] = {}
    for e in reader.event_rows(XID_EVENT, start=scope.start, end=scope.end):
        try:
            code = int(e.data.get("xid", e.labels.get("xid")))
        except (TypeError, ValueError):
            continue
        groups.setdefault((_ref(e.labels), code), []).append(e)
    out = []
    for (ref, code), evs in sorted(groups.items(), key=lambda kv: kv[1][0].t):
        info = xid_info(code)
        times = f"at {time_of_day(evs[0].t)}" + (f" ({len(evs)} times, last at {time_of_day(evs[-1].t)})" if len(evs) > 1 else "")
        advice = [info.action, *(ADVICE_HARDWARE if info.severity == "critical" else ADVICE_APPLICATION)]
        out.append(HealthEvent(
            "gpu_xid", ref, evs[0].labels.get("uuid", ""), evs[0].t, evs[-1].t, info.severity, True,
            f"XID {code} on {ref} {times}: {info.meaning}.", f"XID {code} hit {ref}",
            {"xid": code, "meaning": info.meaning, "count": len(evs), "model": evs[0].labels.get("model", "")},
            advice,
        ))
    return out


def ecc_events(reader: AnalysisReader, scope: DiagnoseScope) -> list[HealthEvent]:
    """An increase of the volatile uncorrectable ECC counter inside the window (a counter that
    drops was reset by a driver reload: counting starts again from its new value)."""
    out = []
    for d in _series(reader, G.GPU_ECC_UNCORRECTED_VOLATILE_TOTAL, scope, _changed):
        rises = [(t, b - a) for t, a, b in zip(d.t[1:], d.value, d.value[1:], strict=False) if b > a]
        if not rises:
            continue
        ref, n = _ref(d.labels), int(sum(x for _, x in rises))
        out.append(HealthEvent(
            "gpu_ecc_uncorrectable", ref, d.labels.get("uuid", ""), rises[0][0], rises[-1][0], "critical", True,
            f"{n} uncorrectable ECC error{'s' if n != 1 else ''} on {ref} (first at {time_of_day(rises[0][0])}): data in GPU memory was corrupted, "
            "and what ran on it since may have computed with it.", f"ECC errors hit {ref}",
            {"ecc_uncorrected_increase": n, F.ECC_UNCORRECTED_VOLATILE_TOTAL: int(d.value[-1])},
            ADVICE_HARDWARE,
        ))
    return out


def remap_events(reader: AnalysisReader, scope: DiagnoseScope) -> list[HealthEvent]:
    """Row remapping failure (critical: the memory cannot be repaired) or pending (a reset applies it)."""
    out = []
    for name, kind, sev, text, advice in (
        (G.GPU_REMAPPED_ROWS_FAILURE, "gpu_row_remap_failure", "critical",
         "row remapping failed: a memory bank has no spare rows left, so this GPU's memory can no longer be repaired in the field", ADVICE_HARDWARE),
        (G.GPU_REMAPPED_ROWS_PENDING, "gpu_row_remap_pending", "warning",
         "a row remapping waits for a GPU reset; until then the bad rows stay in use",
         ["Drain the GPU and reset it (nvidia-smi -r -i GPU) to apply the remapping.", "After the reset, check that no remapping failure is reported (nvidia-smi -q -d ROW_REMAPPER)."]),
    ):
        for d in _series(reader, name, scope, _threshold(_each(_flag_set))):
            for a, _b, secs in _stretches(d, _flag_set):
                ref = _ref(d.labels)
                rows = _latest_value(reader, G.GPU_REMAPPED_ROWS_UNCORRECTABLE_TOTAL, ref)
                out.append(HealthEvent(
                    kind, ref, d.labels.get("uuid", ""), d.t[a], d.t[a] + secs, sev, True,
                    f"On {ref} {text} (since {time_of_day(d.t[a])}).", f"{ref} reported a row remapping {'failure' if sev == 'critical' else 'pending'}",
                    {"flag_seconds": Q.seconds(round(secs, 1)), F.REMAPPED_ROWS_UNCORRECTABLE: None if rows is None else int(rows)}, advice,
                ))
    return out


def lost_events(reader: AnalysisReader, scope: DiagnoseScope) -> list[HealthEvent]:
    out = []
    for d in _series(reader, GPU_UP, scope, _threshold(_each(_lost))):
        for a, b, secs in _stretches(d, _lost):
            ref = _ref(d.labels)
            still = b == len(d.t) - 1
            out.append(HealthEvent(
                "gpu_lost", ref, d.labels.get("uuid", ""), d.t[a], d.t[a] + secs, "critical", True,
                f"{ref} stopped answering at {time_of_day(d.t[a])} (GPU is lost){' and had not come back at the last sample' if still else f' for {secs:.0f} s'}.",
                f"{ref} was lost", {"lost_seconds": Q.seconds(round(secs, 1)), "lost_at_last_sample": still},
                ["Drain and reboot the node; look for XID 79 (fallen off the bus) in the kernel log (dmesg).", *ADVICE_HARDWARE[1:],
                 "If it repeats, check the GPU's power cables and PCIe / SXM seating."],
            ))
    return out


# ------------------------------------------------------------------ conditions
def _sm_clock(reader: AnalysisReader, ref: GpuRef, scope: DiagnoseScope, t0: float, t1: float, active: set[float]) -> tuple[float | None, float | None, float | None]:
    """Median SM clock in the minute before the cut (samples without the reason), median and lowest
    during it. Without samples before, the GPU's highest SM clock is the reference."""
    lo = t0 - REFERENCE_SECONDS if scope.start is None else max(scope.start, t0 - REFERENCE_SECONDS)
    data = reader.series_windows(G.GPU_SM_CLOCK_HERTZ, {"host": ref.host, "gpu": ref.gpu}, start=lo, end=t1)
    if not data:
        return None, None, None
    d = data[0]
    before = [v for t, v in zip(d.t, d.value, strict=True) if t < t0 and round(t, 3) not in active]
    during = [v for t, v in zip(d.t, d.value, strict=True) if t0 <= t <= t1]
    ref_hz = statistics.median(before) if before else _latest_value(reader, G.GPU_SM_CLOCK_MAX_HERTZ, ref)
    if not during:
        return ref_hz, None, None
    return ref_hz, statistics.median(during), min(during)


def clock_cut_events(source: AnalysisReader | Store, scope: DiagnoseScope, min_seconds: float = MIN_CONDITION_SECONDS) -> list[HealthEvent]:
    """Stretches where a clock-event reason that cuts the clocks was active, with how deep the SM clock fell."""
    reader = analysis_reader(source)
    out = []
    for reason, cause in CLOCK_CUT_REASONS.items():
        for d in _series(reader, GPU_CLOCK_EVENT_ACTIVE, scope, _threshold(_each(_flag_set)), {"reason": reason}):
            active = {round(t, 3) for t, v in zip(d.t, d.value, strict=True) if v >= 1}
            for a, b, secs in _stretches(d, _flag_set):
                if secs < min_seconds:
                    continue
                ref = _ref(d.labels)
                before_hz, during_hz, lowest_hz = _sm_clock(reader, ref, scope, d.t[a], d.t[b], active)
                drop = None if not before_hz or during_hz is None else 1.0 - during_hz / before_hz
                sev = "warning"
                if reason == "sw_power_cap" and (drop is None or drop < POWER_CAP_DEEP_DROP_RATIO):
                    sev = "info"
                depth = f"; SM clock {before_hz / 1e6:.0f} → {during_hz / 1e6:.0f} MHz ({-drop:+.0%})" if drop is not None and before_hz and during_hz is not None else ""
                advice = ADVICE_POWER_CAP if reason == "sw_power_cap" else ADVICE_POWER_BRAKE if reason == "hw_power_brake" else ADVICE_THERMAL
                if reason == "hw_slowdown":
                    advice = [*ADVICE_THERMAL[:1], *ADVICE_POWER_BRAKE[:1], *ADVICE_THERMAL[2:]]
                out.append(HealthEvent(
                    "gpu_clock_cut", ref, d.labels.get("uuid", ""), d.t[a], d.t[a] + secs, sev, False,
                    f"The clocks of {ref} were cut for {reason} for {secs:.0f} s from {time_of_day(d.t[a])}: {cause}{depth}.",
                    f"the clocks of {ref} were cut for {reason}",
                    {"reason": reason, "cut_seconds": Q.seconds(round(secs, 1)), "sm_clock_before_hz": Q.hertz(before_hz), "sm_clock_during_hz": Q.hertz(during_hz),
                     "sm_clock_lowest_hz": Q.hertz(lowest_hz), "sm_clock_drop_ratio": Q.ratio(None if drop is None else round(drop, 3))},
                    list(advice),
                ))
    return out


def temperature_events(reader: AnalysisReader, scope: DiagnoseScope) -> list[HealthEvent]:
    """Temperature within 5 °C of the GPU's slowdown threshold (or above it)."""
    out = []
    slowdown_of = {_ref(lv.labels): lv.value for lv in reader.latest_values(G.GPU_TEMPERATURE_SLOWDOWN_CELSIUS)}

    def hot(d: SeriesWindow) -> Callable[[float], bool] | None:
        s = slowdown_of.get(_ref(d.labels))  # none reported: nothing to be near
        return None if s is None else lambda v: v >= s - TEMPERATURE_MARGIN_CELSIUS

    for d in _series(reader, G.GPU_TEMPERATURE_CELSIUS, scope, _threshold(hot)):
        ref = _ref(d.labels)
        slowdown = slowdown_of[ref]
        for a, b, secs in _stretches(d, lambda v, s=slowdown: v >= s - TEMPERATURE_MARGIN_CELSIUS):
            if secs < MIN_CONDITION_SECONDS:
                continue
            peak = max(d.value[a : b + 1])
            shutdown = _latest_value(reader, G.GPU_TEMPERATURE_SHUTDOWN_CELSIUS, ref)
            where = "above" if peak >= slowdown else "within 5 °C of"
            out.append(HealthEvent(
                "gpu_temperature_high", ref, d.labels.get("uuid", ""), d.t[a], d.t[a] + secs, "warning", False,
                f"{ref} reached {peak:.0f} °C for {secs:.0f} s from {time_of_day(d.t[a])}, {where} its slowdown temperature ({slowdown:.0f} °C)"
                + (f"; it shuts down at {shutdown:.0f} °C." if shutdown else "."),
                f"{ref} ran at {peak:.0f} °C",
                {"temperature_max_celsius": Q.celsius(peak), F.TEMPERATURE_SLOWDOWN_CELSIUS: Q.celsius(slowdown), F.TEMPERATURE_SHUTDOWN_CELSIUS: Q.celsius(shutdown),
                 "hot_seconds": Q.seconds(round(secs, 1))},
                list(ADVICE_THERMAL),
            ))
    return out


def memory_events(reader: AnalysisReader, scope: DiagnoseScope) -> list[HealthEvent]:
    """Device memory in use above 95 % of the GPU's memory (the GPU's view: every process counts)."""
    out = []
    total_of = {_ref(lv.labels): lv.value for lv in reader.latest_values(G.GPU_MEMORY_TOTAL_BYTES)}

    def full(d: SeriesWindow) -> Callable[[float], bool] | None:
        tot = total_of.get(_ref(d.labels))
        return None if not tot else lambda v: v / tot > MEMORY_FULL_RATIO

    for d in _series(reader, G.GPU_MEMORY_USED_BYTES, scope, _threshold(full)):
        ref = _ref(d.labels)
        total = total_of[ref]
        for a, b, secs in _stretches(d, lambda v, tot=total: v / tot > MEMORY_FULL_RATIO):
            if secs < MIN_CONDITION_SECONDS:
                continue
            peak = max(d.value[a : b + 1])
            holders = memory_holders(reader, ref, d.t[a], d.t[a] + secs)
            out.append(HealthEvent(
                "gpu_memory_full", ref, d.labels.get("uuid", ""), d.t[a], d.t[a] + secs, "warning", False,
                f"{ref} had {peak / total:.0%} of its memory in use for {secs:.0f} s from {time_of_day(d.t[a])}: the next allocation on it may fail."
                + _holders_text(reader, ref, holders, d.t[a], d.t[a] + secs),
                f"the memory of {ref} was {peak / total:.0%} full",
                {"memory_used_max_bytes": Q.bytes_(int(peak)), F.MEMORY_TOTAL_BYTES: Q.bytes_(int(total)), "memory_used_max_ratio": Q.ratio(round(peak / total, 3)),
                 "full_seconds": Q.seconds(round(secs, 1)), "processes": [{"pid": h.pid, "process": h.process, "memory_bytes": Q.bytes_(int(h.max_bytes))} for h in holders] or None},
                list(ADVICE_MEMORY),
            ))
    return out


def _holders_text(reader: AnalysisReader, ref: GpuRef, holders: list[MemoryHolder], start: float, end: float) -> str:
    """Who held the memory: each of the largest holders by pid, a workload gpulens knows with its
    own allocator peak (so a stale process is not taken for the job)."""
    if not holders:
        return ""
    whose = {p: o for o in present(occupants_around(reader, start, end), ref, start, end) for p in o.pids}
    parts = []
    for h in holders[:3]:
        o = whose.get(h.pid)
        if o is None:
            parts.append(f"pid {h.pid} ({h.process or '?'}, not a workload gpulens knows) {format_bytes(h.max_bytes)}")
            continue
        own = own_memory_peak(reader, o, start, end)
        parts.append(f"pid {h.pid} ({o.name}) {format_bytes(h.max_bytes)}" + (f", its own allocator peak {format_bytes(own)}" if own else ""))
    return " Held by " + "; ".join(parts) + "."


def other_process_events(reader: AnalysisReader, scope: DiagnoseScope) -> list[HealthEvent]:
    """A process that is none of the workloads gpulens knows holds a large share of a GPU's memory
    while a workload whose own pid the listing shows runs there (so the listing tells the two apart)."""
    total_of = {_ref(lv.labels): lv.value for lv in reader.latest_values(G.GPU_MEMORY_TOTAL_BYTES)}

    def big(d: SeriesWindow) -> Callable[[float], bool] | None:
        tot = total_of.get(_ref(d.labels))
        return None if not tot else lambda v: v / tot >= OTHER_PROCESS_SHARE

    found = []
    for d in _series(reader, GPU_PROCESS_MEMORY, scope, _threshold(big)):
        ref, total = _ref(d.labels), total_of[_ref(d.labels)]
        for a, b, secs in _stretches(d, lambda v, tot=total: v / tot >= OTHER_PROCESS_SHARE):
            found.append((d, ref, total, d.t[a], d.t[a] + secs, max(d.value[a : b + 1])))
    if not found:
        return []
    placed = occupants_around(reader, min(f[3] for f in found), max(f[4] for f in found))
    known = {(o.labels.get("host", ""), p) for occs in placed.values() for o in occs for p in o.pids}
    out = []
    for d, ref, total, a, b, held in found:
        pid, name = int(d.labels.get("pid", "-1")), d.labels.get("process", "") or "?"
        if (ref.host, pid) in known:
            continue
        mine = [o for o in present(placed, ref, a, b) if o.identified_by == LISTED]
        spans = [(max(a, x), min(b, y)) for o in mine for x, y in o.spans if x < b and y > a]
        if not spans:
            continue
        s0, s1 = min(x for x, _ in spans), max(y for _, y in spans)
        names = ", ".join(o.name for o in mine)
        own = [p for p in (own_memory_peak(reader, o, s0, s1) for o in mine) if p is not None]
        own_txt = f"; {mine[0].name}'s own allocator peak was {format_bytes(max(own))}" if own and len(mine) == 1 else ""
        out.append(HealthEvent(
            "other_process_memory", ref, d.labels.get("uuid", ""), s0, s1, "warning", False,
            f"pid {pid} ({name}), which is not {names}, held {format_bytes(held)} ({held / total:.0%}) of the memory of {ref} "
            f"for {s1 - s0:.0f} s from {time_of_day(s0)} while {names} ran on it{own_txt}.",
            f"pid {pid} held {format_bytes(held)} of {ref}",
            {"pid": pid, "process": name, "memory_bytes": Q.bytes_(int(held)), "memory_share": Q.ratio(round(held / total, 3)),
             F.MEMORY_TOTAL_BYTES: Q.bytes_(int(total)), "workload_allocator_peak_bytes": Q.bytes_(int(max(own))) if own else None,
             "seconds": Q.seconds(round(s1 - s0, 1))},
            [ADVICE_OTHER_PROCESS[0].replace("PID", str(pid)), ADVICE_OTHER_PROCESS[1].replace("PID", str(pid)), *ADVICE_OTHER_PROCESS[2:]],
        ))
    return out


# ------------------------------------------------------------------ findings
FAULT_DETECTORS = (xid_events, ecc_events, remap_events, lost_events)
CONDITION_DETECTORS = (clock_cut_events, temperature_events, memory_events, other_process_events)


def _selected(scope: DiagnoseScope, occs: list[Occupant]) -> bool:
    """With --job / --service, a GPU counts only if the selected workload ran on it."""
    if not scope.job and not scope.service:
        return True
    return any(
        (scope.job and o.labels.get(N.TRAIN_JOB_LABEL) == scope.job) or (scope.service and o.labels.get("service") == scope.service)
        for o in occs
    )


def to_findings(reader: AnalysisReader, scope: DiagnoseScope, events: list[HealthEvent]) -> list[Finding]:
    if not events:
        return []
    placed = occupants_around(reader, min(h.start for h in events), max(h.end for h in events))
    out = []
    for h in events:
        imps: list[WorkloadImpact] = impacts(reader, placed, h.ref, h.start, h.end, h.what, point=h.point)
        on_gpu = [o for o in placed.get(h.ref, []) if o.overlaps(h.start, h.end)]
        if not _selected(scope, on_gpu):
            continue
        summary = h.summary
        if imps:
            summary += " " + "; ".join(i.sentence[:1].upper() + i.sentence[1:] for i in imps) + "."
        else:
            summary += " No workload gpulens knows of ran on it at that time."
        evidence = {**{k: v for k, v in h.evidence.items() if v is not None}, "uuid": h.uuid,
                    "workloads": [i.sentence for i in imps], "workload_impact": [asdict(i) for i in imps]}
        labels = {"gpu": h.ref.gpu, "host": h.ref.host, **workload_labels(imps, on_gpu)}
        out.append(Finding(h.kind, "gpu", h.start, h.end, h.severity, summary, evidence, list(h.advice), labels))  # type: ignore[arg-type]
    return out


@register_analyzer("gpu_faults", order=FAULT_ORDER)
def gpu_faults(reader: AnalysisReader, scope: DiagnoseScope) -> list[Finding]:
    """XIDs, uncorrectable ECC errors, row remapping and lost GPUs: the hardware needs attention."""
    return to_findings(reader, scope, [h for det in FAULT_DETECTORS for h in det(reader, scope)])


@register_analyzer("gpu_conditions", order=CONDITION_ORDER)
def gpu_conditions(reader: AnalysisReader, scope: DiagnoseScope) -> list[Finding]:
    """Clock cuts, heat and full memory: the GPU runs, but slower or close to failing allocations."""
    return to_findings(reader, scope, [h for det in CONDITION_DETECTORS for h in det(reader, scope)])
