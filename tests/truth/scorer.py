"""Score `gpulens diagnose` against the truth suite (tests/truth/cases/NAME/truth.json).

Each case is replayed into a fresh store with the CLI, diagnosed with `--format json`, and the
report is compared with the truth written when the recording was made:
- recall: planted incidents found with a cause kind the truth accepts, at its place, overlapping its span;
- precision: reported incidents whose cause matches a planted incident (split by severity);
- join accuracy: of the matched incidents, those whose workloads named equal the truth's exactly;
- contradictions: two pieces of advice pointing opposite ways over overlapping windows (CONTRADICTIONS);
- symptom-as-cause: a kind the truth lists as a symptom of an incident, reported as its own cause
  (or a symptom that brings its own advice).

Two report shapes are read. Today's: a flat list of findings, each its own incident. The
incidents shape: a finding may carry `"incident": <id>` and `"role": "cause" | "symptom"`; findings
sharing an id form one incident whose cause is the one with role cause.

    python tests/truth/scorer.py [--case NAME]
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CASES = HERE / "cases"
SLACK_SECONDS = 10.0  # a reported span may start or end this far from the planted one
LOCATING_KEYS = ("gpu", "rank", "service")  # at least one must agree for a place to match
PLACE_KEYS = ("host", "gpu", "train_job", "rank", "service")

# Opposite advice: (name, side A, side B), matched on the stable words of a finding's summary and
# advice. A report that carries both sides over overlapping windows contradicts itself.
CONTRADICTIONS: tuple[tuple[str, str, str], ...] = (
    ("fewer vs more replicas", r"(?<!not )fewer replicas", r"more replicas|add replicas|more capacity"),
    ("not the GPU vs the GPU slowed", r"not by the GPU|not the GPU", r"power brake|thermal slowdown|clocks of GPU \S+( on \S+)? were cut|lowered its clocks"),
    ("roll back vs hardware cause", r"roll it back|roll back|rollback", r"report (it|the node) to (the|its) operators|check cooling|RMA the GPU|power suppl"),
    ("raise the batch vs shrink it", r"raise the batch size", r"smaller micro-batch"),
)


@dataclass
class Incident:
    """One reported incident: its cause finding and the findings it explains."""

    cause: dict[str, Any]
    members: list[dict[str, Any]]

    @property
    def kind(self) -> str:
        return str(self.cause.get("kind", ""))

    @property
    def severity(self) -> str:
        return str(self.cause.get("severity", ""))

    @property
    def start(self) -> float:
        return min(float(f.get("start", 0.0)) for f in self.members)

    @property
    def end(self) -> float:
        return max(float(f.get("end", 0.0)) for f in self.members)


def incidents_of(findings: list[dict[str, Any]]) -> list[Incident]:
    """Group a report: findings that share an `incident` id form one incident, others stand alone."""
    groups: dict[Any, list[dict[str, Any]]] = {}
    alone: list[Incident] = []
    for f in findings:
        if f.get("incident") is None:
            alone.append(Incident(f, [f]))
        else:
            groups.setdefault(f["incident"], []).append(f)
    grouped = [Incident(next((f for f in fs if f.get("role") == "cause"), fs[0]), fs) for fs in groups.values()]
    return sorted(alone + grouped, key=lambda i: (i.start, i.kind))


def workloads_of(f: dict[str, Any]) -> set[str]:
    """Workloads a finding names: its impact list (GPU findings), else its labels."""
    ev = f.get("evidence") or {}
    for key in ("workloads_hit", "workload_impact"):
        if isinstance(ev.get(key), list):
            return {str(x["workload"] if isinstance(x, dict) else x) for x in ev[key]}
    labels = f.get("labels") or {}
    out = set()
    if labels.get("train_job"):
        out.add(f"job {labels['train_job']} rank {labels.get('rank', '0')}")
    if labels.get("service"):
        out.add(f"service {labels['service']}")
    return out


def _overlaps(a0: float, a1: float, b0: float, b1: float, slack: float = SLACK_SECONDS) -> bool:
    return a0 <= b1 + slack and a1 >= b0 - slack


def place_matches(labels: dict[str, Any], place: dict[str, str]) -> bool:
    """Every place key the finding also carries agrees, and one locating key (gpu, rank, service) does."""
    labels = {k: str(v) for k, v in (labels or {}).items()}
    shared = [k for k in PLACE_KEYS if k in labels and k in place]
    if any(labels[k] != place[k] for k in shared):
        return False
    return any(k in shared for k in LOCATING_KEYS)


def cause_matches(inc: Incident, planted: dict[str, Any]) -> bool:
    if inc.kind not in planted["cause_kinds"]:
        return False
    if not place_matches(inc.cause.get("labels") or {}, planted["place"]):
        return False
    if not _overlaps(inc.start, inc.end, *planted["span"]):
        return False
    text = str(inc.cause.get("summary", "")) + json.dumps(inc.cause.get("evidence") or {})
    return all(word in text for word in planted.get("must_mention", []))


def _in_affected(f: dict[str, Any], planted: dict[str, Any]) -> bool:
    labels = f.get("labels") or {}
    aff = planted.get("affects") or {}
    return (labels.get("train_job") in aff.get("jobs", []) or labels.get("service") in aff.get("services", [])
            or (bool(planted["place"].get("gpu")) and str(labels.get("gpu")) == planted["place"]["gpu"] and f.get("workload") == "gpu"))


def _texts(f: dict[str, Any]) -> str:
    return " ".join([str(f.get("summary", "")), *map(str, f.get("advice") or [])])


def contradictions(findings: list[dict[str, Any]]) -> list[str]:
    """Pairs of opposite advice over overlapping windows, named `pair: kind A / kind B`."""
    out = []
    for name, a, b in CONTRADICTIONS:
        sa = [f for f in findings if re.search(a, _texts(f), re.I)]
        sb = [f for f in findings if re.search(b, _texts(f), re.I)]
        hits = {f"{name}: {x['kind']} / {y['kind']}" for x in sa for y in sb
                if _overlaps(float(x["start"]), float(x["end"]), float(y["start"]), float(y["end"]), 0.0)}
        out.extend(sorted(hits))
    return out


@dataclass
class CaseScore:
    case: str
    planted: int = 0
    found: int = 0
    reported: int = 0
    correct: int = 0
    by_severity: dict[str, list[int]] = field(default_factory=dict)  # severity -> [reported, correct]
    joins_checked: int = 0
    joins_exact: int = 0
    duplicates: int = 0  # reported incidents beyond the first for one planted incident
    contradictions: list[str] = field(default_factory=list)
    symptom_as_cause: list[str] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)
    wrong_joins: list[str] = field(default_factory=list)
    false: list[str] = field(default_factory=list)  # reported incidents that match nothing planted
    one_incident_broken: bool = False

    @property
    def recall(self) -> float | None:
        return self.found / self.planted if self.planted else None

    @property
    def precision(self) -> float | None:
        return self.correct / self.reported if self.reported else None

    @property
    def join_accuracy(self) -> float | None:
        return self.joins_exact / self.joins_checked if self.joins_checked else None

    def problems(self) -> list[str]:
        """What keeps this case from its Done-when; empty when it passes."""
        out = [f"missed {m}" for m in self.missed]
        out += [f"wrong join {w}" for w in self.wrong_joins]
        out += [f"unexplained finding {x}" for x in self.false]
        out += [f"contradiction {c}" for c in self.contradictions]
        out += [f"symptom as cause {s}" for s in self.symptom_as_cause]
        if self.duplicates:
            out.append(f"{self.duplicates} duplicate incident(s) for one cause")
        if self.one_incident_broken:
            out.append(f"should read as one incident, reads as {self.reported}")
        return out


def score(truth: dict[str, Any], findings: list[dict[str, Any]]) -> CaseScore:
    """Compare one report (a list of finding dicts, flat or with incidents) with one truth."""
    s = CaseScore(truth["case"], planted=len(truth["incidents"]))
    incs = incidents_of(findings)
    s.reported = len(incs)
    matched_by: dict[str, int] = {}
    for inc in incs:
        hit = next((p for p in truth["incidents"] if cause_matches(inc, p)), None)
        sev = s.by_severity.setdefault(inc.severity, [0, 0])
        sev[0] += 1
        if hit is not None:
            s.correct += 1
            sev[1] += 1
            matched_by[hit["id"]] = matched_by.get(hit["id"], 0) + 1
            if matched_by[hit["id"]] == 1:
                s.joins_checked += 1
                named = workloads_of(inc.cause)
                if named == set(hit["workloads"]):
                    s.joins_exact += 1
                else:
                    s.wrong_joins.append(f"{hit['id']}: named {sorted(named)}, truth {hit['workloads']}")
            for m in inc.members:
                if m is not inc.cause and m.get("advice"):
                    s.symptom_as_cause.append(f"{m.get('kind')} (a symptom of {hit['id']}) brings its own advice")
            continue
        sym = next((p for p in truth["incidents"] if inc.kind in p.get("symptoms", []) and _overlaps(inc.start, inc.end, *p["span"])
                    and _in_affected(inc.cause, p)), None)
        if sym is not None:
            s.symptom_as_cause.append(f"{inc.kind} {_where(inc.cause)} (a symptom of {sym['id']})")
        else:
            s.false.append(f"{inc.kind} {_where(inc.cause)}")
    for p in truth["incidents"]:
        if p["id"] not in matched_by:
            s.missed.append(f"{p['id']} ({p['root_cause']}, one of {', '.join(p['cause_kinds'][:3])})")
            continue
        s.found += 1
        s.duplicates += matched_by[p["id"]] - 1
        if p.get("also_reported") and not any(f.get("kind") in p["also_reported"] and place_matches(f.get("labels") or {}, p["place"])
                                               for f in findings):
            s.found -= 1
            s.missed.append(f"{p['id']}: nothing of {', '.join(p['also_reported'][:2])}... reports the silence")
    s.one_incident_broken = bool(truth.get("one_incident")) and s.reported != 1
    s.contradictions = contradictions(findings)
    return s


def _where(f: dict[str, Any]) -> str:
    labels = f.get("labels") or {}
    return "(" + ", ".join(f"{k}={labels[k]}" for k in PLACE_KEYS if labels.get(k) not in (None, "")) + ")"


# ------------------------------------------------------------------ running a case
def load_truth(case: str) -> dict[str, Any]:
    return json.loads((CASES / case / "truth.json").read_text(encoding="utf-8"))


def case_names() -> list[str]:
    return sorted(p.name for p in CASES.iterdir() if (p / "truth.json").is_file())


def _gpulens(args: list[str]) -> str:
    """Run the CLI's entry point in this process (as `gpulens ARGS`) and return what it printed."""
    import contextlib
    import io

    from gpulens.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(args))
    if rc != 0:
        raise RuntimeError(f"`gpulens {' '.join(args)}` failed ({rc}): {err.getvalue().strip()[-500:]}")
    return out.getvalue()


