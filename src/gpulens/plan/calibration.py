"""Fit a GPU's efficiency and overhead factors from measured runs, store them, load them.

Inputs: JSON lines in the format of gpulens/data/h200-trace/memory_calibration.jsonl (one
configuration per line: shapes, precision, optimizer, batch, seq, measured peak_alloc, step_s ...),
and the training benchmarks gpulens records in its store (`gpulens bench train` runs: measured
tokens/s and FLOPs per token give the achieved matmul efficiency).

Storage: one JSON file, `$GPULENS_CALIBRATION`, else `$XDG_CONFIG_HOME/gpulens/calibration.json`
(`~/.config/gpulens/calibration.json`), keyed by the catalog's GPU name.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpulens.errors import BadInputError
from gpulens.plan.catalog import GpuSpec, find_gpu
from gpulens.plan.memory import TrainSetup, training_memory
from gpulens.plan.models import ModelSpec, from_hf_config
from gpulens.plan.serve import ServeSetup, serving_speed, weight_bytes
from gpulens.plan.speed import Efficiency, training_speed

# weak pull toward the defaults, so that a factor no run constrains stays sensible
_PRIOR_WEIGHT = 0.15


def calibration_path() -> Path:
    env = os.environ.get("GPULENS_CALIBRATION")
    if env:
        return Path(env).expanduser()
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "gpulens" / "calibration.json"


@dataclass
class Measurement:
    """One measured configuration."""

    kind: str  # train | infer
    model: ModelSpec
    status: str = "ok"  # ok | oom | error
    gpu: str | None = None
    precision: str = "amp_bf16"
    optimizer: str = "adamw"
    batch: int = 1
    seq: int = 0
    grad_ckpt: bool = False
    dtype: str = "bf16"
    prompt: int = 0
    new_tokens: int = 0
    peak_alloc: int | None = None
    peak_reserved: int | None = None
    mem_after_load: int | None = None
    step_s: float | None = None
    tokens_per_s: float | None = None
    prefill_s: float | None = None
    decode_token_s: float | None = None
    achieved_flops: float | None = None  # from benchmark runs: tokens/s x FLOPs per token
    mfu_ratio: float | None = None  # from the training monitor: model FLOPs / bf16 dense peak
    label: str = ""

    def train_setup(self) -> TrainSetup:
        return TrainSetup(self.precision, self.optimizer, self.batch, self.seq, grad_ckpt=self.grad_ckpt)

    def serve_setup(self) -> ServeSetup:
        return ServeSetup(dtype=self.dtype, batch=self.batch, prompt_tokens=self.prompt, new_tokens=self.new_tokens)


def _num(d: dict[str, Any], key: str, cast: type = float) -> Any:
    v = d.get(key)
    return None if v is None else cast(v)


def parse_measurement(d: dict[str, Any], *, where: str) -> Measurement:
    kind = d.get("kind")
    if kind not in ("train", "infer"):
        raise BadInputError(f"{where}: 'kind' must be 'train' or 'infer', not {kind!r}.", hint="See docs/plan.md for the format.")
    shapes = d.get("shapes")
    if not isinstance(shapes, dict):
        raise BadInputError(f"{where}: the field 'shapes' (the model's config fields) is missing.",
                            hint="Give hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, vocab_size.")
    cfg = {"model_type": "llama", **shapes}
    model = from_hf_config(cfg, name=str(d.get("model") or "model"), where=where)
    try:
        m = Measurement(
            kind=kind, model=model, status=str(d.get("status") or "ok"),
            gpu=d.get("gpu") or d.get("device_name"),
            precision=str(d.get("precision") or "amp_bf16"), optimizer=str(d.get("optimizer") or "adamw"),
            batch=int(d.get("batch") or 1), seq=int(d.get("seq") or 0), grad_ckpt=bool(d.get("grad_ckpt")),
            dtype=str(d.get("dtype") or "bf16"), prompt=int(d.get("prompt") or 0), new_tokens=int(d.get("new_tokens") or 0),
            peak_alloc=_num(d, "peak_alloc", int), peak_reserved=_num(d, "peak_reserved", int),
            mem_after_load=_num(d, "mem_after_load", int), step_s=_num(d, "step_s"), tokens_per_s=_num(d, "tokens_per_s"),
            prefill_s=_num(d, "prefill_s"), decode_token_s=_num(d, "decode_token_s_median"),
            label=f"{d.get('model', 'model')} {kind} {d.get('precision') or d.get('dtype', '')} b{d.get('batch')}",
        )
    except (TypeError, ValueError) as e:
        raise BadInputError(f"{where}: a field has the wrong type ({e}).", hint="Numbers must be numbers.") from None
    if kind == "train" and m.seq <= 0:
        raise BadInputError(f"{where}: a training run needs 'seq' above zero.", hint="Add the sequence length.")
    if kind == "infer" and m.prompt <= 0:
        raise BadInputError(f"{where}: an inference run needs 'prompt' above zero.", hint="Add the prompt length.")
    return m


def load_measurements(path: Path) -> list[Measurement]:
    """Read a JSON-lines file (or a JSON list) of measured configurations."""
    if not path.exists():
        raise BadInputError(f"The measurements file {path} does not exist.", hint="Pass the path of a .jsonl file.")
    text = path.read_text()
    rows: list[tuple[str, dict[str, Any]]] = []
    try:
        if text.lstrip().startswith("["):
            rows = [(f"{path} item {i + 1}", d) for i, d in enumerate(json.loads(text))]
        else:
            rows = [(f"{path} line {i + 1}", json.loads(line)) for i, line in enumerate(text.splitlines()) if line.strip()]
    except json.JSONDecodeError as e:
        raise BadInputError(f"{path} is not JSON lines: {e}.", hint="One JSON object per line.") from None
    if not rows:
        raise BadInputError(f"{path} holds no measurements.", hint="Add one JSON object per measured configuration.")
    return [parse_measurement(d, where=w) for w, d in rows]


def measurements_from_store(store_path: Path) -> list[Measurement]:
    """What gpulens recorded in a store: `gpulens bench train` runs (measured tokens/s x FLOPs per
    token = the achieved rate) and the training monitor's MFU series (median per job)."""
    import statistics as st

    from gpulens.runs import list_runs
    from gpulens.store import Store
    from gpulens.workload.names import TRAIN_MFU_RATIO

    out: list[Measurement] = []
    dummy = ModelSpec("recorded", "llama", 64, 1, 1, 1, 64, 64, 64)  # these runs carry rates, not shapes
    if not store_path.exists():
        raise BadInputError(f"There is no gpulens store at {store_path}.", hint="Pass the --store of a recorded session.")
    with Store(store_path) as store:
        for run in list_runs(store, kind="bench-train"):
            s, c = run.summary, run.config
            tps, fpt = s.get("tokens_per_second"), s.get("flops_per_token")
            name = c.get("device_name") or s.get("device_name")
            if not (tps and fpt and name) or str(c.get("device", "")).startswith("cpu"):
                continue
            out.append(Measurement(kind="train", model=dummy, gpu=name, precision=str(c.get("precision", "bf16")),
                                   achieved_flops=float(tps) * float(fpt), label=run.label))
        for series in store.query(TRAIN_MFU_RATIO):
            vals = [v for v in series.value if v and v > 0]
            if len(vals) >= 3:
                labels = series.key.labels
                out.append(Measurement(kind="train", model=dummy, gpu=labels.get("gpu_model") or None,
                                       mfu_ratio=float(st.median(vals)),
                                       label=f"monitored job {labels.get('job', '?')} ({len(vals)} steps)"))
    return out


