"""`gpulens top`: a live terminal view per GPU over any backend."""

from __future__ import annotations

import threading
from collections import deque

import typer

from gpulens.cli.common import console
from gpulens.render.top import render


def top_command(
    backend: str = typer.Option(None, "--backend", "-b", help="nvml, fake[:N], replay[:PATH]. Default: nvml when a driver is present."),
    interval: str = typer.Option("1s", "--interval", help="Refresh interval."),
    duration: str = typer.Option(None, "--duration", help="Stop after this long. Default: until Ctrl-C."),
    speed: str = typer.Option("1", "--speed", help="For replay: 1 = recorded pace, N = faster."),
) -> None:
    """A live view of each GPU: utilization with its recent history, memory, temperature, power,
    clocks, throttle reasons and processes. Ctrl-C quits."""
    import time

    from rich.live import Live

    from gpulens.cli.agent import install_stop_handlers
    from gpulens.gpu import open_backend
    from gpulens.units import parse_duration

    interval_s = parse_duration(interval, what="--interval")
    duration_s = parse_duration(duration, what="--duration") if duration else None
    speed_f = None if speed == "max" else parse_duration(speed, what="--speed")
    be = open_backend(backend, speed=speed_f, rebase=True)
    history: dict[int, deque[float]] = {g.index: deque(maxlen=40) for g in be.gpus()}
    stop = threading.Event()
    install_stop_handlers(stop)
    host = __import__("socket").gethostname()
    t_end = None if duration_s is None else time.monotonic() + duration_s
    paced = bool(getattr(be, "paced", False))
    last_draw = 0.0
    try:
        with Live(console=console, refresh_per_second=4, transient=False) as live:
            while not stop.is_set() and not be.exhausted and (t_end is None or time.monotonic() < t_end):
                samples = be.sample()
                for s in samples:
                    if s.utilization_gpu_ratio is not None:
                        history.setdefault(s.gpu, deque(maxlen=40)).append(s.utilization_gpu_ratio)
                if samples and (not paced or time.monotonic() - last_draw >= interval_s):
                    live.update(render(samples, history, host))
                    last_draw = time.monotonic()
                if not paced:
                    stop.wait(interval_s)
    finally:
        be.close()


def register(app: typer.Typer) -> None:
    app.command("top")(top_command)
