"""`gpulens plan calibrate --measurements FILE` with a run whose figures no GPU can measure (a NaN or
negative step time, a 1e300-byte peak, a batch of 0, grad_ckpt "no"): one sentence naming the line
and the field, exit 2, and the stored calibration left byte for byte. Before, some raised a
traceback (exit 1) and others were fitted and stored."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gpulens.data import bundled_trace

BUNDLED = bundled_trace() / "memory_calibration.jsonl"


def _calibrate(tmp_path, measurements) -> subprocess.CompletedProcess:
    env = {**os.environ, "GPULENS_CALIBRATION": str(tmp_path / "calibration.json"),
           "GPULENS_PLAN_CONFIG": str(tmp_path / "plan.yaml")}
    return subprocess.run([sys.executable, "-m", "gpulens", "plan", "calibrate", "--measurements", str(measurements),
                           "--gpu", "h200"], capture_output=True, text=True, timeout=120, env=env)


def _run(kind: str) -> dict:
    return next(d for d in map(json.loads, BUNDLED.read_text().splitlines()) if d.get("kind") == kind)


@pytest.mark.parametrize(("kind", "field", "value"), [
    ("train", "step_s", "nan"), ("train", "step_s", -1.0), ("train", "step_s", 0), ("train", "peak_alloc", 1e300),
    ("train", "tokens_per_s", -3), ("train", "batch", 1e300), ("train", "grad_ckpt", "no"),
    ("infer", "decode_token_s_median", "nan"), ("infer", "prefill_s", "inf"), ("infer", "batch", 0),
    ("infer", "new_tokens", -1), ("infer", "dtype", "zzz"),
])
def test_a_bad_measured_value_is_refused_and_the_stored_calibration_kept(tmp_path, kind, field, value):
    first = _calibrate(tmp_path, BUNDLED)
    assert first.returncode == 0, first.stdout + first.stderr
    stored = (tmp_path / "calibration.json").read_bytes()
    bad = tmp_path / "runs.jsonl"
    bad.write_text(BUNDLED.read_text().rstrip("\n") + "\n" + json.dumps({**_run(kind), field: value}) + "\n")
    r = _calibrate(tmp_path, bad)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "line 19" in r.stderr and (f"'{field}'" in r.stderr or "dtype" in r.stderr)
    assert (tmp_path / "calibration.json").read_bytes() == stored
