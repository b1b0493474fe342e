"""Workload records that arrived on the agent's socket -> the node's store, in the loop's thread.

The store keeps one writer: the sampling loop's thread. The listener (`ingest_server`) only decodes
batches and queues them; on each frame this sink takes what is queued, reads every record through
the importers `gpulens replay` uses (`workload.importers`: the same validation, the same series and
events as a monitor writing its own store), and commits the records with each sender's last batch
number in one transaction (`Store.atomic`, the number in the store's meta table). Only then is each
batch answered "stored", so a batch whose answer was lost (the agent killed after its commit) and
that comes again is answered "duplicate" and not stored twice. When the store cannot be written
(a full disk) the batches are answered "try again" and their senders keep them.
"""

from __future__ import annotations

import logging
import os
import queue
import time
from pathlib import Path

from gpulens.errors import StoreError
from gpulens.pipeline.ingest_server import IngestServer, PendingBatch
from gpulens.pipeline.sinks import SinkBase
from gpulens.store import Store
from gpulens.workload.importers import ImportContext, import_event, load_builtin_importers
from gpulens.workload.wire import (
    MAX_UNIX_PATH_BYTES,
    WIRE_KINDS,
    AgentAddress,
    Reply,
    default_socket_path,
    runtime_socket_path,
)

log = logging.getLogger(__name__)

SEQ_META_PREFIX = "ingest_seq:"  # + sender -> the last batch number stored (Store meta)
BUDGET_SECONDS = 0.25  # at most this long storing records per frame (at least one batch), so sampling keeps its pace
MAX_SENDERS_CACHED = 10_000


def default_ingest_address(store_path: str | os.PathLike[str]) -> AgentAddress | None:
    """The socket `gpulens agent` listens on when `--ingest` is not given: `<store>.ingest.sock`
    beside the store (wire.default_socket_path), or under $XDG_RUNTIME_DIR when that path is too long for a socket; None (with a
    warning) when neither fits."""
    for p in (default_socket_path(store_path), runtime_socket_path(store_path)):
        if p is not None and len(os.fsencode(str(p))) <= MAX_UNIX_PATH_BYTES:
            return AgentAddress(path=str(p))
    log.warning("the store's folder %s is too deep for a Unix socket beside it: workload records are not taken; "
                "pass --ingest unix:PATH", Path(store_path).resolve().parent)
    return None


class IngestSink(SinkBase):
    def __init__(self, store: Store, server: IngestServer, *, host: str, budget_seconds: float = BUDGET_SECONDS):
        load_builtin_importers()
        self.store = store
        self.server = server
        self.ctx = ImportContext(job="default", service="default", host=host)
        self.budget_seconds = budget_seconds
        self._last_seq: dict[str, int] = {}
        self._failing = False

    @property
    def counters(self):  # noqa: ANN201 - IngestCounters
        return self.server.counters

    def on_frame(self, frame: object) -> None:
        self.drain()

    def drain(self) -> int:
        """Store what is queued (within the time budget); returns the batches answered."""
        deadline = time.monotonic() + self.budget_seconds
        answered = 0
        while True:
            batches: list[PendingBatch] = []
            records = 0
            while records < 20_000:
                try:
                    p = self.server.queue.get_nowait()
                except queue.Empty:
                    break
                batches.append(p)
                records += len(p.batch.records)
            if not batches:
                return answered
            for p, reply in zip(batches, self._store(batches), strict=True):
                p.resolve(reply)
            answered += len(batches)
            if time.monotonic() >= deadline:
                return answered

    def _seen(self, sender: str) -> int:
        last = self._last_seq.get(sender)
        if last is None:
            if len(self._last_seq) >= MAX_SENDERS_CACHED:
                self._last_seq.clear()  # read back from the store on the next batch of each
            raw = self.store.get_meta(SEQ_META_PREFIX + sender)
            last = self._last_seq[sender] = int(raw) if raw and raw.isdigit() else 0
        return last

    def _store(self, batches: list[PendingBatch]) -> list[Reply]:
        c = self.server.counters
        replies: list[Reply] = []
        marks: dict[str, int] = {}
        stored_total = skipped_total = dups = 0
        try:
            with self.store.atomic("write workload records to"):
                for p in batches:
                    b = p.batch
                    if b.seq <= marks.get(b.sender, self._seen(b.sender)):
                        replies.append(Reply(b.seq, ok=True, duplicate=True))
                        dups += 1
                        continue
                    stored = skipped = 0
                    for rec in b.records:
                        if isinstance(rec, dict) and rec.get("kind") in WIRE_KINDS and import_event(rec, self.store, self.ctx):
                            stored += 1
                        else:
                            skipped += 1
                    self.store.set_meta(SEQ_META_PREFIX + b.sender, str(b.seq))
                    marks[b.sender] = b.seq
                    replies.append(Reply(b.seq, ok=True, stored=stored, skipped=skipped))
                    stored_total += stored
                    skipped_total += skipped
        except StoreError as e:
            self.ctx.series_ids.clear()  # series created in the rolled-back transaction are gone
            c.busy += len(batches)
            if not self._failing:
                self._failing = True
                log.error("workload records cannot be stored (%s); their senders keep them and send them again", e)
            return [Reply(p.batch.seq, ok=False, error=str(e)) for p in batches]
        if self._failing:
            self._failing = False
            log.warning("workload records are stored again")
        self._last_seq.update(marks)
        c.batches += len(batches)
        c.duplicates += dups
        c.records += stored_total
        c.records_skipped += skipped_total
        return replies

    def close(self) -> None:
        """Take no more, store what was queued (answered before the listener stops), stop it."""
        self.server.stop_accepting()
        try:
            while self.drain():
                pass
        finally:
            self.server.close()
