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
# Issue 18: at 8 GPUs x 10 Hz, one evaluation after 10 minutes costs at most 1.5x one after 1 minute.
GOAL_GROWTH_RATIO = 1.5


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


def _growth(db: Path, gpus: int = 8, hz: float = 10.0, minutes: float = 10.0) -> tuple[float, float, int]:
    """Median time of one evaluation of every pack around minute 1 and around the last minute of
    `minutes` at `gpus` fake GPUs sampled at `hz`, on a simulated clock (the loop and the store as
    the agent runs them; samples flushed before each evaluation, as the loop does)."""
    import statistics

    from gpulens.alerts.runtime import AlertRuntime
    from gpulens.gpu import FakeBackend
    from gpulens.pipeline import NodeConfig, build_node
    from gpulens.store import Store

    now = [1_800_000_000.0]
    fake = FakeBackend(gpus=gpus, clock=lambda: now[0])
    with Store(db) as st:
        node = build_node(NodeConfig(backend=fake, alerts=None, colocation=False, host="bench"), store=st)
        rt = AlertRuntime(st, learn_seconds=7 * 86400, clock=lambda: now[0])
        early: list[float] = []
        late: list[float] = []
        ticks = int(minutes * 60 * hz)
        per_eval = int(hz)  # evaluate every second, as the agent does by default
        for i in range(1, ticks + 1):
            now[0] += 1.0 / hz
            node.loop.tick()
            if i % per_eval:
                continue
            node.loop.flush()
            t0 = time.perf_counter()
            rt.evaluate(now[0])
            dt = time.perf_counter() - t0
            second = i // per_eval
            if 50 <= second < 60:
                early.append(dt)
            elif second >= minutes * 60 - 10:
                late.append(dt)
        rt.close()
        node.close()
    return statistics.median(early), statistics.median(late), rt.evaluations


def run() -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        plain, _, _ = _import(Path(tmp) / "plain.db", False)
        total, in_eval, n = _import(Path(tmp) / "alerts.db", True)
        early, late, evals = _growth(Path(tmp) / "growth.db")
    per_eval_ms = in_eval / max(n, 1) * 1000
    return [
        {
            "name": "one evaluation of every pack after 10 min at 8 GPUs x 10 Hz",
            "value": late * 1000,
            "unit": "ms",
            "reference": "the same after 1 min (ms)",
            "reference_value": early * 1000,
            "ratio": late / early,
            "evaluations": evals,
            "goal": f"within {GOAL_GROWTH_RATIO}x of after 1 min",
            "met": late / early <= GOAL_GROWTH_RATIO,
        },
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