def run_case(case: str, workdir: Path | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Replay the case into a new store with the CLI and diagnose it: (truth, findings)."""
    truth = load_truth(case)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        store = str(Path(tmp) / "truth.db")
        _gpulens(["replay", str(CASES / case), "--store", store, *truth["replay_args"]])
        out = _gpulens(["diagnose", "--store", store, "--format", "json", *truth["diagnose_args"]])
    return truth, json.loads(out)


# ------------------------------------------------------------------ the table
def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def table(scores: list[CaseScore]) -> str:
    """A Markdown table: one row per case, then the totals over every case."""
    rows = ["| case | planted | found | recall | reported | correct | precision | info / warning / critical (correct of reported) | joins exact | contradictions | symptom as cause | duplicates |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]

    def sev(by: dict[str, list[int]]) -> str:
        return " / ".join(f"{by.get(k, [0, 0])[1]} of {by.get(k, [0, 0])[0]}" for k in ("info", "warning", "critical"))

    total = CaseScore("**total**")
    for s in scores:
        rows.append(f"| {s.case} | {s.planted} | {s.found} | {_pct(s.recall)} | {s.reported} | {s.correct} | {_pct(s.precision)} | {sev(s.by_severity)} "
                    f"| {s.joins_exact} of {s.joins_checked} | {len(s.contradictions)} | {len(s.symptom_as_cause)} | {s.duplicates} |")
        for k in ("planted", "found", "reported", "correct", "joins_checked", "joins_exact", "duplicates"):
            setattr(total, k, getattr(total, k) + getattr(s, k))
        for k, (n, c) in s.by_severity.items():
            t = total.by_severity.setdefault(k, [0, 0])
            t[0], t[1] = t[0] + n, t[1] + c
        total.contradictions += s.contradictions
        total.symptom_as_cause += s.symptom_as_cause
    rows.append(f"| {total.case} | {total.planted} | {total.found} | {_pct(total.recall)} | {total.reported} | {total.correct} | {_pct(total.precision)} "
                f"| {sev(total.by_severity)} | {total.joins_exact} of {total.joins_checked} ({_pct(total.join_accuracy)}) | {len(total.contradictions)} "
                f"| {len(total.symptom_as_cause)} | {total.duplicates} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Score gpulens diagnose on the truth suite.")
    ap.add_argument("--case", action="append", help="only this case (repeatable); default: every case")
    ap.add_argument("--why", action="store_true", help="also list what keeps each case from passing")
    args = ap.parse_args(argv)
    scores = []
    for case in args.case or case_names():
        truth, findings = run_case(case)
        scores.append(score(truth, findings))
    print(table(scores))
    if args.why:
        for s in scores:
            print(f"\n{s.case}: " + ("passes" if not s.problems() else "; ".join(s.problems())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
