"""Builds H200-session recordings with the phases in another order and with other durations, from the
bundled trace. Phase labels are used here only as ground truth for the tests, never by the rules."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

PHASE_KINDS_TRAIN_HEALTHY = {"train_normal"}
PHASE_IDLE = {"idle", "idle_between", "idle_end"}
PHASE_ANOMALY = {"train_dataloader_stall", "train_checkpoint"}


@dataclass
class Segment:
    phase: str
    start: float
    end: float


def _time(record: dict) -> float:
    for k in ("t_end", "end", "t"):
        if isinstance(record.get(k), int | float):
            return float(record[k])
    raise ValueError(record)


def load_phases(trace: Path) -> list[Segment]:
    events = [json.loads(line) for line in (trace / "events.jsonl").open()]
    tel = [json.loads(line) for line in (trace / "telemetry.jsonl").open()]
    marks = [(e["t"], e["name"]) for e in events if e["kind"] == "phase"]
    end = max(max(r["t"] for r in tel), max(_time(e) for e in events)) + 0.05
    return [Segment(name, t, marks[i + 1][0] if i + 1 < len(marks) else end) for i, (t, name) in enumerate(marks)]


_TIME_KEYS = ("t", "t_start", "t_end", "arrival", "start", "first_token", "end")


def _shift(record: dict, dt: float) -> dict:
    out = dict(record)
    for k in _TIME_KEYS:
        if isinstance(out.get(k), int | float):
            out[k] = out[k] + dt
    return out


def build_recording(src: Path, dst: Path, plan: list[tuple[str, float]]) -> list[Segment]:
    """Writes a trace folder at `dst` whose phases follow `plan` [(phase, duration factor)...]: a factor
    below 1 keeps the first part of the phase, above 1 plays it again (factor 2 = twice)."""
    events = [json.loads(line) for line in (src / "events.jsonl").open()]
    tel = [json.loads(line) for line in (src / "telemetry.jsonl").open()]
    phases = {s.phase: s for s in load_phases(src)}
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "nvml_probe.json", dst / "nvml_probe.json")
    out_tel: list[dict] = []
    out_ev: list[dict] = []
    segments: list[Segment] = []
    cursor = tel[0]["t"]
    seen: set[str] = set()
    for phase, factor in plan:
        seg = phases[phase]
        length = seg.end - seg.start
        played = 0.0
        first_copy = phase not in seen
        seen.add(phase)
        out_ev.append({"kind": "phase", "name": phase, "t": cursor})
        while played < factor - 1e-9:
            part = min(1.0, factor - played)
            cut = seg.start + part * length
            dt = cursor - seg.start
            for r in tel:
                if seg.start <= r["t"] < cut:
                    out_tel.append(_shift(r, dt))
            for e in events:
                if e["kind"] == "phase":
                    continue
                # Time inside the phase: a step or request belongs to the phase it ends in.
                t = _time(e)
                if not (seg.start <= t < cut):
                    continue
                # The job's first step (warm-up, 1.75 s) happens once per job, not per healthy stretch.
                if e["kind"] == "train_step" and e.get("step") == 0 and phase == "train_normal" and not (first_copy and played == 0):
                    continue
                out_ev.append(_shift(e, dt))
            cursor += part * length
            played += part
        segments.append(Segment(phase, cursor - factor * length, cursor))
    out_tel.sort(key=lambda r: r["t"])
    out_ev.sort(key=_time)
    (dst / "telemetry.jsonl").write_text("".join(json.dumps(r) + "\n" for r in out_tel))
    (dst / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in out_ev))
    return segments
