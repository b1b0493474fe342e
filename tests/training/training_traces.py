"""Ground truth for the training diagnosis: the recorded phases (test oracle only) and a rewritten
copy of the H200 session with the phases in another order, other durations and shifted times."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from gpulens.store import Store

TRAIN_PHASES = ("train_normal", "train_dataloader_stall", "train_checkpoint", "train_small_batch")


@dataclass
class Window:
    phase: str
    start: float  # first step's start
    end: float  # last step's end


def phase_windows(store: Store) -> list[Window]:
    """Windows of the training phases, from the raw `phase` events and the steps inside them."""
    marks = sorted((e.t, e.data["name"]) for e in store.events("phase"))
    steps = [e.data for e in store.events("train_step")]
    out = []
    for i, (t, name) in enumerate(marks):
        if name not in TRAIN_PHASES:
            continue
        t_next = marks[i + 1][0] if i + 1 < len(marks) else float("inf")
        inside = [s for s in steps if t <= s["t_start"] < t_next]
        if inside:
            out.append(Window(name, min(s["t_start"] for s in inside), max(s["t_end"] for s in inside)))
    return out


def checkpoint_windows(store: Store) -> list[tuple[float, float]]:
    return [(e.data["t_end"] - e.data["checkpoint_s"], e.data["t_end"]) for e in store.events("train_step") if e.data.get("checkpoint_s", 0) > 0.5]


def overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def coverage(findings, w: Window) -> float:
    """Share of window `w` covered by the union of the findings."""
    spans = sorted((max(f.start, w.start), min(f.end, w.end)) for f in findings if f.end > w.start and f.start < w.end)
    covered, cur = 0.0, w.start
    for a, b in spans:
        a = max(a, cur)
        if b > a:
            covered += b - a
            cur = b
    return covered / (w.end - w.start)


# (phase, first step, last step + 1, repeats): another order, other lengths. The job still starts
# with its warm-up steps, as every real job does.
REORDERED = (
    ("train_normal", 0, 10, 1),
    ("train_small_batch", 0, 30, 2),
    ("train_dataloader_stall", 0, 12, 1),
    ("train_normal", 10, 40, 2),
    ("train_checkpoint", 0, 30, 1),
    ("train_normal", 10, 30, 1),
)
TIME_SHIFT_SECONDS = 10 * 86400.0 + 1234.5


def build_reordered_trace(src: Path, dst: Path, plan=REORDERED, shift: float = TIME_SHIFT_SECONDS) -> Path:
    """Copy the H200 session's training part into `dst`, rearranged by `plan`: each block's steps
    and the telemetry recorded during them move together, so the GPU still shows what it showed."""
    events = [json.loads(line) for line in (src / "events.jsonl").read_text().splitlines() if line.strip()]
    telemetry = [json.loads(line) for line in (src / "telemetry.jsonl").read_text().splitlines() if line.strip()]
    steps = {p: [e for e in events if e["kind"] == "train_step" and e["phase"] == p] for p in TRAIN_PHASES}
    first_train = min(e["t"] for e in events if e["kind"] == "phase" and e["name"] in TRAIN_PHASES)
    out_ev = [e for e in events if e["kind"] in ("phase", "cold_start") and e["t"] < first_train]
    out_tel = [t for t in telemetry if t["t"] < first_train]
    cursor = first_train
    n = 0
    for phase, a, b, repeats in plan:
        block = steps[phase][a:b]
        w0, w1 = block[0]["t_start"], block[-1]["t_end"]
        tel = [t for t in telemetry if w0 <= t["t"] <= w1]
        for _ in range(repeats):
            d = cursor - w0
            out_ev.append({"kind": "phase", "name": phase, "t": cursor})
            for s in block:
                out_ev.append({**s, "step": n, "t_start": s["t_start"] + d, "t_end": s["t_end"] + d})
                n += 1
            out_tel.extend({**t, "t": t["t"] + d, "phase": phase} for t in tel)
            cursor += (w1 - w0) + 0.05
    out_ev.append({"kind": "phase", "name": "idle_end", "t": cursor})
    out_tel.extend({**t, "t": cursor + 0.1 * i, "phase": "idle_end", "gpu_util": 0} for i, t in enumerate(telemetry[-20:]))
    dst.mkdir(parents=True, exist_ok=True)
    with (dst / "events.jsonl").open("w") as f:
        for e in sorted(out_ev, key=lambda e: e.get("t_end", e.get("t"))):
            for k in ("t", "t_start", "t_end"):
                if k in e:
                    e[k] += shift
            f.write(json.dumps(e) + "\n")
    with (dst / "telemetry.jsonl").open("w") as f:
        for t in sorted(out_tel, key=lambda t: t["t"]):
            f.write(json.dumps({**t, "t": t["t"] + shift}) + "\n")
    shutil.copy(src / "nvml_probe.json", dst / "nvml_probe.json")
    return dst
