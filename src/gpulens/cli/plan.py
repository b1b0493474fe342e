"""`gpulens plan`: will it fit, how fast, what it costs; `plan compare`, `plan calibrate`, `plan gpus`, `plan models`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.table import Table
from rich.text import Text

from gpulens.cli.common import console
from gpulens.errors import BadInputError
from gpulens.render import print_table
from gpulens.units import format_seconds, parse_duration

HELP = """Plan GPU memory, speed and cost of **training** or **serving** a model, before renting anything.

Examples:

  gpulens plan --model llama-3-8b --workload train --gpu h100-sxm --batch 4 --seq 4096

  gpulens plan --model ./config.json --workload infer --gpu l40s --prompt 2000 --new-tokens 300 --runtime vllm

  gpulens plan compare --model qwen2.5-7b --workload infer --gpu a100-80gb --gpu h100-sxm --gpu l40s

  gpulens plan calibrate --measurements runs.jsonl --gpu h200

`--model` takes a config.json (or its folder), a preset (`gpulens plan models`) or a bare size such
as `7b` (a rough answer). GPU names are case-insensitive (`gpulens plan gpus`). Prices come only
from your config file (see docs/plan.md). Memory is predicted for PyTorch + transformers (eager,
SDPA attention); `--runtime vllm` models a serving engine that preallocates its KV cache.
"""

_COLORS = ["cyan", "magenta", "yellow", "green", "blue", "red", "bright_cyan", "bright_magenta", "bright_yellow"]


def _req_kwargs(**kw: Any) -> dict[str, Any]:
    """The PlanRequest fields from the options both `plan` and `plan compare` take."""
    if kw["model"] is None:
        raise BadInputError("No model given.", hint="Pass --model PATH|PRESET|SIZE, e.g. --model llama-3-8b.")
    workload = kw["workload"]
    if workload in ("inference", "serve", "serving"):
        workload = "infer"
    if workload not in ("train", "infer"):
        raise BadInputError(f"Unknown workload {workload!r}.", hint="Use --workload train or --workload infer.")
    batch = kw["batch"] if kw["batch"] is not None else (8 if workload == "train" else 1)
    tp = kw["tp"]
    if workload == "infer" and kw["gpus"] > 1 and tp == 1:
        tp = kw["gpus"]  # serving on N GPUs of one replica = tensor parallelism
    tpot = parse_duration(kw["tpot_target"], what="TPOT target") if kw.get("tpot_target") else None
    ttft = parse_duration(kw["ttft_target"], what="TTFT target") if kw.get("ttft_target") else None
    return dict(
        model=kw["model"], workload=workload, gpus=kw["gpus"], precision=kw["precision"].lower(), optimizer=kw["optimizer"].lower(),
        batch=batch, seq=kw["seq"], grad_accum=kw["grad_accum"], grad_ckpt=kw["grad_ckpt"], zero=kw["zero"],
        dtype=kw["dtype"].lower(), kv_dtype=kw["kv_dtype"].lower() if kw["kv_dtype"] else None, prompt=kw["prompt"],
        new_tokens=kw["new_tokens"], runtime=kw["runtime"].lower(), tensor_parallel=tp,
        tpot_target_seconds=tpot, ttft_target_seconds=ttft, target_requests_per_second=kw["target_rps"],
    )


def _gib(n: float | None) -> str:
    return "–" if n is None else f"{n / (1 << 30):,.1f} GiB"


def _bar(breakdown: dict[str, int], capacity: int, context: int, width: int = 56) -> Text:
    """One line: a coloured block per item, then free space up to the card's capacity (┃)."""
    total = sum(breakdown.values()) + context
    scale = max(total, capacity) / width
    cells: list[tuple[str, str]] = []
    for i, (name, v) in enumerate(list(breakdown.items()) + [("cuda_context", context)]):
        n = max(1 if v > 0 else 0, round(v / scale))
        cells += [("█", _COLORS[i % len(_COLORS)] if name != "cuda_context" else "grey50")] * n
    cap_at = min(width, round(capacity / scale))
    while len(cells) < cap_at:
        cells.append(("·", "dim"))
    text = Text()
    for i, (ch, style) in enumerate(cells[: max(width, cap_at)]):
        if i == cap_at:
            text.append("┃", style="bold white")
        text.append(ch, style=("bold red" if i >= cap_at and ch == "█" else style))
    if cap_at >= len(cells):
        text.append("┃", style="bold white")
    return text


