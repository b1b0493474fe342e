"""Helpers of the reliability tests: small traces written to a temp folder, and counts read back."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from gpulens.store import Store


def h200_lines(h200_trace: Path, n: int | None = None) -> list[str]:
    lines = [ln for ln in (h200_trace / "telemetry.jsonl").read_text().splitlines() if ln.strip()]
    return lines[:n] if n else lines


def write_trace(folder: Path, lines: list[str], h200_trace: Path | None = None, *, events: list[dict] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if h200_trace is not None:
        shutil.copy(h200_trace / "nvml_probe.json", folder / "nvml_probe.json")
    (folder / "telemetry.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    if events is not None:
        (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    return folder


def sample_rows(store: Store, name: str) -> int:
    return sum(store.count_samples(s.id, -1e300, 1e300) for s in store.stored_series(name))
