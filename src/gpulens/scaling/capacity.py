"""A replica's capacity from a recorded `gpulens bench serve --sweep` run: an open-loop sweep's best
rate that met every SLO is the requests per second one replica serves (the `arrival_rate` signal's
target); a closed-loop sweep's best concurrency is the requests in flight one replica carries within
its SLOs (the `concurrency` signal's target)."""

from __future__ import annotations

from dataclasses import replace

from gpulens.errors import BadInputError
from gpulens.runs.registry import Run, list_runs, resolve_run
from gpulens.scaling.signals import Targets
from gpulens.store import Store

BENCH_SERVE_KIND = "bench-serve"  # bench/serve/output.py RUN_KIND


def _sweep_runs(store: Store) -> list[Run]:
    return [r for r in list_runs(store, BENCH_SERVE_KIND) if isinstance(r.summary.get("sweep"), dict)]


def targets_from_sweep(store: Store, ref: str, base: Targets) -> tuple[Targets, Run]:
    """`base` with the target the sweep run `ref` ("latest" = the newest sweep) measured."""
    if ref.strip().lower() == "latest":
        runs = _sweep_runs(store)
        if not runs:
            raise BadInputError("The store has no `gpulens bench serve --sweep` run to take a replica's capacity from.",
                                hint="Run a sweep against one replica first, or give --capacity / --target-concurrency.")
        run = runs[0]
    else:
        run = resolve_run(store, ref)
    sweep = run.summary.get("sweep")
    if run.kind != BENCH_SERVE_KIND or not isinstance(sweep, dict):
        raise BadInputError(f"Run {run.label} is not a `gpulens bench serve --sweep` run.", hint="Name a sweep run, or 'latest'.")
    best = sweep.get("best")
    if not isinstance(best, int | float) or best <= 0:
        raise BadInputError(f"Sweep {run.label} found no load that met every SLO, so it gives no capacity.",
                            hint="Sweep again from a lower start, or give --capacity / --target-concurrency.")
    if sweep.get("mode") == "closed":
        return replace(base, concurrency_per_replica=float(best)), run
    return replace(base, capacity_rps_per_replica=float(best)), run
