"""The three panels (training | inference | GPU health) as data: which series each chart draws and
which headline numbers each panel shows.

The dashboard, the Grafana export and the reports all read these definitions, so the three views
always show the same things under the same names (those of `vocab/names.py` and `vocab/gpu.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from gpulens.reader import selection_label as selection_label  # re-exported: panels name their selection
from gpulens.vocab import gpu as gm
from gpulens.vocab import names as wn

Workload = Literal["training", "inference", "gpu"]
Scope = Literal["training", "inference", "gpu", "host"]
# How a series is drawn: its samples as they are, quantiles of per-event samples per time bucket,
# the per-second rate of a counter, or the number of per-event samples per second.
SeriesKind = Literal["line", "quantile", "rate", "events_per_second"]
# How a series is drawn: a line through its samples, or one mark per sample, never joined (records of
# separate events, such as checkpoints or model loads: a line between two made a ramp no one measured).
Draw = Literal["line", "points"]
# Units a value is formatted in (base units, as in the metric names).
# flag: 0 or 1 (a clock-event reason off or on), drawn on an off / on axis rather than as a percentage.
Unit = Literal["seconds", "ratio", "bytes", "celsius", "watts", "hertz", "per_second", "count", "joules_per_token", "flag"]
# joules_per_token: gpulens.energy's figure for the panel's workloads (the steps or requests in the
# window), the very number `gpulens energy` prints; `metric` names the energy counter it reads.
StatAgg = Literal["count", "mean", "max", "min", "p50", "p95", "p99", "sum_ratio", "event_count", "joules_per_token"]

# Which selection keys apply to a workload's series.
SELECTION_KEYS: dict[Scope, tuple[str, ...]] = {
    "training": ("job", "host"),
    "inference": ("service", "host"),
    "gpu": ("gpu", "host"),
    "host": ("host",),  # events of other kinds
}
# The series label each selection key filters on: gpulens.reader.selection_label (the readers ask it too).
# Labels that tell apart several series drawn in one chart, in the order they are named.
LEGEND_LABELS = ("reason", "status", "xid", "gpu", wn.TRAIN_JOB_LABEL, "rank", "service", "model", "process", "pid", "host")
# The label a legend always names, even when one series has it: whose GPU, job or service a line is
# ("hw_thermal (GPU 1)"), by the series' workload.
LEGEND_OWNER = {"gpu": "gpu", "training": wn.TRAIN_JOB_LABEL, "inference": "service"}
# How a legend writes a label's name.
LEGEND_NAMES = {"gpu": "GPU", wn.TRAIN_JOB_LABEL: "job"}


def legend_name(label: str) -> str:
    return LEGEND_NAMES.get(label, label)


@dataclass(frozen=True)
class SeriesSpec:
    metric: str
    label: str
    kind: SeriesKind = "line"
    quantile: float | None = None  # for kind == "quantile"
    match: tuple[tuple[str, str], ...] = ()  # fixed label matchers, e.g. (("status", "timeout"),)
    workload: Workload | None = None  # overrides the chart's workload for selection (e.g. GPU capacity)
    # For events_per_second over Prometheus (which sees no single events): the counter to take the rate of.
    counter: str | None = None
    draw: Draw = "line"

    @property
    def match_dict(self) -> dict[str, str]:
        return dict(self.match)


@dataclass(frozen=True)
class ChartSpec:
    id: str
    title: str
    unit: Unit
    series: tuple[SeriesSpec, ...]
    help: str = ""
    empty: str = "No data for this chart in this range."  # shown when the chart has nothing to draw


@dataclass(frozen=True)
class StatSpec:
    id: str
    label: str
    metric: str  # for event_count: the event kind
    agg: StatAgg
    unit: Unit
    denominator: str | None = None  # for sum_ratio: sum(metric) / sum(denominator)
    match: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class PanelSpec:
    id: Workload
    title: str
    charts: tuple[ChartSpec, ...]
    stats: tuple[StatSpec, ...]
    feeds: tuple[str, ...]  # metrics whose presence means the panel has data
    empty_hint: str  # what feeds this panel, shown when it has no data
    extra: dict[str, str] = field(default_factory=dict)


def _q(metric: str, label: str, q: float) -> SeriesSpec:
    return SeriesSpec(metric, label, "quantile", quantile=q)


TRAINING = PanelSpec(
    id="training",
    title="Training",
    feeds=(wn.TRAIN_STEP_SECONDS, wn.TRAIN_TOKENS_PER_SECOND, wn.TRAIN_SAMPLES_PER_SECOND),
    empty_hint=(
        "No training steps in this range. Wrap the training loop with the training monitor "
        "(`from gpulens import TrainingMonitor`, or the Lightning / Hugging Face callback) and run "
        "`gpulens agent`, or import a recorded session with `gpulens replay`."
    ),
    charts=(
        ChartSpec(
            "train_step",
            "Step time and where it goes",
            "seconds",
            (
                SeriesSpec(wn.TRAIN_STEP_SECONDS, "step"),
                SeriesSpec(wn.TRAIN_DATA_WAIT_SECONDS, "data wait"),
                SeriesSpec(wn.TRAIN_COMPUTE_SECONDS, "compute"),
                SeriesSpec(wn.TRAIN_COMM_WAIT_SECONDS, "communication"),
                SeriesSpec(wn.TRAIN_CHECKPOINT_SECONDS, "checkpoint", draw="points"),
            ),
            "Per step: total time, and the time spent waiting for data, computing, communicating and checkpointing.",
        ),
        ChartSpec(
            "train_throughput",
            "Throughput (tokens/s)",
            "per_second",
            (SeriesSpec(wn.TRAIN_TOKENS_PER_SECOND, "tokens/s"),),
            "Tokens processed per second of step time.",
        ),
        ChartSpec(
            "train_samples",
            "Throughput (samples/s)",
            "per_second",
            (SeriesSpec(wn.TRAIN_SAMPLES_PER_SECOND, "samples/s"),),
        ),
        ChartSpec(
            "train_mfu",
            "MFU and wait shares",
            "ratio",
            (
                SeriesSpec(wn.TRAIN_MFU_RATIO, "MFU"),
                SeriesSpec(wn.TRAIN_DATA_WAIT_RATIO, "data wait share"),
                SeriesSpec(wn.TRAIN_COMM_WAIT_RATIO, "communication share"),
            ),
            "Model FLOPs utilization (6·N per token over the GPU's peak) and the share of each step spent waiting.",
        ),
        ChartSpec(
            "train_memory",
            "Training memory",
            "bytes",
            (
                SeriesSpec(wn.TRAIN_MEMORY_ALLOCATED_BYTES, "allocated"),
                SeriesSpec(wn.TRAIN_MEMORY_PEAK_BYTES, "peak"),
                SeriesSpec(wn.TRAIN_MEMORY_RESERVED_BYTES, "reserved"),
                SeriesSpec(gm.GPU_MEMORY_TOTAL_BYTES, "GPU capacity", workload="gpu"),
            ),
            "The allocator's view against the GPU's capacity: peak close to capacity means the next batch may not fit.",
        ),
    ),
    stats=(
        StatSpec("steps", "steps", wn.TRAIN_STEP_SECONDS, "count", "count"),
        StatSpec("step_p50", "step time p50", wn.TRAIN_STEP_SECONDS, "p50", "seconds"),
        StatSpec("step_p95", "step time p95", wn.TRAIN_STEP_SECONDS, "p95", "seconds"),
        StatSpec(
            "data_wait_share", "data wait share", wn.TRAIN_DATA_WAIT_SECONDS, "sum_ratio", "ratio",
            denominator=wn.TRAIN_STEP_SECONDS,
        ),
        StatSpec("tokens_p50", "tokens/s p50", wn.TRAIN_TOKENS_PER_SECOND, "p50", "per_second"),
        StatSpec("mfu_p50", "MFU p50", wn.TRAIN_MFU_RATIO, "p50", "ratio"),
        StatSpec("memory_peak", "peak memory", wn.TRAIN_MEMORY_PEAK_BYTES, "max", "bytes"),
        StatSpec("energy_per_token", "energy per token", gm.GPU_ENERGY_JOULES_TOTAL, "joules_per_token", "joules_per_token"),
    ),
)

INFERENCE = PanelSpec(
    id="inference",
    title="Inference",
    feeds=(wn.INFER_LATENCY_SECONDS, wn.INFER_REQUESTS_TOTAL, wn.INFER_QUEUE_DEPTH),
    empty_hint=(
        "No inference requests in this range. Add the inference middleware to the serving app "
        "(`gpulens.workload.inference`), point `gpulens agent --scrape` at a vLLM / TGI / Triton "
        "`/metrics` endpoint, or import a recorded session with `gpulens replay`."
    ),
    charts=(
        ChartSpec(
            "infer_latency",
            "Request latency p50 / p95 / p99",
            "seconds",
            (
                _q(wn.INFER_LATENCY_SECONDS, "p50", 0.50),
                _q(wn.INFER_LATENCY_SECONDS, "p95", 0.95),
                _q(wn.INFER_LATENCY_SECONDS, "p99", 0.99),
            ),
            "Percentiles of the requests that ended in each interval, computed from every request (never averaged).",
        ),
        # Two charts: TPOT (tens of ms) drawn on TTFT's axis (seconds) was a flat line along the bottom.
        ChartSpec(
            "infer_ttft",
            "Time to first token",
            "seconds",
            (_q(wn.INFER_TTFT_SECONDS, "TTFT p50", 0.50), _q(wn.INFER_TTFT_SECONDS, "TTFT p95", 0.95)),
            "From arrival to the first generated token: queueing and prefill.",
        ),
        ChartSpec(
            "infer_tpot",
            "Time per output token",
            "seconds",
            (_q(wn.INFER_TPOT_SECONDS, "TPOT p50", 0.50), _q(wn.INFER_TPOT_SECONDS, "TPOT p95", 0.95)),
            "Between generated tokens: the decode speed each user sees.",
        ),
        ChartSpec(
            "infer_rps",
            "Requests per second",
            "per_second",
            (SeriesSpec(wn.INFER_LATENCY_SECONDS, "completed", "events_per_second", counter=wn.INFER_REQUESTS_TOTAL),),
            "Requests that ended per second.",
        ),
        ChartSpec(
            "infer_queue",
            "Queue depth and requests in flight",
            "count",
            (SeriesSpec(wn.INFER_QUEUE_DEPTH, "queued"), SeriesSpec(wn.INFER_IN_FLIGHT, "in flight")),
        ),
        ChartSpec(
            "infer_errors",
            "Errors and timeouts per second",
            "per_second",
            (
                SeriesSpec(wn.INFER_REQUESTS_TOTAL, "errors", "rate", match=(("status", "error"),)),
                SeriesSpec(wn.INFER_REQUESTS_TOTAL, "timeouts", "rate", match=(("status", "timeout"),)),
                SeriesSpec(wn.INFER_REQUESTS_TOTAL, "rejected", "rate", match=(("status", "rejected"),)),
            ),
            empty="No errors, timeouts or rejected requests in this range.",
        ),
        ChartSpec(
            "infer_memory",
            "Memory against capacity",
            "bytes",
            (
                SeriesSpec(wn.INFER_MEMORY_ALLOCATED_BYTES, "allocated"),
                SeriesSpec(wn.INFER_MEMORY_RESERVED_BYTES, "reserved"),
                SeriesSpec(gm.GPU_MEMORY_USED_BYTES, "GPU used", workload="gpu"),
                SeriesSpec(gm.GPU_MEMORY_TOTAL_BYTES, "GPU capacity", workload="gpu"),
            ),
            "Headroom is the gap to capacity: the KV cache and batch growth need it under load.",
        ),
        ChartSpec(
            "infer_cold_start",
            "Cold starts",
            "seconds",
            (SeriesSpec(wn.INFER_COLD_START_SECONDS, "model load", draw="points"),),
            "Time from process start (or model load) to ready, one point per load.",
        ),
    ),
    stats=(
        StatSpec("requests", "requests", wn.INFER_LATENCY_SECONDS, "count", "count"),
        StatSpec("latency_p50", "latency p50", wn.INFER_LATENCY_SECONDS, "p50", "seconds"),
        StatSpec("latency_p95", "latency p95", wn.INFER_LATENCY_SECONDS, "p95", "seconds"),
        StatSpec("latency_p99", "latency p99", wn.INFER_LATENCY_SECONDS, "p99", "seconds"),
        StatSpec("ttft_p50", "TTFT p50", wn.INFER_TTFT_SECONDS, "p50", "seconds"),
        StatSpec("tpot_p50", "TPOT p50", wn.INFER_TPOT_SECONDS, "p50", "seconds"),
        StatSpec("cold_start", "cold start", wn.INFER_COLD_START_SECONDS, "max", "seconds"),
        StatSpec("memory_peak", "peak memory", wn.INFER_MEMORY_RESERVED_BYTES, "max", "bytes"),
        StatSpec("energy_per_token", "energy per generated token", gm.GPU_ENERGY_JOULES_TOTAL, "joules_per_token", "joules_per_token"),
    ),
)

GPU = PanelSpec(
    id="gpu",
    title="GPU health",
    feeds=(gm.GPU_UTILIZATION_RATIO, gm.GPU_TEMPERATURE_CELSIUS, gm.GPU_POWER_WATTS),
    empty_hint=(
        "No GPU telemetry in this range. Run `gpulens agent` on the GPU machine (it samples NVML), "
        "or `gpulens replay` to import a recorded trace."
    ),
    charts=(
        ChartSpec(
            "gpu_util",
            "Utilization",
            "ratio",
            (
                SeriesSpec(gm.GPU_UTILIZATION_RATIO, "GPU busy"),
                SeriesSpec(gm.GPU_SM_ACTIVE_RATIO, "SM active"),
                SeriesSpec(gm.GPU_TENSOR_ACTIVE_RATIO, "tensor active"),
            ),
            "'GPU busy' only says a kernel ran; SM and tensor activity say how much of the GPU worked.",
        ),
        ChartSpec(
            "gpu_temperature",
            "Temperature",
            "celsius",
            (
                SeriesSpec(gm.GPU_TEMPERATURE_CELSIUS, "temperature"),
                SeriesSpec(gm.GPU_TEMPERATURE_SLOWDOWN_CELSIUS, "slowdown at"),
            ),
        ),
        ChartSpec(
            "gpu_power",
            "Power against its limit",
            "watts",
            (SeriesSpec(gm.GPU_POWER_WATTS, "power"), SeriesSpec(gm.GPU_POWER_LIMIT_WATTS, "limit")),
        ),
        ChartSpec(
            "gpu_clocks",
            "Clocks",
            "hertz",
            (
                SeriesSpec(gm.GPU_SM_CLOCK_HERTZ, "SM clock"),
                SeriesSpec(gm.GPU_SM_CLOCK_MAX_HERTZ, "SM clock max"),
                SeriesSpec(gm.GPU_MEMORY_CLOCK_HERTZ, "memory clock"),
            ),
        ),
        ChartSpec(
            "gpu_throttle",
            "Clock-event (throttle) reasons",
            "flag",
            (SeriesSpec(gm.GPU_CLOCK_EVENT_ACTIVE, "active"),),
            "On while the reason holds the clocks down (idle is harmless; power and thermal reasons cost speed).",
        ),
        ChartSpec(
            "gpu_memory",
            "GPU memory",
            "bytes",
            (SeriesSpec(gm.GPU_MEMORY_USED_BYTES, "used"), SeriesSpec(gm.GPU_MEMORY_TOTAL_BYTES, "capacity")),
        ),
        ChartSpec(
            "gpu_process_memory",
            "Memory by process",
            "bytes",
            (SeriesSpec(gm.GPU_PROCESS_MEMORY, "memory"),),
            "Device memory each compute process holds: who shares the GPU (training beside serving?).",
            empty="No per-process memory readings in this range (NVML lists processes only where it is allowed to).",
        ),
        ChartSpec(
            "gpu_errors",
            "XID and ECC errors",
            "count",
            (
                SeriesSpec(gm.GPU_XID_TOTAL, "XID"),
                SeriesSpec(gm.GPU_ECC_UNCORRECTED_VOLATILE_TOTAL, "ECC uncorrected"),
                SeriesSpec(gm.GPU_ECC_CORRECTED_VOLATILE_TOTAL, "ECC corrected"),
                SeriesSpec(gm.GPU_REMAPPED_ROWS_PENDING, "row remap pending"),
            ),
            empty="No XID or ECC errors recorded in this range.",
        ),
    ),
    stats=(
        StatSpec("util_mean", "utilization mean", gm.GPU_UTILIZATION_RATIO, "mean", "ratio"),
        StatSpec("temperature_max", "temperature max", gm.GPU_TEMPERATURE_CELSIUS, "max", "celsius"),
        StatSpec("power_max", "power max", gm.GPU_POWER_WATTS, "max", "watts"),
        StatSpec("power_limit", "power limit", gm.GPU_POWER_LIMIT_WATTS, "max", "watts"),
        StatSpec("memory_max", "memory used max", gm.GPU_MEMORY_USED_BYTES, "max", "bytes"),
        StatSpec("xid_events", "XID errors", "xid", "event_count", "count"),
    ),
)

PANELS: dict[str, PanelSpec] = {p.id: p for p in (TRAINING, INFERENCE, GPU)}


def chart_workload(chart: ChartSpec, series: SeriesSpec, panel: PanelSpec) -> Workload:
    return series.workload or panel.id


def metrics_used() -> list[str]:
    """Every metric a panel reads, for the Grafana export and the docs."""
    out: list[str] = []
    for p in PANELS.values():
        for c in p.charts:
            for s in c.series:
                if s.metric not in out:
                    out.append(s.metric)
    return out
