"""The calibration file: where it lives, reading it back, and the efficiency a GPU plans with (its
stored fit, else the defaults, which say they are not calibrated). Writing it is
`calibration.save_calibration` (it stores a fit's report)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from gpulens.errors import BadInputError
from gpulens.plan.catalog import GpuSpec, user_config_file
from gpulens.plan.speed import Efficiency, default_efficiency
from gpulens.safe_parse import json_value, load_json, read_text


def calibration_path() -> Path:
    return user_config_file("GPULENS_CALIBRATION", "calibration.json")


def read_store(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {"version": 1, "gpus": {}}
    hint = "Delete it and run `gpulens plan calibrate` again."
    data = load_json(read_text(path, "the calibration file", hint=hint), f"the calibration file {path}", hint=hint)
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), dict):
        raise BadInputError(f"The calibration file {path} is not in gpulens's format.", hint="Delete it and calibrate again.")
    return data


def load_efficiency(gpu: GpuSpec, *, path: Path | None = None) -> Efficiency:
    """The stored calibration of `gpu`, else the defaults (which say they are not calibrated)."""
    data = read_store(path or calibration_path())
    entry = data["gpus"].get(gpu.name)
    if not entry:
        return default_efficiency(gpu)
    eff = Efficiency.from_dict(entry)
    return replace(eff, calibrated=True, source=entry.get("source") or "calibrated")


def gpu_from_env_json(measurements_path: Path) -> str | None:
    """gpulens recordings keep an env.json (device name, versions) beside their files."""
    env = measurements_path.parent / "env.json"
    try:
        name = json_value(env.read_bytes()).get("device", {}).get("name")
    except (OSError, ValueError, AttributeError):
        return None
    return str(name) if name else None
