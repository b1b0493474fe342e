"""`gpulens top`'s frame: one table row per GPU sample."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from gpulens.render.tables import FittedTable

_SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], lo: float = 0.0, hi: float = 1.0) -> str:
    if not values:
        return ""
    span = (hi - lo) or 1.0
    return "".join(_SPARK[min(len(_SPARK) - 1, max(0, int((v - lo) / span * (len(_SPARK) - 1) + 0.5)))] for v in values)


def render(samples, history, host: str) -> FittedTable:  # type: ignore[no-untyped-def]
    """One frame: a row per GPU, fitted to the width the Live display offers when it is drawn."""
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
            procs = escape(", ".join(f"{p.pid} {p.name} {format_bytes(p.used_memory_bytes)}" for p in s.processes[:3]))  # NVML names are anyone's
        elif s.compute_process_count:
            procs = str(s.compute_process_count)
        elif s.processes is not None or s.compute_process_count == 0:
            procs = "none"
        table.add_row(
            escape(f"{s.gpu} {s.name}"), pct(s.utilization_gpu_ratio), sparkline(list(history[s.gpu])), mem, temp, power, clock, throttle, procs
        )
    # on a narrow terminal the context columns go first, named under the table; the figures stay
    return FittedTable(table, optional=("history (util)", "processes", "throttle", "SM clock"))
