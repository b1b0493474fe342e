"""`gpulens tune train` and `gpulens tune serve`: parse, validate, run the library's loop, render."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from gpulens.cli.common import console, console_err, store_option
from gpulens.cli.options import parse_ratio, with_options
from gpulens.cli.serve_options import ServeOptions

tune_app = typer.Typer(
    help="Run the tuning loop for you: baseline, find the bottleneck, change one thing, re-measure, keep or roll back.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)

KNOB_HELP = ("NAME=V1,V2,...: a knob and the values to try, the baseline's first. Known names (workers, pin_memory, "
             "batch, checkpointing, precision, compile, ...) are tried in the guides' order; repeat for more knobs.")


class _LiveView:
    """The CLI's observer: a live line per trial on a terminal, questions in beginner mode."""

    def __init__(self, ask: bool, quiet: bool):
        from gpulens.tune.loop import Observer

        self._base = Observer()
        self.ask = ask
        self.quiet = quiet
        self._progress = None
        self._task = None

    def _start(self) -> None:
        if self._progress is None and not self.quiet and console_err.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                      console=console_err, transient=True)
            self._progress.start()

    def trial_started(self, index, knobs, change) -> None:  # noqa: ANN001
        self._start()
        what = "baseline" if change is None else f"trial {index}: {change.text}"
        if self._progress is not None:
            self._task = self._progress.add_task(what, total=None)
        elif not self.quiet:
            console_err.print(f"{what} …", highlight=False)

    def progress(self, index, done, wanted, estimate) -> None:  # noqa: ANN001
        if self._progress is None or self._task is None:
            return
        desc = self._progress.tasks[-1].description.split("  ")[0]
        if estimate is not None and estimate.median is not None:
            ci = f" ({estimate.ci95_low:,.0f}…{estimate.ci95_high:,.0f})" if estimate.ci95_low is not None else ""
            desc += f"  {estimate.median:,.0f}/s{ci}"
        self._progress.update(self._task, completed=done, total=wanted, description=desc)

    def trial_finished(self, trial) -> None:  # noqa: ANN001
        if self._progress is not None and self._task is not None:
            self._progress.remove_task(self._task)
            self._task = None
        if not self.quiet:
            label = "baseline" if trial.index == 0 else f"trial {trial.index} ({', '.join(f'{k}={v}' for k, v in trial.changed.items())})"
            med = f"{trial.estimate.median:,.0f} {trial.metric}" if trial.estimate.median is not None else "no measurement"
            console_err.print(f"{label}: {med} → {trial.verdict.replace('_', ' ')}", highlight=False)

    def approve(self, change, reason) -> bool:  # noqa: ANN001
        if not self.ask:
            return True
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        return typer.confirm(f"Try {change.text} ({reason})?", default=True, err=True)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def _run(tune, spec, store: Path, *, ask: bool, fmt: str, html: Path | None) -> None:  # noqa: ANN001
    """Validate, run the loop with a live view over the store, then print or write the result."""
    from gpulens.store import Store

    spec.validate()
    view = _LiveView(ask=ask, quiet=fmt == "json")
    try:
        with Store(store) as s:
            result = tune(spec, s, view)
    finally:
        view.close()
    _emit(result, fmt, html)


def _emit(result, fmt: str, html: Path | None) -> None:  # noqa: ANN001
    from gpulens.tune.report import html_report, terminal

    # The result first: a report that cannot be written (a full disk) must not lose what the tune found.
    if fmt == "json":
        typer.echo(json.dumps(result.to_dict(), indent=2, default=str))
    else:
        console.print(terminal(result))
    if html is not None:
        from gpulens.files import write_atomically

        write_atomically(html, html_report(result), what="the HTML report", hint="Free some space or give a path in a writable folder.")
        if fmt != "json":
            console.print(f"HTML report: {html}", highlight=False)


def _check_format(fmt: str) -> None:
    from gpulens.errors import BadInputError, shown

    if fmt not in ("table", "json"):
        raise BadInputError(f"Unknown --format {shown(fmt)}.", hint="Use table or json.")


def _ask(yes: bool, fmt: str) -> bool:
    return not yes and fmt != "json" and sys.stdin.isatty() and console_err.is_terminal


