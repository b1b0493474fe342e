"""`gpulens eval compare`: the accuracy gate (docs/eval.md)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from gpulens.cli.common import console

eval_app = typer.Typer(help="Accuracy gates: is a candidate model no worse than its baseline on the same examples?",
                       no_args_is_help=True)


def _fmt(x: float) -> str:
    return f"{x:+.4g}" if x else "0"


@eval_app.command("compare")
def compare_command(
    baseline: Path = typer.Argument(..., help="The baseline's per-example results: an lm-eval --log_samples file or folder, or a JSONL with an id and the metric on each line, e.g. {\"id\": \"q1\", \"acc\": 1}."),
    candidate: Path = typer.Argument(..., help="The candidate's, in the same form."),
    metric: str = typer.Option(..., "--metric", help="The per-example metric, e.g. acc, exact_match, or a field of your JSONL."),
    margin: float = typer.Option(None, "--margin", help="How much worse the candidate may be, in the metric's units. Default for 0-1 scores: 0.01."),
    direction: list[str] = typer.Option([], "--direction", help="METRIC=higher or METRIC=lower, for a metric gpulens does not know."),
    task: str = typer.Option(None, "--task", help="The lm-eval task, when a folder holds several."),
    filter_name: str = typer.Option(None, "--filter", help="The lm-eval filter, when a task scores each example under several."),
    seed: int = typer.Option(0, "--seed", help="Seed of the paired bootstrap (non 0-1 metrics)."),
    fmt: str = typer.Option("table", "--format", help="table or json."),
) -> None:
    """Pass (exit 0) when the candidate is shown to be no worse than the baseline by more than
    --margin: the lower end of the 95 % interval of its improvement is above −margin. Exit 1 on a
    regression or when the examples cannot show it, 2 on bad input."""
    from gpulens.errors import BadInputError, GateFailedError, shown
    from gpulens.evals import compare_files
    from gpulens.vocab.directions import parse_direction

    if fmt not in ("table", "json"):
        raise BadInputError(f"--format must be table or json, not {shown(fmt)}.")
    overrides = dict(parse_direction(d) for d in direction)
    out = compare_files(baseline, candidate, metric, margin=margin, overrides=overrides, task=task,
                        filter_name=filter_name, seed=seed)
    r = out.result
    if fmt == "json":
        typer.echo(json.dumps(out.to_json()))
    else:
        better = "higher" if r.direction == "higher_is_better" else "lower"
        method = "exact McNemar, Tango score interval" if r.method == "exact_mcnemar" else "paired bootstrap"
        console.print(f"{r.metric} ({better} is better), {r.examples} paired examples, {method}", highlight=False)
        console.print(f"  baseline   {r.baseline_mean:.4g}", highlight=False)
        console.print(f"  candidate  {r.candidate_mean:.4g}", highlight=False)
        console.print(f"  difference {_fmt(r.difference)}  95 % interval [{_fmt(r.difference_low)}, {_fmt(r.difference_high)}]"
                      + (f"  p = {r.p_value:.3g}" if r.p_value is not None else ""), highlight=False)
        console.print(f"  flipped    {r.improved} better, {r.regressed} worse", highlight=False)
        sentence = {
            "pass": f"PASS: no worse than the baseline by more than {r.margin:g}",
            "regression": f"FAIL: a real drop (the whole interval is worse than the baseline; margin {r.margin:g})",
            "inconclusive": f"FAIL: cannot show it is no worse than the baseline by more than {r.margin:g}: {r.reason}",
        }[r.verdict]
        console.print(("[green]" if r.passed else "[red]") + sentence + "[/]", highlight=False)
    if not r.passed:
        raise GateFailedError(f"The candidate failed the gate on {r.metric}: {r.verdict} (margin {r.margin:g}).",
                              hint=f"{r.reason[:1].upper()}{r.reason[1:]}." if r.verdict == "inconclusive" else None)


def register(app: typer.Typer) -> None:
    app.add_typer(eval_app, name="eval")
