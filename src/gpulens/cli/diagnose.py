"""`gpulens diagnose`: name the bottleneck of the training jobs and services in a store."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from gpulens.cli.common import STORE_HELP, console, open_existing_store
from gpulens.errors import BadInputError, StorageFullError, StoreError
from gpulens.store import DEFAULT_STORE_PATH
from gpulens.workload.names import TRAIN_JOB_LABEL

SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
FORMATS = ("text", "json")


def diagnose_command(
    store: Path = typer.Option(DEFAULT_STORE_PATH, "--store", help=STORE_HELP),
    job: str = typer.Option(None, "--job", help="Only this training job (its `train_job` label)."),
    service: str = typer.Option(None, "--service", help="Only this inference service (its `service` label)."),
    fmt: str = typer.Option("text", "--format", help="text (for people) or json (a list of findings, for scripts)."),
    slo: list[str] = typer.Option([], "--slo", help='A serving objective to check, e.g. "p99_latency<=500ms" '
                                  '(repeatable). Kept in the store for the --service (or every service) and '
                                  "checked on later runs too."),
) -> None:
    """Find what slows a training job or an inference service, with the evidence and the fixes in
    the order that pays.

    Each finding names a bottleneck (e.g. input_bound: the GPU waits for data; checkpoint_stall;
    underutilized: the batch is too small to fill the GPU; straggler: one rank is slow), when it
    happened, the numbers behind it and what to do first. Fix one thing, then measure again.

        gpulens replay          # the bundled H200 session into the store
        gpulens diagnose        # every job and service in the store
        gpulens diagnose --job llama-ft --format json
        gpulens diagnose --service chat --slo "p99_latency<=2s" --slo "p95_ttft<=300ms"

    Inference findings: slo_violation (with --slo, or objectives kept from before), queueing,
    latency_bound_low_utilization, memory_headroom, error_rate, timeouts, cold_start.
    """
    from gpulens.diagnose import DiagnoseScope, diagnose
    from gpulens.store import Store

    if fmt not in FORMATS:
        raise BadInputError(f"Unknown --format {fmt!r}.", hint="Use --format text or --format json.")
    if slo:
        _keep_slos(store, slo, service)
    with Store(store, readonly=True) as st:
        try:
            _check_selection(st, job, service)
            findings = diagnose(st, DiagnoseScope(job=job, service=service))
        except StorageFullError:
            raise
        except StoreError as e:  # the store turns SQLite's errors into these
            raise StoreError(e.message, hint="Point --store at a file written by `gpulens agent` or `gpulens replay`.") from None
    if fmt == "json":
        typer.echo(json.dumps([f.to_dict() for f in findings], indent=2, default=str))
        return
    _render_text(findings, store, job, service)


def _keep_slos(store: Path, slos: list[str], service: str | None) -> None:
    """Validate the objectives, then keep them in the store (one write, before the read-only pass)."""
    from gpulens.bench.serve.slo import parse_slos
    from gpulens.diagnose.inference import set_slos

    parse_slos(slos)  # a malformed objective fails here, before the store is touched
    with open_existing_store(store, "services to hold to objectives") as st:
        set_slos(st, slos, service or "*")


def _check_selection(st: Any, job: str | None, service: str | None) -> None:
    """A --job or --service that the store does not hold is a typo more often than a healthy job."""
    if job:
        jobs = sorted({k.labels.get(TRAIN_JOB_LABEL, "") for k in st.series("train_step_seconds")})
        if job not in jobs:
            have = ", ".join(jobs) if jobs else "none"
            raise BadInputError(f"The store {st.path} has no training steps of job {job!r} (jobs there: {have}).", hint="Check the spelling, or leave out --job to see every job.")
    if service:
        services = sorted({k.labels.get("service", "") for k in st.series() if k.name.startswith("infer_")})
        if service not in services:
            have = ", ".join(services) if services else "none"
            raise BadInputError(f"The store {st.path} has no requests of service {service!r} (services there: {have}).", hint="Check the spelling, or leave out --service.")


def _when(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def _value(key: str, v: Any) -> str:
    from gpulens.units import format_bytes, format_seconds

    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, dict):
        if {"slo", "value"} <= v.keys():  # a missed objective: "p99_latency<=500ms: 2.62 s"
            is_rate = str(v["slo"]).startswith("error_rate")
            return f"{v['slo']}: {_value('error_ratio' if is_rate else 'value_seconds', v['value'])}"
        return ", ".join(f"{k}: {_value(key, x)}" for k, x in v.items())
    if isinstance(v, list):
        return "; ".join(_value(key, x) for x in v)
    if isinstance(v, int | float):
        if key.endswith("_hz"):
            return f"{v / 1e6:,.0f} MHz"
        if key.endswith("_celsius"):
            return f"{v:.0f} °C"
        if key.endswith("_bytes"):
            return format_bytes(v)
        if key.endswith("_seconds"):
            return format_seconds(float(v))
        if "_vs_" in key or key == "ratio":
            return f"{v:.2f}×"
        if key.endswith(("_ratio", "_share")):
            return f"{v:.0%}"
        if isinstance(v, float):
            return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
        return f"{v:,}"
    return str(v)


def _render_text(findings: list[Any], store: Path, job: str | None, service: str | None) -> None:
    what = " ".join(x for x in (f"job {job}" if job else "", f"service {service}" if service else "") if x) or "every job and service"
    if not findings:
        console.print(escape(f"No bottleneck found for {what} in {store}."))
        console.print("[dim]That means none of the checks fired (GPU health, input pipeline, checkpoints, communication, memory, utilization, throttling, loss). Keep this run as your baseline.[/]")
        return
    console.print(f"[bold]{len(findings)} finding(s)[/] for {escape(what)} in {escape(str(store))}: GPU faults first, then oldest first.")
    console.print("[dim]Work on one at a time: start with the critical ones, change one thing, then re-measure against the baseline.[/]\n")
    for n, f in enumerate(findings, 1):
        style = SEVERITY_STYLE.get(f.severity, "")
        who = ", ".join(f"{k} {v}" for k, v in f.labels.items() if k in (TRAIN_JOB_LABEL, "rank", "service", "gpu", "host"))
        dur = f.end - f.start
        console.print(f"[bold]{n}. [{style}]{escape(f.severity.upper())}[/] {escape(f.kind.replace('_', ' '))}[/]  [dim]{escape(f.workload + ('; ' + who if who else ''))}[/]")
        span = f"{_when(f.start)}" + (f" → {datetime.fromtimestamp(f.end).strftime('%H:%M:%S')} ({dur:.1f} s)" if dur > 0 else "")
        console.print(f"   [dim]{span}[/]")
        console.print(f"   {escape(f.summary)}", highlight=False)
        if f.evidence:
            console.print("   [bold]Evidence[/]")
            for k, v in f.evidence.items():
                if v is None or v == [] or (isinstance(v, dict) and len(v) > 6) or (isinstance(v, list) and isinstance(v[0], dict)):
                    continue  # nested detail stays in --format json
                console.print(escape(f"     {k.replace('_', ' ')}: {_value(k, v)}"), highlight=False)
        if f.advice:
            console.print("   [bold]What to do, in order[/]")
            for i, a in enumerate(f.advice, 1):
                console.print(escape(f"     {i}. {a}"), highlight=False)
        console.print()


def register(app: typer.Typer) -> None:
    app.command("diagnose")(diagnose_command)