def _render_plan(res: Any) -> None:
    d = res.to_dict()
    m, g, r, mem = res.model, res.gpu, res.request, res.memory
    from gpulens.plan.models import format_count

    params = f"{format_count(m.params)} params" + (f", {format_count(m.active_params)} active" if m.is_moe else "")
    if r.workload == "train":
        what = (f"train · {r.precision} · {r.optimizer} · micro-batch {r.batch} × {r.seq} tokens"
                + (f" · accumulate ×{r.grad_accum}" if r.grad_accum > 1 else "")
                + (" · checkpointing" if r.grad_ckpt else "") + (f" · ZeRO-{r.zero}" if r.zero else ""))
        cards = f"{r.gpus} × {g.name}"
    else:
        what = f"serve · {r.runtime} · weights {r.dtype} · {r.batch} × ({r.prompt} prompt + {r.new_tokens} new) tokens"
        cards = f"{r.tensor_parallel} × {g.name}" if r.tensor_parallel > 1 else g.name
    console.print(f"[bold]{m.name}[/] ({params}) on [bold]{cards}[/] ({_gib(g.memory_bytes)} each)")
    console.print(f"  {what}", highlight=False)
    usable = mem.capacity_bytes - mem.cuda_context_bytes
    if res.fits:
        console.print(f"[bold green]✔ Fits[/]: peak {_gib(mem.peak_bytes)} of {_gib(usable)} usable "
                      f"({_gib(mem.headroom_bytes)} to spare), highest at the {mem.peak_at}.")
    else:
        console.print(f"[bold red]✘ Does not fit[/]: needs {_gib(mem.peak_bytes)} at the {mem.peak_at}; "
                      f"the card has {_gib(usable)} usable.")
    console.print()
    console.print(Text("Memory  ") + _bar(mem.breakdown, mem.capacity_bytes, mem.cuda_context_bytes))
    t = Table(show_header=True, header_style="bold", box=None, padding=(0, 2))
    t.add_column("")
    t.add_column("item")
    t.add_column("size", justify="right")
    t.add_column("share", justify="right")
    for i, (k, v) in enumerate(mem.breakdown.items()):
        t.add_row(Text("█", style=_COLORS[i % len(_COLORS)]), k.replace("_", " "), _gib(v), f"{v / max(mem.peak_bytes, 1):.0%}")
    t.add_row("", "[bold]peak allocated by PyTorch[/]", f"[bold]{_gib(mem.peak_bytes)}[/]", "")
    t.add_row(Text("█", style="grey50"), "CUDA context (outside PyTorch)", _gib(mem.cuda_context_bytes), "")
    t.add_row("", "reserved by the allocator (≈)", _gib(mem.reserved_bytes), "")
    t.add_row(Text("┃", style="bold"), "the card", _gib(mem.capacity_bytes), "")
    console.print(t)
    console.print()
    s = d["speed"]
    st = Table(show_header=False, box=None, padding=(0, 2))
    if r.workload == "train":
        st.add_row("step time", format_seconds(s["step_seconds"]))
        st.add_row("tokens per second", f"{s['tokens_per_second']:,.0f}" + (f" (all {r.gpus} GPUs)" if r.gpus > 1 else ""))
        st.add_row("MFU (model FLOPs / peak)", f"{s['mfu_ratio']:.0%}")
        st.add_row("time split", f"matmuls {format_seconds(s['compute_seconds'])}, memory-bound {format_seconds(s['memory_seconds'])}, "
                                 f"overhead {format_seconds(s['overhead_seconds'])}"
                                 + (f", communication {format_seconds(s['communication_seconds'])}" if s["communication_seconds"] else ""))
    else:
        st.add_row("time to first token (TTFT)", format_seconds(s["ttft_seconds"]))
        st.add_row("time per output token (TPOT)", f"{format_seconds(s['tpot_seconds'])} ({s['bound']}-bound)")
        st.add_row("output tokens per second", f"{s['output_tokens_per_second']:,.0f} at batch {s['batch']}")
        st.add_row("largest batch that fits", str(s["max_batch_that_fits"]))
        if s.get("max_batch_for_tpot_target") is not None:
            st.add_row("largest batch meeting the TPOT target", str(s["max_batch_for_tpot_target"]))
    console.print(f"[bold]Speed[/] [dim]({res.efficiency.source})[/]")
    console.print(st)
    if r.workload == "infer" and s.get("by_batch"):
        bt = Table(title="by batch size", box=None, header_style="bold", padding=(0, 2))
        for c in ("batch", "TTFT", "TPOT", "output tokens/s"):
            bt.add_column(c, justify="right")
        for row in s["by_batch"]:
            bt.add_row(str(row["batch"]), format_seconds(row["ttft_seconds"]), format_seconds(row["tpot_seconds"]),
                       f"{row['output_tokens_per_second']:,.0f}")
        console.print(bt)
    if res.cost:
        c = res.cost
        parts = [f"{c.hourly_total:,.2f} {c.currency}/hour"]
        if c.per_million_tokens is not None:
            parts.append(f"{c.per_million_tokens:,.3f} {c.currency} per million {'trained' if r.workload == 'train' else 'output'} tokens")
        if c.per_thousand_requests is not None:
            parts.append(f"{c.per_thousand_requests:,.3f} {c.currency} per thousand requests")
        if c.break_even_months is not None:
            parts.append(f"buying pays off after {c.break_even_months:,.1f} months of renting 24/7")
        console.print("[bold]Cost[/]  " + " · ".join(parts))
    if res.replicas:
        rt = Table(title="more cards or more replicas", box=None, header_style="bold", padding=(0, 2))
        for col in ("replicas", "× TP", "= GPUs", "batch", "TTFT", "TPOT", "cost/hour"):
            rt.add_column(col, justify="right")
        for o in res.replicas[:6]:
            rt.add_row(str(o.replicas), str(o.tensor_parallel), str(o.gpus), str(o.batch), format_seconds(o.ttft_seconds),
                       format_seconds(o.tpot_seconds), f"{o.hourly_total:,.2f}" if o.hourly_total is not None else "–")
        console.print(rt)
    if res.advice:
        console.print("\n[bold]What to do[/]")
        for i, a in enumerate(res.advice, 1):
            if a.kind == "fix":
                mark = "[green]✔ fits[/]" if a.fits else "[yellow]still too big[/]"
                console.print(f"  {i}. {a.text} → {_gib(a.peak_bytes)} {mark}\n     [dim]{a.why}[/]", highlight=False)
            else:
                console.print(f"  {i}. {a.text}", highlight=False)
    for n in res.notes:
        console.print(f"[dim]· {n}[/]", highlight=False)