# ---------------------------------------------------------------- fitting


@dataclass
class FitReport:
    gpu: str
    efficiency: Efficiency
    runs: int
    before: dict[str, list[float]] = field(default_factory=dict)  # relative errors per figure, defaults
    after: dict[str, list[float]] = field(default_factory=dict)  # with the fitted factors
    skipped: list[str] = field(default_factory=list)


def _train_err(ms: list[Measurement], gpu: GpuSpec, eff: Efficiency) -> list[float]:
    return [training_speed(m.model, m.train_setup(), gpu, eff).step_seconds / m.step_s - 1 for m in ms if m.step_s]


def _mem_err(ms: list[Measurement], gpu: GpuSpec, eff: Efficiency) -> list[float]:
    out = []
    for m in ms:
        if not m.peak_alloc:
            continue
        if m.kind == "train":
            est = training_memory(m.model, m.train_setup(), capacity_bytes=gpu.memory_bytes,
                                  workspace_bytes=eff.workspace_bytes, activation_scale=eff.activation_scale)
        else:
            from gpulens.plan.serve import serving_memory

            est = serving_memory(m.model, m.serve_setup(), capacity_bytes=gpu.memory_bytes, eff=eff)
        out.append(est.peak_bytes / m.peak_alloc - 1)
    return out


def _decode_err(ms: list[Measurement], gpu: GpuSpec, eff: Efficiency) -> list[float]:
    return [serving_speed(m.model, m.serve_setup(), gpu, eff).tpot_seconds / m.decode_token_s - 1 for m in ms if m.decode_token_s]


def _prefill_err(ms: list[Measurement], gpu: GpuSpec, eff: Efficiency) -> list[float]:
    return [serving_speed(m.model, m.serve_setup(), gpu, eff).prefill_seconds / m.prefill_s - 1 for m in ms if m.prefill_s]


