"""The text `gpulens plan` prints: the plan (memory bar, breakdown, speed, cost, fixes), the
comparison table, the calibration report, the GPU and model listings. Pure rendering of the
planner's typed results; the commands in cli/plan.py only parse, call and hand over."""

from __future__ import annotations

import statistics
from typing import Any

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from gpulens.cli.common import console
from gpulens.mfu import format_mfu
from gpulens.render import print_table
from gpulens.units import format_seconds

_COLORS = ["cyan", "magenta", "yellow", "green", "blue", "red", "bright_cyan", "bright_magenta", "bright_yellow"]
_OUTSIDE_PYTORCH = {"nccl_buffers": "NCCL buffers (outside PyTorch)"}  # breakdown rows not in its allocator


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


def _mechanism_memory_rows(t: Table, mech: dict[str, dict]) -> None:
    """Expert parallelism's and the optimizer offload's memory figures (plan/expert_parallel.py, offload.py)."""
    ep = mech.get("expert_parallel")
    if ep:
        t.add_row("", f"of which experts ({ep['experts_per_gpu']} of {ep['num_experts']} per layer): weights",
                  _gib(ep["expert_weights_bytes"]), "")
    off = mech.get("optimizer_offload")
    if off:
        t.add_row("", "optimizer in CPU memory (ZeRO-Offload), per GPU", _gib(off["cpu_bytes_per_gpu"]), "")
        t.add_row("", f"CPU memory per node ({off['gpus_per_node']} GPU(s))", _gib(off["cpu_bytes_per_node"]), "")


def _mechanism_speed_rows(st: Table, s: dict[str, Any]) -> None:
    if s.get("expert_all_to_all_count"):
        st.add_row("expert all-to-alls", f"{s['expert_all_to_all_count']} per micro-batch, "
                                         f"{format_seconds(s['expert_all_to_all_seconds'])} a step over "
                                         f"{s['expert_all_to_all_link']} (not overlapped)")
    if s.get("offload_host_link"):
        st.add_row("optimizer offload", f"PCIe {format_seconds(s['offload_pcie_seconds'])} + CPU Adam "
                                        f"{format_seconds(s['offload_cpu_adam_seconds'])} a step over "
                                        f"{s['offload_host_link']} (not overlapped)")


def verdict_line(res: Any) -> str:
    """The headline, agreeing with the numbers under it: what the verdict was decided on, and on a
    no-fit what tips it and by how much (the margin kept free counts; a preallocating engine is
    decided by what its KV pool holds, not by a peak)."""
    from gpulens.plan.memory import FIT_MARGIN_RATIO

    mem, r = res.memory, res.request
    usable = mem.capacity_bytes - mem.cuda_context_bytes
    limit = mem.capacity_bytes * (1 - FIT_MARGIN_RATIO) - mem.cuda_context_bytes
    margin = f"{FIT_MARGIN_RATIO:.0%} of the card ({_gib(mem.capacity_bytes * FIT_MARGIN_RATIO)}) kept free for fragmentation"
    engine = r.workload == "infer" and r.runtime != "hf"
    if engine:
        pool = mem.breakdown.get("kv_cache", 0)
        held = res.speed.get("max_concurrency") or 0
        if res.fits:
            return (f"[bold green]✔ Fits[/]: the KV pool ({_gib(pool)}) holds {held} sequences of "
                    f"{r.prompt + r.new_tokens} tokens, at least the batch of {r.batch}.")
        if pool <= 0:
            return ("[bold red]✘ Does not fit[/]: weights, activations and CUDA graphs take the whole "
                    "preallocated share; no room is left for a KV cache.")
        return (f"[bold red]✘ Does not fit[/]: the KV pool ({_gib(pool)}) holds {held} sequences of "
                f"{r.prompt + r.new_tokens} tokens, {r.batch - held} fewer than the batch of {r.batch}.")
    if res.fits:
        if mem.reserved_bytes > usable:
            return (f"[bold yellow]✔ Fits, tightly[/]: peak {_gib(mem.peak_bytes)} of {_gib(usable)} usable, highest at "
                    f"the {mem.peak_at}; the allocator would cache ≈{_gib(mem.reserved_bytes)}, more than the card, "
                    "so it frees its cache and retries (slower; fragmentation can still run out of memory).")
        return (f"[bold green]✔ Fits[/]: peak {_gib(mem.peak_bytes)} of {_gib(usable)} usable "
                f"({_gib(mem.headroom_bytes)} to spare), highest at the {mem.peak_at}.")
    over = mem.peak_bytes - limit
    if mem.peak_bytes <= usable:
        return (f"[bold red]✘ Does not fit[/]: needs {_gib(mem.peak_bytes)} at the {mem.peak_at}, within the "
                f"{_gib(usable)} usable but not the {margin}: {_gib(over)} over the {_gib(limit)} limit.")
    return (f"[bold red]✘ Does not fit[/]: needs {_gib(mem.peak_bytes)} at the {mem.peak_at}; the card has "
            f"{_gib(usable)} usable ({_gib(limit)} after the {margin}): {_gib(over)} too much.")


