"""Recorded workload events (a trace's events.jsonl) -> the store.

An event of a kind no importer claims is stored as it was recorded (kind, time, fields), so nothing
is lost. Feature modules turn the kinds they understand into series and labelled events by
registering an importer (which then stores the event itself, e.g. with `store_raw`):

    @register_importer("train_step")
    def _train_step(record: dict, store: Store, ctx: ImportContext) -> None: ...

Importers live beside the feature (e.g. gpulens.workload.training); `BUILTIN_IMPORTER_MODULES` lists
the modules loaded before an import.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpulens.errors import StoreError
from gpulens.gpu.trace_fields import is_sane_time
from gpulens.store import Store

log = logging.getLogger(__name__)

# Modules that register importers when imported. Missing ones are skipped.
BUILTIN_IMPORTER_MODULES = (
    "gpulens.workload.training.importer",
    "gpulens.workload.inference.importer",
    "gpulens.workload.inference.engine_readings",
    "gpulens.workload.colocation_importer",
)


REPLAY_HOST = "replay"  # the host of a recording that names none


@dataclass
class ImportContext:
    """Labels for imported workload series: the training job name, the service name, the host.
    A record's own `job`, `service` and `host` win over these defaults; `host_map` maps the host a
    recording names (its header's, its events') onto the host its GPU samples are stored under, so
    workload and GPU of one recording land under one host. `host` "" means: the recording's own."""

    job: str = "h200-demo"
    service: str = "h200-demo"
    model: str = ""
    host: str = ""  # "" = the recording's own host (a live replay: the node's), else "replay"
    host_map: dict[str, str] = field(default_factory=dict)
    gpu_model: str = ""  # the recorded GPU's name (e.g. "NVIDIA H200"), for peaks such as MFU's
    counts: dict[str, int] = field(default_factory=dict)
    skipped_events: int = 0  # records without a sane time, or that their importer could not read
    facts: dict[str, Any] = field(default_factory=dict)  # what earlier records told (e.g. the model's parameters)
    # series ids by label set and name, for importers of many records of one series (a live agent's
    # steps); whoever rolls back a transaction that may have created series must clear it
    series_ids: dict[tuple[tuple[str, str], ...], dict[str, int]] = field(default_factory=dict)

    def ids_for(self, labels: dict[str, str]) -> dict[str, int]:
        """The series-id cache of one label set (name -> id), bounded."""
        key = tuple(labels.items())
        ids = self.series_ids.get(key)
        if ids is None:
            if len(self.series_ids) >= 4096:
                self.series_ids.clear()
            ids = self.series_ids[key] = {}
        return ids


    def host_of(self, record: dict[str, Any]) -> str:
        """The stored host of a record: its own `host` (mapped), else the recording's."""
        h = record.get("host")
        default = self.host or REPLAY_HOST
        if not isinstance(h, str) or not h:
            return default
        return self.host_map.get(h, h)


EventImporter = Callable[[dict[str, Any], Store, ImportContext], None]
_IMPORTERS: dict[str, list[EventImporter]] = {}


def register_importer(kind: str) -> Callable[[EventImporter], EventImporter]:
    def deco(fn: EventImporter) -> EventImporter:
        _IMPORTERS.setdefault(kind, []).append(fn)
        return fn

    return deco


def load_builtin_importers() -> None:
    for name in BUILTIN_IMPORTER_MODULES:
        try:
            if importlib.util.find_spec(name) is None:
                continue
        except ModuleNotFoundError:
            continue
        importlib.import_module(name)


def event_time(record: dict[str, Any]) -> float | None:
    """The moment a record describes: its end for spans (steps, requests), else `t`."""
    for key in ("t_end", "end", "t"):
        v = record.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool):
            return float(v) if is_sane_time(v) else None  # a broken clock: the record has no usable time
    return None


def import_event(record: dict[str, Any], store: Store, ctx: ImportContext) -> bool:
    """Store one recorded event and feed it to the importers of its kind. False (and counted in
    `ctx.skipped_events`) if it has no sane time or its importer cannot read it."""
    t = event_time(record)
    kind = record.get("kind")
    if t is None or not isinstance(kind, str):
        ctx.skipped_events += 1
        return False
    importers = _IMPORTERS.get(kind)
    try:
        if not importers:
            store_raw(record, store, {"source": "replay"})
        for fn in importers or ():
            fn(record, store, ctx)
    except StoreError:
        raise  # the store itself failing (a full disk) is not the record's fault
    except Exception as e:  # noqa: BLE001 - one unreadable record (a string where a number belongs) is skipped
        ctx.skipped_events += 1
        log.debug("skipped a %s event at %s: %s", kind, t, e)
        return False
    ctx.counts[kind] = ctx.counts.get(kind, 0) + 1
    return True


def store_raw(record: dict[str, Any], store: Store, labels: dict[str, str] | None = None) -> None:
    """Store a recorded event unchanged under its own kind."""
    t = event_time(record)
    if t is not None:
        store.event(str(record.get("kind")), t, labels or {}, record)
