"""What `nvidia-smi --query-gpu` says about each field NvmlBackend reads: the query field, how its text
becomes gpulens's base unit, and how far apart two honest readings may be."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from gpulens.vocab import gpu_fields as F

MiB = 1024 * 1024
NOT_AVAILABLE = ("[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]", "")


@dataclass(frozen=True, slots=True)
class SmiField:
    """One GpuSample field and its nvidia-smi counterpart. Two readings agree when they differ by at
    most `abs_tol` (in the base unit) or `rel_tol` of the larger; `instant` fields move between the two
    reads (utilization, power, clocks), so only the median difference over the run is judged."""

    field: str  # GpuSample attribute
    query: str  # nvidia-smi --query-gpu name
    parse: Callable[[str], float]
    abs_tol: float = 0.0
    rel_tol: float = 0.0
    instant: bool = False


def _num(scale: float = 1.0) -> Callable[[str], float]:
    return lambda text: float(text) * scale


def _pstate(text: str) -> float:
    return float(text.strip().removeprefix("P"))


def _yes_no(text: str) -> float:
    t = text.strip().lower()
    if t in ("yes", "enabled", "1", "true"):
        return 1.0
    if t in ("no", "disabled", "0", "false"):
        return 0.0
    raise ValueError(f"not a yes/no: {text!r}")


def _hex(text: str) -> float:
    return float(int(text.strip(), 16))


SMI_FIELDS: tuple[SmiField, ...] = (
    SmiField(F.UTILIZATION_GPU_RATIO, "utilization.gpu", _num(0.01), abs_tol=0.15, instant=True),
    SmiField(F.UTILIZATION_MEMORY_COPY_RATIO, "utilization.memory", _num(0.01), abs_tol=0.15, instant=True),
    SmiField(F.UTILIZATION_ENCODER_RATIO, "utilization.encoder", _num(0.01), abs_tol=0.05, instant=True),
    SmiField(F.UTILIZATION_DECODER_RATIO, "utilization.decoder", _num(0.01), abs_tol=0.05, instant=True),
    SmiField(F.MEMORY_USED_BYTES, "memory.used", _num(MiB), abs_tol=256 * MiB, instant=True),
    SmiField(F.MEMORY_FREE_BYTES, "memory.free", _num(MiB), abs_tol=256 * MiB, instant=True),
    SmiField(F.MEMORY_RESERVED_BYTES, "memory.reserved", _num(MiB), abs_tol=2 * MiB),
    SmiField(F.MEMORY_TOTAL_BYTES, "memory.total", _num(MiB), abs_tol=2 * MiB),
    SmiField(F.TEMPERATURE_CELSIUS, "temperature.gpu", _num(), abs_tol=3, instant=True),
    SmiField(F.MEMORY_TEMPERATURE_CELSIUS, "temperature.memory", _num(), abs_tol=3, instant=True),
    SmiField(F.POWER_WATTS, "power.draw", _num(), abs_tol=30, rel_tol=0.15, instant=True),
    SmiField(F.POWER_LIMIT_WATTS, "enforced.power.limit", _num(), abs_tol=1),
    SmiField(F.SM_CLOCK_HZ, "clocks.sm", _num(1e6), abs_tol=150e6, instant=True),
    SmiField(F.MEMORY_CLOCK_HZ, "clocks.mem", _num(1e6), abs_tol=150e6, instant=True),
    SmiField(F.SM_CLOCK_MAX_HZ, "clocks.max.sm", _num(1e6), abs_tol=1e6),
    SmiField(F.MEMORY_CLOCK_MAX_HZ, "clocks.max.mem", _num(1e6), abs_tol=1e6),
    SmiField(F.CLOCK_EVENT_MASK, "clocks_event_reasons.active", _hex, instant=True),
    SmiField(F.PERFORMANCE_STATE, "pstate", _pstate, instant=True),
    SmiField(F.PCIE_REPLAY_TOTAL, "pcie.link.replay_counter", _num()),
    SmiField(F.ECC_CORRECTED_VOLATILE_TOTAL, "ecc.errors.corrected.volatile.total", _num()),
    SmiField(F.ECC_UNCORRECTED_VOLATILE_TOTAL, "ecc.errors.uncorrected.volatile.total", _num()),
    SmiField(F.ECC_CORRECTED_AGGREGATE_TOTAL, "ecc.errors.corrected.aggregate.total", _num()),
    SmiField(F.ECC_UNCORRECTED_AGGREGATE_TOTAL, "ecc.errors.uncorrected.aggregate.total", _num()),
    SmiField(F.REMAPPED_ROWS_CORRECTABLE, "remapped_rows.correctable", _num()),
    SmiField(F.REMAPPED_ROWS_UNCORRECTABLE, "remapped_rows.uncorrectable", _num()),
    SmiField(F.REMAPPED_ROWS_PENDING, "remapped_rows.pending", _yes_no),
    SmiField(F.REMAPPED_ROWS_FAILURE, "remapped_rows.failure", _yes_no),
    SmiField(F.MIG_MODE, "mig.mode.current", _yes_no),
)

# GpuSample fields nvidia-smi --query-gpu has no counterpart for, and how the check covers them instead.
NO_SMI_COUNTERPART: dict[str, str] = {
    F.TEMPERATURE_SLOWDOWN_CELSIUS: "a threshold (nvidia-smi -q shows it, --query-gpu does not): read once, reported",
    F.TEMPERATURE_SHUTDOWN_CELSIUS: "a threshold (nvidia-smi -q shows it, --query-gpu does not): read once, reported",
    F.ENERGY_JOULES: "a counter: checked to rise by about the power drawn over the run",
    F.PCIE_TX_BYTES_PER_SECOND: "no --query-gpu field: checked to be present and non-negative",
    F.PCIE_RX_BYTES_PER_SECOND: "no --query-gpu field: checked to be present and non-negative",
    F.NVLINK_BYTES_TOTAL: "no --query-gpu field: checked to be a non-decreasing counter where present",
    F.GRAPHICS_ACTIVE_RATIO: "GPM: checked in 0..1, and busy under load",
    F.SM_ACTIVE_RATIO: "GPM: checked in 0..1, and busy under load",
    F.SM_OCCUPANCY_RATIO: "GPM: checked in 0..1",
    F.TENSOR_ACTIVE_RATIO: "GPM: checked in 0..1",
    F.DRAM_ACTIVE_RATIO: "GPM: checked in 0..1",
    F.COMPUTE_PROCESS_COUNT: "checked against the check's own CUDA process being listed",
}


def parse_value(f: SmiField, text: str) -> float | None:
    """One CSV cell (`--format=csv,noheader,nounits`) in the base unit; None for N/A or unreadable."""
    text = text.strip()
    if text in NOT_AVAILABLE or text.startswith("[") or text.lower().startswith("not "):
        return None
    try:
        return f.parse(text)
    except ValueError:
        return None


def parse_rows(text: str, fields: list[SmiField]) -> dict[int, dict[str, float | None]]:
    """`nvidia-smi --query-gpu=index,<fields> --format=csv,noheader,nounits` -> gpu -> field -> value."""
    out: dict[int, dict[str, float | None]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(fields) + 1:
            continue  # a warning line, or a value with a comma: skip rather than misalign
        try:
            gpu = int(cells[0])
        except ValueError:
            continue
        out[gpu] = {f.field: parse_value(f, c) for f, c in zip(fields, cells[1:], strict=True)}
    return out


class NvidiaSmi:
    """Runs nvidia-smi. `supported()` asks each query field once (one unknown field fails a whole
    query, and older drivers lack some: clocks_event_reasons.active, memory.reserved, temperature.memory)."""

    def __init__(self, binary: str | None = None, run: Callable[[list[str]], str] | None = None):
        self.binary = binary or shutil.which("nvidia-smi") or "nvidia-smi"
        self._run = run or self._subprocess

    def _subprocess(self, args: list[str]) -> str:
        done = subprocess.run([self.binary, *args], capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise RuntimeError((done.stdout + done.stderr).strip().splitlines()[-1] if (done.stdout + done.stderr).strip() else f"exit {done.returncode}")
        return done.stdout

    def supported(self, fields: tuple[SmiField, ...] = SMI_FIELDS) -> tuple[list[SmiField], dict[str, str]]:
        ok, rejected = [], {}
        for f in fields:
            try:
                self._run([f"--query-gpu={f.query}", "--format=csv,noheader,nounits"])
                ok.append(f)
            except RuntimeError as e:
                rejected[f.field] = f"nvidia-smi does not know {f.query}: {e}"
        return ok, rejected

    def query(self, fields: list[SmiField]) -> dict[int, dict[str, float | None]]:
        text = self._run([f"--query-gpu=index,{','.join(f.query for f in fields)}", "--format=csv,noheader,nounits"])
        return parse_rows(text, fields)

    def version(self) -> str:
        try:
            return self._run(["--version"]).strip().splitlines()[0]
        except (RuntimeError, IndexError, OSError):
            return ""