def _emit_json(obj: Any) -> None:
    console.print_json(json.dumps(obj, default=str))


def register(app: typer.Typer) -> None:
    plan_app = typer.Typer(help=HELP, rich_markup_mode="markdown", no_args_is_help=False, invoke_without_command=True)

    @plan_app.callback(invoke_without_command=True)
    def plan_cmd(
        ctx: typer.Context,
        model: str = typer.Option(None, "--model", "-m", help="config.json path or folder, preset name, or a size such as 7b."),
        workload: str = typer.Option("train", "--workload", "-w", help="train or infer."),
        gpu: str = typer.Option("h100-sxm", "--gpu", "-g", help="GPU name, case-insensitive (see `gpulens plan gpus`)."),
        gpus: int = typer.Option(1, "--gpus", help="Training: number of GPUs (data parallel; with --zero, sharded). Serving: GPUs per replica (= --tp)."),
        precision: str = typer.Option("amp_bf16", "--precision", help="Training: fp32, amp_bf16, amp_fp16 (fp32 weights, 16-bit autocast), bf16, fp16 (weights and states in 16-bit)."),
        optimizer: str = typer.Option("adamw", "--optimizer", help="adamw, sgd, sgd-momentum, adafactor, adamw8bit."),
        batch: int = typer.Option(None, "--batch", "-b", help="Training: micro-batch per GPU (default 8). Serving: concurrent sequences (default 1)."),
        seq: int = typer.Option(2048, "--seq", "-s", help="Training: sequence length in tokens."),
        grad_accum: int = typer.Option(1, "--grad-accum", help="Training: micro-batches per optimizer step."),
        grad_ckpt: bool = typer.Option(False, "--grad-ckpt/--no-grad-ckpt", help="Training: activation checkpointing per layer."),
        zero: int = typer.Option(0, "--zero", help="Training: ZeRO stage 0-3 across --gpus (3 = FSDP full sharding)."),
        dtype: str = typer.Option("bf16", "--dtype", help="Serving: weight format fp32, bf16, fp16, fp8, int8, int4."),
        kv_dtype: str = typer.Option(None, "--kv-dtype", help="Serving: KV-cache format (default: the compute dtype; fp8 halves it)."),
        prompt: int = typer.Option(512, "--prompt", help="Serving: prompt tokens per request."),
        new_tokens: int = typer.Option(128, "--new-tokens", help="Serving: generated tokens per request."),
        runtime: str = typer.Option("hf", "--runtime", help="Serving: hf (transformers generate) or vllm (preallocated paged KV cache)."),
        tp: int = typer.Option(1, "--tp", help="Serving: tensor-parallel GPUs per replica."),
        tpot_target: str = typer.Option(None, "--tpot-target", help="Serving: per-token latency target, e.g. 50ms."),
        ttft_target: str = typer.Option(None, "--ttft-target", help="Serving: first-token latency target, e.g. 2s."),
        target_rps: float = typer.Option(None, "--target-rps", help="Serving: requests per second to plan replicas for."),
        fmt: str = typer.Option("text", "--format", help="text or json."),
    ) -> None:
        if ctx.invoked_subcommand is not None:
            return
        if model is None:
            typer.echo(ctx.get_help())
            raise typer.Exit(0)
        from gpulens.plan.planner import PlanRequest, plan

        kw = _req_kwargs(**{k: v for k, v in locals().items() if k not in ("ctx", "fmt", "gpu", "PlanRequest", "plan")})
        res = plan(PlanRequest(gpu=gpu, **kw))
        _check_format(fmt)
        if fmt == "json":
            _emit_json(res.to_dict())
        else:
            _render_plan(res)

    @plan_app.command("compare")
    def compare_cmd(
        model: str = typer.Option(..., "--model", "-m", help="config.json path, preset name, or a size such as 7b."),
        gpu: list[str] = typer.Option(..., "--gpu", "-g", help="A GPU to compare; repeat the option (or give a comma list)."),
        workload: str = typer.Option("train", "--workload", "-w", help="train or infer."),
        gpus: int = typer.Option(1, "--gpus"),
        precision: str = typer.Option("amp_bf16", "--precision"),
        optimizer: str = typer.Option("adamw", "--optimizer"),
        batch: int = typer.Option(None, "--batch", "-b"),
        seq: int = typer.Option(2048, "--seq", "-s"),
        grad_accum: int = typer.Option(1, "--grad-accum"),
        grad_ckpt: bool = typer.Option(False, "--grad-ckpt/--no-grad-ckpt"),
        zero: int = typer.Option(0, "--zero"),
        dtype: str = typer.Option("bf16", "--dtype"),
        kv_dtype: str = typer.Option(None, "--kv-dtype"),
        prompt: int = typer.Option(512, "--prompt"),
        new_tokens: int = typer.Option(128, "--new-tokens"),
        runtime: str = typer.Option("hf", "--runtime"),
        tp: int = typer.Option(1, "--tp"),
        tpot_target: str = typer.Option(None, "--tpot-target"),
        ttft_target: str = typer.Option(None, "--ttft-target"),
        target_rps: float = typer.Option(None, "--target-rps"),
        fmt: str = typer.Option("text", "--format", help="text or json."),
    ) -> None:
        """The same plan on several GPUs side by side (same options as `gpulens plan`)."""
        from gpulens.plan.planner import PlanRequest, compare

        names = [n.strip() for g in gpu for n in g.split(",") if n.strip()]
        kw = _req_kwargs(**{k: v for k, v in locals().items() if k not in ("gpu", "fmt", "names", "PlanRequest", "compare")})
        _check_format(fmt)
        results = compare(PlanRequest(gpu=names[0], **kw), names)
        if fmt == "json":
            _emit_json({"results": [r.to_dict() for r in results]})
            return
        _render_compare(results)

    @plan_app.command("calibrate")
    def calibrate_cmd(
        measurements: Path = typer.Option(None, "--measurements", help="JSON lines of measured runs (format of memory_calibration.jsonl); 'bundled' = the recorded H200 runs."),
        gpu: str = typer.Option(None, "--gpu", "-g", help="The GPU the runs were measured on, when the runs do not say."),
        store: Path = typer.Option(None, "--store", help="Also use the `gpulens bench train` runs recorded in this store."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Fit and show, but do not store."),
        fmt: str = typer.Option("text", "--format", help="text or json."),
    ) -> None:
        """Fit a GPU's efficiency and overhead factors from measured runs and store them; later plans on that GPU use them."""
        from gpulens.plan.calibration import calibrate, calibration_path

        _check_format(fmt)
        if measurements is not None and str(measurements) == "bundled":
            from gpulens.data import bundled_trace

            measurements = bundled_trace() / "memory_calibration.jsonl"
            gpu = gpu or "h200"
        reports = calibrate(measurements, gpu_name=gpu, store_path=store, save=not dry_run)
        if fmt == "json":
            _emit_json({"stored_in": None if dry_run else str(calibration_path()),
                        "gpus": [{"gpu": r.gpu, "runs": r.runs, "factors": r.efficiency.to_dict(), "errors_before": r.before,
                                  "errors_after": r.after, "skipped": r.skipped} for r in reports]})
            return
        for rep in reports:
            console.print(f"[bold]{rep.gpu}[/]: fitted from {rep.runs} runs" + (f" ({len(rep.skipped)} failed runs skipped)" if rep.skipped else ""))
            t = Table(box=None, header_style="bold", padding=(0, 2))
            for c in ("figure", "runs", "median error before", "worst before", "median error after", "worst after"):
                t.add_column(c, justify="right" if c != "figure" else "left")
            for k in rep.after:
                b, a = [abs(v) for v in rep.before[k]], [abs(v) for v in rep.after[k]]
                t.add_row(k.replace("_", " "), str(len(a)), f"{_median(b):.0%}", f"{max(b):.0%}", f"{_median(a):.0%}", f"{max(a):.0%}")
            print_table(console, t)
            e = rep.efficiency
            console.print(f"  matmul efficiency {e.compute_ratio:.0%} (16-bit), {e.fp32_compute_ratio:.0%} (fp32) · "
                          f"bandwidth efficiency {e.memory_bandwidth_ratio:.0%} · per-layer overhead {format_seconds(e.layer_overhead_seconds)} · "
                          f"decode overhead {format_seconds(e.decode_token_overhead_seconds)} · allocator reserved/allocated {e.reserved_ratio:.2f}",
                          highlight=False)
        console.print("[dim]not stored (--dry-run)[/]" if dry_run else f"stored in {calibration_path()}; later plans on these GPUs use it and say so.")

    @plan_app.command("gpus")
    def gpus_cmd(fmt: str = typer.Option("text", "--format", help="text or json.")) -> None:
        """The GPU catalog (datasheet figures with their sources) plus your own cards and prices."""
        from gpulens.plan.catalog import all_gpus, config_path

        _check_format(fmt)
        rows = all_gpus()
        if fmt == "json":
            _emit_json([g.to_dict() for g in rows])
            return
        t = Table(header_style="bold", box=None, padding=(0, 2))
        for c in ("GPU", "GiB", "GB/s", "BF16", "FP8", "INT8", "interconnect", "TDP W", "price/h"):
            t.add_column(c, justify="left" if c in ("GPU", "interconnect") else "right", no_wrap=True)
        for g in rows:
            t.add_row(g.name + (" (yours)" if g.user_defined else ""), f"{g.memory_bytes / (1 << 30):.0f}",
                      f"{g.memory_bandwidth_bytes_per_second / 1e9:,.0f}", _tf(g.bf16_dense_flops or g.fp16_dense_flops),
                      _tf(g.fp8_dense_flops), _tf(g.int8_dense_ops), g.interconnect or "–",
                      f"{g.tdp_watts:.0f}" if g.tdp_watts else "–", f"{g.hourly_price:g}" if g.hourly_price else "–")
        print_table(console, t)
        console.print(f"[dim]Dense peaks in TFLOP/s (TOPS for INT8), from each vendor's datasheet (`--format json` lists the sources). "
                      f"Your cards and prices: {config_path()}[/]")

    @plan_app.command("models")
    def models_cmd(fmt: str = typer.Option("text", "--format", help="text or json.")) -> None:
        """The bundled model presets (configs written as data from their public config.json)."""
        from gpulens.plan.models import format_count, preset, preset_names

        _check_format(fmt)
        specs = [preset(n) for n in preset_names()]
        if fmt == "json":
            _emit_json([s.to_dict() | {"source": s.source} for s in specs])
            return
        t = Table(header_style="bold", box=None, padding=(0, 2))
        for c in ("preset", "family", "params", "layers", "hidden", "heads / kv", "vocab"):
            t.add_column(c, justify="left" if c in ("preset", "family") else "right", no_wrap=c == "preset")
        for s in specs:
            t.add_row(s.name, s.family, format_count(s.params) + (f" ({format_count(s.active_params)} active)" if s.is_moe else ""),
                      str(s.num_layers), str(s.hidden_size), f"{s.num_heads} / {s.num_kv_heads}", f"{s.vocab_size:,}")
        print_table(console, t)

    app.add_typer(plan_app, name="plan", help=HELP)


def _median(v: list[float]) -> float:
    import statistics

    return statistics.median(v) if v else 0.0


def _tf(v: float | None) -> str:
    return f"{v / 1e12:,.0f}" if v else "–"


def _check_format(fmt: str) -> None:
    if fmt not in ("text", "json"):
        raise BadInputError(f"Unknown format {fmt!r}.", hint="Use --format text or --format json.")


def _render_compare(results: list[Any]) -> None:
    r0 = results[0]
    train = r0.request.workload == "train"
    console.print(f"[bold]{r0.model.name}[/] · {'train' if train else 'serve'} · compared on {len(results)} GPUs")
    t = Table(header_style="bold", box=None, padding=(0, 2))
    cols = ["GPU", "fits", "peak", "card"] + (["step", "tokens/s", "MFU"] if train else ["TTFT", "TPOT", "max batch", "out tok/s"])
    cols += ["cost / M tokens", "calibrated"]
    for c in cols:
        t.add_column(c, justify="left" if c in ("GPU", "fits") else "right")
    for r in results:
        s = r.speed
        fit = "[green]✔[/]" if r.fits else "[red]✘[/]"
        row = [r.gpu.name, fit, _gib(r.memory.peak_bytes), _gib(r.memory.capacity_bytes)]
        if train:
            row += [format_seconds(s["step_seconds"]), f"{s['tokens_per_second']:,.0f}", f"{s['mfu_ratio']:.0%}"]
        else:
            row += [format_seconds(s["ttft_seconds"]), format_seconds(s["tpot_seconds"]), str(s["max_batch_that_fits"]),
                    f"{s['output_tokens_per_second']:,.0f}"]
        cost = r.cost.per_million_tokens if r.cost else None
        row += [f"{cost:,.3f} {r.cost.currency}" if cost is not None else "no price", "yes" if r.efficiency.calibrated else "no"]
        t.add_row(*row)
    console.print(t)
    if not any(r.cost for r in results):
        from gpulens.plan.catalog import config_path

        console.print(f"[dim]Add your hourly prices to {config_path()} to compare costs (gpulens invents none).[/]")
    for r in results:
        if not r.fits and r.advice:
            console.print(f"[dim]{r.gpu.name}: first fix: {r.advice[0].text}[/]", highlight=False)
