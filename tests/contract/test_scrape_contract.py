"""The metrics contract (docs/metrics.md), checked the way a fleet uses it: through a real Prometheus
that scrapes real agents (see scrape_rig.py), never a backfill."""

from __future__ import annotations

import math
import re
import subprocess
import sys

import numpy as np
import pytest
import yaml
from testlib import wait_until, which_or_skip

from gpulens.export.grafana import grafana_dashboard
from gpulens.store import Store
from gpulens.vocab import names as wn

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rig(request, tmp_path_factory):
    which_or_skip("prometheus")
    rig = getattr(request.config, "_gpulens_scrape_rig", None)
    if rig is None:  # not started at collection (e.g. run on its own from an IDE)
        from scrape_rig import ScrapeRig

        rig = ScrapeRig(tmp_path_factory.mktemp("scrape-rig")).start()
    try:
        rig.wait()
        yield rig
    finally:
        rig.stop()


def _store_values(rig, name: str, match: dict) -> np.ndarray:
    with Store(rig.store, readonly=True) as st:
        return np.array([v for d in st.query(name, match, max_points=None) for v in d.value])


def _bucket(v: float, bounds: tuple[float, ...]) -> tuple[float, float]:
    edges = [0.0, *bounds, math.inf]
    i = next(i for i in range(1, len(edges)) if v <= edges[i])
    return edges[i - 1], edges[i]


def _agrees_within_buckets(estimate: float, values: np.ndarray, q: float, bounds: tuple[float, ...]) -> None:
    """histogram_quantile interpolates inside the bucket that holds the q-th ranked value; the store's
    percentile interpolates between neighbouring ranks. They agree when the estimate lies in the
    buckets of those ranks."""
    v = np.sort(values)
    n = len(v)
    ranks = {math.floor(q * (n - 1)), math.ceil(q * (n - 1)), max(0, math.ceil(q * n) - 1)}
    lo = min(_bucket(v[r], bounds)[0] for r in ranks)
    hi = max(_bucket(v[r], bounds)[1] for r in ranks)
    exact = float(np.percentile(values, q * 100))
    assert lo - 1e-9 <= estimate <= hi + 1e-9, f"p{q * 100:g}: Prometheus {estimate}, store {exact}, buckets [{lo}, {hi}]"


def test_the_job_picker_lists_the_users_job_and_filters_on_it(rig):
    var = next(v for v in grafana_dashboard()["templating"]["list"] if v["name"] == "job")
    metric, label = re.fullmatch(r"label_values\((\w+), (\w+)\)", var["definition"]).groups()
    jobs = rig.api(f"/api/v1/label/{label}/values", {"match[]": metric})
    assert jobs == ["llama-ft"]
    steps = rig.query(f'train_step_seconds_count{{{label}=~"llama-ft"}}')
    assert {s["metric"]["job"] for s in steps} == {"gpulens", "gpulens-dcgm"}  # Prometheus's own job label, both agents
    assert all(s["metric"][label] == "llama-ft" and float(s["value"][1]) > 0 for s in steps)


def test_no_series_carries_an_exported_label(rig):
    series = rig.api("/api/v1/series", {"match[]": ['{job="gpulens"}', '{job="gpulens-dcgm"}']})
    assert len(series) > 100
    clashes = {(s["__name__"], k) for s in series for k in s if k.startswith("exported_")}
    assert not clashes, sorted(clashes)[:10]


def test_percentiles_from_histograms_agree_with_the_store(rig):
    for name, match, prom in (
        (wn.TRAIN_STEP_SECONDS, {"train_job": "llama-ft"}, 'train_job="llama-ft"'),
        (wn.INFER_LATENCY_SECONDS, {"service": "chat"}, 'service="chat"'),
    ):
        values = _store_values(rig, name, match)
        assert len(values) >= 100, (name, len(values))
        for q in (0.5, 0.95, 0.99):
            # The cumulative buckets at the end hold every event of the run: the same population.
            got = rig.query(f'histogram_quantile({q}, sum by (le) ({name}_bucket{{job="gpulens", {prom}}}))', rig.end_time)
            assert got, (name, q)
            _agrees_within_buckets(float(got[0]["value"][1]), values, q, wn.HISTOGRAM_BUCKETS[name])
    assert rig.bench is not None and rig.bench.returncode == 0, rig.bench.stderr if rig.bench else ""


