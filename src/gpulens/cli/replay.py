"""`gpulens replay`: import a recorded trace into a store."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from gpulens.cli.agent import MAX_GAP_HELP
from gpulens.cli.common import STORE_HELP, console, console_err
from gpulens.store import DEFAULT_STORE_PATH

REPLAY_MAX_GAP_HELP = MAX_GAP_HELP.removeprefix("For replay backends: ").replace("the longest", "The longest", 1)


def replay_command(
    trace: Path = typer.Argument(None, help="A trace folder (telemetry.jsonl + events.jsonl) or a `gpulens record` file. Default: the bundled H200 session."),
    store: Path = typer.Option(DEFAULT_STORE_PATH, "--store", help=STORE_HELP),
    speed: str = typer.Option("max", "--speed", help="max = import as fast as possible; N = play at N times the recorded pace."),
    max_gap: str = typer.Option("60s", "--max-gap", help=REPLAY_MAX_GAP_HELP),
    job: str = typer.Option("h200-demo", "--job", help="Job label for imported training steps that name none."),
    service: str = typer.Option("h200-demo", "--service", help="Service label for imported requests that name none."),
    host: str = typer.Option(None, "--host", help="Host to store the trace under (GPU samples and workload records). Default: the host the recording names, else replay."),
    force: bool = typer.Option(False, "--force", help="Import all of the trace again, even what this store holds of it already (those samples are then stored twice)."),
    learn: str = typer.Option("7d", "--learn", help="How long each series is learned (from its first sample) before learned alert rules may fire."),
    rules: Path = typer.Option(None, "--rules", help="Alert rules file (YAML). Default: the built-in packs."),
    notify: list[str] = typer.Option([], "--notify", help="Where alerts go: log, file:PATH, webhook:URL. Repeatable."),
) -> None:
    """Import a recorded trace (GPU telemetry and workload events) as if it had been sampled live.

    Recorded times are kept, alert rules are evaluated along the recorded timeline, and a malformed
    line is skipped and counted while the rest is imported; so is a line whose time is more than
    --max-gap from both its neighbours. Each sample is stored once: a trace imported before imports
    nothing again, a grown one only its new lines, an interrupted import (Ctrl-C, SIGTERM) keeps what
    it committed and is continued by the next, and replays of one trace running at once wait for
    each other.

        gpulens replay                                   # the bundled H200 session
        gpulens replay path/to/trace --store run.db --learn 20s
        gpulens replay node-a.jsonl --host node-a        # joins events that say host node-a
    """

    from gpulens.cli.agent import install_stop_handlers
    from gpulens.data import bundled_trace
    from gpulens.pipeline import AlertsConfig, StopEvent
    from gpulens.pipeline.ingest import import_trace
    from gpulens.store import Store
    from gpulens.units import format_seconds, parse_duration, parse_speed
    from gpulens.workload.importers import ImportContext

    speed_f = parse_speed(speed, allow_max=True)
    max_gap_s = parse_duration(max_gap, what="--max-gap")
    stop = StopEvent()
    install_stop_handlers(stop)
    path = trace or bundled_trace()
    alerts = AlertsConfig(parse_duration(learn, what="--learn", allow_zero=True), rules, list(notify))
    def waiting(pid: str) -> None:
        console_err.print(escape(f"another gpulens replay (pid {pid}) is importing this trace into {store}; waiting for it, "
                                 "then importing what it did not."))

    with Store(store) as st, console_err.status(f"importing {path} …"):
        summary = import_trace(path, st, speed=speed_f, ctx=ImportContext(job=job, service=service, host=host or ""), force=force,
                               alerts=alerts, on_wait=waiting, max_gap_seconds=max_gap_s, stop_event=stop)
    if summary.already_imported:
        console.print(escape(f"{summary.trace} is already in {store}; nothing imported (use --force to import it again)."))
        return
    if summary.lines_already_imported:
        console.print(escape(f"{summary.lines_already_imported} line(s) of {summary.trace} were imported before; "
                             "only what came after them is imported now."))
    events = ", ".join(f"{n} {k}" for k, n in sorted(summary.events.items())) or "none"
    console.print(escape(
        f"imported {summary.gpu_frames} GPU samples ({summary.gpu_values} values) over "
        f"{format_seconds(summary.duration_seconds)} from {', '.join(summary.gpus)}; events: {events}"
    ))
    if summary.skipped_lines:
        first = "; ".join(str(x) for x in summary.skipped[:5])
        console_err.print(f"[yellow]skipped {summary.skipped_lines} malformed line(s)[/] ({escape(first)}); the rest was imported.")
    if summary.skipped_events:
        console_err.print(f"[yellow]skipped {summary.skipped_events} workload record(s)[/] without a usable time or fields.")


def register(app: typer.Typer) -> None:
    app.command("replay")(replay_command)
