"""Repository of the learned alert baselines (`alert_baselines`): one row per watched series."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from gpulens.store.decode import damaged_row, json_column
from gpulens.store.store import Store
from gpulens.store.types import canonical_labels


@dataclass
class BaselineRow:
    """A stored baseline. Times are unix seconds; statistics are in the series' unit.
    `median` is None while nothing was learned; `profile` maps a UTC hour to its statistics
    ({"samples", "median", "mad", "quantiles"})."""

    series_id: int
    name: str
    labels: dict[str, str]
    state: str  # learning | ready | frozen
    learn_start: float
    learn_seconds: float
    computed_at: float | None = None
    window_start: float | None = None
    window_end: float | None = None
    samples: int = 0
    median: float | None = None
    mad: float | None = None
    quantiles: dict[float, float] = field(default_factory=dict)
    profile: dict[int, dict] = field(default_factory=dict)


def save_baseline(store: Store, b: BaselineRow) -> None:
    with store._guard("write to") as conn:
        conn.execute(
            "INSERT OR REPLACE INTO alert_baselines (series_id, name, labels, state, learn_start, learn_seconds, "
            "computed_at, window_start, window_end, samples, median, mad, quantiles, profile) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                b.series_id, b.name, canonical_labels(b.labels), b.state, b.learn_start, b.learn_seconds,
                b.computed_at, b.window_start, b.window_end, b.samples, b.median, b.mad,
                json.dumps({str(k): v for k, v in b.quantiles.items()}),
                json.dumps({str(h): s for h, s in b.profile.items()}),
            ),
        )


def load_baselines(store: Store) -> list[BaselineRow]:
    """Every stored baseline, by name and labels."""
    with store._guard("read") as conn:
        rows = conn.execute(
            "SELECT series_id, name, labels, state, learn_start, learn_seconds, computed_at, window_start, "
            "window_end, samples, median, mad, quantiles, profile FROM alert_baselines ORDER BY name, labels"
        ).fetchall()
    return [_baseline(store, r) for r in rows]


def _baseline(store: Store, r: tuple) -> BaselineRow:
    path, sid = store.path, r[0]
    labels = json_column(r[2], path, "alert_baselines", sid, "labels")
    quantiles, profile = (json_column(r[i], path, "alert_baselines", sid, c) for i, c in ((12, "quantiles"), (13, "profile")))
    try:
        return BaselineRow(
            sid, r[1], labels, r[3], r[4], r[5], r[6], r[7], r[8], int(r[9]), r[10], r[11],
            {float(k): float(v) for k, v in quantiles.items()},
            {int(h): s for h, s in profile.items()},
        )
    except (TypeError, ValueError, OverflowError):
        raise damaged_row(path, "alert_baselines", sid, "samples, quantiles or profile", "holds something that is not a number") from None


def set_learning_seconds(store: Store, learn_seconds: float) -> None:
    """Apply a new learning period to every baseline still learning."""
    with store._guard("write to") as conn:
        conn.execute("UPDATE alert_baselines SET learn_seconds = ? WHERE state = 'learning'", (learn_seconds,))
