"""`gpulens plan --gpu local`: the card in this machine, read through the GPU seam (here a recording
replayed with GPULENS_BACKEND, the only GPU this machine has) and looked up by its NVML name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _recording(tmp_path: Path, names: list[str], memory_total_bytes: int = 150754820096) -> Path:
    """A one-line gpulens recording whose header lists GPUs of these NVML names."""
    gpus = [{"index": i, "uuid": f"GPU-test-{i}", "name": n, "memory_total_bytes": memory_total_bytes}
            for i, n in enumerate(names)]
    path = tmp_path / "rec.jsonl"
    path.write_text(json.dumps({"format": "gpulens-recording", "version": 1, "backend": "fake", "gpus": gpus}) + "\n")
    return path


def _plan(backend: str | None, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "GPULENS_BACKEND"}
    if backend is not None:
        env["GPULENS_BACKEND"] = backend
    return subprocess.run([sys.executable, "-m", "gpulens", "plan", "--model", "llama-3-8b", "--workload", "infer", *args],
                          capture_output=True, text=True, timeout=120, env=env)


def test_local_is_the_machines_card_planned_as_its_catalog_entry(tmp_path):
    rec = _recording(tmp_path, ["NVIDIA H200"] * 2)
    local = _plan(f"replay:{rec}", "--gpu", "local", "--format", "json")
    named = _plan(None, "--gpu", "h200", "--format", "json")
    assert local.returncode == 0, local.stderr
    assert "2 × NVIDIA H200, planned as H200" in local.stderr and "this machine has" not in local.stderr
    plan_local, plan_named = json.loads(local.stdout), json.loads(named.stdout)
    assert plan_local["gpu"] == plan_named["gpu"] and plan_local["memory"] == plan_named["memory"]


def test_compare_takes_local_beside_catalog_names(tmp_path):
    rec = _recording(tmp_path, ["NVIDIA H100 80GB HBM3"])
    r = subprocess.run([sys.executable, "-m", "gpulens", "plan", "compare", "--model", "llama-3-8b", "--workload", "infer",
                        "--gpu", "this,l40s", "--format", "json"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "GPULENS_BACKEND": f"replay:{rec}"})
    assert r.returncode == 0, r.stderr
    assert [row["gpu"]["name"] for row in json.loads(r.stdout)["results"]] == ["H100-SXM", "L40S"]


@pytest.mark.parametrize(("names", "says", "code"), [
    (["NVIDIA H200", "NVIDIA L40S"], "2 kinds of GPU", 2),
    (["NVIDIA Imaginary X1"], "is not in gpulens's catalog", 2),
])
def test_a_machine_local_cannot_name_one_card_for_is_one_sentence(tmp_path, names, says, code):
    r = _plan(f"replay:{_recording(tmp_path, names)}", "--gpu", "local")
    assert r.returncode == code, r.stdout + r.stderr
    assert says in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("mig", [False, True])
def test_a_gpu_in_mig_mode_is_said(tmp_path, mig):
    rec = tmp_path / "rec.jsonl"
    r = subprocess.run([sys.executable, "-m", "gpulens", "record", "--backend", "fake:1", "--out", str(rec),
                        "--duration", "1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    if mig:  # the recorded sample as NVML reads a GPU in MIG mode
        rec.write_text(rec.read_text().replace('"mig_mode":false', '"mig_mode":true'))
    r = _plan(f"replay:{rec}", "--gpu", "local")
    assert r.returncode == 0, r.stderr
    assert ("MIG mode: this plan is for the whole card" in r.stderr) is mig, r.stderr


def test_a_card_other_than_the_catalogs_variant_is_said(tmp_path):
    # Meta's H100 reports the bare "NVIDIA H100" with 96 GB; the catalog's H100-SXM has 80
    r = _plan(f"replay:{_recording(tmp_path, ['NVIDIA H100'], memory_total_bytes=96 * 10**9)}", "--gpu", "local")
    assert r.returncode == 0, r.stderr
    assert "NVML reports 89.4 GiB on this NVIDIA H100" in r.stderr and "catalog's figures" in r.stderr


def test_local_without_a_driver_is_one_sentence_naming_the_way_out():
    from gpulens.gpu import nvidia_driver_present

    if nvidia_driver_present():
        pytest.skip("this machine has an NVIDIA driver")
    r = _plan(None, "--gpu", "local")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "--gpu local has no card to plan for" in r.stderr and "GPULENS_BACKEND=replay" in r.stderr


def test_a_plan_for_more_gpus_than_the_machine_holds_says_so(tmp_path):
    rec = _recording(tmp_path, ["NVIDIA H200"])
    r = _plan(f"replay:{rec}", "--gpu", "local", "--tp", "4")
    assert r.returncode == 0, r.stderr
    assert "The plan is for 4 GPUs; this machine has 1." in r.stderr
