"""Alert evaluation cost on replay: importing the bundled H200 session (~100 s recorded) with all
rule packs evaluated every 0.1 s of recorded time, against the same import without alerts in the
same run.

Goal (issue #6 / agent integration): about 1,000 evaluations over the 100 s trace take a few
seconds at most, i.e. one evaluation of every pack costs under 5 ms.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

GOAL_MS_PER_EVALUATION = 5.0


class _Timed:
    """Times AlertRuntime.evaluate alone: the store flush import_trace does before each evaluation
    is the importer's cost, reported separately."""

    def __init__(self, rt):  # noqa: ANN001
        self.rt = rt
        self.seconds = 0.0

    def evaluate(self, now: float):  # noqa: ANN201
        t0 = time.perf_counter()
        out = self.rt.evaluate(now)
        self.seconds += time.perf_counter() - t0
        return out


def _import(db: Path, with_alerts: bool) -> tuple[float, float, int]:
    from gpulens.alerts.runtime import AlertRuntime
    from gpulens.data import bundled_trace
    from gpulens.pipeline.ingest import import_trace
    from gpulens.store import Store

    t0 = time.perf_counter()
    with Store(db) as st:
        rt = AlertRuntime(st, learn_seconds=3.0) if with_alerts else None
        timed = _Timed(rt) if rt else None
        import_trace(bundled_trace(), st, evaluators=[timed] if timed else None, evaluate_seconds=0.1)
        if rt:
            rt.close()
    return time.perf_counter() - t0, timed.seconds if timed else 0.0, rt.evaluations if rt else 0


def run() -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        plain, _, _ = _import(Path(tmp) / "plain.db", False)
        total, in_eval, n = _import(Path(tmp) / "alerts.db", True)
    per_eval_ms = in_eval / max(n, 1) * 1000
    return [
        {
            "name": f"replay of the H200 session with alerts ({n} evaluations of all packs)",
            "value": per_eval_ms,
            "unit": "ms per evaluation",
            "reference": "the same import without alerts (s)",
            "reference_value": plain,
            "ratio": in_eval / plain,  # seconds evaluating per second of plain import
            "total_seconds_with_alerts": total,
            "goal": f"< {GOAL_MS_PER_EVALUATION:.0f} ms per evaluation",
            "met": per_eval_ms < GOAL_MS_PER_EVALUATION,
        }
    ]


if __name__ == "__main__":
    for row in run():
        print(row)
