"""`gpulens baseline`: what the learned alert rules compare against, and freezing or relearning it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer
from rich.markup import escape

from gpulens.cli.common import STORE_HELP, console, open_existing_store
from gpulens.store import DEFAULT_STORE_PATH
from gpulens.vocab.names import TRAIN_JOB_LABEL, TRAIN_STEP_SECONDS
from gpulens.vocab.time import format_when

baseline_app = typer.Typer(
    help="Learned baselines of the series that learned alert rules watch (step time, latency, queue depth...).",
    no_args_is_help=True,
)

METRIC_HELP = f"Only this series name, e.g. {TRAIN_STEP_SECONDS}."
SHOW_METRIC_HELP = METRIC_HELP + " Default: every one."
LABEL_HELP = f"Only series with this label value, KEY=VALUE (repeatable), e.g. --label {TRAIN_JOB_LABEL}=llama."


def _labels(items: list[str] | None) -> dict[str, str]:
    from gpulens.errors import BadInputError, shown

    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise BadInputError(f"Cannot read --label {shown(item)}.", hint=f"Write KEY=VALUE, e.g. --label {TRAIN_JOB_LABEL}=llama.")
        out[key.strip()] = value.strip()
    return out


@baseline_app.command("show")
def baseline_show_command(
    metric: str = typer.Argument(None, help=SHOW_METRIC_HELP),
    label: list[str] = typer.Option(None, "--label", help=LABEL_HELP),
    store: Path = typer.Option(DEFAULT_STORE_PATH, "--store", help=STORE_HELP),
    fmt: str = typer.Option("table", "--format", help="table or json."),
) -> None:
    """Show each baseline: learning / ready / frozen, median, MAD, and today's band at default width.

        gpulens baseline show
        gpulens baseline show train_step_seconds --label train_job=llama --format json
    """
    from gpulens.alerts.baseline import BandSpec, describe_band, load_baselines
    from gpulens.errors import BadInputError, shown

    if fmt not in ("table", "json"):
        raise BadInputError(f"Unknown --format {shown(fmt)}.", hint="Use table or json.")
    now = time.time()
    with open_existing_store(store, "baselines", readonly=True) as st:
        items = load_baselines(st, metric, _labels(label))
        span = st.time_range()
        if not items and fmt != "json" and (metric is not None or label):
            _say_which_there_are(load_baselines(st), metric, label)
    spec = BandSpec()
    rows = []
    for b in items:
        lo, hi = describe_band(b, spec, now)
        rows.append({
            "series": b.name, "labels": b.labels, "state": b.state,
            "learn_start": b.learn_start, "learn_seconds": b.learn_seconds, "ready_at": b.learn_start + b.learn_seconds,
            "samples": b.stats.samples if b.stats else 0,
            "median": b.stats.median if b.stats else None, "mad": b.stats.mad if b.stats else None,
            "quantiles": {str(q): v for q, v in b.stats.quantiles.items()} if b.stats else {},
            "band_low": lo, "band_high": hi, "profile_hours": sorted(b.profile), "computed_at": b.computed_at,
        })
    if fmt == "json":
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        console.print("No baselines yet: they start when a learned rule first sees its series (`gpulens agent`).")
        return
    for r in rows:
        labels = ",".join(f'{k}="{v}"' for k, v in sorted(r["labels"].items()))
        state = r["state"] if r["state"] != "learning" else _learning_text(r["ready_at"], span, now)
        console.print(f"[bold]{escape(r['series'])}[/]" + escape(f"{{{labels}}}  {state}"), highlight=False)
        if r["median"] is not None:
            band = f"{r['band_low']:.4g} – {r['band_high']:.4g}" if r["band_low"] is not None else "–"
            tod = f", time-of-day profile for {len(r['profile_hours'])} h" if r["profile_hours"] else ""
            console.print(f"  median {r['median']:.4g}  MAD {r['mad']:.4g}  band {band}  ({r['samples']} samples{tod})", highlight=False)


def _learning_text(ready_at: float, span: tuple[float, float] | None, now: float) -> str:
    """When a learning baseline is ready: a baseline learns over the data's own time, so a replayed
    store whose data ends before then says so (it is ready only once newer data arrives)."""
    data_end = span[1] if span else now
    if ready_at > data_end and data_end < now - 3600:
        return (f"learning: ready once the data reaches {format_when(ready_at)} (this store's data ends "
                f"{format_when(data_end)}; `gpulens baseline freeze` uses what there is)")
    return f"learning until {format_when(ready_at)}"


def _say_which_there_are(every, metric: str | None, label: list[str] | None) -> None:  # type: ignore[no-untyped-def]
    """A filter that matched nothing in a store that has baselines names the ones it has (exit 2)."""
    from gpulens.errors import BadInputError

    if not every:
        return  # no baselines at all: "No baselines yet" says it
    names = sorted({b.name for b in every})
    asked = " ".join([*([metric] if metric else []), *(f"--label {x}" for x in label or [])])
    raise BadInputError(f"There is no baseline for {asked}.", hint="Baselines in this store: " + ", ".join(names) + ".")


def _selection(metric: str | None, label: list[str] | None, all_: bool, verb: str) -> tuple[str | None, dict[str, str]]:
    from gpulens.errors import BadInputError

    labels = _labels(label)
    if all_ and (metric is not None or labels):
        raise BadInputError(f"--all {verb}s every baseline: leave out the series name and --label, or --all.")
    if metric is None and not labels and not all_:
        raise BadInputError(f"Say which baselines to {verb}.", hint=f"Give a series name, --label KEY=VALUE, or --all to {verb} every one.")
    return metric, labels


@baseline_app.command("freeze")
def baseline_freeze_command(
    metric: str = typer.Argument(None, help=METRIC_HELP),
    label: list[str] = typer.Option(None, "--label", help=LABEL_HELP),
    all_: bool = typer.Option(False, "--all", help="Every ready baseline (a series name, --label or --all is needed)."),
    store: Path = typer.Option(DEFAULT_STORE_PATH, "--store", help=STORE_HELP),
) -> None:
    """Stop refreshing ready baselines: keep the known-good behaviour as the reference (e.g. before a
    slow drift would teach the baseline that slower is normal). A running agent picks it up.

        gpulens baseline freeze train_step_seconds --label train_job=llama
        gpulens baseline freeze --all
    """
    from gpulens.alerts.baseline import freeze_baselines, load_baselines

    metric, labels = _selection(metric, label, all_, "freeze")
    with open_existing_store(store, "baselines") as st:
        if not load_baselines(st, metric, labels):  # a typo froze nothing, exit 0, as `show` refuses it
            _say_which_there_are(load_baselines(st), metric, label)
        done = freeze_baselines(st, metric, labels)
    console.print(f"Froze {len(done)} baseline(s)." + ("" if done else " Only ready baselines can be frozen; see `gpulens baseline show`."))


@baseline_app.command("reset")
def baseline_reset_command(
    metric: str = typer.Argument(None, help=METRIC_HELP),
    label: list[str] = typer.Option(None, "--label", help=LABEL_HELP),
    all_: bool = typer.Option(False, "--all", help="Every baseline (a series name, --label or --all is needed)."),
    store: Path = typer.Option(DEFAULT_STORE_PATH, "--store", help=STORE_HELP),
) -> None:
    """Forget baselines and learn them again from now (after a deliberate change: a new model, more
    replicas, a new GPU type). Their learned rules stay quiet until relearned.

        gpulens baseline reset infer_request_latency_seconds --label service=chat
        gpulens baseline reset --all
    """
    from gpulens.alerts.baseline import load_baselines, reset_baselines

    metric, labels = _selection(metric, label, all_, "reset")
    with open_existing_store(store, "baselines") as st:
        if not load_baselines(st, metric, labels):
            _say_which_there_are(load_baselines(st), metric, label)
        done = reset_baselines(st, metric, labels)
    console.print(f"Reset {len(done)} baseline(s); they learn again from now.")


def register(app: typer.Typer) -> None:
    app.add_typer(baseline_app, name="baseline")
