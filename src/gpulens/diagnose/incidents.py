"""Incidents: the flat findings of `diagnose()` grouped into one root cause and the symptoms it
explains, by the rules of diagnose.explain, so a report is an account of what happened rather than
a list of detectors' opinions.

An incident has one span (its members'), one severity and one ordered advice list (its cause's; a
symptom's advice never appears: it would treat the symptom). The severity is the worst of its
members: the cause's own severity rates the condition (a clock cut is a warning), the symptoms rate
what it did (a missed SLO is critical), and the reader triages by what it did. Every member carries
that one severity, so one event reads the same everywhere.

    incidents = group(diagnose(store))
    json = [d for inc in incidents for d in inc.finding_dicts()]   # the flat list, with ids and roles
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from gpulens.diagnose.base import Finding, Severity
from gpulens.diagnose.evidence import evidence_label, format_value, missed_text
from gpulens.diagnose.explain import RULES, Rule, Voice, contradicts, explains, ranks_of, workloads_of
from gpulens.vocab.names import TRAIN_JOB_LABEL

SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}
Role = Literal["cause", "symptom"]


@dataclass
class Symptom:
    finding: Finding
    explained_by: Finding  # the cause itself, or a symptom of it (a chain: GPU → straggler → waiting ranks)
    rule: Rule


@dataclass
class Incident:
    id: int
    cause: Finding
    symptoms: list[Symptom] = field(default_factory=list)
    severity: Severity = "info"
    advice: list[str] = field(default_factory=list)
    explanation: list[str] = field(default_factory=list)  # one sentence per symptom group: what explains what
    advice_dropped: list[str] = field(default_factory=list)  # advice lines an earlier incident contradicts

    @property
    def kind(self) -> str:
        return self.cause.kind

    @property
    def members(self) -> list[Finding]:
        return [self.cause, *(s.finding for s in self.symptoms)]

    @property
    def start(self) -> float:
        return min(f.start for f in self.members)

    @property
    def end(self) -> float:
        return max(f.end for f in self.members)

    @property
    def workloads(self) -> list[str]:
        return sorted(set().union(*(workloads_of(f) for f in self.members)))

    @property
    def summary(self) -> str:
        return " ".join([self.cause.summary, *self.explanation])

    def finding_dicts(self) -> list[dict[str, Any]]:
        """The members as today's finding dicts, each with `incident` and `role` (the JSON edge)."""
        d = self.cause.to_dict()
        d.update(severity=self.severity, summary=self.summary, advice=list(self.advice), incident=self.id, role="cause")
        out = [d]
        for s in self.symptoms:
            sd = s.finding.to_dict()
            sd.update(severity=self.severity, summary=symptom_sentence(s), advice=[], incident=self.id, role="symptom",
                      explained_by={"kind": s.explained_by.kind, "rule": s.rule.name})
            out.append(sd)
        return out


# ------------------------------------------------------------------ grouping
def _explainer(findings: list[Finding], i: int) -> tuple[int, Rule] | None:
    """The finding that explains findings[i]: from the first rule that has one, the one diagnose()
    lists first (GPU faults, then GPU conditions, then workloads: the deepest cause)."""
    f = findings[i]
    for rule in RULES:
        cands = [j for j, c in enumerate(findings) if j != i and explains(rule, c, f)]
        if cands:
            return cands[0], rule
    return None


def root(parent: dict[int, tuple[int, Rule]], i: int) -> int:
    while i in parent:
        i = parent[i][0]
    return i


def group(findings: list[Finding]) -> list[Incident]:
    """Group findings into incidents, in the order of their causes in `findings` (diagnose() lists
    GPU faults, then GPU conditions, then workload findings, oldest first)."""
    parent: dict[int, tuple[int, Rule]] = {}
    for i in range(len(findings)):
        e = _explainer(findings, i)
        if e is not None and root(parent, e[0]) != i:  # never close a cycle of explanations
            parent[i] = e
    roots = {i: root(parent, i) for i in range(len(findings))}
    incidents: dict[int, Incident] = {}
    for i in sorted(set(roots.values())):
        incidents[i] = Incident(0, findings[i])
    for i in range(len(findings)):
        if roots[i] != i:
            j, rule = parent[i]
            incidents[roots[i]].symptoms.append(Symptom(findings[i], findings[j], rule))
    out = list(incidents.values())
    for n, inc in enumerate(out, 1):
        inc.id = n
        inc.severity = max((f.severity for f in inc.members), key=lambda s: SEVERITY_RANK.get(s, 0))
        inc.advice = list(inc.cause.advice)
        inc.explanation = explanation(inc)
    one_voice(out)
    return out


def one_voice(incidents: list[Incident]) -> None:
    """Drop an advice line that says the opposite of what an earlier incident over an overlapping
    window says (the report leads with faults and GPU conditions, so those keep their word)."""
    said: list[Voice] = []
    for inc in incidents:
        earlier = [v.text for v in said if v.start <= inc.end and inc.start <= v.end]
        kept = [a for a in inc.advice if not contradicts(a, earlier)]
        inc.advice_dropped = [a for a in inc.advice if a not in kept]
        inc.advice = kept
        said += [Voice(str(inc.id), inc.start, inc.end, t) for t in (inc.summary, *inc.advice)]


