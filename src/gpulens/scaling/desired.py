"""The desired replica count per service over time (`gpulens scale`), and at one instant (the
exporter's `gpulens_desired_replicas`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from gpulens.errors import BadInputError, shown
from gpulens.scaling.hpa import ScalePolicy, Stabilizer, hpa_recommendation
from gpulens.scaling.signals import (
    RequestLog,
    Signal,
    Targets,
    kv_cache_readings,
    request_log,
    services,
    signals_at,
)
from gpulens.store import Store
from gpulens.vocab import names as N
from gpulens.vocab.gpu import GPU_UP

DEFAULT_WINDOW_SECONDS = 60.0  # the recording rule's default too (4 scrapes at 15 s)
DEFAULT_STEP_SECONDS = 5.0
# The most evaluations per service one answer makes (two weeks at a 5 s step is 241,920; each costs
# about 50 us): past it a tiny step over a long range (1 ms over 100 years) would run for days.
MAX_EVALUATIONS = 250_000


@dataclass(frozen=True)
class ScalePoint:
    t: float
    service: str
    desired_replicas: int  # after the scale-down stabilization
    current_replicas: int
    driver: str  # the signal whose recommendation is the largest
    value: float  # that signal's total over all replicas
    target: float  # and its per-replica target
    recommended_replicas: int  # before stabilization

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def recommend(current: int, signals: list[Signal], policy: ScalePolicy) -> tuple[int, Signal]:
    """The largest recommendation over the signals, within the policy's bounds, and its signal."""
    best = max(signals, key=lambda s: (hpa_recommendation(current, s.value, s.target, policy.tolerance_ratio), s.value / s.target))
    return policy.clamp(hpa_recommendation(current, best.value, best.target, policy.tolerance_ratio)), best


class ServiceScaler:
    """One service's HPA state: call `at(t)` with increasing times."""

    def __init__(self, service: str, log: RequestLog, *, window_seconds: float, targets: Targets, policy: ScalePolicy,
                 kv_cache: tuple[list[float], list[float]] | None = None):
        self.service, self.log, self.window_seconds, self.targets, self.policy = service, log, window_seconds, targets, policy
        self.kv_cache = kv_cache
        self.stabilizer = Stabilizer(policy.stabilization_seconds)

    def at(self, t: float) -> ScalePoint:
        current, sigs = signals_at(self.log, t, self.window_seconds, self.targets, self.kv_cache)
        rec, sig = recommend(current, sigs, self.policy)
        return ScalePoint(t, self.service, self.stabilizer.update(t, rec), current, sig.driver, sig.value, sig.target, rec)


def desired_replicas(store: Store, *, service: str | None = None, window_seconds: float = DEFAULT_WINDOW_SECONDS,
                     step_seconds: float = DEFAULT_STEP_SECONDS, targets: Targets | None = None,
                     policy: ScalePolicy | None = None, start: float | None = None, end: float | None = None,
                     after_seconds: float = 0.0) -> list[ScalePoint]:
    """The desired replicas of each service (or `service`) every `step_seconds` over the store's time
    range (or [start, end]), as an HPA evaluating at those times would have asked. `after_seconds`
    goes on past the end, as an HPA would with no new requests (a finished session's scale-down)."""
    check_steps(window_seconds, step_seconds)
    names = pick_services(services(store), service, "The store")
    # The time the node was watched: its GPU samples and its requests (not its other events: a run
    # recorded today in a store of last week's session would stretch the range to today).
    ranges = [r for r in (store.time_range(GPU_UP), store.time_range(N.INFER_LATENCY_SECONDS)) if r is not None]
    if not ranges or not names:
        return []
    rng = (min(r[0] for r in ranges), max(r[1] for r in ranges))
    lo, hi = rng[0] if start is None else start, (rng[1] if end is None else end) + after_seconds
    inputs = {name: (request_log(store, name), kv_cache_readings(store, name)) for name in names}
    return evaluate(inputs, lo, hi, window_seconds=window_seconds, step_seconds=step_seconds, targets=targets, policy=policy)


def check_steps(window_seconds: float, step_seconds: float) -> None:
    if window_seconds <= 0 or step_seconds <= 0:
        raise BadInputError("The window and the step must be longer than zero.")


def pick_services(names: list[str], service: str | None, where: str) -> list[str]:
    """Every service `where` holds requests of, or just `service` (one sentence when it is not there)."""
    if service is None:
        return names
    if service not in names:
        raise BadInputError(f"{where} has no requests of service {shown(service)}.",
                            hint=(f"It has {', '.join(names)}." if names else "It has no inference requests at all."))
    return [service]


def evaluate(inputs: Mapping[str, tuple[RequestLog, tuple[list[float], list[float]] | None]], lo: float, hi: float, *,
             window_seconds: float, step_seconds: float, targets: Targets | None = None,
             policy: ScalePolicy | None = None) -> list[ScalePoint]:
    """The HPA rule every `step_seconds` from `lo` to `hi`, per service, over its request log and
    KV-cache readings (from a store, or from a fleet's Prometheus: gpulens.scaling.exported)."""
    targets, policy = targets or Targets(), policy or ScalePolicy()
    span = hi - lo
    if not span / step_seconds < MAX_EVALUATIONS:  # also a span that is not finite
        raise BadInputError(f"A step of {step_seconds:g} s over {span:.6g} s is {span / step_seconds:.3g} evaluations per service, "
                            f"more than the {MAX_EVALUATIONS:,} gpulens makes.",
                            hint="Give a longer --step, or a shorter --after.")
    steps = int(math.floor(span / step_seconds)) + 1
    out: list[ScalePoint] = []
    for name, (log, kv) in inputs.items():
        scaler = ServiceScaler(name, log, window_seconds=window_seconds, targets=targets, policy=policy, kv_cache=kv)
        out.extend(scaler.at(lo + i * step_seconds) for i in range(steps))
    return sorted(out, key=lambda p: (p.t, p.service))
