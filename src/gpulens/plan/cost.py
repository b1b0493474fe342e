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
