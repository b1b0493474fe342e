"""The environment fingerprint and its diff."""

from __future__ import annotations

import json
import subprocess
import sys

from gpulens.runs import diff, take_fingerprint
from gpulens.runs.fingerprint import _cuda_runtime, relevant_env

# What NVML reported on the H200 of the bundled recording (src/gpulens/data/h200-trace/env.json).
H200_NVML = {
    "driver": "580.159.04",
    "cuda_driver": "13.0",
    "gpus": [{"index": 0, "name": "NVIDIA H200", "uuid": "GPU-5c7ed611-60e2-dff3-ba6d-6fa2fa8bb05e", "vbios": "96.00.AF.00.01", "mig_mode": 0}],
}


def test_fingerprint_with_recorded_nvml_answers():
    fp = take_fingerprint(nvml_versions=H200_NVML, environ={"CUDA_VISIBLE_DEVICES": "0", "NCCL_DEBUG": "INFO", "HOME": "/root"})
    assert fp.driver == "580.159.04" and fp.cuda_driver == "13.0"
    assert fp.gpus[0].name == "NVIDIA H200" and fp.gpus[0].mig_mode == 0 and fp.gpus[0].vbios
    assert fp.env == {"CUDA_VISIBLE_DEVICES": "0", "NCCL_DEBUG": "INFO"}  # HOME is not relevant
    assert "numpy" in fp.packages and fp.python.startswith(f"{sys.version_info.major}.{sys.version_info.minor}")


def test_without_a_driver_the_gpu_fields_stay_empty():
    fp = take_fingerprint(nvml_versions={})
    assert fp.driver is None and fp.gpus == [] and fp.cuda_driver is None


def test_cuda_runtime_from_the_torch_build_tag():
    assert _cuda_runtime({"torch": "2.11.0+cu130"}) == "13.0"
    assert _cuda_runtime({"torch": "2.4.0+cu121"}) == "12.1"
    assert _cuda_runtime({"torch": "2.13.0+cpu"}) == "none (CPU build)"
    assert _cuda_runtime({}) is None


def test_relevant_env_prefixes():
    env = relevant_env({"NCCL_IB_DISABLE": "1", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "PATH": "/bin", "OMP_NUM_THREADS": "4"})
    assert set(env) == {"NCCL_IB_DISABLE", "PYTORCH_CUDA_ALLOC_CONF", "OMP_NUM_THREADS"}


def test_fingerprint_does_not_import_torch():
    # importing torch costs seconds and can initialise CUDA: versions come from metadata only
    code = "import sys; from gpulens.runs import take_fingerprint; take_fingerprint(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_diff_flattens_nested_fields():
    a = take_fingerprint(nvml_versions=H200_NVML, environ={}).to_dict()
    b = json.loads(json.dumps(a))
    b["gpus"][0]["vbios"] = "96.00.B0.00.01"
    b["driver"] = "580.200"
    b["env"]["NCCL_ALGO"] = "Ring"
    got = {(c.key, c.what) for c in diff(a, b)}
    assert got == {("gpus.0.vbios", "changed"), ("driver", "changed"), ("env.NCCL_ALGO", "added")}
    assert diff(a, a) == []
