"""Fit a GPU's efficiency and overhead factors from measured runs, store them, load them.

Inputs: a list of `Measurement`s (`measured_runs`), from JSON lines in the format of
gpulens/data/h200-trace/memory_calibration.jsonl (one configuration per line: shapes, precision,
optimizer, batch, seq, measured peak_alloc, step_s ...), or from what the caller read out of a
gpulens store (`gpulens.runs.measurements`: benchmark runs and the healthy steps of monitored
jobs). The planner reads no store itself.

A fit is written only when it succeeded and its leave-one-out error is no worse than the
defaults' on the same measurements; otherwise nothing is written and `CalibrationRefusedError`
says why.

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
from gpulens.mfu import MFU_IMPOSSIBLE
from gpulens.plan.calibration_store import (  # noqa: F401 - re-exported: the planner and the CLI read them here
    calibration_path,
    gpu_from_env_json,
    load_efficiency,
    read_store,
)
from gpulens.plan.catalog import GpuSpec, find_gpu
from gpulens.plan.measured_runs import (  # noqa: F401 - re-exported: callers read the runs' format here
    Measurement,
    load_measurements,
    parse_measurement,
)
from gpulens.plan.memory import training_memory
from gpulens.plan.serve import serving_speed, weight_bytes
from gpulens.plan.speed import Efficiency, RuntimeSpeed, default_efficiency, training_speed

# weak pull toward the defaults, so that a factor no run constrains stays sensible
_PRIOR_WEIGHT = 0.15
# The figure a calibration fits for training step time: its own word, not the store's `train_step` event.
FIGURE_TRAIN_STEP = "train_step"


# ---------------------------------------------------------------- fitting


@dataclass(frozen=True)
class Rejected:
    """A run or a set of steps left out of a fit, and why."""

    label: str
    reason: str


@dataclass
class LeaveOneOut:
    """Each measurement predicted by a fit of the others (`held_out_fits`), against the defaults' prediction of it."""

    measurements: int
    mean_abs_error_ratio: float  # mean |relative error| of the held-out predictions
    defaults_mean_abs_error_ratio: float  # the same measurements predicted by the defaults

    @property
    def informative(self) -> bool:
        return self.measurements >= 2  # with one, the fit of "the others" is the defaults

    @property
    def worse_than_defaults(self) -> bool:
        return self.informative and self.mean_abs_error_ratio > self.defaults_mean_abs_error_ratio + 1e-9


@dataclass
class FigureCheck:
    """One figure of one scope (training, or a serving runtime), each run predicted by a fit of
    all the others (held out) and by the defaults. A fit whose mean held-out error is worse than
    the defaults' is not used for that figure's factors."""

    figure: str  # train_step | peak_memory | decode_tpot | prefill
    scope: str  # train | infer (peak memory) | a serving runtime (hf, vllm, ...)
    held_out: list[float]  # |relative error| per run
    defaults: list[float]

    @property
    def median_ratio(self) -> float:
        return statistics.median(self.held_out)

    @property
    def worst_ratio(self) -> float:
        return max(self.held_out)

    @property
    def defaults_median_ratio(self) -> float:
        return statistics.median(self.defaults)

    @property
    def defaults_worst_ratio(self) -> float:
        return max(self.defaults)

    @property
    def used(self) -> bool:
        """Whether the fitted factors beat the defaults on runs they did not see (mean error)."""
        return len(self.held_out) < 2 or statistics.fmean(self.held_out) <= statistics.fmean(self.defaults) + 1e-12

    @property
    def calibrated_errors(self) -> list[float]:
        """What calibration delivers on unseen runs: the fit's held-out errors when it is used, else
        the defaults' (which are then kept)."""
        return self.held_out if self.used else self.defaults


@dataclass
class FitReport:
    gpu: str
    efficiency: Efficiency
    runs: int
    before: dict[str, list[float]] = field(default_factory=dict)  # relative errors per figure, defaults
    after: dict[str, list[float]] = field(default_factory=dict)  # with the fitted factors
    skipped: list[str] = field(default_factory=list)  # labels of failed runs (oom, error)
    used: list[str] = field(default_factory=list)  # labels of the measurements the fit used
    rejected: list[Rejected] = field(default_factory=list)  # left out by the caller or the fit, with reasons
    leave_one_out: LeaveOneOut | None = None
    checks: list[FigureCheck] = field(default_factory=list)  # leave-one-out per figure and scope
    refused: str | None = None  # why this fit must not be stored (calibrate raises unless it only shows)


