"""The scaling signal as Prometheus recording rules, over the series the agent's /metrics exports, so
a fleet's Prometheus computes the same replica count as `gpulens scale` (the `concurrency` signal):

- `gpulens:desired_replicas:recommended`: the HPA rule, `ceil(in flight / target)`, kept at the
  current replica count while usage is within the tolerance; in flight is
  `rate(infer_request_latency_seconds_sum[W])` summed over the service's hosts (Little's law, as
  `scaling/signals.py` computes it from the requests); current replicas are the hosts exporting the
  service;
- `gpulens:desired_replicas`: its maximum over the scale-down stabilization window.

The window must hold at least two scrapes (four is safer): the default 1 m suits a 15 s scrape.
"""

from __future__ import annotations

from gpulens.scaling.hpa import ScalePolicy
from gpulens.scaling.signals import DEFAULT_CONCURRENCY_PER_REPLICA
from gpulens.vocab import names as N

RECOMMENDED_RULE = "gpulens:desired_replicas:recommended"
DESIRED_RULE = "gpulens:desired_replicas"
DEFAULT_RULE_WINDOW_SECONDS = 60.0


def _seconds(x: float) -> str:
    return f"{round(x * 1000)}ms" if x < 1 or x != int(x) else f"{int(x)}s"


def recording_rules(*, window_seconds: float = DEFAULT_RULE_WINDOW_SECONDS,
                    concurrency_per_replica: float = DEFAULT_CONCURRENCY_PER_REPLICA,
                    policy: ScalePolicy | None = None) -> list[dict]:
    policy = policy or ScalePolicy()
    w, target, tol = _seconds(window_seconds), f"{concurrency_per_replica:g}", f"{policy.tolerance_ratio:g}"
    lat = N.INFER_LATENCY_SECONDS
    in_flight = f"sum by (service) (rate({lat}_sum[{w}]))"
    current = f"count by (service) (count by (service, host) ({lat}_count))"
    recommended = (
        f"clamp_max(clamp_min((ceil({in_flight} / {target}) and on (service) "
        f"(abs({in_flight} / ({target} * {current}) - 1) > {tol})) or on (service) {current}, "
        f"{policy.min_replicas}), {policy.max_replicas})"
    )
    labels = {"gpulens_signal": "concurrency", "target_per_replica": target}
    return [
        {"record": RECOMMENDED_RULE, "expr": recommended, "labels": labels},
        {"record": DESIRED_RULE, "expr": f"max_over_time({RECOMMENDED_RULE}[{_seconds(policy.stabilization_seconds)}])"},
    ]
