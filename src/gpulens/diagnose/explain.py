"""The explanation rules: which finding explains which, written down as one table.

A rule says: a finding of one of `causes` explains a finding of one of `symptoms` when they are at
the same `place` and their spans relate by `when` (with SLACK_SECONDS of slack). The analyzers each
decide alone; these rules turn their opinions into an account (diagnose.incidents groups by them).
Places are read from what a finding names: the workloads a GPU finding hit (its `workload_impact`),
a workload finding's job/rank or service, and a GPU finding's host and GPU. Kinds that other
analyzers add later (gpu_silent, rank_silent, other_process_memory, ...) are named here already, so
their findings take their place the day they appear.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from gpulens.diagnose.base import Finding
from gpulens.vocab.names import EV_COLD_START, TRAIN_JOB_LABEL

# Spans are sampled (steps, agent samples every few seconds, request windows): two findings of one
# event may start or end this far apart and still overlap.
SLACK_SECONDS = 10.0

Place = Literal["on_gpu", "other_ranks"]
When = Literal["overlap", "during", "after"]

GPU_FAULTS = ("gpu_xid", "gpu_ecc_uncorrectable", "gpu_row_remap_failure", "gpu_lost", "gpu_silent")
GPU_CONDITIONS = ("gpu_clock_cut", "gpu_temperature_high", "throttled")
SLOWER_STEPS = ("step_time_regression", "straggler")
HIGHER_LATENCY = ("slo_violation", "latency_bound_low_utilization", "queueing")
MEMORY_SYMPTOMS = ("memory_pressure", "gpu_memory_full", "oom", "memory_headroom")
STOPPED = ("rank_silent", "service_silent", "error_rate", "timeouts", "slo_violation")


@dataclass(frozen=True)
class Rule:
    name: str
    causes: tuple[str, ...]
    symptoms: tuple[str, ...]
    place: Place  # on_gpu: a shared workload or the same host+GPU; other_ranks: the same job, another rank
    when: When  # overlap: the spans overlap (with slack); during: they truly overlap (no slack); after: the symptom lasts past the cause's start
    verb: str  # how the text reads: "{symptom} {verb} {cause}"
    holds: str = ""  # an extra condition on the pair, by name in CONDITIONS


def _job_not_the_holder(cause: Finding, symptom: Finding) -> bool:
    """The job's own allocator peak is under half of what the device held: someone else holds it."""
    for f in (cause, symptom):
        peak, used = f.evidence.get("allocator_peak_bytes"), f.evidence.get("device_used_bytes")
        if isinstance(peak, int | float) and isinstance(used, int | float) and used > 0:
            return peak < 0.5 * used
    return False


CONDITIONS: dict[str, Callable[[Finding, Finding], bool]] = {
    "job_not_the_holder": _job_not_the_holder,
    "job_is_the_holder": lambda c, s: not _job_not_the_holder(c, s),
}

# Order matters: a symptom takes its explainer from the first rule that finds one, so the rules
# that name the deepest cause (a fault, an outside process, the same event seen twice) come first.
RULES: tuple[Rule, ...] = (
    Rule("fault_stops_work", GPU_FAULTS[:4], ("gpu_lost", "gpu_silent", *STOPPED), "on_gpu", "after", "after"),
    Rule("silent_gpu_stops_work", ("gpu_lost", "gpu_silent"), STOPPED, "on_gpu", "after", "after"),
    # A data-parallel job is one program: when one rank's GPU faults, the others stop with it (their
    # collective waits forever, or the launcher tears the job down).
    Rule("fault_stops_the_job", GPU_FAULTS, ("rank_silent",), "other_ranks", "after", "after"),
    Rule("other_process_holds_memory", ("other_process_memory",), MEMORY_SYMPTOMS, "on_gpu", "overlap", "because of"),
    Rule("gpu_full_not_by_the_job", ("gpu_memory_full",), ("memory_pressure", "oom"), "on_gpu", "overlap", "because of",
         "job_not_the_holder"),
    Rule("job_fills_the_gpu", ("memory_pressure",), ("gpu_memory_full",), "on_gpu", "overlap", "is the same event as",
         "job_is_the_holder"),
    Rule("one_slowdown_seen_twice", ("gpu_clock_cut",), ("gpu_temperature_high", "throttled"), "on_gpu", "overlap",
         "is the same slowdown as"),
    Rule("hot_gpu_throttles", ("gpu_temperature_high",), ("throttled",), "on_gpu", "overlap", "is the same slowdown as"),
    Rule("colocation_interferes", ("colocation",), (*SLOWER_STEPS, *HIGHER_LATENCY, *MEMORY_SYMPTOMS, "underutilized"),
         "on_gpu", "overlap", "because of"),
    Rule("slow_rank_is_the_regression", ("straggler",), ("step_time_regression",), "on_gpu", "overlap", "because of"),
    Rule("slow_gpu_slows_work", GPU_CONDITIONS, (*SLOWER_STEPS, *HIGHER_LATENCY), "on_gpu", "overlap", "because of"),
    Rule("slow_rank_makes_ranks_wait", ("straggler", "input_bound", "checkpoint_stall", "step_time_regression"),
         ("comm_bound",), "other_ranks", "overlap", "waiting for"),
    Rule("slow_gpu_makes_ranks_wait", GPU_CONDITIONS, ("comm_bound",), "other_ranks", "overlap", "waiting for"),
    # A stall idles the GPU only while it lasts: the steps right after a checkpoint are not its doing.
    Rule("stall_idles_the_gpu", ("input_bound", "checkpoint_stall"), ("underutilized",), "on_gpu", "during", "because of"),
    Rule("bottleneck_misses_the_slo", ("queueing", "latency_bound_low_utilization", "memory_headroom", EV_COLD_START,
                                       "error_rate", "timeouts"), ("slo_violation",), "on_gpu", "overlap", "because of"),
)


