"""The scaling recording rules, evaluated by Prometheus's own rule engine (`promtool test rules`)
over the bundled H200 session's request counters as /metrics exports them, give the same replica
counts as `gpulens scale` on the same session."""

from __future__ import annotations

import bisect
import math
import subprocess
from pathlib import Path

import yaml
from testlib import which_or_skip

from gpulens.scaling import ScalePolicy, desired_replicas
from gpulens.scaling.promql import DESIRED_RULE, recording_rules
from gpulens.scaling.signals import request_log
from gpulens.store import Store

WINDOW, STABILIZATION = 10.0, 10.0


def test_prometheus_evaluates_the_rule_to_gpulens_answer(replayed_store: Path, tmp_path: Path) -> None:
    promtool = which_or_skip("promtool")
    policy = ScalePolicy(stabilization_seconds=STABILIZATION)
    with Store(replayed_store, readonly=True) as st:
        lo, hi = st.time_range()
        t0 = math.floor(lo)
        n = int(hi - t0) + 20
        log = request_log(st, "h200-demo")
        ours = desired_replicas(st, window_seconds=WINDOW, step_seconds=1.0, policy=policy, start=t0, end=t0 + n)
    # The histogram's _sum and _count as the agent exports them, one scrape a second.
    sums, counts = [], []
    for k in range(n + 1):
        i = bisect.bisect_right(log.end, t0 + k)
        sums.append(sum(log.latency_seconds[:i]))
        counts.append(i)
    labels = '{service="h200-demo", host="replay", model="m400m", job="gpulens", instance="node:9400"}'
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "gpulens-scaling",
                                                 "rules": recording_rules(window_seconds=WINDOW, policy=policy)}]}))
    ours_at = {round(p.t - t0): p.desired_replicas for p in ours}
    # Check every 5 s from the first full window on (a rate needs two samples in its window).
    times = range(int(WINDOW) + 5, n, 5)
    tests = [{"expr": DESIRED_RULE, "eval_time": f"{k}s",
              "exp_samples": [{"labels": f'{DESIRED_RULE}{{gpulens_signal="concurrency", service="h200-demo", target_per_replica="4"}}',
                               "value": ours_at[k]}]} for k in times]
    spec = tmp_path / "test.yml"
    spec.write_text(yaml.safe_dump({
        "rule_files": [str(rules)], "evaluation_interval": "1s",
        "tests": [{"interval": "1s",
                   "input_series": [
                       {"series": f"infer_request_latency_seconds_sum{labels}", "values": " ".join(f"{v:.6f}" for v in sums)},
                       {"series": f"infer_request_latency_seconds_count{labels}", "values": " ".join(str(c) for c in counts)},
                   ],
                   "promql_expr_test": tests}],
    }))
    assert max(ours_at[k] for k in times) == 2 and ours_at[max(times)] == 1
    done = subprocess.run([promtool, "test", "rules", str(spec)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