def render_plan(res: Any) -> None:
    d = res.to_dict()
    m, g, r, mem = res.model, res.gpu, res.request, res.memory
    from gpulens.plan.models import format_count

    params = f"{format_count(m.params)} params" + (f", {format_count(m.active_params)} active" if m.is_moe else "")
    if r.workload == "train":
        what = (f"train · {r.precision} · {r.optimizer} · micro-batch {r.batch} × {r.seq} tokens"
                + (f" · accumulate ×{r.grad_accum}" if r.grad_accum > 1 else "")
                + (" · checkpointing" if r.grad_ckpt else "")
                + (" · selective recompute" if r.recompute == "selective" else "") + (f" · ZeRO-{r.zero} ({r.zero_layout} layout)" if r.zero else "")
                + (f" · TP {r.tensor_parallel}" if r.tensor_parallel > 1 else "")
                + (f" · PP {r.pipeline_parallel}" if r.pipeline_parallel > 1 else "")
                + (f" × {r.virtual_stages} chunks" if r.virtual_stages > 1 else "")
                + (f" · CP {r.context_parallel}" if r.context_parallel > 1 else "")
                + (" · SP" if r.sequence_parallel else "")
                + (f" · EP {r.expert_parallel}" if r.expert_parallel > 1 else "")
                + (" · optimizer offloaded to CPU" if r.offload == "optimizer" else "")
                + (f" · {'QLoRA' if r.finetune == 'qlora' else 'LoRA'} r{r.lora_rank} ({r.lora_targets}, {r.lora_dtype}"
                   + (f", {r.lora_optimizer_dtype} states" if r.lora_optimizer_dtype not in (None, r.lora_dtype) else "")
                   + (", LitGPT" if r.lora_engine == "litgpt" else "")
                   + (", NF4 without double quantization" if r.finetune == "qlora" and not r.qlora_double_quant else "")
                   + ")"
                   if r.finetune != "full" else ""))
        cards = f"{r.gpus} × {g.name}"
    else:
        what = (f"serve · {r.runtime} · weights {r.dtype} · {r.batch} × ({r.prompt} prompt + {r.new_tokens} new) tokens"
                + (f" · TP {r.tensor_parallel} × PP {r.pipeline_parallel}" if r.pipeline_parallel > 1 else "")
                + (f" · prefix hit {r.prefix_hit_ratio:.0%}" if r.prefix_hit_ratio else ""))
        cards = f"{r.replica_gpus} × {g.name}" if r.replica_gpus > 1 else g.name
    # a bare size's name already is its count ("~7.00B (rough)"): say what was guessed instead of the count again
    who = f"[bold]{params}[/] (rough: LLaMA-like shapes guessed from the size)" if m.rough else f"[bold]{m.name}[/] ({params})"
    console.print(f"{who} on [bold]{cards}[/] ({_gib(g.memory_bytes)} each)")
    console.print(f"  {what}", highlight=False)
    console.print(verdict_line(res), highlight=False)
    console.print()
    console.print(Text("Memory  ") + _bar(mem.breakdown, mem.capacity_bytes, mem.cuda_context_bytes))
    t = Table(show_header=True, header_style="bold", box=None, padding=(0, 2))
    t.add_column("")
    t.add_column("item")
    t.add_column("size", justify="right")
    t.add_column("share", justify="right")
    for i, (k, v) in enumerate(mem.breakdown.items()):
        label = _OUTSIDE_PYTORCH.get(k, k.replace("_", " "))
        t.add_row(Text("█", style=_COLORS[i % len(_COLORS)]), label, _gib(v), f"{v / max(mem.peak_bytes, 1):.0%}")
    # NCCL's communicator buffers are cudaMalloc'ed by NCCL, not by PyTorch's allocator
    total = "peak: PyTorch's allocations + NCCL's buffers" if any(k in _OUTSIDE_PYTORCH for k in mem.breakdown) \
        else "peak allocated by PyTorch"
    t.add_row("", f"[bold]{total}[/]", f"[bold]{_gib(mem.peak_bytes)}[/]", "")
    t.add_row(Text("█", style="grey50"), "CUDA context (outside PyTorch)", _gib(mem.cuda_context_bytes), "")
    usable = mem.capacity_bytes - mem.cuda_context_bytes
    if mem.reserved_bytes > usable:  # the allocator cannot hold more than the card: it frees its cache first
        t.add_row("", "reserved by the allocator (≈, capped by the card)", _gib(usable), "")
    else:
        t.add_row("", "reserved by the allocator (≈)", _gib(mem.reserved_bytes), "")
    t.add_row(Text("┃", style="bold"), "the card", _gib(mem.capacity_bytes), "")
    _mechanism_memory_rows(t, mem.mechanisms)
    print_table(console, t)
    console.print()
    s = d["speed"]
    st = Table(show_header=False, box=None, padding=(0, 2))
    if r.workload == "train":
        st.add_row("step time", format_seconds(s["step_seconds"]))
        st.add_row("tokens per second", f"{s['tokens_per_second']:,.0f}" + (f" (all {r.gpus} GPUs)" if r.gpus > 1 else ""))
        fp8 = s.get("fp8")
        st.add_row("MFU (model FLOPs / peak)", format_mfu(s["mfu_ratio"])
                   + (f" (of the {s['mfu_peak_format']} peak, not the FP8 one)" if fp8 else ""))
        if fp8:
            st.add_row("FP8 GEMMs", f"{', '.join(fp8['gemms'])}: forward, dgrad, wgrad (E4M3/E5M2) in "
                                    f"{format_seconds(fp8['gemm_seconds'] * r.grad_accum)}")
            st.add_row("", f"casts to FP8 {format_seconds(fp8['cast_seconds'] * r.grad_accum)} (in memory-bound); "
                           f"16-bit: {fp8['stays_16bit']}")
            st.add_row("", f"FP8 peak x {fp8['ceiling_ratio']:.0%}: assumed, the 16-bit matmul ceiling's share")
        attn = s.get("attention_seconds") or 0.0
        matmuls = f"matmuls {format_seconds(s['compute_seconds'] - attn)}" + (
            f", attention {format_seconds(attn)} ({s['attention_kernel']})" if attn else "")
        st.add_row("time split", f"{matmuls}, memory-bound {format_seconds(s['memory_seconds'])}, "
                                 f"overhead {format_seconds(s['overhead_seconds'])}"
                                 + (f", communication {format_seconds(s['communication_seconds'])}" if s["communication_seconds"] else ""))
        if s.get("tensor_parallel_link"):
            st.add_row("tensor-parallel all-reduces", f"over {s['tensor_parallel_link']}")
        if s.get("pipeline_bubble_ratio"):
            v = s.get("pipeline_virtual_stages", 1)
            st.add_row("pipeline bubble", f"{s['pipeline_bubble_ratio']:.0%} of the step ("
                       + (f"interleaved 1F1B, {v} chunks per stage" if v > 1 else "1F1B; more micro-batches shrink it") + ")")
            st.add_row("stage-to-stage sends", format_seconds(s.get("pipeline_p2p_seconds", 0.0))
                       + (f" ({v}× 1F1B's)" if v > 1 else ""))
        if s.get("context_parallel", 1) > 1:
            st.add_row("context parallel (ring)", f"K/V sends {format_seconds(s['context_parallel_transfer_seconds'])}, "
                       f"{format_seconds(s['context_parallel_exposed_seconds'])} not hidden by attention")
            st.add_row("", f"over {s['context_parallel_link']}")
        _mechanism_speed_rows(st, s)
        if s.get("communication_link"):
            bus = s.get("communication_bus_bytes_per_second") or s["communication_link_bytes_per_second"]
            st.add_row("gradient collectives", f"over {s['communication_link']}, ring moving {bus / 1e9:.4g} GB/s "
                                              f"per GPU as NCCL does · {s['nodes']} node(s)")
    else:
        st.add_row("time to first token (TTFT)", format_seconds(s["ttft_seconds"]))
        st.add_row("time per output token (TPOT)", f"{format_seconds(s['tpot_seconds'])} ({s['bound']}-bound)")
        st.add_row("output tokens per second", f"{s['output_tokens_per_second']:,.0f} at batch {s['batch']}")
        st.add_row("largest batch that fits", str(s["max_batch_that_fits"]))
        if s.get("speculative"):
            sd = s["speculative"]
            st.add_row("speculative decoding",
                       f"{sd['draft_model']} guesses K = {sd['speculative_tokens']}, acceptance {sd['acceptance_ratio']:g} "
                       f"(assumed) → {sd['expected_new_tokens']:.2f} tokens per step")
            st.add_row("", f"step = {sd['speculative_tokens']} × {format_seconds(sd['draft_step_seconds'])} draft + "
                           f"{format_seconds(sd['verify_seconds'])} verify ({sd['verify_bound']}-bound) · TPOT "
                           f"{format_seconds(sd['plain_tpot_seconds'])} without: {sd['speedup_ratio']:.2f}× "
                           f"{'faster' if sd['speedup_ratio'] >= 1 else 'slower'}")
        if s.get("tensor_parallel_link"):
            share = s["tensor_parallel_seconds"] / max(s["tpot_seconds"], 1e-12)
            st.add_row("tensor-parallel all-reduces",
                       f"{format_seconds(s['tensor_parallel_seconds'])} of each token ({share:.0%}) over "
                       f"{s['tensor_parallel_link']} (NCCL {s.get('tensor_parallel_protocol') or 'ring'})")
        if s.get("pipeline"):
            pl = s["pipeline"]
            st.add_row("pipeline stages", f"{pl['stages']}, {pl['micro_batches']} micro-batch(es) of ≤ {pl['micro_batch']} "
                                          f"in flight; TPOT = stages {format_seconds(pl['stages_seconds'])} + sends "
                                          f"{format_seconds(pl['send_seconds'])}")
            st.add_row("", f"sends over {pl['link']}" + (f" ({pl['inter_node_sends']} across nodes)" if pl["inter_node_sends"] else ""))
        if s.get("prefix_hit_ratio"):
            st.add_row("prefix cache hits", f"{s['prefix_hit_ratio']:.0%} of each prompt: the prefill computes "
                                            f"{s['prefill_flops'] / 1e12:,.3g} TFLOPs")
        if s.get("max_batch_for_tpot_target") is not None:
            st.add_row("largest batch meeting the TPOT target", str(s["max_batch_for_tpot_target"]))
    # serving speed comes from the runtime's own factors (fitted for it, or its defaults)
    source = s.get("efficiency_source") if r.workload == "infer" else res.efficiency.source
    console.print(f"[bold]Speed[/] [dim]({source or res.efficiency.source})[/]")
    console.print(st)
    if r.workload == "infer" and s.get("by_batch"):
        bt = Table(title="by batch size", box=None, header_style="bold", padding=(0, 2))
        spec = "speculative_speedup_ratio" in s["by_batch"][0]
        for c in ("batch", "TTFT", "TPOT", "output tokens/s") + (("speculation speed-up",) if spec else ()):
            bt.add_column(c, justify="right")
        for row in s["by_batch"]:
            bt.add_row(str(row["batch"]), format_seconds(row["ttft_seconds"]), format_seconds(row["tpot_seconds"]),
                       f"{row['output_tokens_per_second']:,.0f}",
                       *((f"{row['speculative_speedup_ratio']:.2f}×",) if spec else ()))
        print_table(console, bt)
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
    if res.electricity:
        e = res.electricity
        parts = [f"{e.kilowatts:,.3g} kW", f"{e.usd_per_hour:,.3f} USD/hour at {e.usd_per_kwh:g} USD/kWh"]
        if e.usd_per_million_tokens is not None:
            parts.append(f"{e.usd_per_million_tokens:.3g} USD per million {'trained' if r.workload == 'train' else 'output'} tokens")
        console.print("[bold]Electricity[/]  " + " · ".join(parts), highlight=False)
        console.print(f"[dim]  ({escape(e.assumption)})[/]")
    if res.replicas:
        rt = Table(title="more cards or more replicas", box=None, header_style="bold", padding=(0, 2))
        for col in ("replicas", "× TP", "= GPUs", "batch", "TTFT", "TPOT", "util", "bound by", "cost/hour"):
            rt.add_column(col, justify="left" if col == "bound by" else "right")
        for o in res.replicas[:6]:
            rt.add_row(str(o.replicas), str(o.tensor_parallel), str(o.gpus), str(o.batch), format_seconds(o.ttft_seconds),
                       format_seconds(o.tpot_seconds), _utilization(o), _BOUND[o.bound_by] if o.bound_by in _BOUND else o.bound_by,
                       f"{o.hourly_total:,.2f}" if o.hourly_total is not None else "–")
        print_table(console, rt)
        if res.replicas[0].utilization_ratio is not None:  # an engine: say which model the latencies come from
            console.print(f"[dim]  TTFT, TPOT under load, first row: {escape(_scheduling_words(res.replicas[0]))}. "
                          "batch: mean requests in flight per replica.[/]", highlight=False)
    if res.advice:
        console.print("\n[bold]What to do[/]")
        first_fix = None
        for i, a in enumerate(res.advice, 1):
            if a.kind == "fix":
                # the fixes are cumulative: each one's memory is with every earlier fix applied
                first_fix = first_fix or i
                mark = "[green]✔ fits[/]" if a.fits else "[yellow]still too big[/]"
                after = f"after {first_fix}–{i}: " if i > first_fix else ""
                plus = "+ " if i > first_fix else ""
                console.print(f"  {i}. {plus}{a.text} → {after}{_gib(a.peak_bytes)} {mark}\n     [dim]{a.why}[/]",
                              highlight=False)
            else:
                console.print(f"  {i}. {a.text}", highlight=False)
    for n in res.notes:
        console.print(f"[dim]· {n}[/]", highlight=False)
    for a in res.accuracy:
        console.print(f"[dim]· {escape(a.sentence())}[/]", highlight=False)