class CalibrationRefusedError(BadInputError):
    """A fit that would predict worse than the defaults: nothing is stored."""


def _rate_ratio(m: Measurement, gpu: GpuSpec) -> tuple[str, float] | None:
    """("bf16"|"fp32", achieved/peak) of a rate-only measurement (benchmark run, monitored job)."""
    if m.mfu_ratio:
        return "bf16", m.mfu_ratio
    if not m.achieved_flops:
        return None
    fmt = "fp32" if m.precision == "fp32" else "bf16"
    if not gpu.supports(fmt):
        return None
    return fmt, m.achieved_flops / gpu.peak_flops(fmt)


def _rate_err(ms: list[Measurement], gpu: GpuSpec, eff: Efficiency) -> list[float]:
    """A measured rate is a floor on the matmul ratio (the step also waits on memory and
    overheads), so only a predicted ratio below what was achieved is an error."""
    out = []
    for m in ms:
        r = _rate_ratio(m, gpu)
        if r is not None:
            pred = eff.fp32_compute_ratio if r[0] == "fp32" else eff.compute_ratio
            out.append(max(0.0, r[1] / pred - 1))
    return out


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
    from scipy.optimize import least_squares

    base = base or default_efficiency(gpu)
    skipped = [m.label for m in measurements if m.status != "ok"]
    rejected = [Rejected(m.label, f"the run failed ({m.status})") for m in measurements if m.status != "ok"]
    ok = []
    for m in measurements:
        r = _rate_ratio(m, gpu) if m.status == "ok" else None
        if r is not None and r[1] > 1.0:
            rejected.append(Rejected(m.label, f"MFU {r[1]:.0%} {MFU_IMPOSSIBLE}"))
        elif m.status == "ok":
            ok.append(m)
    train = [m for m in ok if m.kind == "train" and m.step_s and m.seq]
    bench = [m for m in ok if m.achieved_flops or m.mfu_ratio]
    infer = [m for m in ok if m.kind == "infer"]
    if not (train or bench or infer):
        why = "; ".join(f"{r.label}: {r.reason}" for r in rejected)
        raise BadInputError("No successful measurement to fit" + (f" (left out: {why})." if why else "."),
                            hint="Give runs with status 'ok' and measured times.")
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
        rates = [r for r in (_rate_ratio(m, gpu) for m in bench) if r is not None]
        r16 = [v for fmt, v in rates if fmt == "bf16"]
        r32 = [v for fmt, v in rates if fmt == "fp32"]
        if r16:
            eff = replace(eff, compute_ratio=statistics.median(r16))
        if r32:
            eff = replace(eff, fp32_compute_ratio=statistics.median(r32))

    # serving: each runtime's factors from that runtime's runs only (an eager-generate fit says
    # nothing about a CUDA-graph engine, and the other way round)
    for runtime in sorted({m.runtime for m in infer}):
        rows = [m for m in infer if m.runtime == runtime]
        eff = replace(eff, runtimes=eff.runtimes | {runtime: _fit_runtime(rows, gpu, eff, runtime)})

    stamp = time.strftime("%Y-%m-%d", time.gmtime())
    eff = replace(eff, calibrated=True, source=f"calibrated on {stamp} from {len(ok)} measured runs")
    rep = FitReport(gpu=gpu.name, efficiency=eff, runs=len(ok), skipped=skipped, used=[m.label for m in ok],
                    rejected=rejected)
    for label, fn in _FIGURES:
        before = fn(ok, gpu, base)
        if before:  # a figure no measurement carries is not reported (an empty column is no error of 0)
            rep.before[label] = before
            rep.after[label] = fn(ok, gpu, eff)
    return rep


