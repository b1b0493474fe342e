"""The GPU check, end to end: one JSON report. `python -m gpulens.gpucheck [--out PATH] [--seconds N]`.

Phases (about 2 minutes on an H200; the budget is 4): environment; NVML against nvidia-smi over
`--seconds` (the first half idle, the second with a CUDA load, so utilization, power, clocks and GPM
move); GPM; XID event registration; the training monitor's overhead and CUDA timing; a forced OOM.
A phase that cannot run (no torch with CUDA, no nvidia-smi) is reported as skipped with the reason."""

from __future__ import annotations

import argparse
import json
import platform
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from gpulens.gpu.types import GpuInfo, GpuSample
from gpulens.gpucheck.compare import Pairs, judge
from gpulens.gpucheck.smi import NO_SMI_COUNTERPART, NvidiaSmi
from gpulens.vocab import gpu_fields as F
from gpulens.vocab.gpu_fields import GPM_FIELDS

NO_DRIVER = "No NVIDIA driver answers here (NVML did not start): there is no GPU to check. Run `make gpu-check` on a machine with an NVIDIA GPU."


def numeric_sample_fields() -> list[str]:
    """The GpuSample fields that carry a reading (what the comparison must account for)."""
    skip = {"t", "gpu", "uuid", "name", "lost", "errors", "processes", "mig_instances"}
    return [f.name for f in fields(GpuSample) if f.name not in skip]