def test_one_xid_keeps_the_alert_firing_for_a_minute(rig):
    assert rig.xid_firing, f"GpuXid never fired: {rig.log('agent')}"
    first = rig.xid_firing[0]
    after = [firing for t, firing in rig.xid_polls if t >= first]
    assert all(after), "GpuXid went inactive while its 10-minute window still held the XID"
    assert rig.xid_firing[-1] - first >= 60, rig.xid_firing[-1] - first


def _concrete(expr: str) -> str:
    expr = expr.replace("$__rate_interval", "1m").replace("$__range", "5m")
    return re.sub(r"\$(host|gpu|job|service)\b", ".*", expr)


def _selectors_have_series(rig, expr: str) -> bool:
    """Whether every selector of `expr` (its fixed matchers; variables match anything) has series."""
    for name, matchers in re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}", expr):
        fixed = ",".join(m for m in (x.strip() for x in matchers.split(",")) if m and ".*" not in m)
        if not rig.api("/api/v1/series", {"match[]": f"{name}{{{fixed}}}"}):
            return False
    return True


def test_every_grafana_and_rule_expression_evaluates_and_those_with_data_answer(rig, tmp_path):
    exprs = [_concrete(t["expr"]) for p in grafana_dashboard()["panels"] for t in p.get("targets", [])]
    answered, expected = 0, 0
    for expr in exprs:
        result = rig.query(expr, rig.end_time)  # an error status fails inside api()
        if _selectors_have_series(rig, expr):
            expected += 1
            assert result, f"no data for {expr}"
            answered += 1
    assert expected >= 20, expected  # the GPU, training and inference panels all had data
    # The rules, exported again now that the store holds the workload (learned rules included once learned).
    out = tmp_path / "rules.yml"
    subprocess.run([sys.executable, "-m", "gpulens.cli.main", "alerts", "export", "--format", "prometheus", "--store", str(rig.store),
                    "--out", str(out)], check=True, capture_output=True)
    rules = [r for g in yaml.safe_load(out.read_text())["groups"] for r in g["rules"]]
    assert rules
    for r in rules:
        rig.query(r["expr"], rig.end_time)  # parses and evaluates


def test_dcgm_names_keep_workload_series_and_type_counters_as_counters(rig):
    meta = rig.api("/api/v1/metadata")
    assert meta["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"][0]["type"] == "counter"
    assert meta["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"][0]["type"] == "counter"
    assert meta["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"][0]["type"] == "counter"
    assert meta["infer_requests_total"][0]["type"] == "counter"
    assert meta["train_step_seconds"][0]["type"] == "histogram"
    for name in ("gpu_up", "train_step_seconds_count", "infer_request_latency_seconds_bucket", "infer_requests_total",
                 "DCGM_FI_DEV_GPU_UTIL"):
        assert rig.query(f'{name}{{job="gpulens-dcgm"}}'), name
    # the dcgm agent serves a copy of the store taken after the workload: the same totals under either naming
    a = rig.query('sum(train_step_seconds_count{job="gpulens"})', rig.end_time)
    b = rig.query('sum(train_step_seconds_count{job="gpulens-dcgm"})', rig.end_time)
    assert a and b and a[0]["value"][1] == b[0]["value"][1]