def fit(measurements: list[Measurement], gpu: GpuSpec, base: Efficiency | None = None) -> FitReport:
    """Fit the factors of `gpu` from measurements taken on it (runs that failed are skipped)."""
    import numpy as np
    from scipy.optimize import least_squares, nnls

    base = base or Efficiency()
    ok = [m for m in measurements if m.status == "ok"]
    skipped = [m.label for m in measurements if m.status != "ok"]
    train = [m for m in ok if m.kind == "train" and m.step_s and m.seq]
    bench = [m for m in ok if m.achieved_flops or m.mfu_ratio]
    infer = [m for m in ok if m.kind == "infer"]
    if not (train or bench or infer):
        raise BadInputError("No successful measurement to fit.", hint="Give runs with status 'ok' and measured times.")
    eff = base

    # memory: allocator-resident workspace, reserved/allocated, activation scale
    loads = [m.mem_after_load - weight_bytes(m.model, "fp32" if m.precision in ("fp32", "amp_bf16", "amp_fp16") and m.kind == "train" else "bf16")
             for m in ok if m.mem_after_load]
    if loads:
        eff = replace(eff, workspace_bytes=int(min(max(statistics.median(loads), 0), 1 << 30)))
    ratios = [m.peak_reserved / m.peak_alloc for m in ok if m.peak_reserved and m.peak_alloc]
    if ratios:
        eff = replace(eff, reserved_ratio=float(statistics.median(ratios)))
    mem_rows = [m for m in train if m.peak_alloc]
    if mem_rows:
        grid = [0.8 + 0.01 * i for i in range(46)]
        eff = replace(eff, activation_scale=min(
            grid, key=lambda s: sum(abs(math.log1p(e)) for e in _mem_err(mem_rows, gpu, replace(eff, activation_scale=s)))))

    # training speed: compute efficiencies, memory efficiency, per-layer overhead (log-space fit)
    if train:
        names = ("compute_ratio", "fp32_compute_ratio", "memory_bandwidth_ratio", "layer_overhead_seconds")
        x0 = np.log([getattr(base, n) for n in names])

        def res(x: Any) -> Any:
            e = replace(eff, **{n: float(math.exp(v)) for n, v in zip(names, x, strict=True)})
            r = [math.log1p(v) for v in _train_err(train, gpu, e)]
            return np.array(r + list(_PRIOR_WEIGHT * (x - x0)))

        lo = np.log([0.02, 0.02, 0.02, 1e-6])
        hi = np.log([0.85, 0.95, 1.0, 0.05])  # no real matmul sustains more than ~85 % of the dense peak
        sol = least_squares(res, np.clip(x0, lo, hi), bounds=(lo, hi))
        eff = replace(eff, **{n: float(math.exp(v)) for n, v in zip(names, sol.x, strict=True)})
    elif bench:
        # benchmark runs measure the whole step: the achieved rate is a floor on the matmul ratio
        r16 = [m.achieved_flops / gpu.peak_flops("bf16") for m in bench
               if m.achieved_flops and m.precision != "fp32" and gpu.supports("bf16")]
        r16 += [m.mfu_ratio for m in bench if m.mfu_ratio]
        r32 = [m.achieved_flops / gpu.peak_flops("fp32") for m in bench
               if m.achieved_flops and m.precision == "fp32" and gpu.supports("fp32")]
        if r16:
            eff = replace(eff, compute_ratio=min(1.0, statistics.median(r16)))
        if r32:
            eff = replace(eff, fp32_compute_ratio=min(1.0, statistics.median(r32)))

    # serving: per-step and per-layer decode overhead above the bandwidth time; prefill overhead
    dec = [m for m in infer if m.decode_token_s]
    if dec:
        zero = replace(eff, decode_token_overhead_seconds=0.0, decode_layer_overhead_seconds=0.0)
        base_t = [serving_speed(m.model, m.serve_setup(), gpu, zero).tpot_seconds for m in dec]
        y = np.array([m.decode_token_s - t for m, t in zip(dec, base_t, strict=True)])
        layers = {m.model.num_layers for m in dec}
        if len(layers) > 1:
            a = np.array([[1.0, float(m.model.num_layers)] for m in dec])
            coef, _ = nnls(a, np.maximum(y, 0))
            fixed, per_layer = float(coef[0]), float(coef[1])
        else:
            fixed, per_layer = float(max(statistics.median(y), 0)), 0.0
        eff = replace(eff, decode_token_overhead_seconds=fixed, decode_layer_overhead_seconds=per_layer)
    pre = [m for m in infer if m.prefill_s]
    if pre:
        # prefill = overhead + FLOP-time / ratio: a line through (ideal FLOP-time, measured)
        ideal = replace(eff, prefill_overhead_seconds=0.0, prefill_compute_ratio=1.0)
        xs = [serving_speed(m.model, m.serve_setup(), gpu, ideal).prefill_seconds for m in pre]
        if len(pre) > 1:
            coef, _ = nnls(np.array([[1.0, x] for x in xs]), np.array([m.prefill_s for m in pre]))
            overhead, inv = float(coef[0]), float(coef[1])
        else:
            overhead, inv = 0.0, pre[0].prefill_s / xs[0]
        ratio = min(1.0, 1.0 / inv) if inv > 0 else eff.compute_ratio
        eff = replace(eff, prefill_overhead_seconds=overhead, prefill_compute_ratio=ratio)

    stamp = time.strftime("%Y-%m-%d", time.gmtime())
    eff = replace(eff, calibrated=True, source=f"calibrated on {stamp} from {len(ok)} measured runs")
    rep = FitReport(gpu=gpu.name, efficiency=eff, runs=len(ok), skipped=skipped)
    checks = (("train_step", _train_err, train), ("peak_memory", _mem_err, ok), ("decode_tpot", _decode_err, dec),
              ("prefill", _prefill_err, pre))
    for label, fn, rows in checks:
        if rows:
            rep.before[label] = fn(rows, gpu, base)
            rep.after[label] = fn(rows, gpu, eff)
    return rep


