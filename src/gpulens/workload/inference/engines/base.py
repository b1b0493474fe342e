"""The shape of an engine mapping: which source metric becomes which gpulens series."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class EngineMap:
    name: str
    prefix: str  # every metric of the engine starts with this: how it is recognised
    model_label: str | None  # the label that names the model, if the engine has one
    # gauge: (source names, first present wins) -> series; `scale` turns the source unit into the base unit
    gauges: tuple[tuple[tuple[str, ...], str, float], ...] = ()
    # histogram base names (first present wins) -> series, written per quantile
    histograms: tuple[tuple[tuple[str, ...], str], ...] = ()
    # cumulative request counters -> infer_requests_total{status}
    status_counters: tuple[tuple[str, str], ...] = ()
    # cumulative duration counter / cumulative request count -> mean duration per request (Triton)
    mean_of_counters: tuple[tuple[str, tuple[str, ...], float, str], ...] = field(default=())
