"""`gpulens query`: read a metric back from the store."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from gpulens.cli.common import STORE_HELP, console
from gpulens.store import DEFAULT_STORE_PATH
from gpulens.store.types import SeriesData
from gpulens.vocab.gpu import GPU_UTILIZATION_RATIO
from gpulens.vocab.time import ZONE, format_when


def query_command(
    metric: str = typer.Argument(..., help=f"Metric name, e.g. {GPU_UTILIZATION_RATIO}. A wrong name lists the close ones the store holds."),
    store: Path = typer.Option(DEFAULT_STORE_PATH, "--store", help=STORE_HELP),
    since: str = typer.Option(None, "--since", help="How far back from now (from the newest sample when all are older), e.g. 15m, 2h, 7d. Default: everything."),
    label: list[str] = typer.Option([], "--label", "-l", help="Keep series with this label, e.g. gpu=0. Repeatable."),
    max_points: int = typer.Option(None, "--max-points", help="Downsample to at most this many points per series (from roll-ups)."),
    fmt: str = typer.Option("table", "--format", help="table or json."),
) -> None:
    """Print a metric's samples. `--since` counts back from now, or from the newest sample when
    every sample is older, so a replayed session in the past answers too."""
    from gpulens.errors import BadInputError, shown
    from gpulens.store import Store

    if fmt not in ("table", "json"):
        raise BadInputError(f"--format must be table or json, not {shown(fmt)}.")
    if max_points is not None and max_points < 1:
        raise BadInputError(f"--max-points must be at least 1, not {max_points}.")
    labels = {}
    for item in label:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise BadInputError(f"Cannot read --label {shown(item)}.", hint="Write NAME=VALUE, e.g. --label gpu=0.")
        labels[k] = v
    with Store(store, readonly=True) as st:
        names = st.metric_names()
        if metric not in names:
            import difflib

            close = difflib.get_close_matches(metric, names, n=3)
            raise BadInputError(
                f"The store {store} has no metric {shown(metric)}.",
                hint=(f"Did you mean {', '.join(close)}?" if close
                      else f"It has {len(names)} metrics, e.g. {', '.join(names[:5])}." if names
                      else "It holds no samples yet: run `gpulens agent` or `gpulens replay` into it first."),
            )
        if labels and not st.series(metric, labels):  # a typo'd label would print nothing at all
            raise BadInputError(
                f"No {metric} series has {shown(' '.join(f'{k}={v}' for k, v in labels.items()), 80, quote=False)}.",
                hint=_label_hint(metric, labels, [k.labels for k in st.series(metric)]))
        start = end = None
        if since is not None:
            from gpulens.units import parse_duration

            # Back from now; from the newest sample where every sample is older (a replayed session
            # answers too). A sample dated in the future (a clock that was wrong) does not move it.
            rng = st.time_range(metric)
            now = time.time()
            end = min(rng[1], now) if rng else now
            start = end - parse_duration(since, what="--since")
        data = st.query(metric, labels or None, start=start, end=end, max_points=max_points)
    if fmt == "json":
        typer.echo(json.dumps([_series_json(d) for d in data]))
        return
    from rich.table import Table

    if not data and since is not None:
        console.print(f"No {escape(metric)} samples in the last {escape(since)}; `gpulens query {escape(metric)}` "
                      "without --since shows them all.", highlight=False)
    for d in data:
        labels = " ".join(f"{k}={v}" for k, v in sorted(d.key.labels.items()))
        # above the table, not its title: a title folds at the table's width, cutting a GPU's uuid in two
        console.print(escape(f"{d.key.name} {labels} ({_resolution_text(d, max_points)}, "
                             f"{len(d)} point{'' if len(d) == 1 else 's'})"), highlight=False)
        table = Table()
        table.add_column(f"time ({ZONE})")
        table.add_column("value", justify="right")
        if d.resolution != "raw" or (max_points is not None):
            table.add_column("min", justify="right")
            table.add_column("max", justify="right")
        for i, t in enumerate(d.t):
            row = [format_when(t, precision="millisecond", zone=False), f"{d.value[i]:.4g}"]
            if len(table.columns) == 4:
                row += [f"{d.value_min[i]:.4g}", f"{d.value_max[i]:.4g}"]
            table.add_row(*row)
        console.print(table)


def _label_hint(metric: str, asked: dict[str, str], present: list[dict[str, str]]) -> str:
    """The values the store's series of `metric` have for the labels asked about."""
    from gpulens.errors import shown

    parts = []
    for k in asked:
        values = sorted({ls[k] for ls in present if k in ls})
        parts.append(f"{k}={', '.join(values[:8])}" + (" …" if len(values) > 8 else "") if values
                     else f"no label {shown(k, quote=False)}")
    return f"Its series have {'; '.join(parts)}."


def _series_json(d: SeriesData) -> dict[str, Any]:
    """One series for `--format json`: `points` are [t, value]. Where a value is an aggregate it
    says so: its function (the mean; each bucket's min, max and sample count beside the points), its
    window in seconds and what it was read from; raw samples carry `aggregate: null`."""
    out: dict[str, Any] = {"metric": d.key.name, "labels": d.key.labels, "resolution": d.resolution}
    out["points"] = [[t, v] for t, v in zip(d.t, d.value, strict=True)]
    if d.bucket_seconds is None:
        out["aggregate"] = None
    else:
        out["aggregate"] = {"function": "mean", "window_seconds": round(d.bucket_seconds, 3),
                            "read_from": "raw samples" if d.resolution == "raw" else f"the {d.resolution} roll-up",
                            "t": "bucket start"}
        out.update(min=d.value_min, max=d.value_max, samples=d.count)
    return out


def _resolution_text(d: SeriesData, max_points: int | None) -> str:
    """What each row is: a raw sample, or the mean (min, max) of a window read from raw samples or a roll-up."""
    if d.bucket_seconds is None:
        return "raw samples"
    from gpulens.units import format_seconds

    source = "raw samples" if d.resolution == "raw" else f"the {d.resolution} roll-up"
    return f"bucket means of {source}, {format_seconds(d.bucket_seconds)} each"


def register(app: typer.Typer) -> None:
    app.command("query")(query_command)
