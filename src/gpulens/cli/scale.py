"""`gpulens scale`: the desired replica count per service over time, by the HPA rule (docs/scale.md),
from a store or from a fleet's Prometheus (--prometheus, the options gpulens.cli.fleet shares)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from gpulens.cli.common import console, open_existing_store, store_option
from gpulens.cli.fleet import match_option, prometheus_option
from gpulens.vocab.time import ZONE, format_when

SPAN_HELP = ("With --prometheus and no --start: how far back from the end to evaluate, e.g. 30m, 6h. Default: 1h. "
             "(--window is the span each signal is averaged over, as without --prometheus.)")


def scale_command(
    ctx: typer.Context,
    store: Path = store_option(),
    service: str = typer.Option(None, "--service", help="Only this service."),
    target_concurrency: float = typer.Option(4.0, "--target-concurrency", help="Requests in flight one replica should carry."),
    capacity: float = typer.Option(None, "--capacity", help="Requests per second one replica serves within its SLO (e.g. from `gpulens bench serve --sweep`); adds the arrival-rate signal."),
    from_run: str = typer.Option(None, "--from-run", help="Take a replica's capacity from this `bench serve --sweep` run (an id, or latest): an open-loop sweep sets --capacity, a closed-loop one --target-concurrency."),
    target_kv_cache: float = typer.Option(0.8, "--target-kv-cache", help="KV-cache usage per replica (engine scrapes)."),
    target_queue: float = typer.Option(None, "--target-queue", help="Requests waiting (queued, not yet served) one replica may hold; adds the queue signal."),
    target_p95_latency: str = typer.Option(None, "--target-p95-latency", help="The p95 latency of successful requests to hold, e.g. 2s; adds the latency signal (a node's store only)."),
    target_p95_ttft: str = typer.Option(None, "--target-p95-ttft", help="The p95 time to first token to hold, e.g. 500ms; adds the TTFT signal (a node's store only)."),
    window: str = typer.Option("1m", "--window", help="How far back each signal is averaged (the recording rule's default too)."),
    step: str = typer.Option("5s", "--step", help="How often the rule is evaluated (an HPA: every 15 s)."),
    stabilization: str = typer.Option("300s", "--stabilization", help="Scale-down stabilization window (the HPA's default: 300 s)."),
    tolerance: float = typer.Option(0.1, "--tolerance", help="No change while usage is within this of the target (the HPA's: 0.1)."),
    min_replicas: int = typer.Option(1, "--min-replicas", help="Never ask for fewer."),
    max_replicas: int = typer.Option(100, "--max-replicas", help="Never ask for more."),
    after: str = typer.Option("0s", "--after", help="Keep evaluating this long past the last record, as an HPA would with no new requests."),
    fmt: str = typer.Option("table", "--format", help="table (the changes) or json (every evaluation)."),
    prometheus: str = prometheus_option(),
    match: str = match_option(),
    start: str = typer.Option(None, "--start", help="Evaluate from this time (unix seconds or ISO time). Default: the store's first sample; over --prometheus, --span before the end."),
    end: str = typer.Option(None, "--end", help="Evaluate up to this time. Default: the store's last sample; over --prometheus, now."),
    span: str = typer.Option(None, "--span", help=SPAN_HELP),
) -> None:
    """The replica count an HPA (or KEDA) would ask for, per service, with the signal that drove it.

    Examples:

    * `gpulens scale --window 10s --step 1s --stabilization 10s`
    * `gpulens scale --target-p95-latency 1s --target-queue 2`
    * `gpulens scale --prometheus http://prometheus:9090 --match '{cluster="a"}' --span 6h --service chat`

    Over --prometheus the signals come from the counters every agent exports (docs/scale.md): the
    sums, counts and rates are exact, each request counted at the scrape that first showed it."""
    from gpulens.cli.fleet import (
        open_prometheus,
        refuse_match_without_prometheus,
        refuse_store_with_prometheus,
        time_window,
    )
    from gpulens.errors import BadInputError, shown
    from gpulens.scaling import ScalePolicy, Targets, desired_replicas
    from gpulens.scaling.desired import check_steps, evaluate, pick_services
    from gpulens.units import parse_duration
    from gpulens.vocab.time import require_overlap

    if fmt not in ("table", "json"):
        raise BadInputError(f"--format must be table or json, not {shown(fmt)}.")
    for name, v in (("--target-concurrency", target_concurrency), ("--capacity", capacity), ("--target-kv-cache", target_kv_cache),
                    ("--target-queue", target_queue)):
        if v is not None and v <= 0:
            raise BadInputError(f"{name} must be above zero, not {v}.")
    if target_kv_cache is not None and target_kv_cache > 1:  # a share of the cache: 1 is all of it
        raise BadInputError(f"--target-kv-cache is a share of the KV cache, at most 1, not {target_kv_cache:g}.",
                            hint="E.g. --target-kv-cache 0.8 (80 % used).")
    if prometheus and (target_p95_latency or target_p95_ttft):
        raise BadInputError("The p95 latency and TTFT signals need each request's times, which only a node's store keeps.",
                            hint="Over --prometheus use --target-concurrency, --capacity, --target-queue or --target-kv-cache "
                                 "(exact from the exported counters); or run scale --store on the node.")
    refuse_match_without_prometheus(match, prometheus)
    refuse_store_with_prometheus(prometheus, ctx)
    start_t, end_t = time_window(start, end, span, prometheus, flag="--span")
    policy = ScalePolicy(tolerance, parse_duration(stabilization, what="--stabilization", allow_zero=True), min_replicas, max_replicas)
    targets = Targets(target_concurrency, capacity, target_kv_cache, target_queue,
                      parse_duration(target_p95_latency, what="--target-p95-latency") if target_p95_latency else None,
                      parse_duration(target_p95_ttft, what="--target-p95-ttft") if target_p95_ttft else None)
    window_s, step_s = parse_duration(window, what="--window"), parse_duration(step, what="--step")
    after_s = parse_duration(after, what="--after", allow_zero=True)
    if from_run is not None:
        with open_existing_store(store, "the sweep run to take a replica's capacity from", readonly=True) as st:
            targets = _targets_from_run(st, from_run, targets, fmt)
    if prometheus:
        from gpulens.scaling.exported import exported_inputs, exported_services

        reader = open_prometheus(prometheus, match, start_t, end_t, None, service)
        check_steps(window_s, step_s)
        names = pick_services(exported_services(reader), service, reader.description)
        inputs = exported_inputs(reader, names, reader.start, reader.end + after_s, window_s)
        points = evaluate(inputs, reader.start, reader.end + after_s, window_seconds=window_s, step_seconds=step_s,
                          targets=targets, policy=policy)
        where = reader.description
    else:
        with open_existing_store(store, "requests to scale on", readonly=True) as st:
            require_overlap(start_t, end_t, st.time_range(), f"The store {store}")
            points = desired_replicas(st, service=service, window_seconds=window_s, step_seconds=step_s, targets=targets,
                                      policy=policy, start=start_t, end=end_t, after_seconds=after_s)
        where = "the store"
    if fmt == "json":
        typer.echo(json.dumps([p.to_json() for p in points]))
        return
    if not points:
        console.print(escape(f"No inference requests in {where}, so no replica count to ask for."))
        return
    from rich.table import Table

    t = Table(title="desired replicas (changes only)", title_justify="left")
    for col in (f"time ({ZONE})", "service", "desired", "current", "driver", "value", "target"):
        t.add_column(col, justify="right" if col in ("desired", "current", "value", "target") else "left")
    last: dict[str, int] = {}
    for p in points:
        if last.get(p.service) == p.desired_replicas:
            continue
        last[p.service] = p.desired_replicas
        t.add_row(format_when(p.t, date=False, zone=False), p.service, str(p.desired_replicas),
                  str(p.current_replicas), p.driver, f"{p.value:.3g}", f"{p.target:.3g}")
    console.print(t)


def _targets_from_run(st: Any, ref: str, targets: Any, fmt: str) -> Any:
    """--from-run: a replica's capacity from a recorded sweep in the local store."""
    from gpulens.scaling.capacity import targets_from_sweep

    targets, run = targets_from_sweep(st, ref, targets)
    if fmt != "json":
        console.print(f"[dim]capacity per replica from sweep {run.label}: "
                      + (f"{targets.capacity_rps_per_replica:g} requests/s" if run.summary["sweep"].get("mode") != "closed"
                         else f"{targets.concurrency_per_replica:g} in flight") + "[/]", highlight=False)
    return targets


def register(app: typer.Typer) -> None:
    app.command("scale")(scale_command)
