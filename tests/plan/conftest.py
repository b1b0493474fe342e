"""Planner tests never read the user's real config or calibration: both live in a temp folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpulens.data import bundled_trace

CALIBRATION_FILE = bundled_trace() / "memory_calibration.jsonl"


@pytest.fixture(autouse=True)
def isolated_plan_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cfg = tmp_path / "plan.yaml"
    monkeypatch.setenv("GPULENS_PLAN_CONFIG", str(cfg))
    monkeypatch.setenv("GPULENS_CALIBRATION", str(tmp_path / "calibration.json"))
    return cfg


@pytest.fixture(scope="session")
def calibration_rows() -> list[dict]:
    return [json.loads(line) for line in CALIBRATION_FILE.read_text().splitlines() if line.strip()]
