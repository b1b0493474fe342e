"""Incidents and the explanation rules: every rule groups a symptom under its cause when both are at
one place and time, and leaves the symptom standing alone when the cause is absent, elsewhere or at
another time. Findings are built here, so kinds other analyzers add later (gpu_silent,
other_process_memory) are covered the day they land."""

from __future__ import annotations

import pytest

from gpulens.diagnose.base import Finding
from gpulens.diagnose.evidence import bytes_, ratio, seconds
from gpulens.diagnose.explain import RULES, SLACK_SECONDS, Voice, opposite_pairs
from gpulens.diagnose.incidents import for_job, group, voices
from gpulens.vocab.names import EV_COLD_START

GPU_KINDS = {"gpu_xid", "gpu_ecc_uncorrectable", "gpu_row_remap_failure", "gpu_lost", "gpu_silent", "gpu_clock_cut",
             "gpu_temperature_high", "gpu_memory_full", "other_process_memory", "colocation"}
INFERENCE_KINDS = {"slo_violation", "latency_bound_low_utilization", "queueing", "memory_headroom", EV_COLD_START,
                   "error_rate", "timeouts", "service_silent"}


def make(kind: str, start: float = 100.0, end: float = 200.0, *, job: str = "j", rank: str = "1", service: str = "s",
         gpu: str = "1", severity: str = "warning", evidence: dict | None = None, advice: tuple[str, ...] = ("fix it",)) -> Finding:
    """A finding of `kind` at one place: a GPU finding that hit job j rank 1 and service s, or that
    rank's / service's own finding."""
    ev = dict(evidence or {})
    if kind in GPU_KINDS:
        ev.setdefault("workload_impact", [{"workload": f"job {job} rank {rank}"}, {"workload": f"service {service}"}])
        return Finding(kind, "gpu", start, end, severity, f"{kind} on GPU {gpu}.", ev, list(advice), {"gpu": gpu, "host": "h"})  # type: ignore[arg-type]
    if kind in INFERENCE_KINDS:
        return Finding(kind, "inference", start, end, severity, f"{kind}.", ev, list(advice), {"service": service, "host": "h"})  # type: ignore[arg-type]
    return Finding(kind, "training", start, end, severity, f"{kind}.", ev, list(advice), {"train_job": job, "rank": rank, "host": "h"})  # type: ignore[arg-type]


def _pair(rule, cause_kind: str, symptom_kind: str, **where) -> tuple[Finding, Finding]:
    """A cause and a symptom that the rule relates: same place (another rank for rank relations), same time."""
    c_ev: dict = {}
    s_ev: dict = {}
    if rule.holds == "job_not_the_holder":
        s_ev = {"allocator_peak_bytes": bytes_(23e9), "device_used_bytes": bytes_(136e9)}
    if rule.holds == "job_is_the_holder":
        c_ev = {"allocator_peak_bytes": bytes_(130e9), "device_used_bytes": bytes_(136e9)}
    t0, t1 = (100.0, 100.0) if rule.when == "after" else (100.0, 200.0)
    cause = make(cause_kind, t0, t1, evidence=c_ev)
    sym_rank = "0" if rule.place == "other_ranks" else "1"
    symptom = make(symptom_kind, 100.0, 200.0, evidence=s_ev, rank=sym_rank, **where)
    return cause, symptom


CASES = [pytest.param(r, c, s, id=f"{r.name}:{c}->{s}") for r in RULES for c in r.causes[:2] for s in r.symptoms if c != s]


@pytest.mark.parametrize(("rule", "cause_kind", "symptom_kind"), CASES)
def test_cause_present_groups_the_symptom(rule, cause_kind, symptom_kind) -> None:
    cause, symptom = _pair(rule, cause_kind, symptom_kind)
    incs = group([cause, symptom])
    assert len(incs) == 1, [i.kind for i in incs]
    assert incs[0].cause is cause and [s.finding for s in incs[0].symptoms] == [symptom]
    dicts = incs[0].finding_dicts()
    assert [d["role"] for d in dicts] == ["cause", "symptom"] and {d["incident"] for d in dicts} == {1}
    assert dicts[1]["advice"] == [] and dicts[0]["advice"] == ["fix it"]


@pytest.mark.parametrize(("rule", "cause_kind", "symptom_kind"), CASES)
def test_cause_absent_elsewhere_or_later_the_symptom_stands_alone(rule, cause_kind, symptom_kind) -> None:
    cause, symptom = _pair(rule, cause_kind, symptom_kind)
    alone = group([symptom])
    assert len(alone) == 1 and alone[0].cause is symptom and alone[0].advice == ["fix it"]
    # elsewhere: another job, service and GPU
    _, far = _pair(rule, cause_kind, symptom_kind, job="other", service="other", gpu="7")
    assert len(group([cause, far])) == 2
    # at another time: a symptom that ended before the cause began (beyond the slack)
    early = make(symptom_kind, 0.0, 100.0 - 3 * SLACK_SECONDS, rank=symptom.labels.get("rank", "1"), evidence=symptom.evidence)
    assert len(group([cause, early])) == 2


