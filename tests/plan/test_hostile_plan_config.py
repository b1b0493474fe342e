"""A user's plan.yaml with values a card cannot have (a hostile-input pass over `gpulens plan`):
one sentence naming the field, exit 2, never a traceback or a plan on an impossible card."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def _plan(tmp_path, yaml_text: str, *args: str) -> subprocess.CompletedProcess:
    cfg = tmp_path / "plan.yaml"
    cfg.write_text(yaml_text)
    return subprocess.run([sys.executable, "-m", "gpulens", "plan", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "GPULENS_PLAN_CONFIG": str(cfg)})


@pytest.mark.parametrize("figure", [
    "memory_gb: 1e308, bandwidth_gbps: 900",  # int(inf): an OverflowError traceback before
    "memory_mib: 1e300, bandwidth_gbps: 900",  # a card of 1e300 MiB, planned as fitting
    "memory_gb: 48, bandwidth_gbps: 1.0e+308",  # a memory-bound decode of 0 s
])
def test_a_card_figure_beyond_any_card_is_refused(tmp_path, figure):
    r = _plan(tmp_path, f"gpus:\n  - {{name: mycard, bf16_tflops: 100, {figure}}}\n",
              "--model", "llama-3-8b", "--workload", "infer", "--gpu", "mycard")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "beyond any card's figure" in r.stderr
