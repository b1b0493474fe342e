"""The truth suite: every case's Done-when (issue 23), and the scorer's own ability to fail.

A case today's diagnose fails is marked xfail(strict=True) with what is missing: the day it passes,
the mark fails the run and must go. Only a missed Done-when (an AssertionError) counts as the
expected failure; a replay or diagnose that crashes fails the run. Cases today's code passes carry
no mark.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from truth import scorer

# What today's diagnose lacks, per case (issue 23's items). A case that is not here must pass.
MISSING: dict[str, str] = {}


def _params() -> list:
    out = []
    for case in scorer.case_names():
        marks = [pytest.mark.xfail(strict=True, raises=AssertionError, reason=f"issue 23: {MISSING[case]}")] if case in MISSING else []
        out.append(pytest.param(case, marks=marks, id=case))
    return out


@pytest.mark.parametrize("case", _params())
def test_case_meets_its_done_when(case: str, tmp_path: Path) -> None:
    """Every planted incident found with cause and place, nothing on a healthy recording, joins
    exact, no contradictory advice, no symptom reported as a cause."""
    truth, findings = scorer.run_case(case, workdir=tmp_path)
    s = scorer.score(truth, findings)
    if truth["healthy"]:
        assert not findings, f"{case} is healthy, yet: " + "; ".join(f"{f['kind']}: {f['summary']}" for f in findings)
    assert not s.problems(), f"{case}: " + "; ".join(s.problems())


def test_every_case_is_known() -> None:
    """MISSING names only cases that exist, and the suite holds the cases issue 23 asks for."""
    names = set(scorer.case_names())
    assert set(MISSING) <= names
    assert len(names) >= 15
    assert {"healthy_training", "healthy_serving", "healthy_training_and_serving"} <= names


def test_truth_files_are_complete() -> None:
    """Each planted incident states its cause kinds, place, span and the workloads it hit."""
    for case in scorer.case_names():
        truth = scorer.load_truth(case)
        assert truth["healthy"] == (not truth["incidents"]), case
        for p in truth["incidents"]:
            assert p["cause_kinds"] and p["place"] and p["span"][0] <= p["span"][1], (case, p["id"])
            assert isinstance(p["workloads"], list) and set(p["symptoms"]).isdisjoint(p["cause_kinds"]), (case, p["id"])


# ------------------------------------------------------------------ the scorer can fail
def _truth() -> dict:
    return scorer.load_truth("straggler_thermal_gpu")


def _finding(kind: str, labels: dict, start: float, end: float, *, severity: str = "warning", advice=(), summary: str = "", evidence=None) -> dict:
    return {"kind": kind, "workload": "gpu" if kind.startswith("gpu_") else "training", "start": start, "end": end, "severity": severity,
            "summary": summary, "evidence": evidence or {}, "advice": list(advice), "labels": labels}


def _right_answer(t: dict) -> list[dict]:
    p = t["incidents"][0]
    a, b = p["span"]
    return [_finding("gpu_clock_cut", {"host": "replay", "gpu": "2", "train_job": "llama-ft", "rank": "2"}, a, b,
                     summary="The clocks of GPU 2 on replay were cut for hw_thermal.", advice=["Check cooling first."],
                     evidence={"workload_impact": [{"workload": "job llama-ft rank 2"}]})]


def test_scorer_passes_the_right_answer() -> None:
    s = scorer.score(_truth(), _right_answer(_truth()))
    assert s.problems() == [] and s.recall == 1.0 and s.precision == 1.0 and s.join_accuracy == 1.0


def test_scorer_catches_planted_wrong_answers() -> None:
    t = _truth()
    a, b = t["incidents"][0]["span"]
    right = _right_answer(t)

    wrong_gpu = copy.deepcopy(right)
    wrong_gpu[0]["labels"].update(gpu="1", rank="1")
    s = scorer.score(t, wrong_gpu)
    assert s.recall == 0.0 and s.precision == 0.0 and any("missed thermal-gpu2" in x for x in s.problems())

    wrong_kind = copy.deepcopy(right)
    wrong_kind[0]["kind"] = "gpu_memory_full"
    assert scorer.score(t, wrong_kind).recall == 0.0

    too_late = copy.deepcopy(right)
    too_late[0]["start"], too_late[0]["end"] = b + 600, b + 700
    assert scorer.score(t, too_late).recall == 0.0

    wrong_join = copy.deepcopy(right)
    wrong_join[0]["evidence"]["workload_impact"].append({"workload": "job llama-ft rank 3"})
    s = scorer.score(t, wrong_join)
    assert s.recall == 1.0 and s.join_accuracy == 0.0 and s.problems()

    symptom = right + [_finding("comm_bound", {"host": "replay", "train_job": "llama-ft", "rank": "0"}, a, b, advice=["Tune DDP bucket_cap_mb."])]
    s = scorer.score(t, symptom)
    assert len(s.symptom_as_cause) == 1 and s.precision == 0.5 and s.one_incident_broken

    duplicate = right + [_finding("throttled", {"host": "replay", "train_job": "llama-ft", "rank": "2"}, a, b, severity="critical")]
    s = scorer.score(t, duplicate)
    assert s.duplicates == 1 and s.by_severity == {"warning": [1, 1], "critical": [1, 1]} and s.problems()


def test_scorer_catches_contradictory_advice() -> None:
    t = _truth()
    a, b = t["incidents"][0]["span"]
    rollback = _right_answer(t) + [_finding("step_time_regression", {"train_job": "llama-ft", "rank": "2"}, a, b,
                                            advice=["If a recent change caused it, roll it back and re-measure."])]
    hardware = [dict(rollback[0], advice=["Report the node to its operators."])] + rollback[1:]
    assert scorer.contradictions(hardware) == ["roll back vs hardware cause: step_time_regression / gpu_clock_cut"]
    replicas = [_finding("latency_bound_low_utilization", {"service": "chat"}, a, b, advice=["Then cost: fewer replicas serve the same load."]),
                _finding("queueing", {"service": "chat"}, a + 5, b, advice=["More capacity: more replicas."])]
    assert any(c.startswith("fewer vs more replicas") for c in scorer.contradictions(replicas))
    not_yet = [dict(replicas[0], advice=["Then cost, but not fewer replicas yet."]), replicas[1]]
    assert not scorer.contradictions(not_yet)
    apart = [replicas[0], dict(replicas[1], start=b + 100, end=b + 200)]
    assert not scorer.contradictions(apart)


def test_scorer_reads_incidents() -> None:
    """The incidents shape: one cause and its symptoms under one id pass; a symptom with advice does not."""
    t = _truth()
    a, b = t["incidents"][0]["span"]
    cause = dict(_right_answer(t)[0], incident="i1", role="cause")
    waits = [_finding("comm_bound", {"train_job": "llama-ft", "rank": r}, a, b) | {"incident": "i1", "role": "symptom"} for r in ("0", "1", "3")]
    s = scorer.score(t, [cause, *waits])
    assert s.problems() == [] and s.reported == 1
    chatty = [cause, dict(waits[0], advice=["Tune DDP bucket_cap_mb."]), *waits[1:]]
    assert scorer.score(t, chatty).symptom_as_cause


def test_scorer_flags_findings_on_a_healthy_case() -> None:
    t = scorer.load_truth("healthy_training")
    f = _finding("underutilized", {"train_job": "h200-demo", "rank": "0"}, 0.0, 1.0)
    s = scorer.score(t, [f])
    assert s.false and s.precision == 0.0


def test_committed_cases_are_the_generators_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recordings and truth files in git are what make_cases.py writes: the truth cannot drift
    from the plan it was written from (rebuild with `python tests/truth/make_cases.py`)."""
    from truth import make_cases

    monkeypatch.setattr(make_cases, "CASES", tmp_path)
    for make in make_cases.ALL:
        make()
    built = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    committed = sorted(p.relative_to(scorer.CASES) for p in scorer.CASES.rglob("*") if p.is_file())
    assert built == committed
    changed = [str(p) for p in built if (tmp_path / p).read_bytes() != (scorer.CASES / p).read_bytes()]
    assert not changed, f"rebuild the cases: {changed}"
