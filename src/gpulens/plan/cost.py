"""Cost arithmetic at the user's own prices (from the plan config file; gpulens invents none)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

HOURS_PER_MONTH = 730.0  # 365 x 24 / 12


@dataclass
class Cost:
    currency: str
    hourly_per_gpu: float
    gpus: int
    hourly_total: float
    per_million_tokens: float | None = None
    per_thousand_requests: float | None = None
    break_even_months: float | None = None  # buying pays for itself after this many months of renting 24/7
    purchase_per_gpu: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def training_cost(hourly_per_gpu: float | None, gpus: int, tokens_per_second: float, *,
                  currency: str = "USD", purchase_per_gpu: float | None = None) -> Cost | None:
    if not hourly_per_gpu:
        return None
    total = hourly_per_gpu * gpus
    per_m = total / 3600 / tokens_per_second * 1e6 if tokens_per_second > 0 else None
    return Cost(currency, hourly_per_gpu, gpus, total, per_million_tokens=per_m,
                break_even_months=break_even_months(hourly_per_gpu, purchase_per_gpu), purchase_per_gpu=purchase_per_gpu)


def serving_cost(hourly_per_gpu: float | None, gpus: int, output_tokens_per_second: float, requests_per_second: float,
                 *, currency: str = "USD", purchase_per_gpu: float | None = None) -> Cost | None:
    if not hourly_per_gpu:
        return None
    total = hourly_per_gpu * gpus
    per_s = total / 3600
    return Cost(
        currency, hourly_per_gpu, gpus, total,
        per_million_tokens=per_s / output_tokens_per_second * 1e6 if output_tokens_per_second > 0 else None,
        per_thousand_requests=per_s / requests_per_second * 1e3 if requests_per_second > 0 else None,
        break_even_months=break_even_months(hourly_per_gpu, purchase_per_gpu),
        purchase_per_gpu=purchase_per_gpu,
    )


def break_even_months(hourly: float | None, purchase: float | None) -> float | None:
    """Months of round-the-clock renting that cost as much as buying the card (power and hosting
    not included: add them to the purchase price in the config if they matter)."""
    if not hourly or not purchase:
        return None
    return purchase / (hourly * HOURS_PER_MONTH)


@dataclass
class ElectricityCost:
    """What the GPUs' electricity costs at the user's price per kWh, from an assumed draw: each GPU's
    TDP times `power_fraction` (the share of TDP it draws on average), times the site's PUE. An
    estimate, not a measurement: `gpulens energy` measures what a real run drew."""

    usd_per_kwh: float
    tdp_watts_per_gpu: float
    gpus: int
    power_fraction: float
    pue: float
    kilowatts: float  # the whole draw: gpus x TDP x power_fraction x PUE
    usd_per_hour: float
    usd_per_million_tokens: float | None = None
    assumption: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def electricity_cost(tdp_watts: float | None, gpus: int, tokens_per_second: float, usd_per_kwh: float | None, *,
                     power_fraction: float = 1.0, pue: float = 1.0) -> ElectricityCost | None:
    """None without a price or without the GPU's TDP (gpulens invents neither)."""
    if usd_per_kwh is None or not tdp_watts:
        return None
    kilowatts = gpus * tdp_watts * power_fraction * pue / 1000.0
    per_hour = kilowatts * usd_per_kwh  # kW x 1 h = kWh
    per_m = per_hour / 3600 / tokens_per_second * 1e6 if tokens_per_second > 0 else None
    assumption = (f"assumes each of {gpus} GPU(s) draws {power_fraction:g} x its {tdp_watts:g} W TDP the whole time"
                  f"{f', times a PUE of {pue:g}' if pue != 1 else ' (PUE 1: the GPUs only)'}; "
                  "a real run often draws well under TDP (`gpulens energy` measures it)")
    return ElectricityCost(usd_per_kwh, tdp_watts, gpus, power_fraction, pue, kilowatts, per_hour, per_m, assumption)