def _median(v: list[float]) -> float:
    return statistics.median(v) if v else 0.0


def _tf(v: float | None) -> str:
    return f"{v / 1e12:,.0f}" if v else "–"



# the constraint that stopped a replica's batch from growing, as the tables say it
_BOUND = {"memory": "KV memory", "TPOT": "TPOT", "TTFT": "TTFT", "TTFT+TPOT": "TTFT+TPOT", "utilization": "utilization"}


def _utilization(o: Any) -> str:
    """An engine replica's prefill-queue utilization at the planned rate ("–" for static batches)."""
    return "–" if o.utilization_ratio is None else f"{o.utilization_ratio * 100:.0f} %"


def _scheduling_words(o: Any) -> str:
    """An engine replica plan's latency model, for the line under its table."""
    return f"{o.scheduling}; {format_seconds(o.queue_wait_seconds)} of its TTFT is queueing"


def render_replica_plans(results: list[Any]) -> None:
    """`plan compare` with --target-rps / --ttft-target / --tpot-target: per GPU its cheapest (else
    smallest) replica layout that meets them, the constraint that bound its batch, or why none does."""
    from gpulens.plan.planner import replica_targets

    targets = replica_targets(results[0].request)
    if not targets:
        return
    rate = results[0].request.target_requests_per_second
    console.print(f"\n[bold]Replica plan[/] for {targets}", highlight=False)
    t = Table(header_style="bold", box=None, padding=(0, 2))
    for c in ("GPU", "replicas × TP", "GPUs", "batch", "TTFT", "TPOT", "req/s", "util", "bound by"):
        t.add_column(c, justify="left" if c in ("GPU", "bound by") else "right")
    missed = []
    for r in results:
        if not r.replicas:
            t.add_row(r.gpu.name, "–", "–", "–", "–", "–", "–", "–", "cannot meet")
            missed.append(r)
            continue
        o = r.replicas[0]
        t.add_row(o.gpu, f"{o.replicas} × TP{o.tensor_parallel}", str(o.gpus), str(o.batch), format_seconds(o.ttft_seconds),
                  format_seconds(o.tpot_seconds), f"{o.replicas * o.requests_per_second_per_replica:,.1f}",
                  _utilization(o), _BOUND.get(o.bound_by, o.bound_by))
    print_table(console, t)
    engine = results[0].request.runtime != "hf"
    console.print("[dim]req/s: what the layout serves" + ("" if rate else " (one replica: no --target-rps given)")
                  + (". bound by: what stops a higher request rate per replica (that target, KV memory: the requests in "
                     "flight fill the KV pool; utilization: the prefill queue would grow without bound). util: the "
                     "prefill queue's utilization at the planned rate; batch: mean requests in flight per replica. "
                     "TTFT, TPOT under load:" if engine else
                     ". bound by: what stops a larger batch per replica (the next batch tried, twice this one, "
                     "misses that target; KV memory: the largest batch whose KV cache fits).") + "[/]", highlight=False)
    for r in results:
        if r.replicas and r.replicas[0].utilization_ratio is not None:
            console.print(f"[dim]  {r.gpu.name}: {escape(_scheduling_words(r.replicas[0]))}.[/]", highlight=False)
    for r in missed:
        why = r.replica_misses[0].reason if r.replica_misses else "no layout meets the targets"
        console.print(f"[dim]{r.gpu.name}: cannot meet {targets}: {why}.[/]", highlight=False)


