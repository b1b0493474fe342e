"""The Kubernetes Horizontal Pod Autoscaler's rule, so the replica count gpulens asks for is the one
an HPA (or KEDA, which drives an HPA) would compute from the same signal.

For an average-per-replica target: `desired = ceil(current × usage)` with
`usage = (total / current) / target`, i.e. `ceil(total / target)`; no change while usage is
within the tolerance of 1 (the HPA's `--horizontal-pod-autoscaler-tolerance`, 0.1); with several
signals the largest recommendation wins. Scale-down is stabilized: the replica count is the largest
recommendation of the last `stabilization_seconds` (the HPA's
`behavior.scaleDown.stabilizationWindowSeconds`), so a short lull does not drop a replica that the
next burst needs; a scale-up applies at once.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from gpulens.errors import BadInputError

HPA_TOLERANCE_RATIO = 0.1
HPA_SCALE_DOWN_STABILIZATION_SECONDS = 300.0


@dataclass(frozen=True)
class ScalePolicy:
    tolerance_ratio: float = HPA_TOLERANCE_RATIO
    stabilization_seconds: float = HPA_SCALE_DOWN_STABILIZATION_SECONDS
    min_replicas: int = 1
    max_replicas: int = 100

    def __post_init__(self) -> None:
        if not 0 <= self.tolerance_ratio < 1:
            raise BadInputError(f"The tolerance must be from 0 to 1 (not inclusive), not {self.tolerance_ratio}.")
        if self.stabilization_seconds < 0:
            raise BadInputError(f"The stabilization window cannot be negative ({self.stabilization_seconds} s).")
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise BadInputError(f"Replica bounds must satisfy 1 <= min <= max, not {self.min_replicas}..{self.max_replicas}.")

    def clamp(self, n: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, n))


def hpa_recommendation(current_replicas: int, total: float, target_per_replica: float, tolerance_ratio: float) -> int:
    """What the HPA rule recommends for one signal: `total` over all current replicas against
    `target_per_replica`."""
    if target_per_replica <= 0:
        raise BadInputError(f"A per-replica target must be above zero, not {target_per_replica}.")
    current = max(current_replicas, 1)
    usage = total / current / target_per_replica
    if abs(usage - 1.0) <= tolerance_ratio:
        return current
    return math.ceil(current * usage - 1e-9)  # 1e-9: a usage of exactly 2.0 computed as 2.0000000001 is 2


class Stabilizer:
    """The scale-down stabilization window: the largest recommendation of the last window."""

    def __init__(self, window_seconds: float):
        self.window_seconds = window_seconds
        # Only the recommendations that can still be the largest of a window: times increasing,
        # recommendations strictly decreasing. Each update is O(1) amortized, so a window of many
        # steps (--stabilization 1d --step 1s) costs no more than a short one.
        self._history: deque[tuple[float, int]] = deque()

    def update(self, t: float, recommendation: int) -> int:
        while self._history and self._history[-1][1] <= recommendation:
            self._history.pop()  # never the largest again: this one is as large and stays longer
        self._history.append((t, recommendation))
        while self._history[0][0] <= t - self.window_seconds and len(self._history) > 1:
            self._history.popleft()
        return self._history[0][1]
