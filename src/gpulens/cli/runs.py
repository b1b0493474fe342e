"""`gpulens runs`, `gpulens note` and `gpulens compare`: the record of runs and changes, and the
statistical comparison that gates a regression."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape

from gpulens.cli.common import STORE_HELP, console, open_existing_store
from gpulens.errors import shown
from gpulens.store import DEFAULT_STORE_PATH
from gpulens.vocab.names import TRAIN_JOB_LABEL
from gpulens.vocab.time import ZONE, format_span, format_when

_NO_RUNS_HINT = "Record one with `gpulens bench train`, or point --store at your store."

runs_app = typer.Typer(help="Stored runs (training jobs, load tests, benchmarks) and what changed between them.", no_args_is_help=True)


def _check_format(fmt: str) -> None:
    from gpulens.errors import BadInputError, shown

    if fmt not in ("table", "json"):
        raise BadInputError(f"Unknown --format {shown(fmt)}.", hint="Use table or json.")


@runs_app.command("list")
def runs_list_command(
    store: Path = typer.Option(DEFAULT_STORE_PATH, "--store", help=STORE_HELP),
    kind: str = typer.Option(None, "--kind", help="Only runs of this kind (e.g. bench-train, loadtest)."),
    name: str = typer.Option(None, "--name", help="Only runs of this name."),
    limit: int = typer.Option(50, "--limit", min=1, help="At most this many, newest first."),
    fmt: str = typer.Option("table", "--format", help="table or json."),
) -> None:
    """List stored runs, newest first, with their verdict from `gpulens compare`.

        gpulens runs list --kind bench-train
    """
    from gpulens.runs import list_runs, run_changes

    _check_format(fmt)
    with open_existing_store(store, "runs", hint=_NO_RUNS_HINT, readonly=True) as st:
        runs = list_runs(st, kind, name, limit=limit)
        changed = {r.id: len(run_changes(st, r.id)) for r in runs}
        kinds = sorted({r.kind for r in list_runs(st)}) if not runs and (kind or name) else []
    if fmt == "json":
        typer.echo(json.dumps([{k: v for k, v in r.__dict__.items() if k != "samples"} for r in runs], indent=2))
        return
    if not runs and kinds:  # a filter that matches nothing, not an empty store
        asked = " and ".join(f"{what} {shown(v)}" for what, v in (("kind", kind), ("name", name)) if v)
        console.print(escape(f"No runs of {asked}; the store holds runs of kind {', '.join(kinds)}."), highlight=False)
        return
    if not runs:
        console.print("No runs stored yet. `gpulens bench train` records one.")
        return
    from rich.table import Table

    from gpulens.render import print_table

    t = Table()
    for col in ("id", "kind", "name", f"when ({ZONE})", "verdict", "changes", "summary"):
        t.add_column(col)
    for r in runs:
        verdict = {"good": "[green]good[/]", "regression": "[red]regression[/]"}.get(r.verdict or "", "")
        if r.baseline:
            verdict = (verdict + " baseline").strip()
        summ = _headline(r.summary)
        t.add_row(str(r.id), escape(r.kind), escape(r.name), format_when(r.ended or r.created, precision="minute", zone=False), verdict, str(changed[r.id] or ""), escape(summ))
    print_table(console, t)


# Summary figures worth a column, in this order; other numbers follow, times and counts never.
_HEADLINE = ("step_seconds_median", "tokens_per_second", "mfu_ratio", "latency_p95_seconds", "requests_per_second")
_NOT_HEADLINE = ("started", "ended", "created", "flops_per_token", "parameters", "tokens_per_step")


def _num(v: float) -> str:
    """A figure a person reads: 11,640 rather than 1.164e+04; 4 significant digits below 1000."""
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def _headline(summary: dict) -> str:
    nums = {k: v for k, v in summary.items() if isinstance(v, int | float) and not isinstance(v, bool) and k not in _NOT_HEADLINE}
    keys = [k for k in _HEADLINE if k in nums] + [k for k in nums if k not in _HEADLINE]
    from gpulens.mfu import mfu_is_impossible

    return ", ".join(f"{k}={_num(nums[k])}" + (" (impossible: above the peak)" if k == "mfu_ratio" and mfu_is_impossible(nums[k]) else "")
                     for k in keys[:3])


@runs_app.command("show")
def runs_show_command(
    run: str = typer.Argument(..., help="A run id, or 'latest'."),
    store: Path = typer.Option(DEFAULT_STORE_PATH, "--store", help=STORE_HELP),
    fmt: str = typer.Option("table", "--format", help="table or json."),
) -> None:
    """Show one run: configuration, summary, fingerprint and what changed since the previous run."""
    from gpulens.runs import resolve_run, run_changes

    _check_format(fmt)
    with open_existing_store(store, "runs", hint=_NO_RUNS_HINT, readonly=True) as st:
        r = resolve_run(st, run)
        changes = run_changes(st, r.id)
    if fmt == "json":
        d = dict(r.__dict__)
        d["changes"] = [{"section": c.section, "key": c.change.key, "old": c.change.old, "new": c.change.new} for c in changes]
        typer.echo(json.dumps(d, indent=2))
        return
    console.print(f"[bold]{escape(r.label)}[/]  " + escape(f"{format_span(r.started, r.ended, precision='minute')}  verdict: {r.verdict or '–'}"))
    for title, d in (("config", r.config), ("summary", r.summary)):
        console.print(f"[bold]{title}[/]: " + escape(json.dumps(d, default=str)), highlight=False, soft_wrap=True)
    if isinstance(r.summary.get("mfu_ratio"), int | float):
        from gpulens.mfu import MFU_IMPOSSIBLE, mfu_is_impossible

        if mfu_is_impossible(r.summary["mfu_ratio"]):
            console.print(f"[bold red]MFU {r.summary['mfu_ratio']:.0%}[/] {MFU_IMPOSSIBLE}.", highlight=False)
    console.print("[bold]samples[/]: " + escape(", ".join(f"{m} ({len(v)})" for m, v in r.samples.items()) or "none"))
    if changes:
        console.print(f"[bold]changed since run #{changes[0].previous_run_id}[/]:")
        for c in changes:
            console.print(escape(f"  {c.section}: {c.change}"), highlight=False)


@runs_app.command("baseline")
def runs_baseline_command(
    run: str = typer.Argument(..., help="The run id to use as the baseline of its kind and name."),
    store: Path = typer.Option(DEFAULT_STORE_PATH, "--store", help=STORE_HELP),
) -> None:
    """Mark a run as the baseline that `gpulens compare baseline NEW` compares against."""
    from gpulens.runs import resolve_run, set_baseline

    with open_existing_store(store, "runs", hint=_NO_RUNS_HINT) as st:
        r = resolve_run(st, run)
        set_baseline(st, r.id)
    console.print(escape(f"run {r.label} is now the baseline of {r.kind}/{r.name}."))


def note_command(
    text: str = typer.Argument(..., help='What you changed, e.g. "raised micro-batch to 16".'),
    store: Path = typer.Option(DEFAULT_STORE_PATH, "--store", help=STORE_HELP),
    job: str = typer.Option(None, "--job", help="Attach the note to this training job."),
    service: str = typer.Option(None, "--service", help="Attach the note to this service."),
) -> None:
    """Attach a change to the timeline, so the next comparison and the dashboard show what you did.

        gpulens note "raised micro-batch to 16" --job llama-ft
    """
    from gpulens.runs import add_note
    from gpulens.store import Store

    labels = {k: v for k, v in ((TRAIN_JOB_LABEL, job), ("service", service)) if v}
    with Store(store) as st:
        t = add_note(st, text, labels=labels)
    console.print(escape(f"noted at {format_when(t, precision='minute')}: {text.strip()}"), highlight=False)


def _parse_threshold(text: str) -> float:
    from gpulens.errors import BadInputError, shown

    s = text.strip()
    try:
        v = float(s.rstrip("%"))
    except ValueError:
        raise BadInputError(f"--threshold {shown(text)} is not a number.", hint="Use e.g. --threshold 5% (or 0.05).") from None
    ratio = v / 100 if s.endswith("%") or v >= 1 else v
    if not (0 < ratio < 10):
        raise BadInputError(f"--threshold {text} is out of range.", hint="Use a positive percentage such as 5%.")
    return ratio


def compare_command(
    a: str = typer.Argument(..., help="The reference run (an id, 'baseline' or 'latest'); alone, the new run, compared with its baseline."),
    b: str = typer.Argument(None, help="The new run (an id or 'latest')."),
    store: Path = typer.Option(DEFAULT_STORE_PATH, "--store", help=STORE_HELP),
    threshold: str = typer.Option("5%", "--threshold", help="A median change smaller than this is 'no change' even when significant."),
    alpha: float = typer.Option(0.05, "--alpha", help="Significance level of the Mann-Whitney test."),
    metric: list[str] = typer.Option([], "--metric", help="Compare only this metric (repeatable). Default: every metric both runs sampled."),
    margin: float = typer.Option(0.01, "--margin", help="Scores (accuracy, exact_match, f1): the absolute drop that is a regression (non-inferiority margin)."),
    direction: list[str] = typer.Option([], "--direction", help="METRIC=higher or METRIC=lower: which way is better, for a metric gpulens does not know (repeatable)."),
    fmt: str = typer.Option("table", "--format", help="table or json."),
    record: bool = typer.Option(True, "--record/--no-record", help="Mark the new run good or regression (what 'last known-good' uses)."),
) -> None:
    """Compare run B with run A, metric by metric, with statistics rather than eyeballing.

    Per metric: the median change with a bootstrap 95 % interval, a Mann-Whitney test, and a
    verdict (regression, improvement, no change, not enough data, direction unknown, not comparable:
    a per-step metric such as step time of runs with another batch size or sequence length). Scores from
    0 to 1 (accuracy, exact_match, f1) are tested for non-inferiority instead: a regression when the
    lower 95 % bound of B − A is below −margin. Beside it: what changed in the configuration and the
    environment, and the last known-good run to roll back to.

    Exit code 1 when any metric regressed, so it can gate a CI job.

        gpulens compare 12 17
        gpulens compare baseline latest --threshold 3%
        gpulens compare 17                  # run 17 against its baseline
        gpulens compare 12 17 --metric accuracy --margin 0.02
    """
    from gpulens.bench.compare import compare_runs
    from gpulens.runs import resolve_run
    from gpulens.vocab.directions import parse_direction

    _check_format(fmt)
    ratio = _parse_threshold(threshold)
    directions = dict(parse_direction(d) for d in direction)
    with open_existing_store(store, "runs", hint=_NO_RUNS_HINT) as st:
        if b is None:
            new = resolve_run(st, a)
            ref = resolve_run(st, "baseline", other=new)
        else:
            new = resolve_run(st, b)
            ref = resolve_run(st, a, other=new)
        cmp = compare_runs(ref, new, threshold_ratio=ratio, alpha=alpha, margin=margin, directions=directions,
                           metrics=list(metric) or None, store=st, record=record)
    if fmt == "json":
        typer.echo(json.dumps(cmp.to_dict(), indent=2, default=str))
    else:
        _render(cmp)
    if cmp.regression:
        from gpulens.errors import GateFailedError

        regressed = ", ".join(m.metric for m in cmp.metrics if m.verdict == "regression")
        raise GateFailedError(f"Run {cmp.b.label} regressed against {cmp.a.label} on {regressed}.",
                              hint="The comparison above says by how much and what changed.")


def _render(cmp) -> None:  # noqa: ANN001
    from rich.table import Table

    from gpulens.render import print_table

    colour = {"regression": "red", "improvement": "green", "no change": "default", "not enough data": "yellow",
              "direction unknown": "yellow", "not comparable": "yellow"}
    console.print(f"[bold]{escape(cmp.b.label)}[/] against [bold]{escape(cmp.a.label)}[/] (threshold {cmp.threshold_ratio:.1%}, α {cmp.alpha:g}"
                  + (f", score margin {cmp.margin:g}" if any(m.test == "non-inferiority" for m in cmp.metrics) else "") + ")")
    t = Table()
    scores = any(m.test == "non-inferiority" for m in cmp.metrics)  # then each cell says median or mean
    # one sample count per side goes in the header (four characters less per cell, so the table fits 80)
    n_a, n_b = ({m.n_a for m in cmp.metrics}, {m.n_b for m in cmp.metrics}) if not scores else (set(), set())
    one_n = len(n_a) == 1 and len(n_b) == 1
    a_head = "A" if scores else f"A median n={n_a.pop()}" if one_n else "A median"
    b_head = "B" if scores else f"B median n={n_b.pop()}" if one_n else "B median"
    for col in ("metric", a_head, b_head, "change", "95 % CI", "p", "verdict"):
        t.add_column(col, justify="right" if col not in ("metric", "verdict") else "left")
    arrows = {"lower_is_better": "↓ better", "higher_is_better": "↑ better", "unknown": "? better"}
    for m in cmp.metrics:
        f = lambda v: "–" if v is None else _num(v)  # noqa: E731
        pc = lambda v: "–" if v is None else f"{v:+.1%}"  # noqa: E731
        if m.test == "non-inferiority":  # a score: means and the absolute difference
            a_cell, b_cell = f"{f(m.mean_a)} [dim]mean n={m.n_a}[/]", f"{f(m.mean_b)} [dim]mean n={m.n_b}[/]"
            change = "–" if m.difference is None else f"{m.difference:+.4f}"
            ci = "–" if m.ci95_low is None else f"{m.ci95_low:+.4f} … {m.ci95_high:+.4f}"
        else:
            tag = "median " if scores else ""
            if one_n:
                a_cell, b_cell = f(m.median_a), f(m.median_b)
            else:
                a_cell, b_cell = f"{f(m.median_a)} [dim]{tag}n={m.n_a}[/]", f"{f(m.median_b)} [dim]{tag}n={m.n_b}[/]"
            change = pc(m.change_ratio)
            ci = "–" if m.ci95_low_ratio is None else f"{m.ci95_low_ratio:+.1%} … {m.ci95_high_ratio:+.1%}"
        t.add_row(
            f"{escape(m.metric)} [dim]{arrows[m.direction]}[/]", a_cell, b_cell,
            change, ci, "–" if m.p_value is None else f"{m.p_value:.2g}", f"[{colour[m.verdict]}]{m.verdict}[/]",
        )
    print_table(console, t)
    for m in cmp.metrics:
        if m.verdict in ("not enough data", "direction unknown", "not comparable") or m.test == "non-inferiority":
            console.print(f"[{colour[m.verdict]}]{escape(m.metric)}[/]: {escape(m.reason)}", highlight=False)
    if cmp.config_changes or cmp.fingerprint_changes or cmp.notes:
        console.print("[bold]what changed[/]:")
        for section, changes in (("config", cmp.config_changes), ("environment", cmp.fingerprint_changes)):
            for c in changes:
                console.print(escape(f"  {section}: {c}"), highlight=False)
        for n in cmp.notes:
            console.print(escape(f"  note ({format_when(n.t, precision='minute')}): {n.text}"), highlight=False)
    else:
        console.print("[bold]what changed[/]: nothing in configuration or environment, and no `gpulens note` between the runs.")
    v = cmp.verdict
    console.print(f"verdict: [{colour[v]}]{v}[/]")
    if cmp.regression:
        good = cmp.last_known_good
        if good is not None:
            console.print(f"last known-good: [bold]{escape(good.label)}[/] — roll back to its configuration (`gpulens runs show {good.id}`).")
        else:
            console.print("last known-good: none recorded yet.")


def register(app: typer.Typer) -> None:
    app.add_typer(runs_app, name="runs")
    app.command("note")(note_command)
    app.command("compare")(compare_command)
