"""The CPU side of `make gpu-check` (gpulens.gpucheck): nvidia-smi's CSV read right, every field the
backend reads accounted for, verdicts that can fail, the comparison loop end to end against a fake GPU
and a stand-in nvidia-smi that answers from the same readings, the OOM and overhead arithmetic, and the
CPU machine's answer (it says so and exits 0). The real run is marked `gpu`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpulens.gpu import FakeBackend, GpuInfo, nvidia_driver_present
from gpulens.gpucheck import run as gc
from gpulens.gpucheck.compare import judge
from gpulens.gpucheck.smi import NO_SMI_COUNTERPART, SMI_FIELDS, NvidiaSmi, parse_rows
from gpulens.gpucheck.torch_checks import oom_checks, overhead_ratio

BY_FIELD = {f.field: f for f in SMI_FIELDS}


def test_every_field_the_backend_reads_is_compared_or_says_why_not():
    compared, other = set(BY_FIELD), set(NO_SMI_COUNTERPART)
    assert compared.isdisjoint(other)
    assert set(gc.numeric_sample_fields()) == compared | other
    assert len({f.query for f in SMI_FIELDS}) == len(SMI_FIELDS)


def test_nvidia_smi_csv_is_read_in_base_units():
    fields = [BY_FIELD[n] for n in ("memory_used_bytes", "performance_state", "clock_event_mask", "mig_mode",
                                    "power_watts", "memory_temperature_celsius", "remapped_rows_pending")]
    text = ("0, 1302, P0, 0x0000000000000001, Disabled, 107.29, 45, No\n"
            "1, 81559, P2, 0x0000000000000004, Enabled, [N/A], [N/A], Yes\n"
            "WARNING: a line nvidia-smi sometimes prints\n")
    rows = parse_rows(text, fields)
    assert rows[0] == {"memory_used_bytes": 1302 * 2**20, "performance_state": 0.0, "clock_event_mask": 1.0, "mig_mode": 0.0,
                       "power_watts": 107.29, "memory_temperature_celsius": 45.0, "remapped_rows_pending": 0.0}
    assert rows[1]["power_watts"] is None and rows[1]["mig_mode"] == 1.0 and rows[1]["clock_event_mask"] == 4.0
    assert set(rows) == {0, 1}


def test_verdicts():
    total, power, ecc = BY_FIELD["memory_total_bytes"], BY_FIELD["power_watts"], BY_FIELD["ecc_uncorrected_volatile_total"]
    assert judge(total, [(80e9, 80e9 + 2**20)] * 5).verdict == "agree"
    assert judge(total, [(80e9, 40e9)] * 5).verdict == "disagree"
    # an instant field: the two reads are apart, one pair may be far off; the run's medians must agree
    assert judge(power, [(300, 305), (310, 300), (500, 120), (305, 310)]).verdict == "agree"
    assert judge(power, [(300, 600)] * 4).verdict == "disagree"
    assert judge(ecc, [(None, None)] * 3).verdict == "absent-both"
    assert judge(ecc, [(None, 0.0)] * 3).verdict == "smi-only"
    assert judge(ecc, [(0.0, None)] * 3).verdict == "nvml-only"
    assert judge(ecc, [(0.0, 0.0), (0.0, 0.0), (0.0, 1.0)]).verdict == "disagree"  # a counter: every pair


def _smi_text(field: str, v: float | None) -> str:
    """A reading as nvidia-smi prints it (csv, nounits)."""
    f = BY_FIELD[field]
    if v is None:
        return "[N/A]"
    if f.query == "pstate":
        return f"P{int(v)}"
    if f.query == "clocks_event_reasons.active":
        return f"0x{int(v):016x}"
    if f.query == "mig.mode.current":
        return "Enabled" if v else "Disabled"
    if f.query.startswith("remapped_rows.p") or f.query.startswith("remapped_rows.f"):
        return "Yes" if v else "No"
    return f"{float(v) / f.parse('1'):.2f}"


class StandInSmi:
    """Answers nvidia-smi's queries from the fake GPU's last readings; knows no `temperature.memory`
    (as older drivers); `skew` scales one field to make a disagreement; `truth` gives nvidia-smi a
    value where the backend has none ((gpu, field) -> value)."""

    def __init__(self, backend, skew: dict[str, float] | None = None, truth: dict | None = None):
        self.backend, self.skew, self.truth, self.last = backend, skew or {}, truth or {}, {}
        real = backend.sample

        def sample():
            out = real()
            self.last = {s.gpu: s for s in out}
            return out

        backend.sample = sample

    def __call__(self, args: list[str]) -> str:
        if args == ["--version"]:
            return "NVIDIA-SMI version  : 580.159.04\n"
        queries = args[0].removeprefix("--query-gpu=").split(",")
        if "temperature.memory" in queries:
            raise RuntimeError('Field "temperature.memory" is not a valid field to query.')
        by_query = {f.query: f for f in SMI_FIELDS}
        lines = []
        for gpu, s in sorted(self.last.items()):
            cells = [str(gpu)] if queries[0] == "index" else []
            for q in queries[1:] if queries[0] == "index" else queries:
                f = by_query[q]
                v = self.truth.get((gpu, f.field), getattr(s, f.field))
                cells.append(_smi_text(f.field, None if v is None else float(v) * self.skew.get(f.field, 1.0)))
            lines.append(", ".join(cells))
        return "\n".join(lines) + "\n"


def test_comparison_loop_against_a_fake_gpu():
    fake = FakeBackend(gpus=2)
    fake.unsupported(1, "utilization_encoder_ratio")  # nvidia-smi still reads it: a backend gap
    fake.unsupported(1, "memory_reserved_bytes")  # neither has it
    smi = StandInSmi(fake, skew={"power_watts": 2.0}, truth={(1, "utilization_encoder_ratio"): 0.0})
    got = gc.compare_with_smi(fake, NvidiaSmi(run=smi), seconds=4, load=None, sleep=lambda s: None)
    v0 = {v["field"]: v["verdict"] for v in got["gpus"]["0"]["fields"]}
    assert v0["power_watts"] == "disagree"  # the skew is caught
    assert v0["memory_total_bytes"] == v0["performance_state"] == v0["clock_event_mask"] == v0["mig_mode"] == "agree"
    assert {k for k, v in v0.items() if v != "agree"} == {"power_watts"}
    assert "memory_temperature_celsius" in got["gpus"]["0"]["not_queried"]
    v1 = {v["field"]: v["verdict"] for v in got["gpus"]["1"]["fields"]}
    assert v1["utilization_encoder_ratio"] == "smi-only" and v1["memory_reserved_bytes"] == "absent-both"
    assert got["pairs"] == 4
    problems = gc.summarize({"nvml_vs_smi": got})["problems"]
    assert len(problems) == 3 and any("utilization_encoder_ratio" in p and "smi-only" in p for p in problems)


def test_report_of_a_run_without_torch_says_what_was_skipped(tmp_path, monkeypatch):
    monkeypatch.setattr(gc, "torch_cuda", lambda: (False, "torch sees no CUDA device (a CPU build?)"))
    fake = FakeBackend(gpus=1)
    smi = NvidiaSmi(run=StandInSmi(fake))
    monkeypatch.setattr(gc.time, "sleep", lambda s: None)
    report = gc.run_check(seconds=2, out=tmp_path / "r.json", driver_present=lambda: True, open_backend=lambda: fake, smi=smi)
    assert json.loads((tmp_path / "r.json").read_text())["status"] == report["status"] == "problems"
    assert report["monitor"] == {"skipped": "torch sees no CUDA device (a CPU build?)"}
    assert "XID events are not registered on every GPU" in report["summary"]["problems"]  # the fake has no XID watch


def test_gpm_check():
    fake = FakeBackend(gpus=1)
    fake.sample()
    busy = [fake.sample()[0] for _ in range(3)]
    for s in busy:
        s.graphics_active_ratio = s.sm_active_ratio = 0.9
    assert gc.gpm_check(busy, {0: "NVIDIA H200"})["0"]["ok"] is True
    busy[1].tensor_active_ratio = 1.7
    assert gc.gpm_check(busy, {0: "NVIDIA H200"})["0"]["ok"] is False
    for s in busy:
        for f in gc.GPM_FIELDS:
            setattr(s, f, None)  # an A100: no GPM at all is fine
    assert gc.gpm_check(busy, {0: "NVIDIA A100"})["0"]["ok"] is True


def test_oom_and_overhead_arithmetic():
    ask, held = 300 * 2**30, 2 * 2**30
    good = {"requested_bytes": int(281.25 * 2**30 * 300 / 281.25), "allocated_bytes": held, "reserved_bytes": held,
            "device_free_bytes": 140 * 2**30}
    assert all(oom_checks(good, ask=ask, allocated_before=held, reserved_before=held, total=141 * 2**30).values())
    bad = {**good, "allocated_bytes": 0, "requested_bytes": None}
    checks = oom_checks(bad, ask=ask, allocated_before=held, reserved_before=held, total=141 * 2**30)
    assert not checks["allocated_bytes_is_what_was_held"] and not checks["requested_bytes_is_the_ask"]
    assert overhead_ratio([1.0, 1.0, 1.2], [1.01, 1.01, 1.3]) == pytest.approx(0.01)
    with pytest.raises(ValueError):
        overhead_ratio([], [1.0])


def test_the_monitor_phase_runs_its_code_on_a_cpu():
    """The overhead phase's own code (model, alternating blocks, the monitor's records) on the CPU,
    tiny; the figures themselves only mean something on a GPU."""
    pytest.importorskip("torch")
    from gpulens.gpucheck.torch_checks import monitor_overhead

    got = monitor_overhead(blocks=2, steps_per_block=4, width=16, batch=8, device="cpu")
    assert got["steps_recorded"] == 8 and len(got["bare_block_seconds"]) == len(got["monitored_block_seconds"]) == 2
    assert got["cuda_timing_ok"] is None and got["gpu_step_seconds_measured"] is None
    assert isinstance(got["overhead_ratio"], float) and got["gpu_step_seconds_recorded_median"] > 0
    json.dumps(got)  # goes into the JSON report as it is


@pytest.mark.skipif(nvidia_driver_present(), reason="a driver is present: the real check runs instead (gpu test)")
def test_on_a_cpu_machine_it_says_so_and_exits_0(tmp_path):
    done = subprocess.run([sys.executable, "-m", "gpulens.gpucheck", "--out", str(tmp_path / "r.json")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "No NVIDIA driver" in done.stdout
    assert json.loads((tmp_path / "r.json").read_text())["status"] == "no-gpu"


@pytest.mark.skipif(nvidia_driver_present(), reason="a driver is present: the real check runs instead (gpu test)")
def test_a_report_that_cannot_be_written_is_one_sentence_and_leaves_nothing(tmp_path):
    out = tmp_path / "r.json"
    (out / "inside").mkdir(parents=True)  # a destination that is a folder: the write fails
    done = subprocess.run([sys.executable, "-m", "gpulens.gpucheck", "--out", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Cannot write" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert [p.name for p in out.iterdir()] == ["inside"]
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.gpu
def test_the_real_gpu_check(tmp_path):
    if not nvidia_driver_present():
        pytest.skip("needs an NVIDIA GPU with a driver")
    report = gc.run_check(seconds=10, out=tmp_path / "r.json")
    assert report["status"] == "ok", report["summary"]


def test_make_gpu_check_installs_torch_only_when_named():
    """On a CPU machine `make gpu-check` says so and exits 0: with no TORCH_SPEC it must not run
    `pip install ''` (which failed with "Invalid requirement" and exit 2)."""
    import shutil
    import subprocess
    from pathlib import Path

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    root = Path(__file__).resolve().parents[2]

    def recipe(*args: str) -> str:
        return subprocess.run(["make", "-n", "-W", "pyproject.toml", "gpu-check", *args], cwd=root, capture_output=True,
                              text=True, timeout=60, check=True).stdout

    plain = recipe("TORCH_SPEC=")
    assert "gpulens.gpucheck --out gpu-check.json" in plain and "''" not in plain
    assert "'torch==2.13.0'" in recipe("TORCH_SPEC=torch==2.13.0")


def test_each_gpu_is_matched_to_the_planners_catalog(tmp_path, monkeypatch):
    monkeypatch.setattr(gc, "torch_cuda", lambda: (False, "no torch"))
    monkeypatch.setattr(gc.time, "sleep", lambda s: None)
    fake = FakeBackend(gpus=1)
    report = gc.run_check(seconds=2, out=tmp_path / "r.json", driver_present=lambda: True, open_backend=lambda: fake,
                          smi=NvidiaSmi(run=StandInSmi(fake)))
    cat = report["gpus"][0]["catalog"]
    assert cat["card"] == "H200" and cat["memory_note"] is None  # the fake is an H200 as NVML names it
    assert not any("catalog" in p for p in report["summary"]["problems"])
    # a name the catalog lacks is a problem; a 96 GB "NVIDIA H100" a note against the 80 GB H100-SXM
    unknown = gc.catalog_check(GpuInfo(index=0, uuid="GPU-x", name="NVIDIA Imaginary X1", memory_total_bytes=10**10))
    assert unknown["card"] is None
    problems = gc.summarize({"gpus": [{"index": 0, "name": "NVIDIA Imaginary X1", "catalog": unknown}]})["problems"]
    assert problems == ["GPU 0: the planner's catalog has no card named 'NVIDIA Imaginary X1' (plan --gpu local and an "
                        "imported training run's MFU cannot use it)"]
    meta = gc.catalog_check(GpuInfo(index=0, uuid="GPU-y", name="NVIDIA H100", memory_total_bytes=96 * 10**9))
    assert meta["card"] == "H100-SXM" and "NVML reports 89.4 GiB" in meta["memory_note"]
