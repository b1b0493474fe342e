"""`gpulens bench train`: a PyTorch micro-benchmark of a transformer block stack.

Warm-up steps (kernel selection, allocator growth) are discarded, then each measured step is timed
on its own so that `compare` gets a distribution, not one mean. MFU counts 6·N + 12·L·H·Q·T FLOPs
per token (PaLM, appendix B), also under activation checkpointing, so MFU stays comparable
between runs with and without recomputation.

torch is imported inside the functions: `pip install 'gpulens[torch]'` for this command only.
"""

from __future__ import annotations

import os
import re
import resource
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from gpulens.errors import BackendUnavailableError, BadInputError
from gpulens.runs.fingerprint import cpu_model
from gpulens.stats import percentile

Precision = Literal["fp32", "bf16", "fp16"]
DeviceChoice = Literal["auto", "cpu", "cuda"]

# (layers, hidden, heads) per named size. "tiny" runs on a laptop CPU in about a second.
SIZES: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 64, 4),
    "small": (4, 512, 8),
    "medium": (12, 768, 12),
    "large": (24, 1024, 16),
    "xl": (24, 2048, 16),
}

# Dense peaks (TFLOP/s) used when gpulens.plan.catalog is not available; from REFERENCE.md
# (vendor datasheets). Keys are lower-case fragments of the NVML device name.
_FALLBACK_PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "h200": {"bf16": 989, "fp16": 989, "fp32": 67},
    "h100 pcie": {"bf16": 756, "fp16": 756, "fp32": 51},
    "h100": {"bf16": 989, "fp16": 989, "fp32": 67},
    "a100": {"bf16": 312, "fp16": 312, "fp32": 19.5},
    "l40s": {"bf16": 362, "fp16": 362, "fp32": 91.6},
    "l4": {"bf16": 121, "fp16": 121, "fp32": 30.3},
    "a10": {"bf16": 125, "fp16": 125, "fp32": 31.2},
    "t4": {"fp16": 65, "fp32": 8.1},
}
# CPU peak estimate: cores × clock × FLOPs per cycle (two 256-bit FMA units = 32 fp32 FLOP/cycle).
_CPU_FLOPS_PER_CYCLE = 32
# Bytes per parameter that training holds whatever the precision (autocast keeps the weights fp32):
# the weights, their gradients and AdamW's two moments, 4 bytes each.
TRAIN_BYTES_PER_PARAMETER = 16
SHRINK_HINT = "Make the model smaller (--layers/--hidden) or the batch (--batch-size/--seq-len)."


@dataclass
class TrainBenchConfig:
    size: str = "small"
    layers: int | None = None  # None: from `size`
    hidden: int | None = None
    heads: int | None = None
    ffn_mult: int = 4
    seq_len: int = 512
    batch_size: int = 8
    precision: Precision = "bf16"
    grad_checkpointing: bool = False
    warmup_steps: int = 3
    steps: int = 20
    device: DeviceChoice = "auto"
    seed: int = 0

    def resolved(self) -> tuple[int, int, int]:
        if self.size not in SIZES and None in (self.layers, self.hidden, self.heads):
            raise BadInputError(
                f"Unknown model size {self.size!r}.", hint=f"Use one of {', '.join(SIZES)} or give --layers, --hidden and --heads."
            )
        base = SIZES.get(self.size, (0, 0, 0))
        # `is None`, not `or`: a given 0 is refused by validate(), not replaced by the size's value
        layers = base[0] if self.layers is None else self.layers
        hidden = base[1] if self.hidden is None else self.hidden
        heads = base[2] if self.heads is None else self.heads
        return layers, hidden, heads

    def validate(self) -> None:
        layers, hidden, heads = self.resolved()
        for name, v, lo in (
            ("layers", layers, 1), ("hidden", hidden, 8), ("heads", heads, 1), ("seq-len", self.seq_len, 2),
            ("batch-size", self.batch_size, 1), ("steps", self.steps, 2), ("ffn-mult", self.ffn_mult, 1),
        ):
            if v < lo:
                raise BadInputError(f"--{name} must be at least {lo}; got {v}.", hint="Choose a larger value.")
        if self.warmup_steps < 0:
            raise BadInputError(f"--warmup must be 0 or more; got {self.warmup_steps}.", hint="Use e.g. --warmup 3.")
        if hidden % heads:
            raise BadInputError(f"--hidden ({hidden}) must be a multiple of --heads ({heads}).", hint="E.g. --hidden 768 --heads 12.")
        if self.precision not in ("fp32", "bf16", "fp16"):
            raise BadInputError(f"Unknown precision {self.precision!r}.", hint="Use fp32, bf16 or fp16.")
        if self.device not in ("auto", "cpu", "cuda"):
            raise BadInputError(f"Unknown device {self.device!r}.", hint="Use auto, cpu or cuda.")


