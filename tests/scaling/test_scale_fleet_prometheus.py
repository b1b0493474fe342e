"""`gpulens scale --prometheus`: the desired replicas of a service computed over a fleet's Prometheus
through the reader seam. A real Prometheus scrapes two real `gpulens agent`s (gpulens.fleet.rig)
whose stores a real InferenceMonitor fills: on each node a request ends every 0.1 s after 2 s, so 20
requests are in flight per node (40 in all), 20 requests/s end in all, and the engine's KV-cache usage
is 0.9 on each. Each signal's replica count comes out as that load asks, and the concurrency over
Prometheus is the nodes' stores' own, to within a scrape's delay. About 35 s, most of it the load."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from testlib import which_or_skip

from gpulens.fleet import SERVICE, FleetRig
from gpulens.fleet.workload import REQUEST_EVERY_SECONDS, REQUEST_LATENCY_SECONDS
from gpulens.scaling import desired_replicas
from gpulens.store import Store
from gpulens.vocab import names as N

pytestmark = pytest.mark.slow
NODES, WINDOW, SCRAPE = 2, 10.0, 1.0
IN_FLIGHT = NODES * REQUEST_LATENCY_SECONDS / REQUEST_EVERY_SECONDS  # 40
# A request counts at the scrape that first shows it: a window may gain or lose up to a scrape's worth.
SCRAPE_SLACK = NODES * REQUEST_LATENCY_SECONDS / REQUEST_EVERY_SECONDS * SCRAPE / WINDOW + 0.5


@pytest.fixture(scope="module")
def serving(tmp_path_factory):
    which_or_skip("prometheus")
    rig = FleetRig(tmp_path_factory.mktemp("fleet-serve"), nodes=NODES, ranks=0, straggler_node=1, xid_node=0,
                   serve_nodes=NODES, serve_seconds=22.0, scrape_seconds=SCRAPE)
    try:
        rig.start()
        rig.finish()
        ends = []
        for i in range(NODES):
            with Store(rig.store(i), readonly=True) as st:
                ends += [e.t for e in st.events(N.EV_REQUEST)]
        # A series' first scrape holds every request before it (Prometheus may first scrape an agent a
        # few seconds after the load began): evaluate only windows that begin after it, and end in the load.
        first = min(float(v[0][0]) for r in rig.query(f"{N.INFER_LATENCY_SECONDS}_count[5m]") for v in [r["values"]])
        yield rig, max(first, min(ends)) + WINDOW + SCRAPE, max(ends) - SCRAPE
    finally:
        rig.stop()


def _scale(rig: FleetRig, lo: float, hi: float, *args: str) -> list[dict]:
    p = subprocess.run([sys.executable, "-m", "gpulens.cli.main", "scale", "--prometheus", rig.prom_url, "--match", '{cluster="rig"}',
                        "--start", f"{lo:.3f}", "--end", f"{hi:.3f}", "--window", f"{WINDOW:g}s", "--step", "1s",
                        "--stabilization", "0s", "--format", "json", *args], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    points = json.loads(p.stdout)
    assert points and {pt["service"] for pt in points} == {SERVICE}
    return points


def test_concurrency_over_prometheus_is_the_stores(serving):
    rig, lo, hi = serving
    points = _scale(rig, lo, hi, "--target-concurrency", "3")
    assert all(pt["driver"] == "concurrency" and pt["current_replicas"] == NODES for pt in points), points
    assert all(abs(pt["value"] - IN_FLIGHT) <= SCRAPE_SLACK for pt in points), [pt["value"] for pt in points]
    # the HPA rule on each point's own value (usage far from 1, so no tolerance): ceil(40 / 3) = 14 on an
    # idle machine; on a loaded one the workload's requests run late and a window may hold 38.5 (13)
    assert all(pt["desired_replicas"] == math.ceil(pt["value"] / 3 - 1e-9) for pt in points), points
    assert {pt["desired_replicas"] for pt in points} <= set(range(math.ceil((IN_FLIGHT - SCRAPE_SLACK) / 3),
                                                                  math.ceil((IN_FLIGHT + SCRAPE_SLACK) / 3) + 1))
    # The nodes' own stores, read as `gpulens scale --store` reads one, summed at the same times.
    per_node = []
    for i in range(NODES):
        with Store(rig.store(i), readonly=True) as st:
            per_node.append({round(p.t, 3): p.value for p in desired_replicas(st, window_seconds=WINDOW, step_seconds=1.0, start=lo, end=hi)})
    for pt in points:
        from_stores = sum(node[round(pt["t"], 3)] for node in per_node)
        assert abs(pt["value"] - from_stores) <= SCRAPE_SLACK, (pt, from_stores)


def test_arrival_rate_and_kv_cache_over_prometheus(serving):
    rig, lo, hi = serving
    rate = _scale(rig, lo, hi, "--target-concurrency", "1000", "--capacity", "3")
    assert all(pt["driver"] == "arrival_rate" for pt in rate), rate
    assert all(abs(pt["value"] - NODES / REQUEST_EVERY_SECONDS) <= SCRAPE_SLACK / REQUEST_LATENCY_SECONDS for pt in rate)
    assert all(pt["desired_replicas"] == math.ceil(pt["value"] / 3 - 1e-9) for pt in rate), rate  # ceil(20 / 3) = 7 when on time
    kv = _scale(rig, lo, hi, "--target-concurrency", "1000", "--target-kv-cache", "0.5")
    assert all(pt["driver"] == "kv_cache" and pt["value"] == pytest.approx(0.9 * NODES) for pt in kv), kv
    assert {pt["desired_replicas"] for pt in kv} == {4}  # ceil(1.8 / 0.5)


def test_bad_input_is_one_sentence(serving):
    rig, lo, hi = serving
    for args, code, words in (
        (["--prometheus", rig.prom_url, "--service", "nope"], 2, "no series of --service 'nope'"),
        (["--span", "1h"], 2, "--span is the span read from a Prometheus server"),
        (["--match", '{cluster="rig"}'], 2, "--match selects series in a Prometheus server"),
        (["--prometheus", rig.prom_url, "--start", f"{lo:.3f}", "--span", "1h"], 2, "Give --start or --span, not both"),
        (["--prometheus", "http://127.0.0.1:1"], 3, "Cannot reach Prometheus"),
    ):
        p = subprocess.run([sys.executable, "-m", "gpulens.cli.main", "scale", *args], capture_output=True, text=True, timeout=60)
        assert p.returncode == code and words in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)
