"""Energy per workload: which training job or service ran on which GPU when, and the joules that
GPU used over that span, per token, per sample (training) and per request (serving).

Where a workload ran comes from `diagnose.gpu_workloads.occupants` (its pid in the GPU process
list, its `train_start` event, or the only GPU of its host). A training rank's span runs from its
first step's start to its last step's end; a service's from its first request's arrival to its last
request's end. Tokens are the steps' `tokens` for training and the requests' generated
(`output_tokens`) tokens for serving.

When two workloads' spans overlap on one GPU, the GPU's joules over the overlap belong to both and
gpulens cannot split them from what the store holds (it keeps each process's memory, not its
utilisation), so both rows carry the whole GPU's energy, name the other workload in
`shared_with` and say so in `note`: their per-token figures are upper bounds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gpulens.diagnose.gpu_workloads import GpuRef, Occupant, occupants
from gpulens.energy.joules import SpanEnergy, counter_joules, power_joules
from gpulens.reader import AnalysisReader, EventRow, analysis_reader
from gpulens.store import Store
from gpulens.vocab import gpu as G
from gpulens.vocab import names as N

ENERGY_COUNTER = G.GPU_ENERGY_JOULES_TOTAL
POWER = G.GPU_POWER_WATTS
EDGE_MARGIN_SECONDS = 60.0  # far more than a sample interval


@dataclass
class WorkloadEnergy:
    """One workload (a training rank or a service) on one GPU over the span it ran."""

    workload: str  # "training" or "serving"
    name: str  # the train_job or the service
    gpu: str
    host: str
    start: float  # unix s
    end: float
    seconds: float
    joules: float | None = None
    mean_watts: float | None = None
    method: str | None = None  # energy_counter, power_integral, or None (no GPU readings in the span)
    tokens: int = 0
    joules_per_token: float | None = None
    samples: int | None = None  # training
    joules_per_sample: float | None = None
    steps: int | None = None
    requests: int | None = None  # serving
    joules_per_request: float | None = None
    rank: str | None = None
    shared_with: list[str] = field(default_factory=list)
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _num(x: object) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def _training_span(events: list[EventRow]) -> tuple[float, float, int, int] | None:
    starts, ends, tokens, samples = [], [], 0, 0
    for e in events:
        d = e.data
        end = _num(d.get("t_end")) or e.t
        begin = _num(d.get("t_start"))
        if begin is None:
            step = _num(d.get("step_s"))
            begin = end - step if step is not None else end
        starts.append(begin)
        ends.append(end)
        tokens += int(_num(d.get("tokens")) or 0)
        samples += int(_num(d.get("samples")) or _num(d.get("batch")) or 0)
    return (min(starts), max(ends), tokens, samples) if starts else None


def _serving_span(events: list[EventRow]) -> tuple[float, float, int] | None:
    starts, ends, tokens = [], [], 0
    for e in events:
        d = e.data
        end = _num(d.get("end")) or e.t
        begin = next((v for v in (_num(d.get(k)) for k in ("intended", "arrival", "start")) if v is not None), end)
        starts.append(begin)
        ends.append(end)
        tokens += int(_num(d.get("output_tokens")) or 0)
    return (min(starts), max(ends), tokens) if starts else None


def _gpu_energy(reader: AnalysisReader, gpu: GpuRef, start: float, end: float) -> SpanEnergy | None:
    for name, integrate in ((ENERGY_COUNTER, counter_joules), (POWER, power_joules)):
        # A margin either side, so both ends of the span interpolate between real readings.
        for s in reader.series_windows(name, {"gpu": gpu.gpu}, start=start - EDGE_MARGIN_SECONDS, end=end + EDGE_MARGIN_SECONDS):
            if s.labels.get("host", "") != gpu.host:
                continue
            got = integrate(s.t, s.value, start, end)
            if got is not None:
                return got
    return None


def _row(reader: AnalysisReader, gpu: GpuRef, occ: Occupant, since: float | None, until: float | None) -> WorkloadEnergy | None:
    labels = occ.labels
    if occ.role == "training":
        steps = reader.event_rows(N.EV_TRAIN_STEP, start=since, end=until, match=labels)
        span = _training_span(steps)
        if span is None:
            return None
        start, end, tokens, samples = span
        row = WorkloadEnergy("training", labels.get(N.TRAIN_JOB_LABEL, ""), gpu.gpu, gpu.host, start, end, end - start,
                             tokens=tokens, samples=samples or None, rank=labels.get("rank"),
                             steps=sum(int(_num(e.data.get("steps")) or 1) for e in steps))  # a Prometheus record is a scrape interval's steps
    else:
        reqs = reader.event_rows(N.EV_REQUEST, start=since, end=until, match=labels)
        sspan = _serving_span(reqs)
        if sspan is None:
            return None
        start, end, tokens = sspan
        row = WorkloadEnergy("serving", labels.get("service", ""), gpu.gpu, gpu.host, start, end, end - start,
                             tokens=tokens, requests=len(reqs))
    got = _gpu_energy(reader, gpu, row.start, row.end)
    if got is None:
        row.note = "no GPU energy or power readings cover this span"
        return row
    row.joules, row.method, row.mean_watts = got.joules, got.method, got.mean_watts
    if got.method == "power_integral":
        row.note = "NVML's energy counter is missing here: joules integrate the power readings"
    if tokens:
        row.joules_per_token = got.joules / tokens
    if row.samples:
        row.joules_per_sample = got.joules / row.samples
    if row.requests:
        row.joules_per_request = got.joules / row.requests
    return row


def workload_energy(source: AnalysisReader | Store, *, job: str | None = None, service: str | None = None,
                    start: float | None = None, end: float | None = None) -> list[WorkloadEnergy]:
    """Energy of every training rank and service the source holds (or only `job` / `service`), by GPU.
    With `start` / `end` (unix s), only the steps and requests recorded in that window count (the
    dashboard's and the report's window); without, every one in the source."""
    reader = analysis_reader(source)
    rows: list[WorkloadEnergy] = []
    for gpu, occs in sorted(occupants(reader, start, end).items(), key=lambda kv: (kv[0].host, kv[0].gpu)):
        on_gpu = [r for r in (_row(reader, gpu, o, start, end) for o in occs) if r is not None]
        for r in on_gpu:
            others = [o for o in on_gpu if o is not r and o.start < r.end and r.start < o.end]
            if others:
                r.shared_with = sorted(f"{o.workload} {o.name}" for o in others)
                r.note = "; ".join(filter(None, [r.note, (
                    "shared the GPU with " + ", ".join(r.shared_with)
                    + ": joules are the whole GPU's over the span, not split (an upper bound)")]))
        rows.extend(on_gpu)
    if job is not None or service is not None:
        rows = [r for r in rows if (r.workload == "training" and r.name == job) or (r.workload == "serving" and r.name == service)]
    return sorted(rows, key=lambda r: (r.start, r.workload, r.name, r.gpu))


def joules_per_token(rows: list[WorkloadEnergy]) -> float | None:
    """One joules-per-token figure for a set of rows: their joules over their tokens, each
    workload's tokens counted once (a service on two GPUs has one row per GPU, each with all its
    tokens; training ranks have their own). For one row it is that row's `joules_per_token`."""
    measured = [r for r in rows if r.joules is not None]
    if len(measured) == 1:
        return measured[0].joules_per_token
    tokens: dict[tuple[str, str, str | None, str], int] = {}
    for r in measured:  # a workload's records are matched by its name, rank and host, not its GPU
        tokens[(r.workload, r.name, r.rank, r.host)] = r.tokens
    total = sum(tokens.values())
    return sum(r.joules or 0.0 for r in measured) / total if total else None
