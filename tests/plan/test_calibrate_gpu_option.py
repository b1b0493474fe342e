"""`gpulens plan calibrate --gpu` that contradicts the recording the runs come from, or is empty:
refused in one sentence, exit 2, nothing stored. Before, `--measurements bundled --gpu l40s` stored
the H200's fit as the L40S's calibration, and `--gpu ''` calibrated the recording's GPU."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize(("gpu", "says"), [("l40s", "their recording says H200"), ("", "No GPU name given")])
def test_a_gpu_the_runs_did_not_run_on_is_refused_and_nothing_stored(tmp_path, gpu, says):
    store = tmp_path / "calibration.json"
    r = subprocess.run([sys.executable, "-m", "gpulens", "plan", "calibrate", "--measurements", "bundled", "--gpu", gpu],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "GPULENS_CALIBRATION": str(store), "GPULENS_PLAN_CONFIG": str(tmp_path / "p.yaml")})
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and says in r.stderr
    assert not store.exists()
