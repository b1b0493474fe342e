"""A stored calibration file whose values no fit writes (a hand edit, a damaged copy): `gpulens plan`
refuses it with one sentence naming the file, the field with its GPU (and runtime) and the value,
exit 2, never a traceback. Before, `compute_ratio: "x"` raised a TypeError, `compute_ratio: 0` a
ZeroDivisionError, `runtimes: "x"` an AttributeError, and `reserved_ratio: "x"` (serving) or
`activation_scale: "x"` (training) never finished: `int(peak_bytes * "x")` repeated the string
billions of times, growing memory without bound."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from gpulens.cli.main import main
from gpulens.plan.speed import Efficiency, RuntimeSpeed

GPU = "H200"
PLAN = ["plan", "--model", "7b", "--gpu", "h200"]


@pytest.fixture(scope="module")
def good_file(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What `gpulens plan calibrate --measurements bundled` writes (the real command, once)."""
    path = tmp_path_factory.mktemp("calibration") / "calibration.json"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPULENS_CALIBRATION", str(path))
        assert main(["plan", "calibrate", "--measurements", "bundled", "--gpu", "h200"]) == 0
    data = json.loads(path.read_text())
    assert GPU in data["gpus"] and "hf" in data["gpus"][GPU]["runtimes"]  # the file carries a runtime's fit
    return data


def _numeric(cls: type) -> list[str]:
    # speed.py postpones annotations: a field's type is its text
    return [f.name for f in fields(cls) if f.type in ("float", "int", "float | None")]


GPU_FACTORS = _numeric(Efficiency)
RUNTIME_FACTORS = _numeric(RuntimeSpeed)
NULLABLE = {f.name for f in fields(RuntimeSpeed) if f.type == "float | None"}  # null: the GPU's own factor
# a ratio or a scale must be above 0; an overhead in seconds or a workspace in bytes may be 0
ZERO_OK = {"layer_overhead_seconds", "workspace_bytes", "decode_step_overhead_seconds",
           "decode_layer_overhead_seconds", "prefill_overhead_seconds"}


def _bad_values(field: str, *, nullable: bool = False) -> list[Any]:
    values: list[Any] = ["x", "0.5", [1], {"a": 1}, True, -1, -0.5, 1e308, float("nan"), float("inf"), float("-inf")]
    if not nullable:
        values.append(None)
    if field not in ZERO_OK:
        values.append(0)
    return values


def _plan(tmp_path: Path, data: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
          workload: str) -> tuple[int, str, str, Path]:
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(data, indent=1))  # NaN and Infinity as Python's json writes them
    monkeypatch.setenv("GPULENS_CALIBRATION", str(path))
    rc = main([*PLAN, "--workload", workload])
    out, err = capsys.readouterr()
    return rc, out, err, path


def _assert_refused(rc: int, out: str, err: str, path: Path, field: str) -> None:
    assert rc == 2, out + err
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) <= 2 and lines[0].startswith("error: "), err  # one sentence, then its hint
    assert f"'{field}'" in lines[0] and str(path) in lines[0], err
    assert "gpulens plan calibrate" in err


GPU_CASES = [(f, v) for f in GPU_FACTORS for v in _bad_values(f)]
RUNTIME_CASES = [(f, v) for f in RUNTIME_FACTORS for v in _bad_values(f, nullable=f in NULLABLE)]


def test_every_factor_the_planner_reads_is_covered():
    assert {"compute_ratio", "memory_bandwidth_ratio", "reserved_ratio", "activation_scale", "workspace_bytes",
            "layer_overhead_seconds", "fp32_compute_ratio"} <= set(GPU_FACTORS)
    assert {"decode_bandwidth_ratio", "prefill_overhead_seconds", "prefill_compute_ratio"} <= set(RUNTIME_FACTORS)


@pytest.mark.parametrize("workload", ["infer", "train"])
@pytest.mark.parametrize(("field", "value"), GPU_CASES, ids=[f"{f}={v!r}" for f, v in GPU_CASES])
def test_a_bad_gpu_factor_is_refused(good_file, tmp_path, monkeypatch, capsys, workload, field, value):
    data = copy.deepcopy(good_file)
    data["gpus"][GPU][field] = value
    rc, out, err, path = _plan(tmp_path, data, monkeypatch, capsys, workload)
    _assert_refused(rc, out, err, path, field)