def _fit_runtime(rows: list[Measurement], gpu: GpuSpec, eff: Efficiency, runtime: str) -> RuntimeSpeed:
    """Decode: TPOT = step overhead + layers x layer overhead + bytes read / (bandwidth x ratio),
    non-negative least squares; with fewer than eight runs the per-layer cost is folded into the
    fixed one (three factors from a handful of runs overfit: held-out error rises), with fewer
    than three only the fixed cost is fitted. Prefill: overhead + ideal FLOP time / matmul
    ratio + ideal elementwise time / bandwidth ratio."""
    import numpy as np
    from scipy.optimize import nnls

    rt = eff.runtime(runtime)
    ideal = replace(rt, decode_bandwidth_ratio=1.0, decode_step_overhead_seconds=0.0, decode_layer_overhead_seconds=0.0,
                    prefill_overhead_seconds=0.0, prefill_compute_ratio=1.0, prefill_bandwidth_ratio=1.0)
    e_ideal = replace(eff, runtimes=eff.runtimes | {runtime: ideal})
    dec = [m for m in rows if m.decode_token_s]
    if dec:
        x = [serving_speed(m.model, m.serve_setup(), gpu, e_ideal).tpot_seconds for m in dec]
        y = np.array([m.decode_token_s for m in dec])
        if len(dec) >= 8:  # enough runs to tell the per-layer cost from the fixed one
            coef, _ = nnls(np.array([[1.0, float(m.model.num_layers), xi] for m, xi in zip(dec, x, strict=True)]), y)
            ratio = min(1.0, 1.0 / coef[2]) if coef[2] > 0 else rt.decode_bandwidth_ratio
            rt = replace(rt, decode_step_overhead_seconds=float(coef[0]), decode_layer_overhead_seconds=float(coef[1]),
                         decode_bandwidth_ratio=float(ratio))
        elif len(dec) >= 3:  # fixed cost (the per-layer one folded in) and the bandwidth share
            coef, _ = nnls(np.array([[1.0, xi] for xi in x]), y)
            ratio = min(1.0, 1.0 / coef[1]) if coef[1] > 0 else rt.decode_bandwidth_ratio
            rt = replace(rt, decode_step_overhead_seconds=float(coef[0]), decode_layer_overhead_seconds=0.0,
                         decode_bandwidth_ratio=float(ratio))
        else:
            rest = [m.decode_token_s - xi / rt.decode_bandwidth_ratio - m.model.num_layers * rt.decode_layer_overhead_seconds
                    for m, xi in zip(dec, x, strict=True)]
            rt = replace(rt, decode_step_overhead_seconds=float(max(statistics.median(rest), 0.0)))
    pre = [m for m in rows if m.prefill_s]
    if pre:
        # prefill = overhead + ideal FLOP time / matmul ratio + ideal elementwise time / bandwidth ratio
        flop_only = replace(e_ideal, runtimes=eff.runtimes | {runtime: replace(ideal, prefill_bandwidth_ratio=1e12)})
        fl = [serving_speed(m.model, m.serve_setup(), gpu, flop_only).prefill_seconds for m in pre]
        el = [serving_speed(m.model, m.serve_setup(), gpu, e_ideal).prefill_seconds - f for m, f in zip(pre, fl, strict=True)]
        y = np.array([m.prefill_s for m in pre])
        bw_ratio = rt.prefill_bandwidth_ratio or eff.memory_bandwidth_ratio
        if len(pre) >= 4:
            # the decode fit's per-layer launch cost applies to the prefill's forward too
            per_layer = [m.model.num_layers * rt.decode_layer_overhead_seconds for m in pre]
            coef, _ = nnls(np.array([[1.0, f, e] for f, e in zip(fl, el, strict=True)]), np.maximum(y - per_layer, 0))
            overhead, inv = float(coef[0]), float(coef[1])
            bw_ratio = min(1.0, 1.0 / coef[2]) if coef[2] > 0 else bw_ratio
        elif len(pre) > 1:
            rest = y - np.array(el) / bw_ratio
            coef, _ = nnls(np.array([[1.0, f] for f in fl]), np.maximum(rest, 0))
            overhead, inv = float(coef[0]), float(coef[1])
        else:
            overhead, inv = 0.0, max(pre[0].prefill_s - el[0] / bw_ratio, 1e-9) / fl[0]
        ratio = min(1.0, 1.0 / inv) if inv > 0 else eff.compute_ratio
        rt = replace(rt, prefill_overhead_seconds=overhead, prefill_compute_ratio=ratio, prefill_bandwidth_ratio=bw_ratio)
    stamp = time.strftime("%Y-%m-%d", time.gmtime())
    return replace(rt, calibrated=True, source=f"{runtime} factors calibrated on {stamp} from {len(rows)} {runtime} runs")


def _train_rows_err(ms: list[Measurement], gpu: GpuSpec, eff: Efficiency) -> list[float]:
    return _train_err([m for m in ms if m.kind == "train" and m.step_s and m.seq], gpu, eff)


def _infer_rows(fn: Any) -> Any:
    return lambda ms, gpu, eff: fn([m for m in ms if m.kind == "infer"], gpu, eff)


