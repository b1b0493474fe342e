"""`gpulens quant check`: quantize, evaluate both, measure both, record both, gate (docs/eval.md)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from gpulens.cli.common import console, store_option

quant_app = typer.Typer(help="Quantization checks: does the quantized model keep its accuracy?", no_args_is_help=True)


@quant_app.command("check")
def check_command(
    model: Path = typer.Option(..., "--model", help="A Hugging Face model folder (config.json, weights, tokenizer)."),
    to: str = typer.Option(..., "--to", help="int8, int4 or fp8 (weights only)."),
    task: str = typer.Option(None, "--task", help="The lm-eval task to evaluate both models on (or --eval-cmd)."),
    eval_cmd: str = typer.Option(None, "--eval-cmd", help="Your own evaluation instead of --task, run on each model folder: "
                                 "it reads {model} and writes per-example scores to {out} (JSONL {\"id\": ..., \"METRIC\": value}, with METRIC as --metric names it, "
                                 "or an lm-eval --log_samples folder)."),
    include_path: Path = typer.Option(None, "--include-path", help="Folder with the task's YAML (a local task; nothing is downloaded)."),
    metric: str = typer.Option("acc", "--metric", help="The per-example metric the gate tests."),
    margin: float = typer.Option(None, "--margin", help="How much worse the quantized model may be (0-1 scores: 0.01 by default)."),
    limit: int = typer.Option(None, "--limit", help="Evaluate only the first N examples of the task."),
    filter_name: str = typer.Option(None, "--filter", help="The lm-eval filter, when the task has several."),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda or cuda:N."),
    store: Path = store_option(),
    record: bool = typer.Option(True, "--record/--no-record", help="Record both as runs (kind quant-check) in the store."),
    fmt: str = typer.Option("table", "--format", help="table or json."),
) -> None:
    """Quantize a model, evaluate the baseline and the quantized model on the same examples, and gate:
    exit 0 when the quantized model passes the `eval compare` gate, 1 when it does not, 2 on bad input.

        gpulens quant check --model ./my-model --to int8 --task mytask --include-path ./tasks
        gpulens quant check --model ./my-model --to int8 --eval-cmd 'python eval.py --model {model} --out {out}'
    """
    from gpulens.errors import BadInputError, GateFailedError, shown
    from gpulens.evals.eval_cmd import EvalCommand
    from gpulens.evals.quant import check_device, check_model_folder, quant_check
    from gpulens.evals.quantize import quantizer_for

    if fmt not in ("table", "json"):
        raise BadInputError(f"--format must be table or json, not {shown(fmt)}.")
    if (task is None) == (eval_cmd is None):
        raise BadInputError("Give one of --task (an lm-eval task) or --eval-cmd (your own evaluation).",
                            hint="e.g. --eval-cmd 'python eval.py --model {model} --out {out}'.")
    command = EvalCommand.of(eval_cmd) if eval_cmd is not None else None
    if command is not None and (include_path is not None or limit is not None):
        raise BadInputError("--include-path and --limit are lm-eval's; with --eval-cmd your command chooses its examples.")
    quantizer = quantizer_for(to)
    check_device(device)
    check_model_folder(model)  # a folder that is no model is one sentence before torch loads or the store opens
    if record:
        from gpulens.store import Store

        store.parent.mkdir(parents=True, exist_ok=True)
        with Store(store) as st:
            res = quant_check(model, to, quantizer, task=task, include_path=include_path, metric=metric, margin=margin,
                              limit=limit, filter_name=filter_name, device=device, store=st, eval_cmd=command)
    else:
        res = quant_check(model, to, quantizer, task=task, include_path=include_path, metric=metric, margin=margin,
                          limit=limit, filter_name=filter_name, device=device, eval_cmd=command)
    r = res.result
    if fmt == "json":
        typer.echo(json.dumps(res.to_json()))
    else:
        console.print(f"{res.model} → {to} ({res.quantized_with})", highlight=False)
        console.print(f"  {metric}: baseline {r.baseline_mean:.4g}, quantized {r.candidate_mean:.4g}, difference {r.difference:+.4g} "
                      f"[{r.difference_low:+.4g}, {r.difference_high:+.4g}], flipped {r.improved} better / {r.regressed} worse",
                      highlight=False)
        console.print(f"  weights: {res.baseline.weights_bytes / 2**20:.3g} MiB → {res.quantized.weights_bytes / 2**20:.3g} MiB "
                      f"({res.memory_ratio:.2f}×)", highlight=False)
        console.print(f"  speed: {res.baseline.tokens_per_second:.4g} → {res.quantized.tokens_per_second:.4g} tokens/s "
                      f"({res.speed_ratio:.2f}×, forward of 8 × 32 tokens on {device})", highlight=False)
        if res.run_ids:
            console.print(f"  recorded runs #{res.run_ids[0]} (baseline) and #{res.run_ids[1]} ({to})", highlight=False)
        console.print(("[green]PASS" if r.passed else "[red]FAIL") + f": {r.verdict} (margin {r.margin:g}): {r.reason}[/]", highlight=False)
    if not r.passed:
        raise GateFailedError(f"The {to} model failed the gate on {metric}: {r.verdict} (margin {r.margin:g}).",
                              hint=f"{r.reason[:1].upper()}{r.reason[1:]}." if r.verdict == "inconclusive" else None)


def register(app: typer.Typer) -> None:
    app.add_typer(quant_app, name="quant")
