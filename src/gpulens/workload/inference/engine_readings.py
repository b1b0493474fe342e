"""Recorded engine readings (`engine_stats` records) -> the series a live `--scrape` writes.

A recording made beside a serving engine can carry what the engine said about itself, one record
per reading:

    {"kind": "engine_stats", "t": 1796100000.5, "service": "chat", "engine": "vllm", "model": "llama-8b",
     "kv_cache_usage_ratio": 0.27, "num_requests_running": 2, "num_requests_waiting": 0, "num_preemptions_total": 0}

A field is named either as the engine names its metric, without the prefix (vLLM's
`num_requests_waiting`, SGLang's `num_queue_reqs`, `vllm:` kept or not), or as gpulens names the
series, without `infer_` (`kv_cache_usage_ratio`, `queue_depth`, `in_flight`, `preemptions_total`).
Either way the reading becomes samples of the engine's `/metrics` and goes through the scraper's
own mapping (`EngineScraper.write_samples`): one write path, so a replay and a live scrape give the
same series, labels and units. Gauges and counters only (a record holds no histogram). A record
without a known `engine` (or a gpulens-named field its engine has no metric for) is written through
`RECORDED`, the identity map, labelled with the engine it names.
"""

from __future__ import annotations

from typing import Any

from gpulens.store import Store
from gpulens.vocab import names as N
from gpulens.workload.importers import ImportContext, register_importer
from gpulens.workload.inference.engines import ENGINES
from gpulens.workload.inference.engines.base import Counter, EngineMap, Gauge
from gpulens.workload.inference.scrape import EngineScraper, Samples

SERIES_PREFIX = "infer_"
NOT_READINGS = frozenset({"kind", "t", "service", "engine", "model", "pid", "host"})
_SCRAPERS = "engine_reading_scrapers"  # ctx.facts key: one scraper per (store, service, engine, model)

# gpulens's own series, each its own source: a record that already speaks gpulens's names
RECORDED = EngineMap(
    name="recorded",
    prefix=SERIES_PREFIX,
    model_label=None,
    gauges=(
        Gauge((N.INFER_IN_FLIGHT,), N.INFER_IN_FLIGHT),
        Gauge((N.INFER_QUEUE_DEPTH,), N.INFER_QUEUE_DEPTH),
        Gauge((N.INFER_BATCH_SIZE,), N.INFER_BATCH_SIZE),
        Gauge((N.INFER_KV_CACHE_USAGE_RATIO,), N.INFER_KV_CACHE_USAGE_RATIO, merge="mean"),
        Gauge((N.INFER_PREFIX_CACHE_HIT_RATIO,), N.INFER_PREFIX_CACHE_HIT_RATIO, merge="mean"),
    ),
    counters=(
        Counter((N.INFER_PREEMPTIONS_TOTAL,), N.INFER_PREEMPTIONS_TOTAL),
        Counter((N.INFER_PROMPT_TOKENS_TOTAL,), N.INFER_PROMPT_TOKENS_TOTAL),
        Counter((N.INFER_OUTPUT_TOKENS_TOTAL,), N.INFER_OUTPUT_TOKENS_TOTAL),
    ),
)


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def to_samples(record: dict[str, Any], engine: EngineMap | None) -> tuple[Samples, Samples]:
    """(samples in `engine`'s own names, samples for `RECORDED`) from one record's readings.
    A gpulens-named field becomes the engine's first source metric for that series (its value
    divided by the rule's scale, which the mapping then applies back)."""
    native: Samples = {}
    recorded: Samples = {}
    sources: set[str] = set()
    by_dest: dict[str, tuple[str, float]] = {}
    if engine is not None:
        for g in engine.gauges:
            if not g.where:  # a filtered gauge needs labels a flat record does not have
                sources.update(g.sources)
                by_dest.setdefault(g.dest, (g.sources[0], g.scale))
        for c in engine.counters:
            sources.update(c.sources)
            by_dest.setdefault(c.dest, (c.sources[0], 1.0))
    ours = {r.dest for r in (*RECORDED.gauges, *RECORDED.counters)}
    for key, raw in record.items():
        value = _number(raw)
        if key in NOT_READINGS or value is None:
            continue
        name = key if engine is None or key.startswith(engine.prefix) else engine.prefix + key
        series = key if key.startswith(SERIES_PREFIX) else SERIES_PREFIX + key
        if engine is not None and name in sources:
            native[name] = [({}, value)]
        elif series in by_dest:
            source, scale = by_dest[series]
            native[source] = [({}, value / scale)]
        elif series in ours:
            recorded[series] = [({}, value)]
    return native, recorded


def _scraper(record: dict[str, Any], store: Store, ctx: ImportContext, engine_name: str) -> EngineScraper:
    service = str(record.get("service") or ctx.service)
    model = str(record.get("model") or ctx.model or "")
    scrapers: dict[tuple[int, str, str, str], EngineScraper] = ctx.facts.setdefault(_SCRAPERS, {})
    key = (id(store), service, engine_name, model)
    if key not in scrapers:
        engine = engine_name if engine_name in ENGINES else "auto"
        scrapers[key] = EngineScraper("", store, service=service, model=model, host=ctx.host, engine=engine)
    return scrapers[key]


@register_importer(N.EV_ENGINE_STATS)
def import_engine_stats(record: dict[str, Any], store: Store, ctx: ImportContext) -> None:
    t = _number(record.get("t"))
    if t is None:
        return
    engine_name = str(record.get("engine") or RECORDED.name)
    engine = ENGINES.get(engine_name)
    native, recorded = to_samples(record, engine)
    scraper = _scraper(record, store, ctx, engine_name)
    if engine is not None and native:
        scraper.write_samples(native, t, engine, flush=False)
    if recorded:
        scraper.write_samples(recorded, t, RECORDED, source=engine_name, flush=False)
    store.event(N.EV_ENGINE_STATS, t, {**scraper.base, "source": engine_name},
                {k: v for k, v in record.items() if k != "kind"})
