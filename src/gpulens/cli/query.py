"""`gpulens query`: read a metric back from the store."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path

import typer
from rich.markup import escape

from gpulens.cli.common import STORE_HELP, console
from gpulens.store import DEFAULT_STORE_PATH
from gpulens.vocab.gpu import GPU_UTILIZATION_RATIO


def query_command(
    metric: str = typer.Argument(..., help=f"Metric name, e.g. {GPU_UTILIZATION_RATIO}. A wrong name lists the close ones the store holds."),
    store: Path = typer.Option(DEFAULT_STORE_PATH, "--store", help=STORE_HELP),
    since: str = typer.Option(None, "--since", help="How far back from the newest sample, e.g. 15m, 2h, 7d. Default: everything."),
    label: list[str] = typer.Option([], "--label", "-l", help="Keep series with this label, e.g. gpu=0. Repeatable."),
    max_points: int = typer.Option(None, "--max-points", help="Downsample to at most this many points per series (from roll-ups)."),
    fmt: str = typer.Option("table", "--format", help="table or json."),
) -> None:
    """Print a metric's samples. `--since` counts back from the newest sample, so a replayed
    session in the past answers too."""
    from gpulens.errors import BadInputError
    from gpulens.store import Store

    if fmt not in ("table", "json"):
        raise BadInputError(f"--format must be table or json, not {fmt!r}.")
    if max_points is not None and max_points < 1:
        raise BadInputError(f"--max-points must be at least 1, not {max_points}.")
    labels = {}
    for item in label:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise BadInputError(f"Cannot read --label {item!r}.", hint="Write NAME=VALUE, e.g. --label gpu=0.")
        labels[k] = v
    with Store(store, readonly=True) as st:
        names = st.metric_names()
        if metric not in names:
            import difflib

            close = difflib.get_close_matches(metric, names, n=3)
            raise BadInputError(
                f"The store {store} has no metric {metric!r}.",
                hint=(f"Did you mean {', '.join(close)}?" if close
                      else f"It has {len(names)} metrics, e.g. {', '.join(names[:5])}." if names
                      else "It holds no samples yet: run `gpulens agent` or `gpulens replay` into it first."),
            )
        start = end = None
        if since is not None:
            from gpulens.units import parse_duration

            rng = st.time_range(metric)
            end = rng[1] if rng else time.time()
            start = end - parse_duration(since, what="--since")
        data = st.query(metric, labels or None, start=start, end=end, max_points=max_points)
    if fmt == "json":
        out = [
            {
                "metric": d.key.name,
                "labels": d.key.labels,
                "resolution": d.resolution,
                "points": [[t, v] for t, v in zip(d.t, d.value, strict=True)],
            }
            for d in data
        ]
        typer.echo(json.dumps(out))
        return
    from rich.table import Table

    for d in data:
        labels = " ".join(f"{k}={v}" for k, v in sorted(d.key.labels.items()))
        table = Table(title=escape(f"{d.key.name} {labels} ({_resolution_text(d.resolution, max_points)}, {len(d)} points)"),
                      title_justify="left")
        table.add_column("time (UTC)")
        table.add_column("value", justify="right")
        if d.resolution != "raw" or (max_points is not None):
            table.add_column("min", justify="right")
            table.add_column("max", justify="right")
        for i, t in enumerate(d.t):
            row = [_utc(t), f"{d.value[i]:.6g}"]
            if len(table.columns) == 4:
                row += [f"{d.value_min[i]:.6g}", f"{d.value_max[i]:.6g}"]
            table.add_row(*row)
        console.print(table)


def _resolution_text(resolution: str, max_points: int | None) -> str:
    """What each row is: a raw sample, or the mean (min, max) of a bucket read from raw samples or a roll-up."""
    if resolution == "raw":
        return "bucket means of raw samples" if max_points else "raw samples"
    return f"bucket means of the {resolution} roll-up"


def _utc(t: float) -> str:
    """A stored time as UTC text; one outside what a date can hold (an older store) says so."""
    try:
        return datetime.utcfromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    except (OverflowError, OSError, ValueError):
        return f"t={t!r} (not a date)"


def register(app: typer.Typer) -> None:
    app.command("query")(query_command)
