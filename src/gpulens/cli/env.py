"""`gpulens env`: the environment fingerprint, and what changed between two of them."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape

from gpulens.cli.common import STORE_HELP, console
from gpulens.store import DEFAULT_STORE_PATH

env_app = typer.Typer(
    help="The environment fingerprint (GPUs, driver, CUDA, framework versions, NCCL/CUDA variables).",
    invoke_without_command=True,
    no_args_is_help=False,
)


@env_app.callback()
def env_command(
    ctx: typer.Context,
    fmt: str = typer.Option("table", "--format", help="table or json (json is what `gpulens env diff` reads)."),
) -> None:
    """Print this machine's environment fingerprint: what a benchmark result depends on besides the code.

    Every run gpulens stores carries one, so `gpulens compare` can say "the driver changed".

        gpulens env
        gpulens env --format json > before.json    # ... upgrade the driver ...
        gpulens env diff before.json current
    """
    if ctx.invoked_subcommand is not None:
        return
    from gpulens.errors import BadInputError, shown
    from gpulens.runs.fingerprint import take_fingerprint

    if fmt not in ("table", "json"):
        raise BadInputError(f"Unknown --format {shown(fmt)}.", hint="Use table or json.")
    fp = take_fingerprint()
    if fmt == "json":
        typer.echo(json.dumps(fp.to_dict(), indent=2))
        return
    from rich.table import Table

    t = Table(show_header=False, box=None)
    t.add_column(style="bold")
    t.add_column()
    for k in ("host", "os", "python", "cpu", "cpu_count", "driver", "nvml", "cuda_driver", "cuda_runtime"):
        v = getattr(fp, k)
        t.add_row(k, "[dim]not available[/]" if v is None else escape(str(v)))
    if not fp.gpus:
        t.add_row("gpus", "[dim]none visible (no NVIDIA driver)[/]")
    for g in fp.gpus:
        mig = {1: "MIG on", 0: "MIG off"}.get(g.mig_mode, "MIG n/a")  # type: ignore[arg-type]
        t.add_row(f"gpu {g.index}", escape(f"{g.name} · {g.uuid} · VBIOS {g.vbios} · {mig}"))
    for name, ver in fp.packages.items():
        t.add_row(escape(name), escape(str(ver)))
    for k, v in fp.env.items():
        t.add_row(escape(f"${k}"), escape(str(v)))
    console.print(t)


@env_app.command("diff")
def env_diff_command(
    a: str = typer.Argument(..., help="Before: a JSON file from `gpulens env --format json`, a run id, or 'current'."),
    b: str = typer.Argument("current", help="After (default: this machine now)."),
    store: Path = typer.Option(DEFAULT_STORE_PATH, "--store", help=STORE_HELP),
    fmt: str = typer.Option("table", "--format", help="table or json."),
) -> None:
    """Show what changed between two fingerprints (files, stored runs, or this machine).

        gpulens env diff before.json             # against this machine now
        gpulens env diff 12 17                   # the environments of runs 12 and 17
    """
    from gpulens.errors import BadInputError, shown
    from gpulens.runs import diff
    from gpulens.runs.registry import load_fingerprint

    if fmt not in ("table", "json"):
        raise BadInputError(f"Unknown --format {shown(fmt)}.", hint="Use table or json.")
    la, fa = load_fingerprint(a, store)
    lb, fb = load_fingerprint(b, store)
    changes = diff(fa, fb)
    if fmt == "json":
        typer.echo(json.dumps([{"key": c.key, "old": c.old, "new": c.new} for c in changes], indent=2))
        return
    if not changes:
        console.print(escape(f"No differences between {la} and {lb}."))
        return
    console.print(f"[bold]{len(changes)} difference(s)[/] " + escape(f"from {la} to {lb}:"))
    for c in changes:
        console.print(escape(f"  {c}"), highlight=False)


def register(app: typer.Typer) -> None:
    app.add_typer(env_app, name="env")
