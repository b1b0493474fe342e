"""`gpulens scale`: the desired replica count per service over time, by the HPA rule (docs/scale.md)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import typer

from gpulens.cli.common import console, open_existing_store, store_option


def scale_command(
    store: Path = store_option(),
    service: str = typer.Option(None, "--service", help="Only this service."),
    target_concurrency: float = typer.Option(4.0, "--target-concurrency", help="Requests in flight one replica should carry."),
    capacity: float = typer.Option(None, "--capacity", help="Requests per second one replica serves within its SLO (e.g. from `gpulens bench serve --sweep`); adds the arrival-rate signal."),
    from_run: str = typer.Option(None, "--from-run", help="Take a replica's capacity from this `bench serve --sweep` run (an id, or latest): an open-loop sweep sets --capacity, a closed-loop one --target-concurrency."),
    target_kv_cache: float = typer.Option(0.8, "--target-kv-cache", help="KV-cache usage per replica (engine scrapes)."),
    window: str = typer.Option("1m", "--window", help="How far back each signal is averaged (the recording rule's default too)."),
    step: str = typer.Option("5s", "--step", help="How often the rule is evaluated (an HPA: every 15 s)."),
    stabilization: str = typer.Option("300s", "--stabilization", help="Scale-down stabilization window (the HPA's default: 300 s)."),
    tolerance: float = typer.Option(0.1, "--tolerance", help="No change while usage is within this of the target (the HPA's: 0.1)."),
    min_replicas: int = typer.Option(1, "--min-replicas", help="Never ask for fewer."),
    max_replicas: int = typer.Option(100, "--max-replicas", help="Never ask for more."),
    after: str = typer.Option("0s", "--after", help="Keep evaluating this long past the last record, as an HPA would with no new requests."),
    fmt: str = typer.Option("table", "--format", help="table (the changes) or json (every evaluation)."),
) -> None:
    """The replica count an HPA (or KEDA) would ask for, per service, with the signal that drove it."""
    from gpulens.errors import BadInputError
    from gpulens.scaling import ScalePolicy, Targets, desired_replicas
    from gpulens.units import parse_duration

    if fmt not in ("table", "json"):
        raise BadInputError(f"--format must be table or json, not {fmt!r}.")
    for name, v in (("--target-concurrency", target_concurrency), ("--capacity", capacity), ("--target-kv-cache", target_kv_cache)):
        if v is not None and v <= 0:
            raise BadInputError(f"{name} must be above zero, not {v}.")
    policy = ScalePolicy(tolerance, parse_duration(stabilization, what="--stabilization", allow_zero=True), min_replicas, max_replicas)
    targets = Targets(target_concurrency, capacity, target_kv_cache)
    with open_existing_store(store, "requests to scale on") as st:
        if from_run is not None:
            from gpulens.scaling.capacity import targets_from_sweep

            targets, run = targets_from_sweep(st, from_run, targets)
            if fmt != "json":
                console.print(f"[dim]capacity per replica from sweep {run.label}: "
                              + (f"{targets.capacity_rps_per_replica:g} requests/s" if run.summary["sweep"].get("mode") != "closed"
                                 else f"{targets.concurrency_per_replica:g} in flight") + "[/]", highlight=False)
        points = desired_replicas(st, service=service, window_seconds=parse_duration(window, what="--window"),
                                  step_seconds=parse_duration(step, what="--step"), targets=targets, policy=policy,
                                  after_seconds=parse_duration(after, what="--after", allow_zero=True))
    if fmt == "json":
        typer.echo(json.dumps([p.to_json() for p in points]))
        return
    if not points:
        console.print("No inference requests in the store, so no replica count to ask for.")
        return
    from rich.table import Table

    t = Table(title="desired replicas (changes only)", title_justify="left")
    for col in ("time (UTC)", "service", "desired", "current", "driver", "value", "target"):
        t.add_column(col, justify="right" if col in ("desired", "current", "value", "target") else "left")
    last: dict[str, int] = {}
    for p in points:
        if last.get(p.service) == p.desired_replicas:
            continue
        last[p.service] = p.desired_replicas
        t.add_row(datetime.fromtimestamp(p.t, UTC).strftime("%H:%M:%S"), p.service, str(p.desired_replicas),
                  str(p.current_replicas), p.driver, f"{p.value:.3g}", f"{p.target:.3g}")
    console.print(t)


def register(app: typer.Typer) -> None:
    app.command("scale")(scale_command)
