"""`gpulens diagnose` as text: the findings in the order to work on them, with their evidence and
advice. Names and summaries come from stores and users, so they are printed as text, never markup."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from gpulens.diagnose.base import Finding
from gpulens.diagnose.evidence import format_value
from gpulens.vocab.names import TRAIN_JOB_LABEL

SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
WHO_LABELS = (TRAIN_JOB_LABEL, "rank", "service", "gpu", "host")


def _when(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def _shown(v: Any) -> bool:
    """Nested detail (long maps, lists of records) stays in --format json."""
    return not (v is None or v == [] or (isinstance(v, dict) and len(v) > 6) or (isinstance(v, list) and isinstance(v[0], dict)))


def render_findings(console: Console, findings: list[Finding], store: Path | str, job: str | None, service: str | None) -> None:
    what = " ".join(x for x in (f"job {job}" if job else "", f"service {service}" if service else "") if x) or "every job and service"
    what, where = escape(what), escape(str(store))
    if not findings:
        console.print(f"No bottleneck found for {what} in {where}.")
        console.print("[dim]That means none of the checks fired (GPU health, input pipeline, checkpoints, communication, memory, utilization, throttling, loss). Keep this run as your baseline.[/]")
        return
    console.print(f"[bold]{len(findings)} finding(s)[/] for {what} in {where}: GPU faults first, then oldest first.")
    console.print("[dim]Work on one at a time: start with the critical ones, change one thing, then re-measure against the baseline.[/]\n")
    for n, f in enumerate(findings, 1):
        style = SEVERITY_STYLE.get(f.severity, "")
        who = escape(", ".join(f"{k} {v}" for k, v in f.labels.items() if k in WHO_LABELS))
        dur = f.end - f.start
        console.print(f"[bold]{n}. [{style}]{f.severity.upper()}[/] {f.kind.replace('_', ' ')}[/]  [dim]{f.workload}{'; ' + who if who else ''}[/]")
        span = f"{_when(f.start)}" + (f" → {datetime.fromtimestamp(f.end).strftime('%H:%M:%S')} ({dur:.1f} s)" if dur > 0 else "")
        console.print(f"   [dim]{span}[/]")
        console.print(f"   {escape(f.summary)}", highlight=False)
        shown = {k: v for k, v in f.evidence.items() if _shown(v)}
        if shown:
            console.print("   [bold]Evidence[/]")
            for k, v in shown.items():
                console.print(f"     {escape(k.replace('_', ' '))}: {escape(format_value(v))}", highlight=False)
        if f.advice:
            console.print("   [bold]What to do, in order[/]")
            for i, a in enumerate(f.advice, 1):
                console.print(f"     {i}. {escape(a)}", highlight=False)
        console.print()
