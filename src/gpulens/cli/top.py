"""`gpulens top`: a live terminal view per GPU over any backend."""

from __future__ import annotations

from collections import deque

import typer
from rich.markup import escape

from gpulens.cli.common import console

_SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], lo: float = 0.0, hi: float = 1.0) -> str:
    if not values:
        return ""
    span = (hi - lo) or 1.0
    return "".join(_SPARK[min(len(_SPARK) - 1, max(0, int((v - lo) / span * (len(_SPARK) - 1) + 0.5)))] for v in values)


def render(samples, history, host: str):  # type: ignore[no-untyped-def]
    from rich.table import Table

    from gpulens.gpu.types import decode_clock_events
    from gpulens.units import format_bytes

    table = Table(title=escape(f"gpulens top — {host}"), title_justify="left", expand=True)
    for col in ("GPU", "util", "history (util)", "memory", "temp", "power", "SM clock", "throttle", "processes"):
        table.add_column(col, no_wrap=col != "processes")
    for s in samples:
        if s.lost:
            table.add_row(escape(f"{s.gpu} {s.name}"), "[bold red]LOST[/]", "", "", "", "", "", "", "")
            continue

        def pct(v):  # type: ignore[no-untyped-def]
            return "–" if v is None else f"{v * 100:.0f} %"

        mem = "–"
        if s.memory_used_bytes is not None and s.memory_total_bytes:
            mem = f"{format_bytes(s.memory_used_bytes)} / {format_bytes(s.memory_total_bytes)}"
        temp = "–" if s.temperature_celsius is None else f"{s.temperature_celsius:.0f} °C"
        if s.temperature_celsius is not None and s.temperature_slowdown_celsius and s.temperature_celsius >= s.temperature_slowdown_celsius - 5:
            temp = f"[bold red]{temp}[/]"
        power = "–" if s.power_watts is None else f"{s.power_watts:.0f} W" + (f" / {s.power_limit_watts:.0f}" if s.power_limit_watts else "")
        clock = "–" if s.sm_clock_hz is None else f"{s.sm_clock_hz / 1e6:.0f} MHz"
        reasons = [r for r in decode_clock_events(s.clock_event_mask) if r != "idle"]
        throttle = "[yellow]" + ", ".join(reasons) + "[/]" if reasons else ("idle" if s.clock_event_mask == 1 else "none")
        procs = "–"
        if s.processes:
            procs = escape(", ".join(f"{p.pid} {p.name} {format_bytes(p.used_memory_bytes)}" for p in s.processes[:3]))
        elif s.compute_process_count:
            procs = str(s.compute_process_count)
        elif s.processes is not None or s.compute_process_count == 0:
            procs = "none"
        table.add_row(
            escape(f"{s.gpu} {s.name}"), pct(s.utilization_gpu_ratio), sparkline(list(history[s.gpu])), mem, temp, power, clock, throttle, procs
        )
    return table


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
    from gpulens.pipeline import Frame, NodeConfig, build_node
    from gpulens.units import parse_duration

    interval_s = parse_duration(interval, what="--interval")
    duration_s = parse_duration(duration, what="--duration") if duration else None
    speed_f = None if speed == "max" else parse_duration(speed, what="--speed")
    history: dict[int, deque[float]] = {}
    host = __import__("socket").gethostname()
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

    node = build_node(NodeConfig(backend=backend, speed=speed_f, interval_seconds=interval_s, view=show, alerts=None, colocation=False))
    install_stop_handlers(node.loop.stop_event)
    try:
        with live:
            node.run(duration_s)
    finally:
        node.close()


def register(app: typer.Typer) -> None:
    app.command("top")(top_command)
