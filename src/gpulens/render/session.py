"""What a recorded session holds and what gpulens concludes from it (`gpulens demo`'s summary)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.padding import Padding
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


# What a person calls a kind of record whose name is not already the word (the plural adds "s").
RECORD_NOUNS = {N.EV_TRAIN_STEP: "training step", "mem": "memory reading", "phase": "phase marker"}


def counts_text(counts: dict[str, int]) -> str:
    """'125 training steps, 106 requests, 1 cold start': largest first, so the parts add up to the
    total a caller prints beside them."""
    parts = []
    for kind, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        one = RECORD_NOUNS.get(kind, kind.replace("_", " "))
        parts.append(f"{n:,} {one if n == 1 else one + 's'}")
    return ", ".join(parts)


def import_text(gpu_frames: int, records: dict[str, int], store_path: Path | str) -> str:
    """The line after an import: its total and the breakdown that adds up to it."""
    total = sum(records.values())
    breakdown = f" ({counts_text(records)})" if records else ""
    return f"imported {gpu_frames:,} GPU samples and {total:,} workload records{breakdown} into {store_path}"


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
            table.add_row("workload", counts_text(workload))
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
            # indented as a block, so a line folded at the terminal's width stays under its finding
            console.print(Padding(
                f"[{SEVERITY_COLOUR.get(f.severity, 'white')}]{f.kind}[/] ({f.workload}, +{f.start - t0:.0f}…{f.end - t0:.0f} s): {escape(f.summary)}",
                (0, 0, 0, 2)), highlight=False)
            if f.advice:
                console.print(Padding(f"[dim]→ {escape(f.advice[0])}[/]", (0, 0, 0, 4)), highlight=False)
    console.print()