def render_compare(comparison: Any) -> None:
    results = comparison.results
    r0 = results[0]
    train = r0.request.workload == "train"
    what = "train" if train else f"serve · {r0.request.runtime}" + (f" · TP {r0.request.tensor_parallel}" if r0.request.tensor_parallel > 1 else "")
    console.print(f"[bold]{r0.model.name}[/] · {what} · compared on {len(results)} GPUs")
    t = Table(header_style="bold", box=None, padding=(0, 2))
    cols = ["GPU", "fits", "peak", "card"] + (["step", "tokens/s", "MFU"] if train else ["TTFT", "TPOT", "max batch", "out tok/s"])
    priced = any(r.cost and r.cost.per_million_tokens is not None for r in results)
    # without any price the cost column would only say "no price" per row: the note below says it once
    cols += (["batch"] if not train else []) + (["cost / M tokens"] if priced else []) + ["calibrated"]
    for c in cols:
        t.add_column(c, justify="left" if c in ("GPU", "fits") else "right")
    for r in results:
        s = r.speed
        fit = "[green]✔[/]" if r.fits else "[red]✘[/]"
        row = [r.gpu.name, fit, _gib(r.memory.peak_bytes), _gib(r.memory.capacity_bytes)]
        if train:
            row += [format_seconds(s["step_seconds"]), f"{s['tokens_per_second']:,.0f}", format_mfu(s["mfu_ratio"])]
        else:
            row += [format_seconds(s["ttft_seconds"]), format_seconds(s["tpot_seconds"]), str(s["max_batch_that_fits"]),
                    f"{s['output_tokens_per_second']:,.0f}"]
        cost = r.cost.per_million_tokens if r.cost else None
        row += [] if train else [str(r.request.batch)]
        if priced:
            row.append(f"{cost:,.3f} {r.cost.currency}" if cost is not None else "no price")
        row.append("yes" if r.efficiency.calibrated else "no")
        t.add_row(*row)
    print_table(console, t)
    if train:
        bases = list(dict.fromkeys(r.cost_basis for r in results if r.cost_basis))
        text = f"Cost per token {'; '.join(bases)}."
    else:  # the batch column says which batch; say why that one
        why = {r.gpu.name: r.cost_basis.partition("(")[2].rstrip(")") for r in results if r.cost_basis}
        bases = list(dict.fromkeys(r.cost_basis for r in results if r.cost_basis))
        reasons = list(dict.fromkeys(why.values()))
        if len(bases) == 1:
            text = f"Cost per token and speed {bases[0]}."
        else:
            text = "Cost per token and speed at the batch shown: " + (
                reasons[0] if len(reasons) == 1 else "; ".join(f"{g}: {w}" for g, w in why.items())) + "."
    if bases:
        console.print(f"[dim]{text}[/]", highlight=False)
    ttft_target = r0.request.ttft_target_seconds
    over = [r.gpu.name for r in results if not train and ttft_target and r.speed["ttft_seconds"] > ttft_target]
    if over:  # the table's TTFT is a burst's, not the target's: say so rather than show it as a miss or a pass
        console.print(f"[dim]TTFT above: the whole batch's prompts prefilled at once, as a burst of that many requests "
                      f"would see it ({', '.join(over)} over {format_seconds(ttft_target)}); the replica plan below "
                      "prices TTFT under load against the target.[/]", highlight=False)
    if not any(r.cost for r in results):
        from gpulens.plan.catalog import config_path

        console.print(f"[dim]Add your hourly prices to {config_path()} to compare costs (gpulens invents none).[/]")
    for r in results:
        if not r.fits and r.advice:
            console.print(f"[dim]{r.gpu.name}: first fix: {r.advice[0].text}[/]", highlight=False)
    for x in comparison.left_out:
        console.print(f"[dim]Left out {x.gpu}: {x.reason}[/]", highlight=False)
    for a in dict.fromkeys(a for r in results for a in r.accuracy):
        console.print(f"[dim]{escape(a.sentence())}[/]", highlight=False)
    if not train:
        render_replica_plans(results)


