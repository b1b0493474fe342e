"""`gpulens plan`: will it fit, how fast, what it costs; `plan compare`, `plan calibrate`, `plan gpus`, `plan models`.

Each command parses, makes one library call and renders (cli/plan_render.py). The options
`plan` and `plan compare` share are generated from `gpulens.plan.request.PlanOptions`."""

from __future__ import annotations

import inspect
import json
import typing
from collections.abc import Callable
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

import typer

from gpulens.cli.common import console, console_err
from gpulens.errors import EXIT_BAD_INPUT, BadInputError
from gpulens.plan.request import PlanOptions

HELP = """Plan GPU memory, speed and cost of **training** or **serving** a model, before renting anything.

Examples:

  gpulens plan --model llama-3-8b --workload train --gpu h100-sxm --batch 4 --seq 4096

  gpulens plan --model ./config.json --workload infer --gpu l40s --prompt 2000 --new-tokens 300 --runtime vllm

  gpulens plan compare --model qwen2.5-7b --workload infer --gpu a100-80gb --gpu h100-sxm --gpu l40s

  gpulens plan compare --model qwen2.5-7b --workload infer --runtime vllm --gpu h100-sxm --gpu l40s --target-rps 20 --tpot-target 30ms

  gpulens plan --model gemma-2-9b --workload train --gpu h100-sxm --batch 1 --seq 4096 --precision bf16 --recompute selective

  gpulens plan calibrate --measurements runs.jsonl --gpu h200

  gpulens plan --model llama-3-70b --workload infer --gpu local --gpus 4

`--model` takes a config.json (or its folder), a preset (`gpulens plan models`) or a bare size such
as `7b` (a rough answer). GPU names are case-insensitive (`gpulens plan gpus`). Prices come only
from your config file (see docs/plan.md). Memory is predicted for PyTorch + transformers (eager,
SDPA attention); `--runtime vllm` models a serving engine that preallocates its KV cache.
"""


