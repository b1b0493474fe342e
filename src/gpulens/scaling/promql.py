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

from gpulens import promql as P
from gpulens.scaling.hpa import ScalePolicy
from gpulens.scaling.signals import DEFAULT_CONCURRENCY_PER_REPLICA
from gpulens.vocab import names as N

RECOMMENDED_RULE = "gpulens:desired_replicas:recommended"
DESIRED_RULE = "gpulens:desired_replicas"
DEFAULT_RULE_WINDOW_SECONDS = 60.0


def recording_rules(*, window_seconds: float = DEFAULT_RULE_WINDOW_SECONDS,
                    concurrency_per_replica: float = DEFAULT_CONCURRENCY_PER_REPLICA,
                    policy: ScalePolicy | None = None) -> list[dict]:
    """The two recording rules (dicts for a Prometheus rule group), written by gpulens.promql."""
    policy = policy or ScalePolicy()
    target, tol = f"{concurrency_per_replica:g}", f"{policy.tolerance_ratio:g}"
    lat = N.INFER_LATENCY_SECONDS
    in_flight = P.aggregate("sum", P.rate(P.selector(lat + "_sum"), window_seconds), by=("service",))
    hosts = P.aggregate("count", P.selector(lat + "_count"), by=("service", "host"))
    current = P.aggregate("count", hosts, by=("service",))
    usage = P.ratio(in_flight, P.paren(f"{target} * {current}"))
    outside = P.paren(f"{P.call('abs', f'{usage} - 1')} > {tol}")  # usage beyond the tolerance
    scaled = P.paren(f"{P.call('ceil', P.ratio(in_flight, target))} and on (service) {outside}")
    bounded = P.call("clamp_min", f"{scaled} or on (service) {current}", P.number(policy.min_replicas))
    recommended = P.call("clamp_max", bounded, P.number(policy.max_replicas))
    labels = {"gpulens_signal": "concurrency", "target_per_replica": target}
    return [
        {"record": RECOMMENDED_RULE, "expr": recommended, "labels": labels},
        {"record": DESIRED_RULE, "expr": P.over_time("max", P.selector(RECOMMENDED_RULE), policy.stabilization_seconds)},
    ]