def render_calibration(reports: list[Any], *, stored_in: str | None) -> None:
    for rep in reports:
        console.print(f"[bold]{rep.gpu}[/]: fitted from {rep.runs} runs" + (f" ({len(rep.skipped)} failed runs skipped)" if rep.skipped else ""))
        t = Table(box=None, header_style="bold", padding=(0, 2))
        for c in ("figure", "runs", "median error before", "worst before", "median error after", "worst after"):
            t.add_column(c, justify="right" if c != "figure" else "left")
        for k, after in rep.after.items():
            b, a = [abs(v) for v in rep.before[k]], [abs(v) for v in after]
            if not a:
                continue
            t.add_row(k.replace("_", " "), str(len(a)), f"{_median(b):.0%}", f"{max(b):.0%}", f"{_median(a):.0%}", f"{max(a):.0%}")
        print_table(console, t)
        e = rep.efficiency
        console.print(f"  matmul efficiency {e.compute_ratio:.0%} (16-bit), {e.fp32_compute_ratio:.0%} (fp32) · "
                      f"bandwidth efficiency {e.memory_bandwidth_ratio:.0%} · per-layer overhead {format_seconds(e.layer_overhead_seconds)} · "
                      f"allocator reserved/allocated {e.reserved_ratio:.2f}",
                      highlight=False)
        for name, rt in sorted(e.runtimes.items()):
            console.print(f"  {name} serving: decode bandwidth {rt.decode_bandwidth_ratio:.0%} · step overhead "
                          f"{format_seconds(rt.decode_step_overhead_seconds)} + {format_seconds(rt.decode_layer_overhead_seconds)}"
                          f"/layer · prefill overhead {format_seconds(rt.prefill_overhead_seconds)} (other runtimes keep "
                          f"their defaults)", highlight=False)
        if getattr(rep, "checks", None):
            t = Table(box=None, header_style="bold", padding=(0, 2), title="runs the fit did not see (leave-one-out)",
                      title_justify="left")
            for c in ("figure", "scope", "runs", "median", "worst", "defaults median", "defaults worst", "fit"):
                t.add_column(c, justify="left" if c in ("figure", "scope", "fit") else "right")
            for c in rep.checks:
                t.add_row(c.figure.replace("_", " "), c.scope, str(len(c.held_out)), f"{c.median_ratio:.1%}",
                          f"{c.worst_ratio:.1%}", f"{c.defaults_median_ratio:.1%}", f"{c.defaults_worst_ratio:.1%}",
                          "used" if c.used else "not used (defaults kept)")
            print_table(console, t)
        loo = rep.leave_one_out
        if loo is not None and loo.informative:
            console.print(f"  leave-one-out: each run predicted from the others is off by {loo.mean_abs_error_ratio:.0%} on average "
                          f"(the defaults: {loo.defaults_mean_abs_error_ratio:.0%})", highlight=False)
        elif loo is not None:
            console.print("  [dim]leave-one-out not possible with one measurement[/]")
        console.print(f"  used ({len(rep.used)}): " + "; ".join(rep.used), highlight=False)
        for r in rep.rejected:
            console.print(f"  [dim]left out: {r.label}: {r.reason}[/]", highlight=False)
        if rep.refused:
            console.print(f"  [bold red]would be refused:[/] {rep.refused}", highlight=False)
    console.print("[dim]not stored (--dry-run)[/]" if stored_in is None else
                  f"stored in {stored_in}; later plans on these GPUs use it and say so.")


