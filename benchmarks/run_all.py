"""`make bench`: run every benchmarks/bench_*.py, print one table, write benchmarks/results.json.

Each benchmark module defines `run() -> list[dict]`, one dict per figure:
  name, value, unit, reference (what it is compared with), reference_value, ratio, goal (text), met (bool|None)
A figure is always printed beside a reference measured in the same run, so the ratio means
something on a noisy machine.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    only = set(argv[1:])
    results: list[dict] = []
    console = Console()
    for path in sorted(HERE.glob("bench_*.py")):
        if only and path.stem not in only and path.stem.removeprefix("bench_") not in only:
            continue
        console.print(f"[bold]{path.stem}[/] …")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
        t0 = time.perf_counter()
        for r in mod.run():
            r.setdefault("benchmark", path.stem)
            results.append(r)
        console.print(f"  done in {time.perf_counter() - t0:.1f} s")
    table = Table(title="gpulens benchmarks")
    for col in ("benchmark", "figure", "value", "reference", "ratio", "goal", "met"):
        table.add_column(col)
    for r in results:
        met = r.get("met")
        table.add_row(
            r["benchmark"].removeprefix("bench_"),
            r["name"],
            f"{r['value']:.4g} {r.get('unit', '')}",
            f"{r.get('reference', '')}: {r.get('reference_value', float('nan')):.4g}" if r.get("reference") else "",
            f"{r['ratio']:.3g}" if r.get("ratio") is not None else "",
            r.get("goal", ""),
            "" if met is None else ("[green]yes[/]" if met else "[red]no[/]"),
        )
    console.print(table)
    out = HERE / "results.json"
    out.write_text(json.dumps({"generated": time.time(), "results": results}, indent=2))
    console.print(f"wrote {out}")
    return 1 if any(r.get("met") is False for r in results) else 0  # a missed goal fails `make bench`


if __name__ == "__main__":
    sys.exit(main(sys.argv))
