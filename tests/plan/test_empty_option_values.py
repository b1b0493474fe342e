"""An option given an empty value (`--tpot-target ''`, as a shell variable that is unset expands to)
is refused in one sentence, exit 2: it was read as "not given" and the plan ran without it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize(("workload", "flag", "says"), [
    ("infer", "--tpot-target", "Cannot read TPOT target ''"),
    ("infer", "--ttft-target", "Cannot read TTFT target ''"),
    ("infer", "--kv-dtype", "Unknown KV-cache dtype ''"),
    ("train", "--recompute", "Unknown recomputation ''"),
])
@pytest.mark.parametrize("command", [(), ("compare", "--gpu", "l40s")])
def test_an_empty_option_value_is_refused(tmp_path, workload, flag, says, command):
    r = subprocess.run([sys.executable, "-m", "gpulens", "plan", *command, "--model", "llama-3-8b",
                        "--workload", workload, flag, ""], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "GPULENS_PLAN_CONFIG": str(tmp_path / "plan.yaml")})
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and says in r.stderr