# ---------------------------------------------------------------- storage


def _read_store(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {"version": 1, "gpus": {}}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise BadInputError(f"Cannot read the calibration file {path}: {e}.",
                            hint="Delete it and run `gpulens plan calibrate` again.") from None
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), dict):
        raise BadInputError(f"The calibration file {path} is not in gpulens's format.", hint="Delete it and calibrate again.")
    return data


def save_calibration(report: FitReport, *, measurements: str, path: Path | None = None) -> Path:
    path = path or calibration_path()
    data = _read_store(path)
    entry = report.efficiency.to_dict() | {
        "measurements": measurements,
        "runs": report.runs,
        "fitted_at": time.time(),
        "errors_after": {k: [round(v, 4) for v in vs] for k, vs in report.after.items()},
    }
    data["gpus"][report.gpu] = entry
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError as e:
        raise BadInputError(f"Cannot write the calibration file {path}: {e.strerror}.",
                            hint="Set GPULENS_CALIBRATION to a writable path.") from None
    return path


def load_efficiency(gpu: GpuSpec, *, path: Path | None = None) -> Efficiency:
    """The stored calibration of `gpu`, else the defaults (which say they are not calibrated)."""
    data = _read_store(path or calibration_path())
    entry = data["gpus"].get(gpu.name)
    if not entry:
        return Efficiency()
    eff = Efficiency.from_dict(entry)
    return replace(eff, calibrated=True, source=entry.get("source") or "calibrated")


def _gpu_from_env_json(measurements_path: Path) -> str | None:
    """gpulens recordings keep an env.json (device name, versions) beside their files."""
    env = measurements_path.parent / "env.json"
    try:
        name = json.loads(env.read_text()).get("device", {}).get("name")
    except (OSError, ValueError, AttributeError):
        return None
    return str(name) if name else None


def calibrate(measurements_path: Path | None, *, gpu_name: str | None, store_path: Path | None = None,
              save: bool = True, path: Path | None = None) -> list[FitReport]:
    """Read measurements, fit per GPU, store. Runs without a GPU name use `gpu_name`."""
    ms: list[Measurement] = []
    source = []
    if measurements_path is not None:
        ms += load_measurements(measurements_path)
        source.append(str(measurements_path))
        gpu_name = gpu_name or _gpu_from_env_json(measurements_path)
    if store_path is not None:
        ms += measurements_from_store(store_path)
        source.append(f"store {store_path}")
    if not ms:
        raise BadInputError("No measurements given.", hint="Pass --measurements FILE and/or --store PATH.")
    groups: dict[str, tuple[GpuSpec, list[Measurement]]] = {}
    for m in ms:
        name = m.gpu or gpu_name
        if not name:
            raise BadInputError(f"The run {m.label!r} does not say which GPU it was measured on.",
                                hint="Pass --gpu NAME (e.g. --gpu h200), or add a 'gpu' field to each run.")
        spec = find_gpu(name)
        groups.setdefault(spec.name, (spec, []))[1].append(m)
    reports = []
    for spec, rows in groups.values():
        rep = fit(rows, spec)
        if save:
            save_calibration(rep, measurements=", ".join(source), path=path)
        reports.append(rep)
    return reports
