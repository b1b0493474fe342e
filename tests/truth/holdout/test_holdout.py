"""The held-out truth set: every case's Done-when (issue 23), scored by tests/truth/scorer.py's rules.

Made apart from the implementation (tests/truth/holdout/README.md): nothing here is tuned on. A case
today's diagnose fails is xfail(strict=True) with what is missing, as in the dev suite; the day it
passes the mark fails the run and must go. Only a missed Done-when (an AssertionError) is the
expected failure; a replay or diagnose that crashes fails the run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from truth import scorer
from truth.holdout import holdout_scorer

# What today's diagnose lacks, per held-out case (issue 23's items). A case that is not here must pass.
MISSING: dict[str, str] = {}
# Cases whose right answer carries advice the scorer does not read: the CONTRADICTIONS pair and the side (0: A, 1: B) it must say.
ADVICE_STANDS = {"code_regression_every_rank": ("roll back vs hardware cause", 0)}  # side 0: A (roll back)
MAX_BYTES = 3_100_000


def _params(names: list[str], missing: dict[str, str]) -> list:
    return [pytest.param(c, marks=[pytest.mark.xfail(strict=True, raises=AssertionError, reason=f"issue 23: {missing[c]}")] if c in missing else [],
                         id=c) for c in names]


@pytest.mark.parametrize("case", _params(holdout_scorer.case_names(), MISSING))
def test_holdout_case_meets_its_done_when(case: str, tmp_path: Path) -> None:
    """Every planted incident found with cause and place, nothing on a healthy recording, joins
    exact, no contradictory advice, no symptom reported as a cause."""
    truth, findings = holdout_scorer.run_case(case, workdir=tmp_path)
    s = scorer.score(truth, findings)
    if truth["healthy"]:
        assert not findings, f"{case} is healthy, yet: " + "; ".join(f"{f['kind']}: {f['summary']}" for f in findings)
    assert not s.problems(), f"{case}: " + "; ".join(s.problems())


@pytest.mark.parametrize("case", list(ADVICE_STANDS))
def test_right_advice_is_not_suppressed(case: str, tmp_path: Path) -> None:
    """A real code regression on healthy GPUs keeps its rollback advice (one voice must not mean silence)."""
    truth, findings = holdout_scorer.run_case(case, workdir=tmp_path)
    name, side = ADVICE_STANDS[case]
    pattern = next(p for p in scorer.CONTRADICTIONS if p[0] == name)[1 + side]
    assert any(re.search(pattern, " ".join(map(str, f.get("advice") or [])), re.I) for f in findings), f"{case}: no advice says {pattern!r}"


def test_every_case_is_known_and_held_apart() -> None:
    """MISSING names only held-out cases; no held-out case shares a name with a dev case; the set holds
    at least 14 cases, healthy ones of each kind among them."""
    names = set(holdout_scorer.case_names())
    assert set(MISSING) <= names and set(ADVICE_STANDS) <= names
    assert len(names) >= 14
    assert names.isdisjoint(scorer.case_names())
    healthy = [c for c in names if holdout_scorer.load_truth(c)["healthy"]]
    texts = [(holdout_scorer.CASES / c / "events.jsonl").read_text(encoding="utf-8") for c in healthy]
    assert any('"kind":"train_step"' in t for t in texts) and any('"kind":"request"' in t for t in texts)


def test_truth_files_are_complete() -> None:
    """Each planted incident states its cause kinds, place (with a locating key), span and the workloads it hit."""
    for case in holdout_scorer.case_names():
        truth = holdout_scorer.load_truth(case)
        assert truth["case"] == case and truth["healthy"] == (not truth["incidents"]) and truth["made"], case
        for p in truth["incidents"]:
            assert p["cause_kinds"] and p["span"][0] <= p["span"][1], (case, p["id"])
            assert any(k in p["place"] for k in scorer.LOCATING_KEYS), (case, p["id"])
            assert set(p["place"]) <= set(scorer.PLACE_KEYS), (case, p["id"])
            assert isinstance(p["workloads"], list) and set(p["symptoms"]).isdisjoint(p["cause_kinds"]), (case, p["id"])


def test_the_set_stays_small() -> None:
    size = sum(p.stat().st_size for p in holdout_scorer.CASES.rglob("*") if p.is_file())
    assert size <= MAX_BYTES, f"the held-out set is {size / 1e6:.2f} MB"


def test_committed_cases_are_the_generators_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recordings and truth files in git are what make_holdout.py writes: the truth cannot drift
    from the plan it was written from (rebuild with `python tests/truth/holdout/make_holdout.py`)."""
    from truth.holdout import make_holdout

    monkeypatch.setattr(make_holdout, "CASES", tmp_path)
    for make in make_holdout.ALL:
        make()
    built = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    committed = sorted(p.relative_to(holdout_scorer.CASES) for p in holdout_scorer.CASES.rglob("*") if p.is_file())
    assert built == committed
    changed = [str(p) for p in built if (tmp_path / p).read_bytes() != (holdout_scorer.CASES / p).read_bytes()]
    assert not changed, f"rebuild the held-out cases: {changed}"
