"""`gpulens bench train`: the training micro-benchmark, added to the `bench` group."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from gpulens.cli.common import STORE_HELP, console, console_err
from gpulens.store import DEFAULT_STORE_PATH


def bench_train_command(
    size: str = typer.Option("small", "--size", help="tiny, small, medium, large or xl (layers × hidden × heads); --layers/--hidden/--heads override."),
    layers: int = typer.Option(None, "--layers", help="Transformer blocks."),
    hidden: int = typer.Option(None, "--hidden", help="Hidden size."),
    heads: int = typer.Option(None, "--heads", help="Attention heads (hidden must be a multiple)."),
    seq_len: int = typer.Option(512, "--seq-len", help="Tokens per sequence."),
    batch_size: int = typer.Option(None, "--batch-size", help="Sequences per step (default 8; with --sweep-batch, where the sweep starts, default 1)."),
    precision: str = typer.Option("bf16", "--precision", help="fp32, bf16 or fp16 (autocast; weights and optimizer stay fp32)."),
    grad_ckpt: bool = typer.Option(False, "--grad-ckpt", help="Recompute activations in the backward pass (less memory, ~1/3 more compute)."),
    warmup: int = typer.Option(3, "--warmup", help="Steps run first and not measured (kernel selection, allocator growth)."),
    steps: int = typer.Option(20, "--steps", help="Measured steps; each is one sample for `gpulens compare`."),
    device: str = typer.Option("auto", "--device", help="auto (CUDA if available), cuda or cpu."),
    sweep: bool = typer.Option(False, "--sweep-batch", help="Double the batch until it no longer fits; report the largest and where tokens/s stops growing."),
    max_batch: int = typer.Option(1024, "--max-batch", min=1, help="Upper end of --sweep-batch (the CPU never runs out of memory quickly)."),
    name: str = typer.Option(None, "--name", help="Run name to compare under. Default: size-precision-device."),
    store: Path = typer.Option(DEFAULT_STORE_PATH, "--store", help=STORE_HELP),
    record: bool = typer.Option(True, "--record/--no-record", help="Store the result as a run with its environment fingerprint."),
    fmt: str = typer.Option("table", "--format", help="table or json."),
) -> None:
    """Measure training step time, tokens/s, MFU and peak memory of a transformer block stack.

    Warm-up steps are discarded; each measured step is kept, so two runs compare with statistics
    (`gpulens compare`). Runs on a CUDA GPU or, more slowly, on the CPU (MFU is then against an
    estimated CPU peak and says so).

        gpulens bench train --size medium --batch-size 16 --precision bf16
        gpulens bench train --size large --sweep-batch
        gpulens compare baseline latest
    """
    from gpulens.bench.train import TrainBenchConfig, record_result, run_train_bench, sweep_batch
    from gpulens.errors import BadInputError, shown

    if fmt not in ("table", "json"):
        raise BadInputError(f"Unknown --format {shown(fmt)}.", hint="Use table or json.")
    cfg = TrainBenchConfig(
        size=size, layers=layers, hidden=hidden, heads=heads, seq_len=seq_len, batch_size=(1 if sweep else 8) if batch_size is None else batch_size,
        precision=precision, grad_checkpointing=grad_ckpt, warmup_steps=warmup, steps=steps, device=device,  # type: ignore[arg-type]
    )
    cfg.validate()
    run_id = None
    if sweep:
        with console_err.status("sweeping the batch size …"):
            sw = sweep_batch(cfg, max_batch=max_batch, start_batch=cfg.batch_size)
        result = sw.best
    else:
        with console_err.status("running the benchmark …"):
            result = run_train_bench(cfg)
        sw = None
    first_of_its_kind = False
    if record and result is not None:
        from gpulens.runs import get_run, list_runs
        from gpulens.store import Store

        with Store(store) as st:
            run_id = record_result(st, result, name=name, kind="bench-train-sweep" if sweep else "bench-train")
            run = get_run(st, run_id, with_samples=False)
            first_of_its_kind = len(list_runs(st, run.kind, run.name, limit=2)) < 2
    if fmt == "json":
        out = {"run_id": run_id}
        if result is not None:
            out |= {"config": result.config, "summary": result.summary(), "step_seconds": result.step_seconds}
        if sw is not None:
            out["sweep"] = {
                "points": [p.__dict__ for p in sw.points], "largest_fitting_batch": sw.largest_fitting_batch,
                "knee_batch": sw.knee_batch, "stopped_because": sw.stopped_because,
            }
        typer.echo(json.dumps(out, indent=2, default=str))
        return
    if sw is not None:
        _render_sweep(sw)
    if result is not None:
        _render(result)
    if run_id is not None:
        if first_of_its_kind:  # nothing to compare with yet: say what the next run will be compared against
            console.print(f"recorded as run #{run_id} in {store}, the first of its kind and name: the next run "
                          "with the same settings is compared against it (`gpulens compare baseline latest`).")
        else:
            console.print(f"recorded as run #{run_id} in {store} (compare with `gpulens compare baseline {run_id}`).")


def _render(r) -> None:  # noqa: ANN001
    from gpulens.units import format_bytes

    c = r.config
    console.print(
        f"[bold]{c['layers']} layers × {c['hidden']} hidden[/] ({r.parameters / 1e6:.1f} M parameters), batch {c['batch_size']} × "
        f"{c['seq_len']} tokens, {c['precision']}{', activation checkpointing' if c['grad_checkpointing'] else ''} on {r.device} ({r.device_name})"
    )
    console.print(f"  step time   median {r.step_seconds_median * 1000:.2f} ms, p90 {r.step_seconds_p90 * 1000:.2f} ms over {len(r.step_seconds)} steps")
    console.print(f"  throughput  {r.tokens_per_second:,.0f} tokens/s")
    if r.mfu_ratio is not None:
        from gpulens.mfu import format_mfu

        console.print(f"  MFU         {format_mfu(r.mfu_ratio, 1)} [dim](peak: {r.peak.source})[/]", highlight=False)
    else:
        console.print("  MFU         [dim]unknown: no peak figure for this device[/]")
    console.print(f"  peak memory {format_bytes(r.peak_memory_bytes)} [dim]({r.peak_memory_source})[/]")


def _render_sweep(sw) -> None:  # noqa: ANN001
    from rich.table import Table

    from gpulens.render import print_table
    from gpulens.units import format_bytes

    t = Table(title="batch sweep")
    for col in ("batch", "fits", "tokens/s", "step", "peak memory"):
        t.add_column(col, justify="right")
    for p in sw.points:
        t.add_row(
            str(p.batch_size), "yes" if p.fits else "[red]OOM[/]",
            "–" if p.tokens_per_second is None else f"{p.tokens_per_second:,.0f}",
            "–" if p.step_seconds_median is None else f"{p.step_seconds_median * 1000:.1f} ms",
            format_bytes(p.peak_memory_bytes) if p.peak_memory_bytes else "–",
        )
    print_table(console, t)
    console.print(
        f"largest batch that fits: [bold]{sw.largest_fitting_batch}[/] ({sw.stopped_because}); "
        f"throughput stops growing (< {sw.gain_ratio:.0%} per doubling) after batch [bold]{sw.knee_batch}[/]."
    )


def register(app: typer.Typer) -> None:
    # The `bench` group belongs to cli/bench.py (the load tester); without it, make the group here.
    try:
        from gpulens.cli.bench import bench_app
    except ImportError:
        bench_app = None
    if bench_app is None:
        bench_app = typer.Typer(help="Measure: honest baseline benchmarks.", no_args_is_help=True)
        app.add_typer(bench_app, name="bench")
    bench_app.command("train")(bench_train_command)
