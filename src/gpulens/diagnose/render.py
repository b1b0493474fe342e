"""`gpulens diagnose` as text: the incidents in the order to work on them, each cause first with its
evidence and advice, the symptoms it explains folded under it. Names and summaries come from stores and users, so they are printed as text, never markup."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from gpulens.diagnose.base import Finding
from gpulens.diagnose.evidence import evidence_label, format_value
from gpulens.diagnose.incidents import Incident
from gpulens.vocab.names import TRAIN_JOB_LABEL
from gpulens.vocab.time import format_span, format_when

SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
WHO_LABELS = (TRAIN_JOB_LABEL, "rank", "service", "gpu", "host")


def _shown(v: Any) -> bool:
    """Nested detail (long maps, lists of records) stays in --format json."""
    return not (v is None or v == [] or (isinstance(v, dict) and len(v) > 6) or (isinstance(v, list) and isinstance(v[0], dict)))


def _head(console: Console, n: int, f: Finding, severity: str) -> None:
    style = SEVERITY_STYLE.get(severity, "")
    who = escape(", ".join(f"{k} {v}" for k, v in f.labels.items() if k in WHO_LABELS))
    console.print(f"[bold]{n}. [{style}]{severity.upper()}[/] {f.kind.replace('_', ' ')}[/]  [dim]{f.workload}{'; ' + who if who else ''}[/]")


def _span(start: float, end: float) -> str:
    dur = end - start
    return f"{format_span(start, end)} ({dur:.1f} s)" if dur > 0 else format_when(start)


def _body(console: Console, summary: str, evidence: dict[str, Any], advice: list[str]) -> None:
    console.print(f"   {escape(summary)}", highlight=False)
    shown = {k: v for k, v in evidence.items() if _shown(v)}
    if shown:
        console.print("   [bold]Evidence[/]")
        for k, v in shown.items():
            console.print(f"     {escape(evidence_label(k, v))}: {escape(format_value(v))}", highlight=False)
    if advice:
        console.print("   [bold]What to do, in order[/]")
        for i, a in enumerate(advice, 1):
            console.print(f"     {i}. {escape(a)}", highlight=False)


def _scope(job: str | None, service: str | None) -> str:
    """What was diagnosed, as the header says it (escaped for rich)."""
    return escape(" ".join(x for x in (f"job {job}" if job else "", f"service {service}" if service else "") if x)
                  or "every job and service")


def _nothing_found(console: Console, what: str, where: str, workloads_seen: bool = True, empty: bool = False) -> None:
    if empty:
        console.print(f"The store {where} holds no samples yet: nothing to diagnose. Run `gpulens agent` or `gpulens replay` "
                      "into it first.")
        return
    if not workloads_seen:  # only the GPU checks had anything to read: "all clear" would overstate it
        console.print(f"No GPU fault found in {where}; it holds no training steps or inference requests, so only the "
                      "GPU health checks ran (XID, ECC, row remapping, temperature, power, clocks).")
        console.print("[dim]Record the workload too (TrainingMonitor or the Lightning / Trainer callbacks; "
                      "InferenceMonitor, InferenceMiddleware or `gpulens agent --scrape URL`) for its bottleneck.[/]")
        return
    console.print(f"No bottleneck found for {what} in {where}.")
    console.print("[dim]That means none of the checks fired (GPU health, input pipeline, checkpoints, communication, "
                  "memory, utilization, throttling, loss). Keep this run as your baseline.[/]")


def _energy(console: Console, lines: list[str]) -> None:
    """The summary's energy lines (`gpulens energy`'s figures, one per workload and GPU)."""
    if lines:
        console.print("[bold]Energy[/] [dim](gpulens energy)[/]")
        for line in lines:
            console.print(f"   {escape(line)}", highlight=False)
        console.print()


def render_incidents(console: Console, incidents: list[Incident], store: Path | str, job: str | None, service: str | None,
                     energy_lines: list[str] | None = None, workloads_seen: bool = True, empty: bool = False) -> None:
    """Each incident: its cause (what it measured, the symptoms it explains, its evidence and its
    advice), then its symptoms folded under it, one line each, with no advice of their own. The
    summary ends with each workload's energy (`energy_lines`) when there is any. `workloads_seen` False: the
    source held GPU telemetry alone, and an empty list says only that the GPU checks found nothing; `empty`: it
    held nothing at all."""
    what, where = _scope(job, service), escape(str(store))
    if not incidents:
        _nothing_found(console, what, where, workloads_seen, empty)
        _energy(console, energy_lines or [])
        return
    n_findings = sum(len(inc.members) for inc in incidents)
    console.print(f"[bold]{len(incidents)} incident(s)[/] ({n_findings} finding(s)) for {what} in {where}: GPU faults first, then oldest first.")
    console.print("[dim]Each incident is one root cause and the symptoms it explains; fix the cause, not the symptoms. "
                  "Start with the critical ones, change one thing, then re-measure against the baseline.[/]\n")
    _energy(console, energy_lines or [])
    for inc in incidents:
        _head(console, inc.id, inc.cause, inc.severity)
        console.print(f"   [dim]{_span(inc.start, inc.end)}[/]")
        _body(console, inc.cause.summary, inc.cause.evidence, inc.advice)
        if inc.symptoms:
            console.print(f"   [bold]Symptoms it explains[/] [dim]({len(inc.symptoms)} finding(s), no advice of their own)[/]")
            for line in inc.explanation:
                console.print(f"     - {escape(line)}", highlight=False)
        console.print()


def render_findings(console: Console, findings: list[Finding], store: Path | str, job: str | None, service: str | None) -> None:
    what, where = _scope(job, service), escape(str(store))
    if not findings:
        _nothing_found(console, what, where)
        return
    console.print(f"[bold]{len(findings)} finding(s)[/] for {what} in {where}: GPU faults first, then oldest first.")
    console.print("[dim]Work on one at a time: start with the critical ones, change one thing, then re-measure against the baseline.[/]\n")
    for n, f in enumerate(findings, 1):
        _head(console, n, f, f.severity)
        console.print(f"   [dim]{_span(f.start, f.end)}[/]")
        _body(console, f.summary, f.evidence, f.advice)
        console.print()
