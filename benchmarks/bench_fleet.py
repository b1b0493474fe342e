"""What a fleet costs (issue 24, item 2), on the fleet rig (gpulens.fleet.rig): N fake-GPU agents
(4 GPUs each), a 4N-rank job with a straggler and an XID, one real Prometheus scraping every second,
at N = 4, 8 and 16 nodes.

Figures per N: series per GPU (GPU families) and per rank (training families) as Prometheus holds
them, the bytes of one agent's /metrics, the samples Prometheus ingests per second (the sum of
`scrape_samples_scraped` over the scrape interval), and the query time of each diagnosis step over
Prometheus (each analyzer alone, on a fresh reader, so a step pays its own reads) and of the whole
`diagnose --prometheus`. Reference: the same figure at 4 nodes, in the same run; the ratio is the
growth. Goal: a diagnosis step grows at most linearly with the fleet (16 nodes: at most 4x the
4-node time, with 50 % slack for a shared 2-core machine).

`python benchmarks/bench_fleet.py` prints the rows; `make bench` tabulates them.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

NODES = (4, 8, 16)
GPUS_PER_NODE = 4
JOB_SECONDS = 12.0
GROWTH_SLACK = 1.5


def _measure(nodes: int) -> dict[str, float]:
    from gpulens.diagnose import DiagnoseScope
    from gpulens.diagnose import base as B
    from gpulens.diagnose import training as TR
    from gpulens.diagnose.fleet import diagnose_fleet
    from gpulens.fleet import FleetRig
    from gpulens.reader.prometheus import PrometheusAnalysisReader

    rig = FleetRig(Path(tempfile.mkdtemp(prefix=f"bench-fleet-{nodes}-")), nodes=nodes, ranks=GPUS_PER_NODE * nodes,
                   straggler_node=nodes - 1, xid_node=nodes // 2 - 1, job_seconds=JOB_SECONDS, xid_after_seconds=8.0)
    out: dict[str, float] = {}
    try:
        rig.start()
        end = rig.finish(stop_agents=False)
        gpus = rig.value("count(gpu_up)") or 1
        ranks = rig.value("count(train_step_seconds_count)") or 1
        out["series per GPU"] = (rig.value('count({gpu!="", train_job=""})') or 0) / gpus
        out["series per rank"] = (rig.value('count({train_job!=""})') or 0) / ranks
        with urllib.request.urlopen(f"http://127.0.0.1:{rig.ports['agent0']}/metrics", timeout=10) as r:
            out["scrape bytes per node"] = float(len(r.read()))
        out["Prometheus samples/s"] = (rig.value("sum(scrape_samples_scraped)") or 0) / rig.scrape_seconds
        B.diagnose(PrometheusAnalysisReader(rig.prom_url, start=end - 300, end=end))  # imports and registers the analyzers
        scope = DiagnoseScope(start=end - 300, end=end)
        for name, fn, _order in B._ANALYZERS:
            TR._CACHE.clear()
            reader = PrometheusAnalysisReader(rig.prom_url, start=end - 300, end=end)
            t0 = time.perf_counter()
            fn(reader, scope)
            out[f"query s: {name}"] = time.perf_counter() - t0
        TR._CACHE.clear()
        t0 = time.perf_counter()
        found = diagnose_fleet(PrometheusAnalysisReader(rig.prom_url, start=end - 300, end=end), scope).findings
        out["query s: whole diagnosis"] = time.perf_counter() - t0
        assert any(f.kind == "straggler" and f.labels.get("rank") == str(rig.straggler_rank) for f in found), "no straggler found"
    finally:
        rig.stop()
        shutil.rmtree(rig.work, ignore_errors=True)
    return out


def run() -> list[dict]:
    from gpulens.diagnose import base as B  # noqa: F401  (fails early without gpulens on the path)

    got = {n: _measure(n) for n in NODES}
    rows = []
    for n in NODES[1:]:
        for name, value in got[n].items():
            ref = got[NODES[0]].get(name)
            ratio = value / ref if ref else None
            row = {"name": f"{name} @ {n} nodes", "value": round(value, 4), "unit": "s" if name.startswith("query") else "",
                   "reference": f"the same at {NODES[0]} nodes", "reference_value": round(ref, 4) if ref else ref,
                   "ratio": round(ratio, 2) if ratio else None}
            if name.startswith("query"):
                limit = GROWTH_SLACK * n / NODES[0]
                row.update(goal=f"<= {limit:g}x the {NODES[0]}-node time (linear growth, 50 % slack)",
                           met=None if ratio is None or ref < 0.01 else ratio <= limit)
            else:
                row.update(goal="per GPU / per rank: flat; per node and per second: linear", met=None)
            rows.append(row)
    return rows


if __name__ == "__main__":
    for r in run():
        print(r)
