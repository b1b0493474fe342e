"""Runs, comparison and co-location figures, each beside a reference measured in the same run:

- fingerprint cost: taking the environment fingerprint in a fresh process, against importing torch
  in a fresh process (what reading versions from metadata avoids); goal < 10 % of it;
- comparison quality on realistic step times (4 % jitter, 5 % slow steps, 30 samples a run):
  false "regression/improvement" rate over 200 same-distribution pairs against the nominal 5 %
  level (goal: at most it), and the share of 10 %-slower pairs called a regression (goal >= 95 %);
- comparison cost: one `compare_runs` of two 30-step runs against one tiny CPU training step;
- co-location diagnosis of the H200 recording against importing that recording (goal < 10 %).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _fresh(code: str, repeats: int = 3) -> float:
    """Median seconds a snippet reports for itself in a fresh interpreter."""
    out = []
    for _ in range(repeats):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
        out.append(float(r.stdout.strip().splitlines()[-1]))
    return statistics.median(out)


def _steps(rng: np.random.Generator, median: float, n: int = 30) -> list[float]:
    x = median * rng.lognormal(0.0, 0.04, n)
    slow = rng.random(n) < 0.05
    x[slow] *= rng.uniform(1.3, 2.0, slow.sum())
    return x.tolist()


def run() -> list[dict]:
    from gpulens.bench.compare import compare_runs, compare_samples
    from gpulens.runs import Run

    res = []
    fp = _fresh("import time; t=time.perf_counter(); from gpulens.runs import take_fingerprint; take_fingerprint(); print(time.perf_counter()-t)")
    torch_s = _fresh("import time; t=time.perf_counter(); import torch; print(time.perf_counter()-t)")
    res.append(dict(name="fingerprint (fresh process)", value=fp, unit="s", reference="import torch (fresh process)",
                    reference_value=torch_s, ratio=fp / torch_s, goal="< 0.1 of importing torch", met=fp / torch_s < 0.1))

    false_calls = sum(
        compare_samples("step_seconds", _steps(np.random.default_rng(s), 0.2), _steps(np.random.default_rng(10_000 + s), 0.2), seed=s).verdict != "no change"
        for s in range(200)
    )
    fpr = false_calls / 200
    res.append(dict(name="false verdicts, same distribution", value=fpr, unit="ratio", reference="nominal alpha",
                    reference_value=0.05, ratio=fpr / 0.05, goal="<= alpha (200 pairs of 30)", met=fpr <= 0.05))
    caught = sum(
        compare_samples("step_seconds", _steps(np.random.default_rng(s), 0.2), _steps(np.random.default_rng(20_000 + s), 0.22), seed=s).verdict == "regression"
        for s in range(200)
    )
    power = caught / 200
    res.append(dict(name="10 % slower called regression", value=power, unit="ratio", reference="all pairs", reference_value=1.0,
                    ratio=power, goal=">= 0.95 (200 pairs of 30)", met=power >= 0.95))

    rng = np.random.default_rng(1)
    a = Run(1, "bench-train", "x", 0.0, None, None, {}, {}, {}, samples={"step_seconds": _steps(rng, 0.2), "tokens_per_second": _steps(rng, 1e4)})
    b = Run(2, "bench-train", "x", 0.0, None, None, {}, {}, {}, samples={"step_seconds": _steps(rng, 0.2), "tokens_per_second": _steps(rng, 1e4)})
    compare_runs(a, b)  # warm scipy's import
    t0 = time.perf_counter()
    for _ in range(10):
        compare_runs(a, b)
    cmp_s = (time.perf_counter() - t0) / 10
    try:
        import torch

        from gpulens.bench.train import TrainBenchConfig, run_train_bench

        r = run_train_bench(TrainBenchConfig(size="tiny", seq_len=64, batch_size=4, warmup_steps=3, steps=10, precision="fp32", device="cpu"))
        step = r.step_seconds_median
        res.append(dict(name="compare two 30-step runs", value=cmp_s, unit="s", reference="one tiny CPU training step",
                        reference_value=step, ratio=cmp_s / step, goal="informational", met=None))
        del torch
    except ImportError:
        pass

    from gpulens.data import bundled_colocation_trace
    from gpulens.diagnose.base import DiagnoseScope
    from gpulens.diagnose.colocation import analyze
    from gpulens.pipeline.ingest import import_trace
    from gpulens.store import Store

    with tempfile.TemporaryDirectory() as d, Store(Path(d) / "c.db") as st:
        t0 = time.perf_counter()
        import_trace(bundled_colocation_trace(), st)
        imp = time.perf_counter() - t0
        t0 = time.perf_counter()
        found = analyze(st, DiagnoseScope())
        diag = time.perf_counter() - t0
    res.append(dict(name="co-location diagnosis (H200 recording)", value=diag, unit="s", reference="importing the recording",
                    reference_value=imp, ratio=diag / imp, goal="< 0.1 of the import, finding present", met=diag / imp < 0.1 and len(found) == 1))
    return res


if __name__ == "__main__":
    for r in run():
        print(r)
