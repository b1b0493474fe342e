"""`gpulens bench train`: a PyTorch micro-benchmark of a transformer block stack.

Warm-up steps (kernel selection, allocator growth) are discarded, then each measured step is timed
on its own so that `compare` gets a distribution, not one mean. MFU counts 6·N + 12·L·H·Q·T FLOPs
per token (PaLM, appendix B), also under activation checkpointing, so MFU stays comparable
between runs with and without recomputation.

torch is imported inside the functions: `pip install 'gpulens[torch]'` for this command only.
"""

from __future__ import annotations

import os
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
    """Build the stack, run warm-up and measured steps, return timings, MFU and peak memory."""
    config.validate()
    torch = _torch()
    layers, hidden, heads = config.resolved()
    device = _device(torch, config.device)
    torch.manual_seed(config.seed)
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[config.precision]
    if device.type == "cpu" and config.precision == "fp16":
        raise BadInputError("fp16 autocast is not supported on the CPU here.", hint="Use --precision bf16 or fp32 on CPU.")
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
    msg = str(e).lower()  # CUDA: "out of memory"; the CPU allocator: "not enough memory"
    return (oom is not None and isinstance(e, oom)) or "out of memory" in msg or "not enough memory" in msg


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
    torch = _torch()
    points: list[SweepPoint] = []
    results: dict[int, TrainBenchResult] = {}
    b = start_batch
    stopped = f"reached --max-batch {max_batch}"
    while b <= max_batch:
        cfg = TrainBenchConfig(**{**asdict(config), "batch_size": b})
        try:
            r = run_train_bench(cfg)
        except Exception as e:
            if not _is_oom(torch, e):
                raise
            points.append(SweepPoint(b, fits=False))
            stopped = f"batch {b} ran out of memory"
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
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