def voices(incidents: list[Incident]) -> list[Voice]:
    """What the final report says, incident by incident, for `explain.opposite_pairs`."""
    return [Voice(f"incident {inc.id} ({inc.kind})", inc.start, inc.end, t) for inc in incidents
            for t in (inc.summary, *inc.advice, *(symptom_sentence(s) for s in inc.symptoms))]


def for_job(incidents: list[Incident], job: str) -> list[Incident]:
    """`diagnose --job J`: that job's incidents and the GPU incidents that hit it, with no inference
    finding and no other job's symptom."""
    out = []
    for inc in incidents:
        if inc.cause.workload == "inference" or not any(j == job for f in inc.members for j, _ in ranks_of(f)):
            continue
        inc.symptoms = [s for s in inc.symptoms if s.finding.workload == "gpu"
                        or (s.finding.workload == "training" and s.finding.labels.get(TRAIN_JOB_LABEL) == job)]
        inc.explanation = explanation(inc)
        out.append(inc)
    return out


# ------------------------------------------------------------------ the text
def _join(xs: list[str]) -> str:
    return xs[0] if len(xs) == 1 else ", ".join(xs[:-1]) + " and " + xs[-1]


def who(fs: list[Finding]) -> str:
    """The place a group of findings names, e.g. `ranks 0, 1 and 3 of job llama-ft`, `service chat`."""
    ranks = sorted({(f.labels.get(TRAIN_JOB_LABEL, ""), str(f.labels.get("rank", "0"))) for f in fs if f.workload == "training"})
    if ranks and len({j for j, _ in ranks}) == 1 and len(ranks) == len(fs):
        rs = [r for _, r in ranks]
        return f"rank{'s' if len(rs) > 1 else ''} {_join(rs)} of job {ranks[0][0]}"
    names = []
    for f in fs:
        g = f.labels.get("gpu")
        if f.workload == "gpu" and g not in (None, ""):
            names.append(f"GPU {g}" + (f" on {f.labels['host']}" if f.labels.get("host") else ""))
        else:
            names += sorted(workloads_of(f)) or [f.workload]
    return _join(list(dict.fromkeys(names)))


def _ev(f: Finding, key: str) -> str | None:
    v = f.evidence.get(key)
    return None if v is None else format_value(v)


def measure(f: Finding) -> str:
    """What the finding measured, in a few words, without its own guess at the cause."""
    ev = f.evidence
    if f.kind == "slo_violation" and ev.get("missed"):  # each objective and by how much: a list, which `shown` skips
        return f"missed {missed_text(ev['missed'])}" + (f" over {_ev(f, 'requests')} requests" if ev.get("requests") else "")
    if f.kind == "comm_bound" and isinstance(ev.get("comm_wait_share"), float) and isinstance(ev.get("median_step_seconds"), float):
        return f"wait {format_value(type(ev['median_step_seconds'])(ev['comm_wait_share'] * ev['median_step_seconds']))} a step ({_ev(f, 'comm_wait_share')} of it)"
    shown = [(evidence_label(k, v), format_value(v)) for k, v in ev.items() if isinstance(v, int | float | str)
             and not isinstance(v, bool) and k not in ("uuid", "model", "host")][:3]
    words = f.kind.replace("_", " ")
    return words + (" (" + ", ".join(f"{k} {v}" for k, v in shown) + ")" if shown else "")


def describe(f: Finding) -> str:
    """A finding as the thing that explains another, e.g. `GPU 2 on replay, whose clocks were cut to 1,100 MHz (hw thermal)`."""
    where = who([f])
    reason = str(f.evidence.get("reason", "")).replace("_", " ")
    why = f" ({reason})" if reason else ""
    clock, temp, slow = _ev(f, "sm_clock_during_hz"), _ev(f, "temperature_max_celsius"), _ev(f, "slow_vs_others")
    if f.kind == "gpu_clock_cut":
        return f"{where}, whose clocks were cut" + (f" to {clock}" if clock else "") + why
    if f.kind == "gpu_temperature_high":
        return f"{where}, running hot" + (f" at {temp}" if temp else "")
    if f.kind == "throttled":
        return f"the GPU of {where} lowering its clocks{why}"
    if f.kind == "straggler":
        return f"{where}, the straggler" + (f" ({slow} the others' work a step)" if slow else "")
    if f.kind == "gpu_xid" and _ev(f, "xid"):
        return f"XID {_ev(f, 'xid')} on {where}"
    return f"{f.kind.replace('_', ' ')} on {where}"


def symptom_sentence(s: Symptom) -> str:
    return f"{who([s.finding])[:1].upper()}{who([s.finding])[1:]}: {measure(s.finding)}, {s.rule.verb} {describe(s.explained_by)}."


def explanation(inc: Incident) -> list[str]:
    """One sentence per group of symptoms of one kind explained alike: what explains what."""
    groups: dict[tuple[str, int, str], list[Symptom]] = {}
    for s in inc.symptoms:
        groups.setdefault((s.finding.kind, id(s.explained_by), s.rule.name), []).append(s)
    out = []
    for ss in groups.values():
        w = who([s.finding for s in ss])
        out.append(f"{w[:1].upper()}{w[1:]}: {measure(ss[0].finding)}, {ss[0].rule.verb} {describe(ss[0].explained_by)}.")
    return out