def calibration_json(reports: list[Any], *, stored_in: str | None) -> dict[str, Any]:
    from dataclasses import asdict

    return {"stored_in": stored_in,
            "gpus": [{"gpu": r.gpu, "runs": r.runs, "factors": r.efficiency.to_dict(), "errors_before": r.before,
                      "errors_after": r.after, "skipped": r.skipped, "used": r.used,
                      "rejected": [asdict(x) for x in r.rejected],
                      "leave_one_out": asdict(r.leave_one_out) if r.leave_one_out else None,
                      "refused": r.refused} for r in reports]}


def render_gpus(rows: list[Any], config_path: Any) -> None:
    t = Table(header_style="bold", box=None, padding=(0, 2))
    for c in ("GPU", "GiB", "GB/s", "BF16", "FP8", "INT8", "interconnect", "TDP W", "price/h"):
        t.add_column(c, justify="left" if c in ("GPU", "interconnect") else "right", no_wrap=True)
    for g in rows:
        # what a process gets (nvidia-smi's memory.total, or measured), not the datasheet's size
        t.add_row(g.name + (" (yours)" if g.user_defined else ""), f"{g.memory_bytes / (1 << 30):.1f}",
                  f"{g.memory_bandwidth_bytes_per_second / 1e9:,.0f}", _tf(g.bf16_dense_flops or g.fp16_dense_flops),
                  _tf(g.fp8_dense_flops), _tf(g.int8_dense_ops), g.interconnect or "–",
                  f"{g.tdp_watts:.0f}" if g.tdp_watts else "–", f"{g.hourly_price:g}" if g.hourly_price else "–")
    print_table(console, t)
    console.print(f"[dim]GiB is what nvidia-smi prints as memory.total (or a measured figure), not the datasheet size "
                  f"(`--format json`: marketing_memory_gb); plans use it. "
                  f"Dense peaks in TFLOP/s (TOPS for INT8), from each vendor's datasheet (`--format json` lists the sources). "
                  f"Your cards and prices: {config_path}[/]")


def render_models(specs: list[Any]) -> None:
    from gpulens.plan.models import format_count

    t = Table(header_style="bold", box=None, padding=(0, 2))
    for c in ("preset", "family", "params", "layers", "hidden", "heads / kv", "vocab"):
        t.add_column(c, justify="left" if c in ("preset", "family") else "right", no_wrap=c == "preset")
    for s in specs:
        t.add_row(s.name, s.family, format_count(s.params) + (f" ({format_count(s.active_params)} active)" if s.is_moe else ""),
                  str(s.num_layers), str(s.hidden_size), f"{s.num_heads} / {s.num_kv_heads}", f"{s.vocab_size:,}")
    print_table(console, t)
