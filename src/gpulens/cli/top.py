"""`gpulens top`: a live terminal view per GPU over any backend."""

from __future__ import annotations

from collections import deque

import typer

from gpulens.cli.agent import MAX_GAP_HELP
from gpulens.cli.common import console
from gpulens.render.top import render


def top_command(
    backend: str = typer.Option(None, "--backend", "-b", help="nvml, fake[:N], replay[:PATH]. Default: nvml when a driver is present."),
    interval: str = typer.Option("1s", "--interval", help="Refresh interval."),
    duration: str = typer.Option(None, "--duration", help="Stop after this long. Default: until Ctrl-C."),
    speed: str = typer.Option("1", "--speed", help="For replay: 1 = recorded pace, N = faster."),
    max_gap: str = typer.Option("60s", "--max-gap", help=MAX_GAP_HELP),
) -> None:
    """A live view of each GPU: utilization with its recent history, memory, temperature, power,
    clocks, throttle reasons and processes. Ctrl-C quits."""
    import time

    from rich.live import Live

    from gpulens.cli.agent import install_stop_handlers
    from gpulens.k8s.node import node_host
    from gpulens.pipeline import Frame, NodeConfig, StopEvent, build_node
    from gpulens.units import parse_duration, parse_speed

    interval_s = parse_duration(interval, what="--interval")
    duration_s = parse_duration(duration, what="--duration") if duration else None
    speed_f = parse_speed(speed, allow_max=True)
    max_gap_s = parse_duration(max_gap, what="--max-gap")
    history: dict[int, deque[float]] = {}
    host = node_host()
    last_draw = 0.0
    live = Live(console=console, refresh_per_second=4, transient=False)

    def show(frame: Frame) -> None:
        nonlocal last_draw
        for s in frame.samples:
            if s.utilization_gpu_ratio is not None:
                history.setdefault(s.gpu, deque(maxlen=40)).append(s.utilization_gpu_ratio)
        # a replay hands every recorded frame: draw at the refresh interval, not at 10 Hz
        if frame.source_time is None or time.monotonic() - last_draw >= interval_s:
            live.update(render(frame.samples, history, host))
            last_draw = time.monotonic()

    stop = StopEvent()
    install_stop_handlers(stop)  # before the backend opens: a signal while it starts ends the view too
    node = build_node(NodeConfig(backend=backend, speed=speed_f, max_gap_seconds=max_gap_s, interval_seconds=interval_s, view=show,
                                 alerts=None, colocation=False, stop_event=stop))
    try:
        with live:
            node.run(duration_s)
    finally:
        node.close()


def register(app: typer.Typer) -> None:
    app.command("top")(top_command)