_FIGURES = ((FIGURE_TRAIN_STEP, _train_rows_err), ("peak_memory", _mem_err), ("decode_tpot", _infer_rows(_decode_err)),
            ("prefill", _infer_rows(_prefill_err)), ("matmul_rate", _rate_err))


# Up to this many runs each is held out alone (leave-one-out, one fit per run); above it the runs are
# held out in this many folds (run i in fold i mod FOLDS), so a few hundred runs cost FOLDS fits, not
# one each: every fit reads every run, and n fits of n runs had grown as n squared (180 runs took minutes).
FOLDS = 20

HeldOut = list[tuple[Measurement, Efficiency]]


def held_out_fits(measurements: list[Measurement], gpu: GpuSpec, base: Efficiency | None = None) -> HeldOut:
    """Each successful measurement with the factors fitted on the runs outside its fold (all the
    others, up to FOLDS runs): the defaults when those give nothing to fit, or nothing a fit accepts."""
    base = base or default_efficiency(gpu)
    ok = [m for m in measurements if m.status == "ok"]
    folds = min(len(ok), FOLDS)
    held: HeldOut = []
    for k in range(folds):
        others = [m for i, m in enumerate(ok) if i % folds != k]
        try:
            eff = fit(others, gpu, base).efficiency if others else base
        except BadInputError:
            eff = base
        held += [(m, eff) for i, m in enumerate(ok) if i % folds == k]
    return held


def leave_one_out(measurements: list[Measurement], gpu: GpuSpec, base: Efficiency | None = None, *,
                  held: HeldOut | None = None) -> LeaveOneOut:
    """Predict each successful measurement from a fit of the others (the defaults when the others
    give nothing to fit), and the same measurement from the defaults. `held`: `held_out_fits`'
    answer, when the caller has it already."""
    base = base or default_efficiency(gpu)
    held = held_out_fits(measurements, gpu, base) if held is None else held
    held_errs: list[float] = []
    default_errs: list[float] = []
    for m, eff in held:
        for _, fn in _FIGURES:
            held_errs += [abs(e) for e in fn([m], gpu, eff)]
            default_errs += [abs(e) for e in fn([m], gpu, base)]
    n = max(len(held_errs), 1)
    return LeaveOneOut(len(held), sum(held_errs) / n, sum(default_errs) / n)


_FIGURE_FNS = {FIGURE_TRAIN_STEP: _train_rows_err, "peak_memory": _mem_err, "decode_tpot": _decode_err, "prefill": _prefill_err}


def _scope(figure: str, m: Measurement) -> str:
    if figure == FIGURE_TRAIN_STEP:
        return "train"
    if figure == "peak_memory":
        return m.kind
    return m.runtime


def leave_one_out_by_figure(measurements: list[Measurement], gpu: GpuSpec,
                            base: Efficiency | None = None, *, held: HeldOut | None = None) -> list[FigureCheck]:
    """Each successful run predicted by a fit of the others (`held_out_fits`), and by the defaults,
    grouped by figure and scope (training; each serving runtime on its own)."""
    base = base or default_efficiency(gpu)
    groups: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    for run, eff in (held_out_fits(measurements, gpu, base) if held is None else held):
        for figure, fn in _FIGURE_FNS.items():
            got, dflt = fn([run], gpu, eff), fn([run], gpu, base)
            if got:
                g = groups.setdefault((figure, _scope(figure, run)), ([], []))
                g[0].append(abs(float(got[0])))
                g[1].append(abs(float(dflt[0])))
    return [FigureCheck(f, sc, h, d) for (f, sc), (h, d) in groups.items()]


_TRAIN_FACTORS = ("compute_ratio", "fp32_compute_ratio", "memory_bandwidth_ratio", "layer_overhead_seconds")
_MEMORY_FACTORS = ("activation_scale", "workspace_bytes")
_DECODE_FACTORS = ("decode_bandwidth_ratio", "decode_step_overhead_seconds", "decode_layer_overhead_seconds")
_PREFILL_FACTORS = ("prefill_overhead_seconds", "prefill_compute_ratio", "prefill_bandwidth_ratio")