def compare_with_smi(backend: Any, smi: NvidiaSmi, *, seconds: float, load: Callable[[threading.Event], None] | None,
                     interval: float = 1.0, sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Sample NVML and nvidia-smi together every `interval` for `seconds`; a CUDA load runs in the
    second half. Returns per-GPU verdicts, the samples taken under load (for GPM), and the energy check."""
    usable, rejected = smi.supported()
    per_gpu: dict[int, Pairs] = {}
    loaded: list[GpuSample] = []
    first: dict[int, GpuSample] = {}
    last: dict[int, GpuSample] = {}
    stop = threading.Event()
    worker: threading.Thread | None = None
    n = max(2, int(seconds / interval))
    t_start = time.monotonic()
    for k in range(n):
        if load is not None and worker is None and k >= n // 2:
            worker = threading.Thread(target=load, args=(stop,), name="gpu-check-load", daemon=True)
            worker.start()
            sleep(interval)  # let the load reach the GPU before reading
        samples = backend.sample()
        rows = smi.query(usable)
        for s in samples:
            if s.lost:
                continue
            first.setdefault(s.gpu, s)
            last[s.gpu] = s
            if worker is not None:
                loaded.append(s)
            row = rows.get(s.gpu, {})
            pairs = per_gpu.setdefault(s.gpu, Pairs())
            for f in usable:
                v = getattr(s, f.field)
                pairs.add(f.field, None if v is None else float(v), row.get(f.field))
        sleep(interval)
    stop.set()
    if worker is not None:
        worker.join(timeout=10)
    elapsed = time.monotonic() - t_start
    gpus = {}
    for gpu, pairs in per_gpu.items():
        verdicts = [judge(f, pairs.values.get(f.field, [])).to_json() for f in usable]
        gpus[str(gpu)] = {
            "fields": verdicts,
            "not_queried": rejected,
            "energy": energy_check(first[gpu], last[gpu]),
            "no_smi_counterpart": {name: NO_SMI_COUNTERPART[name] for name in NO_SMI_COUNTERPART},
        }
    return {"seconds": elapsed, "pairs": n, "gpus": gpus, "loaded_samples": loaded}


def energy_check(first: GpuSample, last: GpuSample) -> dict[str, Any]:
    """The energy counter must rise by about the mean power times the time between the samples."""
    if first.energy_joules is None or last.energy_joules is None or last.t <= first.t:
        return {"ok": None, "note": "no energy counter"}
    used = last.energy_joules - first.energy_joules
    mean_power = ((first.power_watts or 0) + (last.power_watts or 0)) / 2
    return {"joules": used, "seconds": last.t - first.t, "mean_watts_from_counter": used / (last.t - first.t),
            "ok": used >= 0 and (mean_power == 0 or used / (last.t - first.t) > 0.2 * mean_power)}


def gpm_check(samples: list[GpuSample], model_names: dict[int, str]) -> dict[str, Any]:
    """GPM fields under load: in 0..1 where present, busy under load; absent (not 0) before Hopper."""
    out: dict[str, Any] = {}
    for gpu, name in model_names.items():
        mine = [s for s in samples if s.gpu == gpu]
        present = {f: [getattr(s, f) for s in mine if getattr(s, f) is not None] for f in GPM_FIELDS}
        info: dict[str, Any] = {"model": name, "samples_under_load": len(mine)}
        for f, vals in present.items():
            info[f] = {"present": len(vals), "min": min(vals) if vals else None, "max": max(vals) if vals else None,
                       "in_range": all(0.0 <= v <= 1.0 for v in vals)}
        busy = present[F.GRAPHICS_ACTIVE_RATIO] or present[F.SM_ACTIVE_RATIO]
        info["busy_under_load"] = bool(busy) and max(busy) > 0.2
        info["ok"] = all(i["in_range"] for i in (info[f] for f in GPM_FIELDS)) and (not any(present.values()) or info["busy_under_load"])
        out[str(gpu)] = info
    return out


def cuda_load(stop: threading.Event) -> None:
    """Matrix multiplies until told to stop: keeps SMs, tensor cores and memory busy."""
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    while not stop.is_set():
        for _ in range(20):
            a = (a @ b).clamp_(-1, 1)
        torch.cuda.synchronize()


def torch_cuda() -> tuple[bool, str]:
    try:
        import torch
    except ImportError:
        return False, "torch is not installed (pip install torch with CUDA)"
    if not torch.cuda.is_available():
        return False, f"torch {torch.__version__} sees no CUDA device (a CPU build?)"
    return True, f"torch {torch.__version__}, CUDA {torch.version.cuda}"


def run_check(*, seconds: float, out: Path, driver_present: Callable[[], bool] | None = None,
              open_backend: Callable[[], Any] | None = None, smi: NvidiaSmi | None = None) -> dict[str, Any]:
    """All phases; the report is written to `out` and returned."""
    from gpulens.gpu import nvidia_driver_present

    t0 = time.monotonic()
    report: dict[str, Any] = {"format": "gpulens-gpu-check", "version": 1, "host": platform.node(), "started": time.time()}
    if not (driver_present or nvidia_driver_present)():
        report.update(status="no-gpu", message=NO_DRIVER)
        _write(out, report)
        return report
    if open_backend is None:
        from gpulens.gpu.nvml import NvmlBackend, nvml_smi_versions

        report["versions"] = nvml_smi_versions()

        def open_backend() -> Any:
            return NvmlBackend(watch_xid=True)

    backend = open_backend()
    smi = smi or NvidiaSmi()
    cuda_ok, cuda_note = torch_cuda()
    report["torch"] = cuda_note
    report["nvidia_smi"] = smi.version()
    try:
        report["gpus"] = [{"index": g.index, "name": g.name, "uuid": g.uuid, "pci_bus_id": g.pci_bus_id,
                           "driver_version": g.driver_version, "slowdown_celsius": g.temperature_slowdown_celsius,
                           "shutdown_celsius": g.temperature_shutdown_celsius, "catalog": catalog_check(g)}
                          for g in backend.gpus()]
        report["xid"] = {"registered_gpus": list(getattr(backend, "xid_watch_gpus", [])),
                         "ok": len(getattr(backend, "xid_watch_gpus", [])) == len(backend.gpus())}
        compared = compare_with_smi(backend, smi, seconds=seconds, load=cuda_load if cuda_ok else None)
        loaded = compared.pop("loaded_samples")
        report["nvml_vs_smi"] = compared
        report["gpm"] = gpm_check(loaded, {g.index: g.name for g in backend.gpus()}) if cuda_ok else {"skipped": cuda_note}
    finally:
        backend.close()
    if cuda_ok:
        report["monitor"] = _guard(torch_phase("monitor_overhead"))
        report["oom"] = _guard(torch_phase("forced_oom"))
    else:
        report["monitor"] = report["oom"] = {"skipped": cuda_note}
    report["summary"] = summarize(report)
    report["status"] = "ok" if report["summary"]["problems"] == [] else "problems"
    report["wall_seconds"] = time.monotonic() - t0
    _write(out, report)
    return report


def catalog_check(g: GpuInfo) -> dict[str, Any]:
    """The planner's catalog entry for this GPU's NVML name (what `gpulens plan --gpu local` plans for,
    and the peak an imported training run's MFU is taken against), and whether NVML's memory matches
    it: the catalog's `nvml_names` met on hardware."""
    from gpulens.plan.catalog import UserConfig, card_for_nvml

    match = card_for_nvml(g.name, g.memory_total_bytes, user=UserConfig())  # the shipped catalog, not a user's plan.yaml
    return {"card": match.card.name if match.card else None, "nvml_memory_total_bytes": g.memory_total_bytes,
            "catalog_memory_bytes": match.card.memory_bytes if match.card else None, "memory_note": match.memory_note}


def torch_phase(name: str) -> Callable[[], dict[str, Any]]:
    from gpulens.gpucheck import torch_checks

    return getattr(torch_checks, name)


def _guard(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A phase that raises is a finding, not the end of the check."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 (reported in the JSON)
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    problems: list[str] = []
    counts: dict[str, int] = {}
    for gpu, g in report.get("nvml_vs_smi", {}).get("gpus", {}).items():
        for v in g["fields"]:
            counts[v["verdict"]] = counts.get(v["verdict"], 0) + 1
            if v["verdict"] in ("disagree", "smi-only"):
                problems.append(f"GPU {gpu}: {v['field']} ({v['query']}) {v['verdict']}: NVML {v['nvml_example']} vs nvidia-smi {v['smi_example']}")
        if g["energy"].get("ok") is False:
            problems.append(f"GPU {gpu}: the energy counter does not follow the power drawn")
    for gpu, g in report.get("gpm", {}).items():
        if isinstance(g, dict) and g.get("ok") is False:
            problems.append(f"GPU {gpu}: GPM fields out of range or idle under load")
    for g in report.get("gpus", []):
        if not (g.get("catalog") or {}).get("card"):
            problems.append(f"GPU {g['index']}: the planner's catalog has no card named {g['name']!r} "
                            "(plan --gpu local and an imported training run's MFU cannot use it)")
    if report.get("xid", {}).get("ok") is False:
        problems.append("XID events are not registered on every GPU")
    for phase in ("monitor", "oom"):
        p = report.get(phase, {})
        if p.get("error") or p.get("ok") is False or p.get("overhead_ok") is False or p.get("cuda_timing_ok") is False:
            problems.append(f"{phase}: {p.get('error') or 'a check failed (see the report)'}")
    return {"verdicts": counts, "problems": problems}


def _write(out: Path, report: dict[str, Any]) -> None:
    """Whole or absent (gpulens.files): a failed write leaves no 0-byte or half report."""
    from gpulens.files import write_atomically

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass  # write_atomically says what is wrong with the path, in one sentence
    write_atomically(out, json.dumps(report, indent=2, default=str) + "\n", what="the GPU check report",
                     hint="Give --out a path in a writable folder with free space.")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpulens.gpucheck", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("gpu-check.json"), help="where the JSON report goes")
    ap.add_argument("--seconds", type=float, default=30.0, help="how long NVML and nvidia-smi are compared")
    args = ap.parse_args(argv)
    if args.seconds < 2:
        print("--seconds must be at least 2 (one idle and one loaded pair).", file=sys.stderr)
        return 2
    from gpulens.files import FileWriteError

    try:
        report = run_check(seconds=args.seconds, out=args.out)
    except FileWriteError as e:
        print(f"error: {e.message}" + (f"\n→ {e.hint}" if e.hint else ""), file=sys.stderr)
        return 2
    if report["status"] == "no-gpu":
        print(report["message"])
        print(f"Wrote {args.out} (status no-gpu).")
        return 0
    for line in report["summary"]["problems"]:
        print(f"problem: {line}")
    print(f"{report['status']}: {report['summary']['verdicts']} in {report['wall_seconds']:.0f} s; wrote {args.out}")
    return 0 if report["status"] == "ok" else 1
