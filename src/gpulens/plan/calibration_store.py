"""The calibration file: where it lives, reading it back, and the efficiency a GPU plans with (its
stored fit, else the defaults, which say they are not calibrated). Writing it is
`calibration.save_calibration` (it stores a fit's report)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpulens.errors import BadInputError, shown
from gpulens.plan.catalog import GpuSpec, user_config_file
from gpulens.plan.speed import RUNTIME_DEFAULTS, Efficiency, default_efficiency
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


# The range each stored factor can take: (lowest, whether the lowest itself is allowed, highest, what
# the value must be). A fit of real runs stays inside them (calibration.fit: matmul and bandwidth ratios
# of at most 1, overheads >= 0, a workspace of at most 1 GiB, allocator and activation ratios near 1); a
# hand-edited or damaged file need not, and its value reached the planner's arithmetic unchecked: "x" repeated a string (`int(peak * reserved_ratio)`: a plan that
# never finished), 0 divided by zero, a list or a dict raised a TypeError traceback.
_SECONDS_MAX = 3600.0  # a fixed cost of an hour per step or per layer is no GPU's
_SCALE_MAX = 10.0  # measured / modelled memory, reserved / allocated: the fit finds ~0.8-1.3
_BYTES_MAX = 1 << 40
_RATIO = (0.0, False, 1.0, "a ratio above 0 and at most 1")
_SCALE = (0.0, False, _SCALE_MAX, f"a ratio above 0 and at most {_SCALE_MAX:g}")
_SECONDS = (0.0, True, _SECONDS_MAX, f"a number of seconds from 0 to {_SECONDS_MAX:g}")
_BYTES = (0.0, True, float(_BYTES_MAX), f"a number of bytes from 0 to {_BYTES_MAX:,}")
_GPU_FACTORS = {
    "compute_ratio": _RATIO, "fp32_compute_ratio": _RATIO, "memory_bandwidth_ratio": _RATIO,
    "layer_overhead_seconds": _SECONDS, "activation_scale": _SCALE, "reserved_ratio": _SCALE, "workspace_bytes": _BYTES,
}
_RUNTIME_FACTORS = {
    "decode_bandwidth_ratio": _RATIO, "decode_step_overhead_seconds": _SECONDS, "decode_layer_overhead_seconds": _SECONDS,
    "prefill_overhead_seconds": _SECONDS, "prefill_compute_ratio": _RATIO, "prefill_bandwidth_ratio": _RATIO,
}
_RUNTIME_NULLABLE = ("prefill_compute_ratio", "prefill_bandwidth_ratio")  # null: the GPU's own factor
# The other fields read back, with what each must be (a GPU's `source` may be null: it reads "calibrated")
_GPU_OTHERS = {"source": (str, type(None)), "calibrated": (bool,), "extra": (dict,)}
_RUNTIME_OTHERS = {"source": (str,), "calibrated": (bool,)}
_OTHER_WHAT = {"source": "text", "calibrated": "true or false", "extra": "a mapping"}
_ENTRY_HINT = "Run `gpulens plan calibrate` again, or delete the file to plan with the defaults."


def _written(value: Any) -> str:
    """A value as the file spells it (null, "x", [1]), cut for a sentence."""
    return shown(json.dumps(value), quote=False)


def _checked_fields(d: dict[str, Any], factors: dict[str, tuple[float, bool, float, str]],
                    others: dict[str, tuple[type, ...]], field_of: str, nullable: tuple[str, ...] = ()) -> dict[str, Any]:
    """`d` with each factor it gives checked against its range (`field_of`: "of GPU 'H200' in the
    calibration file /x", for the sentence); a bad one is one BadInputError sentence."""
    out = dict(d)

    def refuse(key: str, what: str) -> BadInputError:
        return BadInputError(f"The field {key!r} {field_of} is {_written(d[key])}, not {what}.", hint=_ENTRY_HINT)

    for key, (low, low_ok, high, what) in factors.items():
        if key not in d or (d[key] is None and key in nullable):
            continue
        v = d[key]
        number = not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v)
        if not (number and (v > low or (low_ok and v == low)) and v <= high):
            raise refuse(key, what)
        if factors[key] is _BYTES:
            out[key] = int(v)
    for key, types in others.items():
        if key in d and not isinstance(d[key], types):
            raise refuse(key, _OTHER_WHAT[key])
    return out


def _checked_entry(entry: Any, gpu: str, path: Path) -> dict[str, Any]:
    """A GPU's stored entry, every factor the planner reads checked: the GPU's own, and each
    runtime's under `runtimes` (a runtime gpulens does not know is left out, as before)."""
    where = f"the calibration file {path}"
    if not isinstance(entry, dict):
        raise BadInputError(f"The entry of GPU {gpu!r} in {where} is {_written(entry)}, not a mapping of its factors.",
                            hint=_ENTRY_HINT)
    out = _checked_fields(entry, _GPU_FACTORS, _GPU_OTHERS, f"of GPU {gpu!r} in {where}")
    runtimes = entry.get("runtimes", {})
    if not isinstance(runtimes, dict):
        raise BadInputError(f"The field 'runtimes' of GPU {gpu!r} in {where} is {_written(runtimes)}, not a mapping "
                            f"of runtimes to their factors.", hint=_ENTRY_HINT)
    checked = {}
    for name, rt in runtimes.items():
        if name not in RUNTIME_DEFAULTS:
            continue
        if not isinstance(rt, dict):
            raise BadInputError(f"The runtime {name!r} of GPU {gpu!r} in {where} is {_written(rt)}, not a mapping of "
                                f"its factors.", hint=_ENTRY_HINT)
        missing = [k for k in _RUNTIME_FACTORS if k not in rt and k not in _RUNTIME_NULLABLE]
        if missing:
            raise BadInputError(f"The runtime {name!r} of GPU {gpu!r} in {where} lacks the field {missing[0]!r}.",
                                hint=_ENTRY_HINT)
        checked[name] = _checked_fields(rt, _RUNTIME_FACTORS, _RUNTIME_OTHERS, f"of runtime {name!r} of GPU {gpu!r} in {where}",
                                        _RUNTIME_NULLABLE)
    out["runtimes"] = checked
    return out


def load_efficiency(gpu: GpuSpec, *, path: Path | None = None) -> Efficiency:
    """The stored calibration of `gpu`, else the defaults (which say they are not calibrated). Only
    `gpu`'s entry is checked: a damaged entry of another GPU does not stop this plan, and
    calibrating this GPU again replaces a damaged entry of its own."""
    path = path or calibration_path()
    data = read_store(path)
    if gpu.name not in data["gpus"] or data["gpus"][gpu.name] == {}:
        return default_efficiency(gpu)
    entry = _checked_entry(data["gpus"][gpu.name], gpu.name, path)
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