@pytest.mark.parametrize(("field", "value"), RUNTIME_CASES, ids=[f"{f}={v!r}" for f, v in RUNTIME_CASES])
def test_a_bad_runtime_factor_is_refused(good_file, tmp_path, monkeypatch, capsys, field, value):
    data = copy.deepcopy(good_file)
    data["gpus"][GPU]["runtimes"]["hf"][field] = value
    rc, out, err, path = _plan(tmp_path, data, monkeypatch, capsys, "infer")
    _assert_refused(rc, out, err, path, field)
    if not (isinstance(value, float) and not math.isfinite(value)):  # NaN and Infinity: the parser names the key
        assert "runtime 'hf'" in err and "GPU 'H200'" in err


@pytest.mark.parametrize(("where", "value"), [
    ("runtimes", "x"), ("runtimes", [1]), ("runtimes", None), ("runtimes", 3),
    ("hf", "x"), ("hf", [1]), ("hf", None), ("hf", 0),
    ("source", ["a"]), ("source", {"a": 1}), ("calibrated", "yes"), ("extra", "x"), ("extra", None),
    ("hf.source", None), ("hf.calibrated", "no"),
])
def test_a_bad_mapping_or_text_field_is_refused(good_file, tmp_path, monkeypatch, capsys, where, value):
    data = copy.deepcopy(good_file)
    entry = data["gpus"][GPU]
    if where == "hf":
        entry["runtimes"]["hf"] = value
    elif where.startswith("hf."):
        entry["runtimes"]["hf"][where[3:]] = value
    else:
        entry[where] = value
    rc, out, err, path = _plan(tmp_path, data, monkeypatch, capsys, "infer")
    _assert_refused(rc, out, err, path, where.removeprefix("hf."))


@pytest.mark.parametrize("value", ["x", None, [1], 0])
def test_a_gpu_entry_that_is_not_a_mapping_is_refused(good_file, tmp_path, monkeypatch, capsys, value):
    data = copy.deepcopy(good_file)
    data["gpus"][GPU] = value
    rc, out, err, path = _plan(tmp_path, data, monkeypatch, capsys, "train")
    _assert_refused(rc, out, err, path, GPU)


def test_a_runtime_missing_a_factor_is_refused(good_file, tmp_path, monkeypatch, capsys):
    data = copy.deepcopy(good_file)
    del data["gpus"][GPU]["runtimes"]["hf"]["decode_bandwidth_ratio"]
    rc, out, err, path = _plan(tmp_path, data, monkeypatch, capsys, "infer")
    _assert_refused(rc, out, err, path, "decode_bandwidth_ratio")
    assert "lacks" in err


@pytest.mark.parametrize("workload", ["infer", "train"])
def test_the_file_calibrate_wrote_still_plans(good_file, tmp_path, monkeypatch, capsys, workload):
    rc, out, err, _ = _plan(tmp_path, good_file, monkeypatch, capsys, workload)
    assert rc == 0, out + err
    assert "calibrated on" in out


def test_values_at_the_edges_of_their_ranges_still_plan(good_file, tmp_path, monkeypatch, capsys):
    data = copy.deepcopy(good_file)
    entry = data["gpus"][GPU]
    entry.update(compute_ratio=1, layer_overhead_seconds=0, workspace_bytes=0.0, reserved_ratio=1.0)
    entry["runtimes"]["hf"].update(prefill_compute_ratio=None, prefill_bandwidth_ratio=None, decode_layer_overhead_seconds=0)
    entry["runtimes"]["some-future-runtime"] = "not read"  # a runtime this gpulens does not know is left out, as before
    for workload in ("infer", "train"):
        rc, out, err, _ = _plan(tmp_path, data, monkeypatch, capsys, workload)
        assert rc == 0, out + err


def test_a_damaged_entry_of_another_gpu_does_not_stop_this_plan(good_file, tmp_path, monkeypatch, capsys):
    # calibrating H200 again replaces only H200's entry: a bad A100 entry must not hold H200's plans hostage
    data = copy.deepcopy(good_file)
    data["gpus"]["A100-SXM-80GB"] = {**data["gpus"][GPU], "compute_ratio": "x"}
    rc, out, err, _ = _plan(tmp_path, data, monkeypatch, capsys, "infer")
    assert rc == 0, out + err
