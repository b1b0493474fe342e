"""`gpulens diagnose`: name the bottleneck of the training jobs and services in a store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from gpulens.cli.common import STORE_HELP, console, open_existing_store
from gpulens.cli.fleet import (
    DEFAULT_PROMETHEUS_WINDOW,
    refuse_match_without_prometheus,
    refuse_store_with_prometheus,
    time_window,
)
from gpulens.errors import BadInputError, StorageFullError, StoreError, shown
from gpulens.store import DEFAULT_STORE_PATH
from gpulens.vocab.names import TRAIN_JOB_LABEL, TRAIN_STEP_SECONDS

FORMATS = ("text", "json")


def diagnose_command(
    ctx: typer.Context,
    store: Path = typer.Option(DEFAULT_STORE_PATH, "--store", help=STORE_HELP),
    job: str = typer.Option(None, "--job", help="Only this training job (its `train_job` label)."),
    service: str = typer.Option(None, "--service", help="Only this inference service (its `service` label)."),
    fmt: str = typer.Option("text", "--format", help="text (for people: incidents, cause first) or json (the list of "
                            "findings, for scripts; each with its `incident` id and `role`: cause or symptom)."),
    slo: list[str] = typer.Option([], "--slo", help='A serving objective to check, e.g. "p99_latency<=500ms" '
                                  '(repeatable). Kept in the store for the --service (or every service) and '
                                  "checked on later runs too."),
    prometheus: str = typer.Option(None, "--prometheus", help="Read a fleet's Prometheus (or Thanos, Mimir, VictoriaMetrics) "
                                   "at this URL instead of a store: every node --match selects, diagnosed as one."),
    match: str = typer.Option("", "--match", help='With --prometheus: a label selector every series must match, e.g. '
                              '\'{cluster="a"}\'. Default: every series.'),
    start: str = typer.Option(None, "--start", help="Window start (unix seconds or ISO time). Default: the store's first "
                              "sample; with --prometheus, --window before the end."),
    end: str = typer.Option(None, "--end", help="Window end. Default: the store's last sample; with --prometheus, now."),
    window: str = typer.Option(None, "--window", help=f"With --prometheus and no --start: how far back from the end, e.g. 30m, 6h. "
                               f"Default: {DEFAULT_PROMETHEUS_WINDOW}."),
) -> None:
    """Find what slows a training job or an inference service, with the evidence and the fixes in
    the order that pays.

    Each finding names a bottleneck (e.g. input_bound: the GPU waits for data; checkpoint_stall;
    underutilized: the batch is too small to fill the GPU; straggler: one rank is slow), when it
    happened, the numbers behind it and what to do first. Findings are grouped into incidents: one
    root cause (a GPU fault, a GPU condition, a bottleneck, another process) with the symptoms it
    explains folded under it, one severity and the cause's advice only. Fix one thing, then
    measure again. With --job, only that job's incidents and the GPU incidents that hit it.

        gpulens replay          # the bundled H200 session into the store
        gpulens diagnose        # every job and service in the store
        gpulens diagnose --job llama-ft --format json
        gpulens diagnose --service chat --slo "p99_latency<=2s" --slo "p95_ttft<=300ms"
        gpulens diagnose --prometheus http://prometheus:9090 --match '{cluster="a"}' --window 6h

    Over --prometheus the GPU analyses run on what the agents' scrapes hold (times to the scrape
    interval); those that need per-step or per-request records are skipped, and a note says so.

    Inference findings: slo_violation (with --slo, or objectives kept from before), queueing,
    latency_bound_low_utilization, memory_headroom, error_rate, timeouts, cold_start.
    """
    from gpulens.diagnose import DiagnoseScope, diagnose
    from gpulens.reader import StoreReader
    from gpulens.store import Store
    from gpulens.vocab.time import require_overlap

    if fmt not in FORMATS:
        raise BadInputError(f"Unknown --format {shown(fmt)}.", hint="Use --format text or --format json.")
    start_t, end_t = time_window(start, end, window, prometheus)
    notes: list[str] = []
    energy_lines: list[str] = []
    workloads_seen, empty = True, False
    where: Path | str = store
    if prometheus:
        refuse_store_with_prometheus(prometheus, ctx)
        if slo:
            raise BadInputError("--slo is checked against per-request records, which a Prometheus server does not keep.",
                                hint="Leave out --slo with --prometheus, or run it with --store on the node.")
        findings, notes, where = _diagnose_prometheus(prometheus, match, start_t, end_t, job, service)
    else:
        refuse_match_without_prometheus(match, prometheus)
        if slo:
            _keep_slos(store, slo, service)
        with Store(store, readonly=True) as st:
            try:
                _check_selection(st, job, service)
                span = st.time_range()
                require_overlap(start_t, end_t, span, f"The store {store}")
                findings = diagnose(StoreReader(st), DiagnoseScope(start=start_t, end=end_t, job=job, service=service))
                workloads_seen, empty = any(k.name.startswith(("train_", "infer_")) for k in st.series()), span is None
                if fmt == "text":
                    energy_lines = _energy_lines(st, start_t, end_t, job, service)
            except StorageFullError:
                raise
            except StoreError as e:  # the store turns SQLite's errors into these
                hint = e.hint or "Point --store at a file written by `gpulens agent` or `gpulens replay`."  # its own, where it has one
                raise StoreError(e.message, hint=hint) from None
    from gpulens.diagnose.incidents import for_job, group

    incidents = group(findings)
    if job:
        incidents = for_job(incidents, job)
    if fmt == "json":
        typer.echo(json.dumps([d for inc in incidents for d in inc.finding_dicts()], indent=2, default=str))
        for note in notes:
            typer.echo(note, err=True)
        return
    from rich.markup import escape

    from gpulens.diagnose.render import render_incidents

    render_incidents(console, incidents, where, job, service, energy_lines, workloads_seen, empty)
    for note in notes:
        console.print(f"[dim]{escape(note)}[/]")


def _diagnose_prometheus(url: str, match: str, start: float | None, end: float | None, job: str | None,
                         service: str | None) -> tuple[list[Any], list[str], str]:
    from gpulens.cli.fleet import open_prometheus
    from gpulens.diagnose import DiagnoseScope
    from gpulens.diagnose.fleet import diagnose_fleet

    reader = open_prometheus(url, match, start, end, job, service)
    got = diagnose_fleet(reader, DiagnoseScope(start=reader.start, end=reader.end, job=job, service=service))
    return got.findings, got.notes, reader.description


def _energy_lines(st: Any, start: float | None, end: float | None, job: str | None, service: str | None) -> list[str]:
    """`gpulens energy`'s rows over the same window and selection, one summary line each."""
    from gpulens.energy import energy_line, workload_energy
    from gpulens.reader import StoreReader

    return [energy_line(r) for r in workload_energy(StoreReader(st), job=job, service=service, start=start, end=end)]