@dataclass
class PeakFlops:
    flops_per_second: float
    source: str  # where the figure comes from; "estimate" for CPUs


@dataclass
class TrainBenchResult:
    config: dict[str, Any]
    device: str  # "cpu" or "cuda:0"
    device_name: str
    parameters: int
    tokens_per_step: int
    flops_per_token: float
    step_seconds: list[float]  # each measured step
    step_seconds_median: float
    step_seconds_p90: float
    tokens_per_second: float  # from the median step
    mfu_ratio: float | None
    peak: PeakFlops | None
    peak_memory_bytes: int | None
    peak_memory_source: str  # "cuda max_memory_allocated" or "process max RSS (CPU)"
    started: float
    ended: float

    def summary(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("step_seconds")
        d.pop("config")
        return d

    def samples(self) -> dict[str, list[float]]:
        return {
            "step_seconds": list(self.step_seconds),
            "tokens_per_second": [self.tokens_per_step / s for s in self.step_seconds if s > 0],
        }


@dataclass
class SweepPoint:
    batch_size: int
    fits: bool
    tokens_per_second: float | None = None
    step_seconds_median: float | None = None
    peak_memory_bytes: int | None = None


@dataclass
class SweepResult:
    points: list[SweepPoint]
    largest_fitting_batch: int | None
    knee_batch: int | None  # the smallest batch after which throughput grows less than `gain_ratio`
    gain_ratio: float
    stopped_because: str
    best: TrainBenchResult | None = field(default=None, repr=False)


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise BadInputError(
            "`gpulens bench train` needs PyTorch, which is not installed.", hint="pip install 'gpulens[torch]'"
        ) from None
    return torch


def _device(torch: Any, choice: str) -> Any:
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise BackendUnavailableError(
                "--device cuda was asked for but PyTorch sees no CUDA GPU.",
                hint="Use --device cpu, or install a CUDA build of torch on a machine with an NVIDIA driver.",
            )
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def build_model(torch: Any, layers: int, hidden: int, heads: int, ffn_mult: int, grad_ckpt: bool) -> Any:
    """A stack of pre-norm transformer blocks (causal SDPA attention, GELU MLP)."""
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(hidden)
            self.qkv = nn.Linear(hidden, 3 * hidden)
            self.proj = nn.Linear(hidden, hidden)
            self.ln2 = nn.LayerNorm(hidden)
            self.fc1 = nn.Linear(hidden, ffn_mult * hidden)
            self.fc2 = nn.Linear(ffn_mult * hidden, hidden)

        def forward(self, x: Any) -> Any:
            b, t, h = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, h // heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, h))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(hidden)

        def forward(self, x: Any) -> Any:
            for blk in self.blocks:
                if grad_ckpt and self.training:
                    from torch.utils.checkpoint import checkpoint

                    x = checkpoint(blk, x, use_reentrant=False)
                else:
                    x = blk(x)
            return self.ln(x)

    return Stack()


def parameter_count(layers: int, hidden: int, ffn_mult: int) -> int:
    """The parameters of build_model's stack, without building it: per block the qkv, proj, fc1 and
    fc2 Linears with their biases and two LayerNorms ((4 + 2·f)·H² + (9 + f)·H), then a final LayerNorm."""
    return layers * ((4 + 2 * ffn_mult) * hidden * hidden + (9 + ffn_mult) * hidden) + 2 * hidden


def memory_floor_bytes(parameters: int, layers: int, hidden: int, batch: int, seq_len: int) -> int:
    """Memory a training step cannot do with less of: the fp32 weights, gradients and AdamW state
    (TRAIN_BYTES_PER_PARAMETER each), the fp32 input, and each block's fp32 input kept for the
    backward pass (kept with activation checkpointing too). The real peak is higher."""
    tokens = batch * seq_len
    return TRAIN_BYTES_PER_PARAMETER * parameters + 4 * tokens * hidden * (layers + 1)


def _cgroup_memory_limit() -> int | None:
    """This process's cgroup memory limit (v2, then v1), None when there is none."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:  # v1 writes "no limit" as a huge number, v2 as "max"
            return int(text)
    return None


def device_memory(torch: Any, device: Any) -> tuple[int, str] | None:
    """(bytes, what they are) of the memory the benchmark runs in: the GPU's, or on the CPU the
    machine's RAM or its container's limit, whichever is smaller. None when it cannot be told."""
    if device.type == "cuda":
        try:
            return int(torch.cuda.get_device_properties(device).total_memory), f"the memory of {device}"
        except (RuntimeError, AssertionError):
            return None
    try:
        ram = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        ram = None
    limit = _cgroup_memory_limit()
    if limit is not None and (ram is None or limit < ram):
        return limit, "this container's memory limit"
    return (ram, "this machine's memory") if ram else None


class _DoesNotFit(Exception):
    """A run that does not fit in memory, estimated before or met at an allocation: one sentence,
    raised as BadInputError by run_train_bench and taken as "does not fit" by sweep_batch. Never
    leaves this module."""

    def __init__(self, sentence: str, *, estimated: bool):
        super().__init__(sentence)
        self.estimated = estimated


def _model_size(parameters: int) -> str:
    from gpulens.units import format_bytes

    return f"{parameters:,} parameters, {format_bytes(4 * parameters)} in fp32"


def _refuse_beyond_memory(config: TrainBenchConfig, torch: Any, device: Any, layers: int, hidden: int) -> None:
    """Before anything is allocated: a model and batch whose floor (memory_floor_bytes) is already
    more than the device has would only fail at its first allocation, or be killed by the kernel."""
    from gpulens.units import format_bytes

    have = device_memory(torch, device)
    n = parameter_count(layers, hidden, config.ffn_mult)
    need = memory_floor_bytes(n, layers, hidden, config.batch_size, config.seq_len)
    if have is not None and need > have[0]:
        raise _DoesNotFit(f"The model ({_model_size(n)}) with batch {config.batch_size:,} × {config.seq_len:,} tokens does not fit in "
                          f"{have[1]} ({format_bytes(have[0])}): training it needs at least {format_bytes(need)} (weights, gradients "
                          f"and AdamW state: {format_bytes(TRAIN_BYTES_PER_PARAMETER * n)}; activations: "
                          f"{format_bytes(need - TRAIN_BYTES_PER_PARAMETER * n)}).", estimated=True)


def flops_per_token(parameters: int, layers: int, hidden: int, seq_len: int) -> float:
    """6·N + 12·L·H·Q·T (H·Q = hidden), training FLOPs per token without recomputation."""
    return 6.0 * parameters + 12.0 * layers * hidden * seq_len


def _cpu_mhz() -> float | None:
    try:
        with open("/proc/cpuinfo") as f:
            mhz = [float(line.split(":")[1]) for line in f if line.startswith("cpu MHz")]
        return max(mhz) if mhz else None
    except (OSError, ValueError):
        return None


def peak_flops(torch: Any, device: Any, device_name: str, precision: str) -> PeakFlops | None:
    """The dense peak for MFU: the plan catalog when it knows the GPU, a datasheet table otherwise,
    an estimate for CPUs (labelled as such)."""
    if device.type == "cpu":
        threads = torch.get_num_threads()
        mhz = _cpu_mhz() or 2500.0
        flops = threads * mhz * 1e6 * _CPU_FLOPS_PER_CYCLE
        return PeakFlops(
            flops, f"estimate: {threads} threads × {mhz:.0f} MHz × {_CPU_FLOPS_PER_CYCLE} FLOP/cycle (CPU, indicative only)"
        )
    try:
        from gpulens.plan.catalog import find_gpu  # the planner's catalog: one source of GPU figures

        gpu = find_gpu(device_name)
        return PeakFlops(gpu.peak_flops(precision), f"gpulens.plan catalog: {gpu.name} dense {precision}")
    except Exception:  # an unknown GPU (or no catalog): fall through to the datasheet table
        pass
    name = device_name.lower()
    for key, peaks in _FALLBACK_PEAK_TFLOPS.items():
        if key in name and precision in peaks:
            return PeakFlops(peaks[precision] * 1e12, f"datasheet dense {precision} peak of {key.upper()}")
    return None


def run_train_bench(config: TrainBenchConfig) -> TrainBenchResult:
    """Build the stack, run warm-up and measured steps, return timings, MFU and peak memory. A model
    or batch that does not fit in memory is refused (BadInputError): before anything is allocated
    when its floor is already beyond the device's memory, else at the allocation that fails."""
    try:
        return _run(config)
    except _DoesNotFit as e:
        raise BadInputError(str(e), hint=SHRINK_HINT) from None


def _run(config: TrainBenchConfig) -> TrainBenchResult:
    """run_train_bench, raising _DoesNotFit for a run that does not fit in memory."""
    config.validate()
    torch = _torch()
    layers, hidden, heads = config.resolved()
    device = _device(torch, config.device)
    if device.type == "cpu" and config.precision == "fp16":
        raise BadInputError("fp16 autocast is not supported on the CPU here.", hint="Use --precision bf16 or fp32 on CPU.")
    _refuse_beyond_memory(config, torch, device, layers, hidden)
    try:
        return _measure(config, torch, device, layers, hidden, heads)
    except Exception as e:
        if not _is_oom(torch, e):
            raise
        if device.type == "cuda":
            torch.cuda.empty_cache()
        have = device_memory(torch, device)
        raise _DoesNotFit(f"The model ({_model_size(parameter_count(layers, hidden, config.ffn_mult))}) with batch "
                          f"{config.batch_size:,} × {config.seq_len:,} tokens does not fit in "
                          f"{have[1] if have else f'the memory of {device}'}: {_allocation_failed(e)}.", estimated=False) from None


def _allocation_failed(e: BaseException) -> str:
    """What the allocator said, short: "allocating 192.0 MiB more failed (DefaultCPUAllocator: can't allocate memory)"."""
    from gpulens.units import format_bytes

    said = re.sub(r"^\[enforce fail at [^\]]*\]\s*(err == 0\.\s*)?", "", " ".join(str(e).split()))
    if not said:
        return f"an allocation failed ({type(e).__name__})"
    cpu = re.search(r"DefaultCPUAllocator: [^:]*", said)
    what = cpu.group(0) if cpu is not None else re.split(r"[.:] ", said)[0]
    if (m := re.search(r"tried to allocate (\d+) bytes", said, re.IGNORECASE)) is not None:
        return f"allocating {format_bytes(int(m.group(1)))} more failed ({what})"
    if (m := re.search(r"tried to allocate ([\d.]+ [KMGT]?i?B)", said, re.IGNORECASE)) is not None:
        return f"allocating {m.group(1)} more failed ({what})"
    return f"{type(e).__name__}: {said[:160]}{'…' if len(said) > 160 else ''}"


def _measure(config: TrainBenchConfig, torch: Any, device: Any, layers: int, hidden: int, heads: int) -> TrainBenchResult:
    torch.manual_seed(config.seed)
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[config.precision]
    model = build_model(torch, layers, hidden, heads, config.ffn_mult, config.grad_checkpointing).to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    scaler = torch.amp.GradScaler(device.type) if config.precision == "fp16" else None
    x = torch.randn(config.batch_size, config.seq_len, hidden, device=device)
    n_params = sum(p.numel() for p in model.parameters())
    cuda = device.type == "cuda"
    device_name = torch.cuda.get_device_name(device) if cuda else (cpu_model() or "CPU")

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = model(x).float().pow(2).mean()
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()

    started = time.time()
    for _ in range(config.warmup_steps):
        step()
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    times: list[float] = []
    for _ in range(config.steps):
        t0 = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    ended = time.time()
    if cuda:
        peak_mem: int | None = int(torch.cuda.max_memory_allocated(device))
        mem_src = "cuda max_memory_allocated"
    else:
        # ru_maxrss is KiB on Linux; it is the process's peak, so it includes what ran before.
        peak_mem = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
        mem_src = "process max RSS (CPU; includes the rest of the process)"
    tokens = config.batch_size * config.seq_len
    fpt = flops_per_token(n_params, layers, hidden, config.seq_len)
    med = statistics.median(times)
    tps = tokens / med
    peak = peak_flops(torch, device, device_name, config.precision)
    cfg = asdict(config) | {"layers": layers, "hidden": hidden, "heads": heads}
    return TrainBenchResult(
        config=cfg,
        device=str(device),
        device_name=device_name,
        parameters=n_params,
        tokens_per_step=tokens,
        flops_per_token=fpt,
        step_seconds=times,
        step_seconds_median=med,
        step_seconds_p90=percentile(times, 90) or 0.0,
        tokens_per_second=tps,
        mfu_ratio=(tps * fpt / peak.flops_per_second) if peak else None,
        peak=peak,
        peak_memory_bytes=peak_mem,
        peak_memory_source=mem_src,
        started=started,
        ended=ended,
    )


def _is_oom(torch: Any, e: BaseException) -> bool:
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    # CUDA: "out of memory"; the CPU allocator: "DefaultCPUAllocator: can't allocate memory" (ENOMEM) or "not enough memory"
    msg = str(e).lower()
    return ((oom is not None and isinstance(e, oom)) or isinstance(e, MemoryError)
            or any(words in msg for words in ("out of memory", "not enough memory", "can't allocate memory", "cannot allocate memory")))


def find_knee(points: list[SweepPoint], gain_ratio: float) -> int | None:
    """The batch after which doubling raises tokens/s by less than `gain_ratio` (the last fitting
    batch when throughput never stops growing)."""
    fitting = [p for p in points if p.fits and p.tokens_per_second is not None]
    if not fitting:
        return None
    for prev, cur in zip(fitting, fitting[1:], strict=False):
        if cur.tokens_per_second < prev.tokens_per_second * (1 + gain_ratio):  # type: ignore[operator]
            return prev.batch_size
    return fitting[-1].batch_size


def sweep_batch(
    config: TrainBenchConfig, *, max_batch: int = 1024, gain_ratio: float = 0.05, start_batch: int = 1
) -> SweepResult:
    """Double the batch from `start_batch` until a step runs out of memory or `max_batch` is
    reached; the knee is the last batch whose doubling still raised tokens/s by `gain_ratio`."""
    if start_batch < 1 or max_batch < start_batch:
        raise BadInputError(
            f"The sweep range {start_batch}..{max_batch} is empty.", hint="Give --max-batch at least the starting batch."
        )
    _torch()  # one sentence now when PyTorch is not installed
    points: list[SweepPoint] = []
    results: dict[int, TrainBenchResult] = {}
    b = start_batch
    stopped = f"reached --max-batch {max_batch}"
    while b <= max_batch:
        cfg = TrainBenchConfig(**{**asdict(config), "batch_size": b})
        try:
            r = _run(cfg)
        except _DoesNotFit as e:
            if not points:  # not even the first batch: nothing to report but that
                raise BadInputError(str(e), hint=SHRINK_HINT) from None
            points.append(SweepPoint(b, fits=False))
            stopped = f"batch {b} would not fit in memory (estimated before allocating)" if e.estimated else f"batch {b} ran out of memory"
            break
        results[b] = r
        points.append(SweepPoint(b, True, r.tokens_per_second, r.step_seconds_median, r.peak_memory_bytes))
        b *= 2
    fitting = [p for p in points if p.fits]
    knee = find_knee(points, gain_ratio)
    largest = fitting[-1].batch_size if fitting else None
    return SweepResult(points, largest, knee, gain_ratio, stopped, results.get(knee) if knee else None)


def record_result(store: Any, result: TrainBenchResult, *, name: str | None = None, kind: str = "bench-train") -> int:
    """Store a benchmark result as a run (with this machine's fingerprint). Returns the run id."""
    from gpulens.runs import save_run

    c = result.config
    name = name or f"{c['size'] if c.get('size') in SIZES else 'custom'}-{c['precision']}-{result.device.split(':')[0]}"
    return save_run(
        store,
        kind,
        name,
        config=c | {"device": result.device, "device_name": result.device_name, "torch_threads": _threads()},
        summary=result.summary(),
        samples=result.samples(),
        started=result.started,
        ended=result.ended,
    )


def _threads() -> int | None:
    try:
        import torch

        return int(torch.get_num_threads())
    except ImportError:
        return os.cpu_count()