@tune_app.command("train", context_settings={"allow_interspersed_args": False})
def train_command(
    command: list[str] = typer.Argument(None, help="Your training command after --, with {NAME} placeholders for the knobs."),
    knob: list[str] = typer.Option(None, "--knob", help=KNOB_HELP),
    steps: int = typer.Option(25, "--steps", min=1, help="Steps per run of the command, warm-up included ({steps} in the command gets it; otherwise gpulens stops the command after that many)."),
    warmup: int = typer.Option(5, "--warmup", min=0, help="Steps dropped at the start of each run (compilation, allocator growth, a loader's prefetch burst)."),
    block: int = typer.Option(4, "--block", min=1, help="Steps per throughput sample."),
    repeats: int = typer.Option(3, "--repeats", min=1, help="Most runs of the command pooled into one trial, until the estimate is tight."),
    tight: str = typer.Option("5%", "--tight", help="Stop repeating when the 95 % interval's half-width is within this share of the median."),
    min_gain: str = typer.Option("5%", "--min-gain", help="Keep a change only when it is faster by at least this much (and significant)."),
    budget: str = typer.Option("20m", "--budget", help="Wall-clock budget for the whole tune."),
    name: str = typer.Option(None, "--name", help="Run name in the store. Default: the monitor's job name."),
    model: str = typer.Option(None, "--model", help="The model trained (a preset, a config.json or a size such as 1b): the planner "
                              "then checks each setting fits before it runs, and skips one it predicts will not."),
    gpu: str = typer.Option(None, "--gpu", help="The GPU type for the planner's check (gpulens plan gpus); needed with --model."),
    seq: int = typer.Option(2048, "--seq", min=1, help="Tokens per sequence, for the planner's check."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Run every trial without asking (beginner mode asks on a terminal)."),
    store: Path = store_option(),
    fmt: str = typer.Option("table", "--format", help="table or json."),
    html: Path = typer.Option(None, "--html", help="Also write the report as one HTML file."),
) -> None:
    """Tune a training command: baseline, diagnose, one change at a time, keep only what is faster beyond noise.

    The command's TrainingMonitor (or gpulens callback) finds the tune's store through the
    environment; no code change is needed beyond the monitor. Every trial is a run in the store.
    Without --knob (beginner mode) gpulens proposes values for the placeholders written with their
    current value, such as {workers=0}, and asks before each trial. See docs/tune.md.

        gpulens tune train --knob workers=0,2,4 --knob batch=16,32 -- python train.py --num-workers {workers} --batch-size {batch}
        gpulens tune train -- python train.py --num-workers {workers=0} --batch-size {batch=16}
    """
    from gpulens.errors import BadInputError
    from gpulens.tune.command import CommandTemplate
    from gpulens.tune.fit import FitCheck
    from gpulens.tune.knobs import parse_knobs
    from gpulens.tune.train import TrainTuneSpec, proposed_knobs, tune_train
    from gpulens.units import parse_duration

    _check_format(fmt)
    if (model is None) != (gpu is None):
        raise BadInputError("The planner's check needs both --model and --gpu.", hint="E.g. --model llama-3.2-1b --gpu l4, or neither.")
    template = CommandTemplate.of(command or [])
    knobs = parse_knobs(knob or [])
    beginner = not knobs
    notes = []
    if beginner:
        knobs = proposed_knobs(template)
        notes.append("beginner mode: proposed " + "; ".join(f"{k.name}={','.join(k.values)}" for k in knobs))
    spec = TrainTuneSpec(template, knobs, steps=steps, warmup_steps=warmup, block_steps=block, max_runs_per_trial=repeats,
                         tight_ratio=parse_ratio(tight, "--tight"), threshold_ratio=parse_ratio(min_gain, "--min-gain"),
                         budget_seconds=parse_duration(budget, what="--budget"), name=name, stop_when_clear=beginner, notes=notes,
                         fit=FitCheck(model, gpu, seq=seq) if model else None)
    _run(tune_train, spec, store, ask=beginner and _ask(yes, fmt), fmt=fmt, html=html)


@tune_app.command("serve")
@with_options(ServeOptions)
def serve_command(
    opts: ServeOptions,
    knob: list[str] = typer.Option(None, "--knob", help="NAME=V1,V2,...: a server knob ({NAME} in --server-cmd) or a client knob "
                                   "(max_connections, stream), the baseline's value first."),
    server_cmd: str = typer.Option(None, "--server-cmd", help="The command that starts the server, with {NAME} placeholders ({port} is the URL's)."),
    ready_url: str = typer.Option(None, "--ready-url", help="The URL that answers once the server is ready. Default: --url."),
    ready_timeout: str = typer.Option("10m", "--ready-timeout", help="Longest wait for a started server to be ready."),
    budget: str = typer.Option("20m", "--budget", help="Wall-clock budget for the whole tune."),
    name: str = typer.Option("serve", "--name", help="Run name in the store."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Run every trial without asking (beginner mode asks on a terminal)."),
    store: Path = store_option(),
    fmt: str = typer.Option("table", "--format", help="table or json."),
    html: Path = typer.Option(None, "--html", help="Also write the report as one HTML file."),
) -> None:
    """Tune a server: the configuration with the highest request rate that meets every SLO.

    With --server-cmd each configuration is started, waited for (its cold start recorded),
    swept with `bench serve --sweep` and stopped; without it only the client's knobs are tuned.
    The load, SLO and sweep options are `bench serve`'s, with its defaults (a `stream` knob
    overrides --stream). Without --knob (beginner mode) gpulens proposes values for the batching
    limits, token budgets and KV-cache memory shares written in the server command with their
    value, such as {max_num_seqs=256} or {gpu_memory_utilization=0.9}, and asks before each trial.

        gpulens tune serve --url http://127.0.0.1:8000/v1/completions --slo "p99_latency<=2s" --server-cmd "vllm serve my-model --port {port} --max-num-seqs {max_num_seqs}" --knob max_num_seqs=64,128,256
        gpulens tune serve --url http://127.0.0.1:8000/generate --slo "p99_latency<=500ms" --knob max_connections=8,32,128
    """
    from gpulens.bench.serve import LoadSpec
    from gpulens.tune.command import CommandTemplate
    from gpulens.tune.knobs import parse_knobs
    from gpulens.tune.serve import ServeTuneSpec, tune_serve
    from gpulens.units import parse_duration

    _check_format(fmt)
    opts.validate()
    load = LoadSpec(target=opts.target(), rate=opts.sweep_rate(), duration_seconds=opts.duration_seconds(),
                    timeout_seconds=opts.timeout_seconds)
    spec = ServeTuneSpec(load, opts.slos(), parse_knobs(knob or []),
                         server_command=CommandTemplate.of(server_cmd) if server_cmd else None,
                         budget_seconds=parse_duration(budget, what="--budget"), max_rate=opts.max_rate,
                         tolerance_ratio=opts.tolerance_ratio, max_probes=opts.max_probes,
                         ready_timeout_seconds=parse_duration(ready_timeout, what="--ready-timeout"), ready_url=ready_url, name=name,
                         propose=not knob)
    _run(tune_serve, spec, store, ask=not knob and _ask(yes, fmt), fmt=fmt, html=html)


def register(app: typer.Typer) -> None:
    app.add_typer(tune_app, name="tune")