def _keep_slos(store: Path, slos: list[str], service: str | None) -> None:
    """Validate the objectives, then keep them in the store (one write, before the read-only pass)."""
    from gpulens.diagnose.inference import set_slos
    from gpulens.vocab.slo import parse_slos

    parse_slos(slos)  # a malformed objective fails here, before the store is touched
    with open_existing_store(store, "services to hold to objectives") as st:
        set_slos(st, slos, service or "*")


def _check_selection(st: Any, job: str | None, service: str | None) -> None:
    """A --job or --service that the store does not hold is a typo more often than a healthy job."""
    if job:
        jobs = sorted({k.labels.get(TRAIN_JOB_LABEL, "") for k in st.series(TRAIN_STEP_SECONDS)})
        if job not in jobs:
            have = ", ".join(jobs) if jobs else "none"
            raise BadInputError(f"The store {st.path} has no training steps of job {shown(job)} (jobs there: {have}).", hint="Check the spelling, or leave out --job to see every job.")
    if service:
        services = sorted({k.labels.get("service", "") for k in st.series() if k.name.startswith("infer_")})
        if service not in services:
            have = ", ".join(services) if services else "none"
            raise BadInputError(f"The store {st.path} has no requests of service {shown(service)} (services there: {have}).", hint="Check the spelling, or leave out --service.")


def register(app: typer.Typer) -> None:
    app.command("diagnose")(diagnose_command)
