"""`gpulens energy`: joules, mean watts and joules per token, sample and request, per workload."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from gpulens.cli.common import console, open_existing_store, store_option
from gpulens.cli.fleet import match_option, prometheus_option, window_option


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def energy_command(
    ctx: typer.Context,
    store: Path = store_option(),
    job: str = typer.Option(None, "--job", help="Only this training job (its train_job label)."),
    service: str = typer.Option(None, "--service", help="Only this inference service."),
    fmt: str = typer.Option("table", "--format", help="table or json."),
    prometheus: str = prometheus_option(),
    match: str = match_option(),
    start: str = typer.Option(None, "--start", help="Window start (unix seconds or ISO time): only steps and requests in it count. "
                              "Default: all of the store; with --prometheus, --window before the end."),
    end: str = typer.Option(None, "--end", help="Window end. Default: the store's last record; with --prometheus, now."),
    window: str = window_option(),
) -> None:
    """Energy per training job and per service, from NVML's cumulative energy counter (power
    integrated where the counter is missing, and said so), on the GPU each ran on. The dashboard's
    and the report's "energy per token" are this figure over their window.

        gpulens energy                                # every job and service
        gpulens energy --job h200-demo --format json  # one training job, as JSON
        gpulens energy --service h200-demo            # one service
        gpulens energy --prometheus http://prometheus:9090 --job pretrain --window 6h   # a job across its nodes

    Over --prometheus each rank's span and steps come from its scraped step histogram (per scrape
    interval) and joules from the scraped energy counter of the GPU it ran on (docs/fleet.md); steps'
    tokens and samples do not reach Prometheus, so J/token and J/sample are left out for training.
    """
    from gpulens.energy import workload_energy
    from gpulens.errors import BadInputError, shown
    from gpulens.reader import StoreReader

    if fmt not in ("table", "json"):
        raise BadInputError(f"--format must be table or json, not {shown(fmt)}.")
    from gpulens.cli.fleet import (
        open_prometheus,
        refuse_match_without_prometheus,
        refuse_store_with_prometheus,
        time_window,
    )
    from gpulens.vocab.time import require_overlap

    refuse_match_without_prometheus(match, prometheus)
    refuse_store_with_prometheus(prometheus, ctx)
    start_t, end_t = time_window(start, end, window, prometheus)
    if prometheus:
        reader = open_prometheus(prometheus, match, start_t, end_t, job, service)
        rows, where = workload_energy(reader, job=job, service=service, start=reader.start, end=reader.end), reader.description
    else:
        with open_existing_store(store, "workloads to measure", readonly=True) as st:
            where = f"The store {store}"
            require_overlap(start_t, end_t, st.time_range(), where)
            rows = workload_energy(StoreReader(st), job=job, service=service, start=start_t, end=end_t)
    if not rows and (job or service):
        which = " or ".join(filter(None, [job and f"job {shown(job)}", service and f"service {shown(service)}"]))
        raise BadInputError(f"{where} has no records of {which}.", hint="Leave out --job/--service to list every workload.")
    if fmt == "json":
        typer.echo(json.dumps([r.to_json() for r in rows]))
        return
    if not rows:
        console.print(f"No training steps or requests in {'the window' if prometheus else 'the store'}, so no energy to attribute.")
        return
    from rich.table import Table

    t = Table(title="energy per workload", title_justify="left")
    for col in ("workload", "gpu", "s", "kJ", "W", "J/token", "J/sample", "J/req"):
        t.add_column(col, justify="left" if col in ("workload", "gpu") else "right", overflow="fold")
    hosts = {r.host for r in rows}
    for r in rows:
        t.add_row(f"{r.workload} {r.name}", f"{r.gpu}@{r.host}" if len(hosts) > 1 else r.gpu, f"{r.seconds:.0f}",
                  _f(None if r.joules is None else r.joules / 1000, ".2f"), _f(r.mean_watts, ".0f"),
                  _f(r.joules_per_token, ".3g"), _f(r.joules_per_sample, ".3g"), _f(r.joules_per_request, ".3g"))
    console.print(t)
    for r in rows:
        if r.note:
            console.print(f"[dim]{r.workload} {r.name}: {r.note}[/]")


def register(app: typer.Typer) -> None:
    app.command("energy")(energy_command)