# ------------------------------------------------------------------ where a finding is
def workloads_of(f: Finding) -> set[str]:
    """The workloads a finding names, as gpulens names them: `job J rank R`, `service S`."""
    out = {str(x["workload"]) for x in f.evidence.get("workload_impact") or [] if isinstance(x, dict) and x.get("workload")}
    if f.labels.get(TRAIN_JOB_LABEL):
        out.add(f"job {f.labels[TRAIN_JOB_LABEL]} rank {f.labels.get('rank', '0')}")
    if f.labels.get("service"):
        out.add(f"service {f.labels['service']}")
    return out


def ranks_of(f: Finding) -> set[tuple[str, str]]:
    """(job, rank) of every training rank the finding names."""
    out = set()
    for w in workloads_of(f):
        if w.startswith("job ") and " rank " in w:
            job, rank = w[4:].rsplit(" rank ", 1)
            out.add((job, rank))
    return out


def gpu_of(f: Finding) -> tuple[str, str] | None:
    g = f.labels.get("gpu")
    return (f.labels.get("host", ""), str(g)) if g not in (None, "") else None


def same_place(cause: Finding, symptom: Finding, place: Place) -> bool:
    if place == "on_gpu":
        g = gpu_of(cause)
        return bool(workloads_of(cause) & workloads_of(symptom)) or (g is not None and g == gpu_of(symptom))
    slow = ranks_of(cause)
    waiting = ranks_of(symptom)
    return any(job == sj and (sj, sr) not in slow for job, _ in slow for sj, sr in waiting)


def same_time(cause: Finding, symptom: Finding, when: When, slack: float = SLACK_SECONDS) -> bool:
    if when == "after":
        return symptom.end >= cause.start - slack
    if when == "during":
        return min(cause.end, symptom.end) - max(cause.start, symptom.start) > 0
    return cause.start - slack <= symptom.end and symptom.start <= cause.end + slack


def explains(rule: Rule, cause: Finding, symptom: Finding) -> bool:
    """Does `cause` explain `symptom` under `rule` (kinds, place, time and the rule's condition)?"""
    if cause is symptom or cause.kind not in rule.causes or symptom.kind not in rule.symptoms:
        return False
    if not (same_place(cause, symptom, rule.place) and same_time(cause, symptom, rule.when)):
        return False
    return not rule.holds or CONDITIONS[rule.holds](cause, symptom)


# ------------------------------------------------------------------ one voice
# Opposite advice: two phrases that cannot both be right about one window. The grouping drops a
# symptom's advice; `opposite_pairs` catches what is left (two causes over one window).
OPPOSITES: tuple[tuple[str, str, str], ...] = (
    ("fewer vs more replicas", r"(?<!not )fewer replicas", r"more replicas|add replicas|more capacity"),
    ("not the GPU vs the GPU slowed", r"not by the GPU|not the GPU",
     r"power brake|thermal slowdown|clocks of GPU \S+( on \S+)? were cut|lowered its clocks"),
    ("roll back vs a hardware cause", r"roll it back|roll back|rollback",
     r"report (it|the node) to (the|its) operators|check cooling|RMA the GPU|power suppl"),
    ("raise the batch vs shrink it", r"raise the batch size", r"smaller micro-batch"),
    ("GPU-bound vs not the GPU", r"(?<!not )GPU-bound", r"not by the GPU|not the GPU"),
)


@dataclass(frozen=True)
class Voice:
    """One thing a report says over a window: a summary or an advice line, and who said it."""

    who: str
    start: float
    end: float
    text: str


def opposite_pairs(voices: list[Voice]) -> list[str]:
    """Every pair of opposite phrases said over overlapping windows, as `name: who A / who B`."""
    out: list[str] = []
    for name, a, b in OPPOSITES:
        sa = [v for v in voices if re.search(a, v.text, re.I)]
        sb = [v for v in voices if re.search(b, v.text, re.I)]
        out += sorted({f"{name}: {x.who} / {y.who}" for x in sa for y in sb
                       if x.who != y.who and x.start <= y.end and y.start <= x.end})
    return out


def contradicts(text: str, others: list[str]) -> bool:
    """Does `text` say one side of an opposite pair whose other side one of `others` says?"""
    for _name, a, b in OPPOSITES:
        for mine, theirs in ((a, b), (b, a)):
            if re.search(mine, text, re.I) and any(re.search(theirs, o, re.I) for o in others):
                return True
    return False
