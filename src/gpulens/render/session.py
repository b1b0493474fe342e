"""What a recorded session holds and what gpulens concludes from it (`gpulens demo`'s summary)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpulens.store import Store
from gpulens.units import format_bytes, format_seconds
from gpulens.vocab import gpu as G
from gpulens.vocab import names as N

SEVERITY_COLOUR = {"critical": "red", "warning": "yellow", "info": "cyan"}
GPU_FIGURES = (
    (G.GPU_UTILIZATION_RATIO, "GPU utilization (mean / max)", lambda v: f"{v * 100:.0f} %"),
    (G.GPU_POWER_WATTS, "power (mean / max)", lambda v: f"{v:.0f} W"),
    (G.GPU_TEMPERATURE_CELSIUS, "temperature (mean / max)", lambda v: f"{v:.0f} °C"),
    (G.GPU_MEMORY_USED_BYTES, "memory used (mean / max)", format_bytes),
)


def print_session_summary(console: Console, store_path: Path, title: str = "the recorded H200 session") -> None:
    with Store(store_path, readonly=True) as st:
        rng = st.time_range()
        table = Table(title=title, title_justify="left", show_header=False)
        table.add_column(style="bold")
        table.add_column()
        if rng:
            table.add_row("span", format_seconds(rng[1] - rng[0]))
        for name, label, fmt in GPU_FIGURES:
            for d in st.query(name):
                if d.value:
                    table.add_row(label, f"{fmt(sum(d.value) / len(d.value))} / {fmt(max(d.value))}")
        kinds = {k: len(st.events(k)) for k in st.event_kinds()}
        workload = {k: n for k, n in kinds.items() if k in (N.EV_TRAIN_STEP, N.EV_REQUEST, N.EV_COLD_START)}
        if workload:
            table.add_row("workload records", ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in sorted(workload.items())))
        if kinds.get("alert"):
            table.add_row("alert notifications", escape(f"{kinds['alert']} (gpulens alerts list --store {store_path})"))
        console.print(table)
        try:
            from gpulens.diagnose import diagnose

            findings = diagnose(st)
        except Exception as e:  # diagnosis is a bonus here, never a reason to stop the demo
            console.print(f"[dim]diagnosis unavailable: {escape(str(e))}[/]")
            findings = []
    if findings:
        t0 = rng[0] if rng else 0.0
        console.print(f"\n[bold]What gpulens finds[/] (details: gpulens diagnose --store {escape(str(store_path))})")
        for f in findings:
            console.print(
                f"  [{SEVERITY_COLOUR.get(f.severity, 'white')}]{f.kind}[/] ({f.workload}, +{f.start - t0:.0f}…{f.end - t0:.0f} s): {escape(f.summary)}",
                highlight=False,
            )
            if f.advice:
                console.print(f"    [dim]→ {escape(f.advice[0])}[/]", highlight=False)
    console.print()
