"""The ingest socket's own counters on /metrics: what the node's agent took from the workloads'
monitors, and what it refused and why, so a fleet sees a monitor that cannot reach its agent.

`gpulens_ingest_batches_total{outcome}`: stored, duplicate (sent again after a lost answer, stored
once), refused (malformed or over a cap; not to be retried), busy (answered "try again"); every
outcome from 0. `gpulens_ingest_records_total{outcome}`: stored, skipped (unreadable inside a stored
batch). `gpulens_ingest_connections_total{outcome}`: accepted, refused (over the connection cap),
stalled (closed with half a batch sent). The counters object is the ingest server's
(`pipeline.ingest_server.IngestCounters`, read by attribute: this layer sits below the pipeline).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric

INGEST_BATCHES = "gpulens_ingest_batches"  # exposed as ..._total
INGEST_RECORDS = "gpulens_ingest_records"
INGEST_CONNECTIONS = "gpulens_ingest_connections"


class IngestCollector:
    def __init__(self, counters: Any):
        self.counters = counters

    def collect(self) -> Iterator[Metric]:
        c = self.counters
        for name, help_text, rows in (
            (INGEST_BATCHES, "Record batches the monitors sent to this agent's ingest socket, by outcome.",
             (("stored", c.batches - c.duplicates), ("duplicate", c.duplicates), ("refused", c.batches_refused), ("busy", c.busy))),
            (INGEST_RECORDS, "Workload records in the stored batches, by outcome.",
             (("stored", c.records), ("skipped", c.records_skipped))),
            (INGEST_CONNECTIONS, "Connections to this agent's ingest socket, by outcome.",
             (("accepted", c.connections), ("refused", c.connections_refused), ("stalled", c.stalled))),
        ):
            fam = CounterMetricFamily(name, help_text, labels=["outcome"])
            for outcome, value in rows:
                fam.add_metric([outcome], float(value))
            yield fam