# ------------------------------------------------------------ the fleet details (issue 24, item 4)
def test_every_series_of_the_node_carries_one_host_value(rig):
    """The agent and the monitors in other processes read GPULENS_HOST: Grafana's `$host` picker
    (built from gpu_up) finds every GPU, training and inference series of the node."""
    series = rig.api("/api/v1/series", {"match[]": ['{job="gpulens", __name__=~"(gpu|train|infer)_.*"}']})
    assert {s["__name__"] for s in series} >= {"gpu_up", "train_step_seconds_count", "infer_request_latency_seconds_count"}
    hosts = {s.get("host") for s in series}
    assert hosts == {"gpu-node-7"}, sorted(h or "(none)" for h in hosts)
    picker = rig.api("/api/v1/label/host/values", {"match[]": "gpu_up"})
    assert picker == ["gpu-node-7"]
    dcgm = rig.api("/api/v1/series", {"match[]": ['{job="gpulens-dcgm", __name__=~"DCGM_.*|gpu_up"}']})
    assert dcgm and {s.get("Hostname") for s in dcgm} == {"gpu-node-7"} and not any("hostname" in s for s in dcgm)


def test_mfu_reaches_prometheus(rig):
    got = rig.query('max_over_time(train_mfu_ratio{job="gpulens", train_job="llama-ft"}[5m])', rig.end_time)
    assert got and all(0 < float(s["value"][1]) < 1 for s in got), got


def test_a_150_s_request_lands_in_a_finite_bucket(rig):
    from scrape_rig import LONG_SERVICE

    sel = f'infer_request_latency_seconds_bucket{{job="gpulens", service="{LONG_SERVICE}"}}'
    buckets = {float(s["metric"]["le"]): float(s["value"][1]) for s in rig.query(sel, rig.end_time)}
    finite = sorted(le for le, n in buckets.items() if math.isfinite(le) and n == 1)
    assert finite and finite[0] == 240.0, buckets  # (120, 240]: interpolated inside it, not clipped at a top
    p50 = rig.query(f"histogram_quantile(0.5, sum by (le) ({sel}))", rig.end_time)
    assert 120 < float(p50[0]["value"][1]) <= 240


def test_a_status_not_seen_yet_rates_zero_not_empty(rig):
    for status in ("error", "timeout", "aborted"):
        got = rig.query(f'rate(infer_requests_total{{job="gpulens", service="chat", status="{status}"}}[1m])', rig.end_time)
        assert got and all(float(s["value"][1]) == 0 for s in got), (status, got)


def test_dcgm_mode_counts_mig_memory_once(rig):
    """The MIG GPU is exported as its instances: their memory sums to what the GPU reports in use
    (the dcgm agent's store holds the whole GPU's reading of each tick), not to twice that."""
    got = rig.query('sum by (UUID) (DCGM_FI_DEV_FB_USED{job="gpulens-dcgm"})', rig.end_time)  # long committed to its store
    assert len(got) == 1, got
    summed = float(got[0]["value"][1]) * 2**20
    profiles = {s["metric"].get("GPU_I_PROFILE") for s in rig.query('DCGM_FI_DEV_FB_USED{job="gpulens-dcgm"}', rig.end_time)}
    assert profiles == {"3g.71gb", "1g.18gb"}  # no parent series beside its instances

    def stored_whole() -> list[float]:
        with Store(rig.work / "dcgm.db", readonly=True) as st:
            return [v for d in st.query("gpu_memory_used_bytes", {"gpu": "0"}, max_points=None) for v in d.value]

    # the agent still runs: the tick Prometheus scraped last reaches the store at its next flush
    wait_until(lambda: any(abs(summed - w) < 1.0 for w in stored_whole()), 60,
               f"the store to hold a whole-GPU reading of {summed:.0f} bytes, the sum of the instances")


def test_dcgm_mode_joins_on_uuid(rig):
    up = rig.query('gpu_up{job="gpulens-dcgm"} * on (UUID) group_left (modelName) DCGM_FI_DEV_GPU_TEMP{job="gpulens-dcgm"}')
    assert len(up) == 1 and up[0]["metric"]["modelName"], up
    xid = rig.query('increase(gpu_xid_errors_total{job="gpulens-dcgm"}[10m]) * on (UUID) group_left (Hostname) '
                    'DCGM_FI_DEV_GPU_TEMP{job="gpulens-dcgm"}', rig.end_time)
    assert xid and xid[0]["metric"]["xid"] == "48" and xid[0]["metric"]["Hostname"] == "gpu-node-7", xid
