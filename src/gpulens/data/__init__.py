"""Bundled demo data: the real H200 session (and the co-location recording) from ../shared/data."""

from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent


def bundled_trace() -> Path:
    """The recorded H200 session shipped with gpulens (telemetry, workload events, NVML probe)."""
    return DATA_DIR / "h200-trace"


def bundled_colocation_trace() -> Path:
    """A training and a serving process sharing one H200, with per-process NVML data."""
    return DATA_DIR / "h200-colocation"
