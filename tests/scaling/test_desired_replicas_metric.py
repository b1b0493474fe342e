"""`gpulens_desired_replicas{service}` on /metrics, from the store's requests, stabilized between scrapes."""

from __future__ import annotations

import time
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gpulens.exporter.exposition import render_text
from gpulens.exporter.prometheus import LatestReadings, make_registry
from gpulens.exporter.scaling import DESIRED_REPLICAS, ScalingCollector
from gpulens.scaling import ScalePolicy
from gpulens.store import Store
from gpulens.vocab import names as N


def _requests(st: Store, service: str, start: float, end: float, per_second: int, latency: float) -> None:
    labels = {"service": service, "host": "h", "model": "m"}
    n = int((end - start) * per_second)
    for i in range(n):
        stop = start + (i + 0.5) / per_second
        st.event(N.EV_REQUEST, stop, labels, {"arrival": stop - latency, "end": stop, "status": "ok"})
        st.write(N.INFER_LATENCY_SECONDS, labels, stop, latency)
    st.flush()


def _scrape(registry: CollectorRegistry) -> dict[str, float]:
    text = render_text(registry).decode()
    return {s.labels["service"]: s.value for f in text_string_to_metric_families(text) if f.name == DESIRED_REPLICAS for s in f.samples}


def test_the_gauge_follows_the_load_and_holds_through_the_stabilization_window(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as st:
        # 0-60 s: 10 req/s of 1 s (10 in flight: 3 replicas at 4 each); 60-120 s: 1 req/s of 1 s.
        _requests(st, "chat", 0.0, 60.0, 10, 1.0)
        _requests(st, "chat", 60.0, 120.0, 1, 1.0)
        now = [0.0]
        coll = ScalingCollector(st, clock=lambda: now[0], window_seconds=10.0, policy=ScalePolicy(stabilization_seconds=30.0))
        reg = CollectorRegistry(auto_describe=False)
        reg.register(coll)  # type: ignore[arg-type]
        seen = {}
        for t in range(5, 125, 5):  # a scrape every 5 s
            now[0] = float(t)
            seen[t] = _scrape(reg)["chat"]
        # Busy: ceil(10 / 4) = 3. The load drops at 60 s (the 60 s scrape's window is still all busy);
        # the gauge holds 3 until 30 s after that scrape, then the largest since (2, at 65 s), then 1.
        assert all(seen[t] == 3 for t in range(10, 90, 5)), seen
        assert seen[90] == 2 and all(seen[t] == 1 for t in range(95, 125, 5)), seen
        now[0] = 1000.0  # long after the last request: the service is no longer shown
        assert _scrape(reg) == {}


def test_the_agent_registry_exports_it(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as st:
        now = time.time()
        _requests(st, "chat", now - 70.0, now, 20, 1.0)  # 20 in flight over the whole 1 m window
        got = _scrape(make_registry(LatestReadings(host="h"), store=st))
    assert got == {"chat": 5.0}