def _option_type(hint: Any) -> Any:
    """`int | None` -> `int`: typer takes the None default as "not given"."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def _typed(ctx: typer.Context, name: str) -> bool:
    """Whether option `name` came from the command line (or the environment), not its default."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def with_plan_options(func: Callable[..., None]) -> Callable[..., None]:
    """Add every PlanOptions field as a typer option to `func`, which receives them as `opts`."""
    hints = typing.get_type_hints(PlanOptions)
    own_hints = typing.get_type_hints(func)
    own = [p.replace(annotation=own_hints.get(p.name, p.annotation))
           for p in inspect.signature(func).parameters.values() if p.name != "opts"]
    names = PlanOptions.names()
    shared = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=_option_type(hints[f.name]),
                                default=typer.Option(None if f.default is MISSING else f.default, *f.metadata["flags"],
                                                     help=f.metadata["help"]))
              for f in fields(PlanOptions) if f.name in names]
    # the click context says which options the user typed (an option given at its default value too);
    # `func`'s own context parameter where it has one, else one of the wrapper's
    ctx_name = next((p.name for p in own if p.annotation is typer.Context), None)
    own_ctx = [] if ctx_name else [inspect.Parameter("plan_ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)]

    def wrapper(**kw: Any) -> None:
        ctx = kw[ctx_name] if ctx_name else kw.pop("plan_ctx")
        given = frozenset(n for n in names if _typed(ctx, n))
        opts = PlanOptions(**{n: kw.pop(n) for n in names}, given=given)
        func(opts=opts, **kw)

    wrapper.__name__, wrapper.__doc__ = func.__name__, func.__doc__
    # help order as before: --model, --workload, the command's own (--gpu), the rest, --format last
    own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own]
    last = [p for p in own if p.name == "fmt"]
    params = own_ctx + shared[:2] + [p for p in own if p.name != "fmt"] + shared[2:] + last
    wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper


def _emit_json(obj: Any) -> None:
    console.print_json(json.dumps(obj, default=str))


def _gpu_named(name: str, opts: PlanOptions) -> str:
    """`--gpu`, with `local` (or `this`) read as this machine's card (cli/plan_local.py), said on stderr."""
    from gpulens.cli.plan_local import is_local, local_gpu

    if not is_local(name):
        return name
    local = local_gpu()
    console_err.print(f"--gpu {name.strip()}: this machine's {local.count} × {local.nvml_name}, planned as "
                      f"{local.catalog_name} from the catalog.", markup=False, highlight=False)
    wanted = max(opts.gpus or 1, (opts.tp or 1) * (opts.pp or 1), opts.nodes * opts.gpus_per_node if opts.nodes else 1)
    if wanted > local.count:
        console_err.print(f"The plan is for {wanted} GPUs; this machine has {local.count}.", markup=False, highlight=False)
    if local.note:
        console_err.print(local.note, markup=False, highlight=False)
    return local.catalog_name


def _check_format(fmt: str) -> None:
    if fmt not in ("text", "json"):
        raise BadInputError(f"Unknown format {fmt!r}.", hint="Use --format text or --format json.")


def register(app: typer.Typer) -> None:
    plan_app = typer.Typer(help=HELP, rich_markup_mode="markdown", no_args_is_help=False, invoke_without_command=True)

    @plan_app.callback(invoke_without_command=True)
    @with_plan_options
    def plan_cmd(
        ctx: typer.Context,
        opts: PlanOptions,
        gpu: str = typer.Option("h100-sxm", "--gpu", "-g", help="GPU name, case-insensitive (see `gpulens plan gpus`), or local: this machine's GPU as NVML names it "
                                                         "(GPULENS_BACKEND=replay: the bundled H200 session's)."),
        fmt: str = typer.Option("text", "--format", help="text or json."),
    ) -> None:
        if ctx.invoked_subcommand is not None:
            return
        if opts.model is None:
            # by name: typer may hand back its own copy of click's ParameterSource enum
            typed = [n for n in ctx.params if getattr(ctx.get_parameter_source(n), "name", "") == "COMMANDLINE"]
            if typed:  # options but no model: what is missing, in one sentence
                raise BadInputError("plan needs --model: a config.json path or folder, a preset name (gpulens plan models) "
                                    "or a size such as 7b.", hint="For example: gpulens plan --model llama-3-8b --gpu h100-sxm.")
            typer.echo(ctx.get_help())  # nothing typed: the help, and exit 2 as `gpulens` and `gpulens export` do
            raise typer.Exit(EXIT_BAD_INPUT)
        from gpulens.cli.plan_render import render_plan
        from gpulens.plan.planner import plan

        res = plan(opts.to_request(_gpu_named(gpu, opts)))
        _check_format(fmt)
        if fmt == "json":
            _emit_json(res.to_dict())
        else:
            render_plan(res)

    @plan_app.command("compare")
    @with_plan_options
    def compare_cmd(
        opts: PlanOptions,
        gpu: list[str] = typer.Option(None, "--gpu", "-g", help="A GPU to compare; repeat the option (or give a comma list)."),
        fmt: str = typer.Option("text", "--format", help="text or json."),
    ) -> None:
        """The same plan on several GPUs side by side (same options as `gpulens plan`). Serving without
        --batch is compared at each GPU's throughput-optimal batch that fits."""
        from gpulens.cli.plan_render import render_compare
        from gpulens.plan.planner import compare

        names = [_gpu_named(n.strip(), opts) for g in gpu or [] for n in g.split(",") if n.strip()]
        _check_format(fmt)
        comparison = compare(opts.to_request(names[0] if names else ""), names, batch_given=opts.batch_given)
        if fmt == "json":
            _emit_json(comparison.to_dict())
            return
        render_compare(comparison)

    @plan_app.command("calibrate")
    def calibrate_cmd(
        measurements: Path = typer.Option(None, "--measurements", help="JSON lines of measured runs (format of memory_calibration.jsonl); 'bundled' = the recorded H200 runs."),
        gpu: str = typer.Option(None, "--gpu", "-g", help="The GPU the runs were measured on, when the runs do not say."),
        store: Path = typer.Option(None, "--store", help="Also use the `gpulens bench train` runs and the healthy steps of monitored jobs recorded in this store."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Fit and show, but do not store."),
        fmt: str = typer.Option("text", "--format", help="text or json."),
    ) -> None:
        """Fit a GPU's efficiency and overhead factors from measured runs and store them; later plans on that GPU use them.
        A fit that predicts its own runs (leave-one-out) worse than the defaults is refused and nothing is stored."""
        from gpulens.cli.plan_render import calibration_json, render_calibration
        from gpulens.plan.calibration import (
            Measurement,
            Rejected,
            calibrate,
            calibration_path,
            load_measurements,
        )

        _check_format(fmt)
        if gpu is not None and not gpu.strip():  # '' was read as "not given"
            raise BadInputError("No GPU name given to --gpu.", hint="Pass --gpu NAME, e.g. --gpu h200, or drop --gpu.")
        recorded = None
        if measurements is not None and str(measurements) == "bundled":
            from gpulens.data import bundled_trace

            measurements = bundled_trace() / "memory_calibration.jsonl"
            recorded = "h200"
        ms: list[Measurement] = []
        rejected: list[Rejected] = []
        source: list[str] = []
        if measurements is not None:
            ms += load_measurements(measurements)
            source.append(str(measurements))
            recorded = recorded or _gpu_of_recording(measurements)
            _check_recorded_gpu(gpu, recorded, measurements)
            gpu = gpu or recorded
        if store is not None:
            recorded = _store_measurements(store)
            ms += recorded.measurements
            rejected += recorded.rejected
            source.append(f"store {store}")
        if not source:
            raise BadInputError("No measurements given.", hint="Pass --measurements FILE and/or --store PATH.")
        reports = calibrate(ms, gpu_name=gpu, source=", ".join(source), rejected=rejected, save=not dry_run)
        stored_in = None if dry_run else str(calibration_path())
        if fmt == "json":
            _emit_json(calibration_json(reports, stored_in=stored_in))
        else:
            render_calibration(reports, stored_in=stored_in)

    @plan_app.command("gpus")
    def gpus_cmd(fmt: str = typer.Option("text", "--format", help="text or json.")) -> None:
        """The GPU catalog (datasheet figures with their sources) plus your own cards and prices."""
        from gpulens.cli.plan_render import render_gpus
        from gpulens.plan.catalog import all_gpus, config_path

        _check_format(fmt)
        rows = all_gpus()
        if fmt == "json":
            _emit_json([g.to_dict() for g in rows])
            return
        render_gpus(rows, config_path())

    @plan_app.command("models")
    def models_cmd(fmt: str = typer.Option("text", "--format", help="text or json.")) -> None:
        """The bundled model presets (configs written as data from their public config.json)."""
        from gpulens.cli.plan_render import render_models
        from gpulens.plan.models import preset, preset_names

        _check_format(fmt)
        specs = [preset(n) for n in preset_names()]
        if fmt == "json":
            _emit_json([s.to_dict() | {"source": s.source} for s in specs])
            return
        render_models(specs)

    app.add_typer(plan_app, name="plan", help=HELP)


def _check_recorded_gpu(gpu: str | None, recorded: str | None, measurements: Path) -> None:
    """--gpu naming another card than the recording's env.json (the bundled runs: an H200) stored
    a fit of one GPU's runs as another GPU's calibration."""
    from gpulens.errors import shown
    from gpulens.plan.catalog import find_gpu

    if not gpu or not recorded:
        return
    try:
        theirs = find_gpu(recorded).name
    except BadInputError:  # a device the catalog does not know: nothing to compare
        return
    ours = find_gpu(gpu).name
    if ours != theirs:
        raise BadInputError(f"--gpu {shown(gpu)} says the runs in {measurements} ran on {ours}, and their recording says "
                            f"{theirs}.", hint="Drop --gpu (the recording's GPU is used), or pass runs measured on that GPU.")


def _gpu_of_recording(measurements: Path) -> str | None:
    from gpulens.plan.calibration import gpu_from_env_json

    return gpu_from_env_json(measurements)


def _store_measurements(path: Path) -> Any:
    """The store is read here, not in the planner (gpulens.plan imports no store)."""
    from gpulens.runs.measurements import read_store_measurements

    return read_store_measurements(path)
