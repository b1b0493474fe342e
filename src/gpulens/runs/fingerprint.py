"""The environment fingerprint: what a result depends on besides the code (GPU, driver, CUDA,
framework versions, the variables that steer NCCL and CUDA). Every stored run carries one, so a
regression can be traced to "the driver changed" rather than guessed at.

Package versions come from installed metadata (importlib.metadata), never by importing the
packages: importing torch costs seconds and may initialise CUDA.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from importlib import metadata
from typing import Any

from gpulens.vocab import gpu_fields as F

# Packages whose versions change performance or numerics.
TRACKED_PACKAGES = (
    "torch",
    "torchvision",
    "transformers",
    "accelerate",
    "deepspeed",
    "lightning",
    "pytorch-lightning",
    "flash-attn",
    "xformers",
    "triton",
    "vllm",
    "text-generation",
    "tritonclient",
    "tensorrt",
    "tensorrt-llm",
    "bitsandbytes",
    "peft",
    "numpy",
    "nvidia-ml-py",
    "nvidia-cudnn-cu12",
    "nvidia-nccl-cu12",
    "nvidia-cublas-cu12",
    "nvidia-cuda-runtime-cu12",
    "gpulens",
)

# Environment variables that change which GPUs are used or how they talk.
TRACKED_ENV_PREFIXES = ("NCCL_", "CUDA_", "TORCH_", "PYTORCH_", "NVIDIA_", "OMP_", "CUBLAS_", "TF32_", "VLLM_")
TRACKED_ENV_EXACT = ("MKL_NUM_THREADS", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


@dataclass
class GpuFingerprint:
    index: int
    name: str | None = None
    uuid: str | None = None
    vbios: str | None = None
    mig_mode: int | None = None  # 1 = MIG enabled


@dataclass
class Fingerprint:
    host: str
    os: str
    python: str
    cpu: str
    cpu_count: int
    driver: str | None = None
    nvml: str | None = None
    cuda_driver: str | None = None  # the highest CUDA version the driver supports
    cuda_runtime: str | None = None  # the CUDA runtime the framework was built with (torch's, from metadata)
    gpus: list[GpuFingerprint] = field(default_factory=list)
    packages: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def package_versions(names: tuple[str, ...] = TRACKED_PACKAGES) -> dict[str, str]:
    out: dict[str, str] = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            continue
    return out


def relevant_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    env = os.environ if environ is None else environ
    return {
        k: v
        for k, v in sorted(env.items())
        if k.startswith(TRACKED_ENV_PREFIXES) or k in TRACKED_ENV_EXACT
    }


def _cuda_runtime(packages: dict[str, str]) -> str | None:
    """The CUDA runtime torch was built with, read from its version string ("2.4.0+cu121") or the
    nvidia-cuda-runtime wheel, so that torch is never imported here."""
    tv = packages.get("torch", "")
    if "+cu" in tv:
        digits = tv.split("+cu", 1)[1]
        if digits.isdigit() and len(digits) >= 3:
            return f"{int(digits[:-1])}.{digits[-1]}"
    if "+cpu" in tv:
        return "none (CPU build)"
    rt = packages.get("nvidia-cuda-runtime-cu12")
    return rt


def cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def take_fingerprint(
    *, nvml_versions: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
) -> Fingerprint:
    """The fingerprint of this machine and process. `nvml_versions` replaces the NVML query (for
    recorded or fake environments); without a driver the GPU fields stay empty."""
    if nvml_versions is None:
        from gpulens.gpu.nvml import nvml_smi_versions

        try:
            nvml_versions = nvml_smi_versions()
        except Exception:  # a broken driver must not stop a run from being recorded
            nvml_versions = {}
    pkgs = package_versions()
    gpus = [
        GpuFingerprint(
            index=int(g.get("index", i)),
            name=g.get("name"),
            uuid=g.get("uuid"),
            vbios=g.get("vbios"),
            mig_mode=g.get(F.MIG_MODE),
        )
        for i, g in enumerate(nvml_versions.get("gpus", []) or [])
    ]
    return Fingerprint(
        host=socket.gethostname(),
        os=f"{platform.system()} {platform.release()}",
        python=platform.python_version() + f" ({sys.implementation.name})",
        cpu=cpu_model() or platform.processor() or platform.machine(),
        cpu_count=os.cpu_count() or 1,
        driver=nvml_versions.get("driver"),
        nvml=nvml_versions.get("nvml"),
        cuda_driver=nvml_versions.get("cuda_driver"),
        cuda_runtime=_cuda_runtime(pkgs),
        gpus=gpus,
        packages=pkgs,
        env=relevant_env(environ),
    )


def fingerprint_dict() -> dict[str, Any]:
    return take_fingerprint().to_dict()


#: the fields every fingerprint has (`gpulens env --format json`): a JSON file without them is something else
FINGERPRINT_KEYS = ("host", "os", "python", "cpu", "packages")
