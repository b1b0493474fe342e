"""The fleet rig (gpulens.fleet.rig, which `gpulens demo --fleet N` runs too): 8 fake-GPU agents as 8 nodes, a 32-rank job, a straggler rank
on node 5 (its GPU thermally throttled), an XID on node 2's GPU 1 during the job, one real Prometheus
scraping them all. `gpulens diagnose --prometheus` names the straggler rank and its node, joins the
XID to the rank on that GPU, and gives the same incidents (kind and place) as the nodes' own stores
read together (issue 24)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from testlib import which_or_skip

from gpulens.fleet import JOB, XID, FleetRig

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    which_or_skip("prometheus")
    rig = FleetRig(tmp_path_factory.mktemp("fleet-rig"), nodes=8, ranks=32)
    try:
        rig.start()
        end = rig.finish()
        yield rig, end
    finally:
        rig.stop()


def _gpulens(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpulens.cli.main", *args], capture_output=True, text=True, timeout=180)


def _window(end: float) -> list[str]:
    return ["--start", f"{end - 300:.3f}", "--end", f"{end:.3f}"]


def _places(dicts: list[dict]) -> set[tuple]:
    """Each incident's cause as (kind, host, GPU, job, rank), and each symptom under its cause's kind."""
    keys = ("host", "gpu", "train_job", "rank")
    out = set()
    for d in dicts:
        place = tuple(d["labels"].get(k) for k in keys)
        out.add((d["role"], d["kind"], *place, d.get("explained_by", {}).get("kind")))
    return out


def _from_stores(rig: FleetRig, end: float) -> list[dict]:
    from gpulens.diagnose import DiagnoseScope, diagnose
    from gpulens.diagnose.incidents import group
    from gpulens.reader import StoreReader
    from gpulens.reader.combined import CombinedReader

    readers = [StoreReader(rig.store(i)) for i in range(rig.nodes)]
    try:
        findings = diagnose(CombinedReader(readers), DiagnoseScope(start=end - 300, end=end))
    finally:
        for r in readers:
            r.close()
    return [d for inc in group(findings) for d in inc.finding_dicts()]


def test_prometheus_names_the_straggler_and_joins_the_xid(fleet):
    rig, end = fleet
    p = _gpulens("diagnose", "--prometheus", rig.prom_url, "--match", '{cluster="rig"}', "--format", "json", *_window(end))
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    straggler = [d for d in got if d["kind"] == "straggler"]
    assert len(straggler) == 1, got
    s = straggler[0]
    assert s["labels"]["rank"] == str(rig.straggler_rank) and s["labels"]["host"] == rig.host(rig.straggler_node), s
    assert s["evidence"]["slow_vs_others"] == pytest.approx(1.6, abs=0.05)
    # The straggler is explained by its GPU's clock cut, on that node and GPU.
    assert s["role"] == "symptom", s
    cause = next(d for d in got if d["incident"] == s["incident"] and d["role"] == "cause")
    assert (cause["labels"]["host"], cause["labels"]["gpu"]) == (rig.host(rig.straggler_node), str(rig.gpus_per_node - 1)), cause
    # The XID on node 2's GPU 1 is joined to exactly the rank there.
    xid = [d for d in got if d["kind"] == "gpu_xid"]
    assert len(xid) == 1 and xid[0]["evidence"]["xid"] == XID, xid
    assert (xid[0]["labels"]["host"], xid[0]["labels"]["gpu"]) == (rig.host(rig.xid_node), str(rig.xid_gpu))
    assert xid[0]["labels"].get("train_job") == JOB and xid[0]["labels"].get("rank") == str(rig.xid_rank), xid[0]
    assert f"job {JOB} rank {rig.xid_rank}" in json.dumps(xid[0]["evidence"]), xid[0]["evidence"]
    assert f"rank {rig.xid_rank - 1} " not in json.dumps(xid[0]["evidence"])


def test_prometheus_gives_the_incidents_of_the_stores(fleet):
    rig, end = fleet
    p = _gpulens("diagnose", "--prometheus", rig.prom_url, "--format", "json", *_window(end))
    assert p.returncode == 0, p.stderr
    from_prom = json.loads(p.stdout)
    from_stores = _from_stores(rig, end)
    assert _places(from_prom) == _places(from_stores), (sorted(_places(from_prom) ^ _places(from_stores), key=str))
    # Over Prometheus only what needs per-request or OOM / NaN records is skipped; the training analyses ran.
    assert "per-step records" not in p.stderr


def test_energy_answers_for_the_whole_job(fleet):
    rig, end = fleet
    p = _gpulens("energy", "--prometheus", rig.prom_url, "--job", JOB, "--format", "json", *_window(end))
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    # Every rank, on its own node's GPU, with the joules of that GPU's scraped energy counter.
    assert sorted((r["host"], r["gpu"], r["rank"]) for r in rows) == sorted(
        (rig.host(r // rig.gpus_per_node), str(r % rig.gpus_per_node), str(r)) for r in range(rig.ranks))
    assert all(r["method"] == "energy_counter" and r["joules"] > 0 and 100 < r["mean_watts"] < 700 for r in rows), rows
    from gpulens.energy import workload_energy
    from gpulens.reader import StoreReader
    from gpulens.reader.combined import CombinedReader

    readers = [StoreReader(rig.store(i)) for i in range(rig.nodes)]
    try:
        local = {(r.host, r.rank): r for r in workload_energy(CombinedReader(readers), job=JOB)}
    finally:
        for r in readers:
            r.close()
    for r in rows:  # the same steps; the span ends at a scrape, up to an interval off each side
        mine = local[(r["host"], r["rank"])]
        assert r["steps"] == mine.steps
        assert abs(r["seconds"] - mine.seconds) <= 2 * rig.scrape_seconds + 0.5, (r, mine)


def test_report_answers_for_the_whole_job(fleet, tmp_path):
    rig, end = fleet
    out = tmp_path / "fleet.md"
    p = _gpulens("report", "--prometheus", rig.prom_url, "--job", JOB, "--out", str(out), *_window(end))
    assert p.returncode == 0, p.stderr
    text = out.read_text()
    assert "straggler" in text and f"rank {rig.straggler_rank}" in text.lower() and rig.host(rig.straggler_node) in text, text[:3000]
    assert "Prometheus" in text
    none = _gpulens("energy", "--prometheus", rig.prom_url, "--job", "nope", *_window(end))
    assert none.returncode == 2 and "no series of --job 'nope'" in none.stderr and "Traceback" not in none.stderr, none.stderr


def test_report_match_covers_exactly_the_selected_nodes(fleet, tmp_path):
    """`report --prometheus --match`: the charts, the label values, the headline numbers and the
    findings cover the nodes the selector picks and no other."""
    from gpulens.promql import parse_matchers
    from gpulens.views.prometheus import PrometheusReader
    from gpulens.vocab.gpu import GPU_UP
    from gpulens.vocab.names import TRAIN_STEP_SECONDS

    rig, end = fleet
    picked = {rig.host(i) for i in range(4)}  # node-0 .. node-3: the XID's node, not the straggler's
    selector = '{cluster="rig", host=~"node-[0-3]"}'
    reader = PrometheusReader(rig.prom_url, matchers=parse_matchers(selector))
    assert set(reader.label_values()["host"]) == picked
    gpus = reader.line(GPU_UP, {}, end - 300, end, 60)
    assert {ln.labels["host"] for ln in gpus} == picked and len(gpus) == 4 * rig.gpus_per_node
    steps = reader.line(TRAIN_STEP_SECONDS, {}, end - 300, end, 60)
    assert {ln.labels["rank"] for ln in steps} == {str(r) for r in range(4 * rig.gpus_per_node)}
    everyone = PrometheusReader(rig.prom_url).aggregate(TRAIN_STEP_SECONDS, {}, "count", end - 300, end)
    assert reader.aggregate(TRAIN_STEP_SECONDS, {}, "count", end - 300, end) == pytest.approx(everyone / 2, rel=0.02)  # half the ranks

    out = tmp_path / "half.md"
    p = _gpulens("report", "--prometheus", rig.prom_url, "--match", selector, "--job", JOB, "--out", str(out), *_window(end))
    assert p.returncode == 0, p.stderr
    text = out.read_text()
    assert rig.host(rig.xid_node) in text and "xid" in text.lower(), text[:3000]
    assert not any(rig.host(i) in text for i in range(4, rig.nodes)), text[:3000]  # not the straggler's node, nor any other
    assert "straggler" not in text.lower()  # its rank is on node-5, outside the selection

    # A hostile value stays one value: it cannot close the selector, so it matches no series.
    hostile = '{host="node-1\\"} or vector(1) or up{x=\\""}'
    bad = _gpulens("report", "--prometheus", rig.prom_url, "--match", hostile, "--out", str(out), *_window(end))
    assert bad.returncode == 2 and "holds no GPU series" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    broken = PrometheusReader(rig.prom_url, matchers=parse_matchers(hostile))
    assert broken.line(GPU_UP, {}, end - 300, end, 60) == [] and broken.label_values()["host"] == []