def drop_unhelpful(eff: Efficiency, checks: list[FigureCheck], base: Efficiency | None = None) -> Efficiency:
    """The fit with every figure's factors back at the defaults where its held-out error is no
    better than the defaults' (a fit that does not improve leave-one-out error is not used)."""
    base = base or Efficiency()
    for c in checks:
        if c.used:
            continue
        if c.figure == FIGURE_TRAIN_STEP:
            eff = replace(eff, **{k: getattr(base, k) for k in _TRAIN_FACTORS})
        elif c.figure == "peak_memory":
            eff = replace(eff, **{k: getattr(base, k) for k in _MEMORY_FACTORS})
        elif c.scope in eff.runtimes:
            names = _DECODE_FACTORS if c.figure == "decode_tpot" else _PREFILL_FACTORS
            rt = replace(eff.runtimes[c.scope], **{k: getattr(base.runtime(c.scope), k) for k in names})
            eff = replace(eff, runtimes=eff.runtimes | {c.scope: rt})
    return eff


# ---------------------------------------------------------------- storage


def save_calibration(reports: list[FitReport] | FitReport, *, measurements: str, path: Path | None = None) -> Path:
    """Add the fits to the calibration file in one atomic replace (a crash leaves the old file)."""
    path = path or calibration_path()
    data = read_store(path)
    for report in [reports] if isinstance(reports, FitReport) else reports:
        data["gpus"][report.gpu] = report.efficiency.to_dict() | {
            "measurements": measurements,
            "runs": report.runs,
            "used": list(report.used),
            "fitted_at": time.time(),
            "errors_after": {k: [round(v, 4) for v in vs] for k, vs in report.after.items()},
        }
    import tempfile

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(data, indent=1, sort_keys=True))
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as e:
        raise BadInputError(f"Cannot write the calibration file {path}: {e.strerror}.",
                            hint="Set GPULENS_CALIBRATION to a writable path.") from None
    return path


def calibrate(measurements: Path | list[Measurement], *, gpu_name: str | None, source: str | None = None,
              rejected: list[Rejected] | None = None, save: bool = True, path: Path | None = None) -> list[FitReport]:
    """Fit per GPU, check each fit by leave-one-out, and store them all only if every one
    succeeded and none predicts worse than the defaults (else CalibrationRefusedError; with
    save=False the reports say `refused` instead). Runs without a GPU name use `gpu_name`;
    `rejected`: what the caller left out before (e.g. unhealthy steps), reported with the fit."""
    if isinstance(measurements, Path):
        source = source or str(measurements)
        gpu_name = gpu_name or gpu_from_env_json(measurements)
        measurements = load_measurements(measurements)
    if not measurements:
        why = "; ".join(f"{r.label}: {r.reason}" for r in rejected or [])
        raise BadInputError("No measurements to fit" + (f" (left out: {why})." if why else "."),
                            hint="Pass --measurements FILE and/or --store PATH with healthy measured runs.")
    groups: dict[str, tuple[GpuSpec, list[Measurement]]] = {}
    for m in measurements:
        name = m.gpu or gpu_name
        if not name:
            raise BadInputError(f"The run {m.label!r} does not say which GPU it was measured on.",
                                hint="Pass --gpu NAME (e.g. --gpu h200), or add a 'gpu' field to each run.")
        spec = find_gpu(name)
        groups.setdefault(spec.name, (spec, []))[1].append(m)
    reports = []
    for spec, rows in groups.values():
        rep = fit(rows, spec)
        rep.rejected = list(rejected or []) + rep.rejected
        held = held_out_fits(rows, spec)  # once: both checks read the same held-out fits
        rep.leave_one_out = loo = leave_one_out(rows, spec, held=held)
        rep.checks = leave_one_out_by_figure(rows, spec, held=held)
        rep.efficiency = drop_unhelpful(rep.efficiency, rep.checks, default_efficiency(spec))
        ok_rows = [m for m in rows if m.status == "ok"]
        rep.after = {label: fn(ok_rows, spec, rep.efficiency) for label, fn in _FIGURES if label in rep.after}
        if loo.worse_than_defaults:
            rep.refused = (
                f"Calibration of {spec.name} refused, nothing stored: predicting each of the {loo.measurements} "
                f"measurements from the others is off by {loo.mean_abs_error_ratio:.0%} on average, the defaults "
                f"by {loo.defaults_mean_abs_error_ratio:.0%}, so the fit would predict worse than the defaults.")
        reports.append(rep)
    refused = [r for r in reports if r.refused]
    if save and refused:  # all or nothing: one bad fit stores none
        raise CalibrationRefusedError(" ".join(r.refused or "" for r in refused),
                                      hint="Measure steady, healthy runs (not input-bound, no checkpoints, past "
                                           "warm-up) of a few configurations, or keep the defaults.")
    if save:
        save_calibration(reports, measurements=source or "measurements", path=path)
    return reports
