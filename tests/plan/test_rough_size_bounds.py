"""A bare size past any model (`--model 1001t`, a 250-digit count): refused in one sentence, exit 2.
Before, it was shaped into a LLaMA of up to 1e240 layers and planned."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("size", ["1001t", "9" * 250 + "t"])
def test_a_bare_size_past_any_model_is_refused(tmp_path, size):
    r = subprocess.run([sys.executable, "-m", "gpulens", "plan", "--model", size], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "GPULENS_PLAN_CONFIG": str(tmp_path / "plan.yaml")})
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "beyond the 1000.00T the planner shapes" in r.stderr
    assert len(r.stderr) < 400


def test_the_largest_bare_size_is_still_planned(tmp_path):
    r = subprocess.run([sys.executable, "-m", "gpulens", "plan", "--model", "1000t"], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "GPULENS_PLAN_CONFIG": str(tmp_path / "plan.yaml")})
    assert r.returncode == 0, r.stdout + r.stderr
