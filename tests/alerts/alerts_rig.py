"""Fixtures for the alert tests: a fake GPU sampled into a real store on an injected clock, with the
alert runtime evaluated after every sample (what the agent loop does)."""

from __future__ import annotations

from collections.abc import Callable

from testlib import free_port, which_or_skip  # noqa: F401  (re-exported for the alert tests)

from gpulens.alerts.engine import AlertState
from gpulens.alerts.runtime import AlertRuntime
from gpulens.gpu.fake import FakeBackend
from gpulens.pipeline.writer import SampleWriter

T0 = 1_800_000_000.0


class Rig:
    def __init__(self, store, *, interval: float = 5.0, packs=("gpu_health",), learn_seconds: float = 3600.0, notify=()):
        self.t = T0
        self.interval = interval
        self.store = store
        self.fake = FakeBackend(1, clock=lambda: self.t, seed=7)
        self.writer = SampleWriter(store, host="node1")
        self.rt = AlertRuntime(store, learn_seconds=learn_seconds, packs=packs, notify=list(notify), clock=lambda: self.t)
        self.log: list[tuple[float, list[AlertState]]] = []

    def tick(self) -> list[AlertState]:
        self.t += self.interval
        self.writer.write_samples(self.fake.sample())
        for ev in self.fake.drain_xid_events():
            self.writer.write_xid(ev, "NVIDIA H200")
        self.store.flush()
        out = self.rt.evaluate(self.t)
        self.log.append((self.t, out))
        return out

    def firing(self, rule: str) -> list[AlertState]:
        return [a for a in self.log[-1][1] if a.rule == rule and a.state == "firing"] if self.log else []

    def run_until(self, cond: Callable[[], bool], max_seconds: float) -> float | None:
        """Ticks until cond() holds; the time it first held, or None."""
        end = self.t + max_seconds
        while self.t < end:
            self.tick()
            if cond():
                return self.t
        return None

    def close(self) -> None:
        self.rt.close()
