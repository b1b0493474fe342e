"""`gpulens plan compare` given one card twice, under one name or two (h100-sxm, H100-SXM,
nvidia-h100-sxm): refused in one sentence, exit 2. It compared the card with itself, a table of
identical rows and a "compared on 3 GPUs" of one."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("gpus", [["h100-sxm", "H100-SXM"], ["l40s,h100-sxm,l40s"], ["h100-sxm", "nvidia-h100-sxm"]])
def test_one_gpu_twice_is_refused(tmp_path, gpus):
    args = [a for g in gpus for a in ("--gpu", g)]
    r = subprocess.run([sys.executable, "-m", "gpulens", "plan", "compare", "--model", "llama-3-8b", "--workload", "infer",
                        *args], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "GPULENS_PLAN_CONFIG": str(tmp_path / "plan.yaml")})
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "twice" in r.stderr