def test_a_chain_reads_cause_first_with_the_waiting_ranks_and_one_severity() -> None:
    clock = make("gpu_clock_cut", rank="2", evidence={"reason": "hw_thermal"}, advice=("Check cooling first.",))
    throttled = make("throttled", rank="2", severity="critical", evidence={"reason": "hw_thermal"}, advice=("Hardware slowdown.",))
    straggler = make("straggler", rank="2", evidence={"slow_rank": "2"})
    waits = [make("comm_bound", rank=r, evidence={"comm_wait_share": ratio(0.39), "median_step_seconds": seconds(1.34)},
                  advice=("tune DDP buckets",)) for r in ("0", "1", "3")]
    regression = make("step_time_regression", rank="2", advice=("If a recent change caused it, roll it back.",))
    incs = group([clock, throttled, straggler, *waits, regression])
    assert len(incs) == 1
    inc = incs[0]
    assert inc.cause is clock and inc.severity == "critical" and inc.advice == ["Check cooling first."]
    assert {d["severity"] for d in inc.finding_dicts()} == {"critical"}
    assert any(line.startswith("Ranks 0, 1 and 3 of job j: wait 522.6 ms a step (39% of it)") and "waiting for rank 2 of job j, the straggler" in line
               for line in inc.explanation), inc.explanation
    assert not opposite_pairs(voices(incs))


def test_without_a_straggler_a_slow_gpu_still_explains_the_other_ranks_wait() -> None:
    clock = make("gpu_clock_cut", rank="5")
    wait = make("comm_bound", rank="0")
    assert len(group([clock, wait])) == 1
    assert len(group([make("gpu_clock_cut", rank="5", job="other"), wait])) == 2


def test_memory_full_by_the_job_itself_keeps_the_job_as_cause() -> None:
    full = make("gpu_memory_full")
    mine = make("memory_pressure", evidence={"allocator_peak_bytes": bytes_(130e9), "device_used_bytes": bytes_(136e9)})
    [inc] = group([full, mine])
    assert inc.cause is mine
    theirs = make("memory_pressure", evidence={"allocator_peak_bytes": bytes_(23e9), "device_used_bytes": bytes_(136e9)})
    [inc] = group([full, theirs])
    assert inc.cause is full


def test_opposite_pairs_catch_only_overlapping_opposites() -> None:
    a = Voice("a", 0, 100, "Then cost: fewer replicas serve the same load.")
    b = Voice("b", 50, 150, "Add more replicas, or autoscale on queue depth.")
    assert opposite_pairs([a, b]) == ["fewer vs more replicas: a / b"]
    assert opposite_pairs([a, Voice("b", 200, 300, b.text)]) == []
    assert opposite_pairs([Voice("a", 0, 100, "not fewer replicas yet"), b]) == []
    assert opposite_pairs([Voice("a", 0, 100, "latency is set by overhead, not by the GPU."),
                           Voice("b", 0, 100, "The power brake cut the clocks.")])


def test_one_voice_drops_a_later_incidents_opposite_advice_and_the_check_names_the_rest() -> None:
    brake = make("gpu_clock_cut", service="chat", gpu="0", advice=("Report the node to its operators: the power brake is asserted.",))
    other = make("latency_bound_low_utilization", service="elsewhere",
                 advice=("Batch requests.", "Then cost: with the GPU this idle, fewer replicas serve the same load."))
    other.summary = "Latency is set by per-request overhead, not by the GPU."
    queue = make("queueing", service="elsewhere2", advice=("more replicas, or autoscaling on queue depth",))
    incs = group([brake, other, queue])
    assert [i.kind for i in incs] == ["gpu_clock_cut", "latency_bound_low_utilization", "queueing"]
    # the later incident's "more replicas" is dropped: the earlier one said "fewer replicas" over that window
    assert len(incs[1].advice) == 2 and incs[2].advice == [] and incs[2].advice_dropped
    # a summary is never dropped: the check over the final report still names what is left
    assert opposite_pairs(voices(incs)) == ["not the GPU vs the GPU slowed: incident 2 (latency_bound_low_utilization) / incident 1 (gpu_clock_cut)"]


def test_for_job_keeps_that_jobs_incidents_and_the_gpu_incidents_that_hit_it() -> None:
    xid = make("gpu_xid", 100, 100)
    errors = make("error_rate", service="s")
    mine = make("input_bound", 300, 400, job="j")
    theirs = make("input_bound", 300, 400, job="k")
    serving = make("queueing", 300, 400, service="t")
    incs = for_job(group([xid, errors, mine, theirs, serving]), "j")
    assert [i.kind for i in incs] == ["gpu_xid", "input_bound"]
    assert incs[0].symptoms == [] and incs[1].cause is mine


def test_the_impact_line_compares_latency_of_successful_requests_only() -> None:
    """After an XID, requests that fail in 5 ms must not read as a p99 drop: failures are counted apart."""
    from gpulens.diagnose.gpu_workloads import Occupant, serving_impact
    from gpulens.reader.answers import EventRow

    def req(t: float, latency: float, status: str = "ok") -> EventRow:
        return EventRow(t, "request", {"service": "s"}, {"arrival": t, "end": t + latency, "status": status})

    rows = [req(float(t), 1.0 + 0.01 * (t % 7)) for t in range(0, 60)]
    rows += [req(61 + i * 0.02, 0.005, "error") for i in range(1000)] + [req(float(t), 1.0 + 0.01 * (t % 7)) for t in range(61, 90, 4)]

    class Reader:
        def event_rows(self, kind, start=None, end=None, match=None):
            return [e for e in rows if (start is None or e.t >= start) and (end is None or e.t <= end)]

    imp = serving_impact(Reader(), Occupant("serving", {"service": "s"}), 60.5, 60.5, "XID 79", True)  # type: ignore[arg-type]
    assert imp.failed_requests_after_start == 1000
    assert imp.p99_latency_change_ratio is not None and abs(imp.p99_latency_change_ratio) < 0.10
    assert "1000 failed" in imp.sentence and "p99 -" not in imp.sentence
