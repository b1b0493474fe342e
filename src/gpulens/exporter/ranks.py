"""`train_rank_info`: which process ran each training rank of this node, so that a fleet's Prometheus
can join a GPU's series (an XID, a clock cut) to the ranks on that GPU.

One gauge of value 1 per rank whose steps are fresh (the same 2 minutes as the workload gauges), with
labels `train_job`, `rank`, `host` (the step series' own) and `pid`, `cuda_device` from the rank's
latest `train_start` event. The GPU is not decided here: the reader gives these to the same join as a
store's `train_start` events (gpulens.diagnose.gpu_workloads): the pid in `gpu_process_memory_bytes`
first, the CUDA index where no other rank of the host claims it, the host's only GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from gpulens.store import Store
from gpulens.vocab import names as wn

LABELS = [wn.TRAIN_JOB_LABEL, "rank", "host", wn.PID_LABEL, wn.CUDA_DEVICE_LABEL]
HELP = ("1 for each training rank with fresh steps: the pid and CUDA device its train_start named "
        "(join a GPU's series to its ranks through gpu_process_memory_bytes or the device).")


def _rank_key(labels: dict[str, str], data: dict | None = None) -> tuple[str, str, str]:
    rank = labels.get("rank")
    if rank is None and data is not None and data.get("rank") is not None:
        rank = str(data["rank"])
    return labels.get(wn.TRAIN_JOB_LABEL, ""), rank or "0", labels.get("host", "")


def _text(v: object) -> str:
    return "" if v is None or isinstance(v, bool) else str(v)


class RankInfoCollector:
    def __init__(self, store: Store, *, max_age_seconds: float = 120.0, clock: Callable[[], float] = time.time):
        self.store = store
        self.max_age_seconds = max_age_seconds
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        now = self.clock()
        fresh = {_rank_key(v.key.labels): v.key.labels for v in self.store.latest(wn.TRAIN_STEP_SECONDS)
                 if now - v.t <= self.max_age_seconds}
        if not fresh:
            return
        starts: dict[tuple[str, str, str], dict] = {}
        for e in self.store.events(wn.EV_TRAIN_START):  # oldest first: a restart's start replaces the first
            starts[_rank_key(e.labels, e.data)] = e.data
        fam = GaugeMetricFamily(wn.RANK_INFO, HELP, labels=LABELS)
        for key in sorted(fresh):
            data = starts.get(key)
            if data is None:
                continue  # imported steps: no process to name
            fam.add_metric([*key, _text(data.get("pid")), _text(data.get("gpu"))], 1.0)
        if fam.samples:
            yield fam
