"""Recorded `engine_stats` records -> the series a live scrape writes (one write path: the scraper's mapping)."""

from __future__ import annotations

import json

from gpulens.store import Store
from gpulens.vocab import names as N
from gpulens.workload.importers import ImportContext, import_event, load_builtin_importers
from gpulens.workload.inference.scrape import EngineScraper

T = 1_800_000_000.0
ENGINE_SERIES = (N.INFER_KV_CACHE_USAGE_RATIO, N.INFER_QUEUE_DEPTH, N.INFER_IN_FLIGHT, N.INFER_PREEMPTIONS_TOTAL)


def _contents(store: Store) -> dict:
    store.flush()
    return {(name, tuple(sorted(s.key.labels.items()))): list(zip(s.t, s.value, strict=True))
            for name in ENGINE_SERIES for s in store.query(name)}


def _import(store: Store, *records: dict, ctx: ImportContext | None = None) -> ImportContext:
    load_builtin_importers()
    ctx = ctx or ImportContext(service="chat", host="node-a")
    for r in records:
        assert import_event({"kind": N.EV_ENGINE_STATS, **r}, store, ctx)
    store.flush()
    return ctx


VLLM_TEXT = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="llama"}} {running}
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{model_name="llama"}} {waiting}
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{model_name="llama"}} {kv}
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{model_name="llama"}} {preempted}
"""


def test_a_vllm_record_writes_what_a_scrape_of_the_same_reading_writes(tmp_path):
    readings = [dict(running=2, waiting=0, kv=0.27, preempted=0), dict(running=8, waiting=5, kv=0.97, preempted=3)]
    with Store(tmp_path / "scraped.db") as scraped:
        for k, r in enumerate(readings):
            EngineScraper("", scraped, service="chat", host="node-a", clock=lambda k=k: T + 5 * k).scrape_once(VLLM_TEXT.format(**r))
        want = _contents(scraped)
    with Store(tmp_path / "imported.db") as imported:
        # the recording's spelling: the engine's names without prefix, and gpulens's for the cache
        _import(imported, *({"t": T + 5 * k, "service": "chat", "engine": "vllm", "model": "llama", "pid": 8300,
                             "num_requests_running": r["running"], "num_requests_waiting": r["waiting"],
                             "kv_cache_usage_ratio": r["kv"], "num_preemptions_total": r["preempted"]}
                            for k, r in enumerate(readings)))
        got = _contents(imported)
        events = imported.events(N.EV_ENGINE_STATS)
    assert got == want and len(got) == 4
    assert len(events) == 2 and events[0].data["pid"] == 8300
    labels = dict(next(iter(got))[1])
    assert labels == {"service": "chat", "model": "llama", "host": "node-a", "source": "vllm"}


def test_prefixed_and_engine_spelled_fields_are_the_same_series(tmp_path):
    with Store(tmp_path / "a.db") as a, Store(tmp_path / "b.db") as b:
        _import(a, {"t": T, "engine": "vllm", "vllm:num_requests_waiting": 4, "vllm:gpu_cache_usage_perc": 0.5})
        _import(b, {"t": T, "engine": "vllm", "queue_depth": 4, "kv_cache_usage_ratio": 0.5})
        assert _contents(a) == _contents(b)
        assert {name for name, _ in _contents(a)} == {N.INFER_QUEUE_DEPTH, N.INFER_KV_CACHE_USAGE_RATIO}


def test_sglang_names_go_through_the_sglang_map(store):
    _import(store, {"t": T, "engine": "sglang", "token_usage": 0.9, "num_queue_reqs": 3, "num_retracted_requests_total": 2})
    got = {name: v for (name, _), v in _contents(store).items()}
    assert got == {N.INFER_KV_CACHE_USAGE_RATIO: [(T, 0.9)], N.INFER_QUEUE_DEPTH: [(T, 3.0)], N.INFER_PREEMPTIONS_TOTAL: [(T, 2.0)]}


def test_an_unknown_engine_or_a_field_its_engine_lacks_keeps_gpulens_names(store):
    _import(store, {"t": T, "engine": "my-server", "kv_cache_usage_ratio": 0.4, "queue_depth": 1, "temperature": 3},
            {"t": T, "engine": "tgi", "kv_cache_usage_ratio": 0.6, "queue_size": 2})
    got = {(name, dict(lab)["source"]): v for (name, lab), v in _contents(store).items()}
    assert got == {(N.INFER_KV_CACHE_USAGE_RATIO, "my-server"): [(T, 0.4)], (N.INFER_QUEUE_DEPTH, "my-server"): [(T, 1.0)],
                   (N.INFER_KV_CACHE_USAGE_RATIO, "tgi"): [(T, 0.6)], (N.INFER_QUEUE_DEPTH, "tgi"): [(T, 2.0)]}


def test_the_record_service_wins_and_the_context_fills_in(store):
    _import(store, {"t": T, "engine": "vllm", "num_requests_waiting": 1},
            {"t": T, "engine": "vllm", "service": "embed", "num_requests_waiting": 2})
    services = {dict(lab)["service"]: v for (_n, lab), v in _contents(store).items()}
    assert services == {"chat": [(T, 1.0)], "embed": [(T, 2.0)]}


def test_a_record_without_a_time_is_skipped(store):
    load_builtin_importers()
    ctx = ImportContext()
    assert not import_event({"kind": N.EV_ENGINE_STATS, "engine": "vllm", "num_requests_waiting": 1}, store, ctx)
    assert ctx.skipped_events == 1


def test_a_replayed_recording_with_engine_stats_is_diagnosed_on_them(tmp_path):
    """Through the CLI's replay: a full cache with waiting requests, recorded, is the finding."""
    from gpulens.cli.main import main

    trace = tmp_path / "rec"
    trace.mkdir()
    lines = []
    for k in range(12):
        full = 4 <= k < 8
        lines.append({"kind": N.EV_ENGINE_STATS, "t": T + 5 * k, "service": "chat", "engine": "vllm",
                      "kv_cache_usage_ratio": 0.96 if full else 0.3, "num_requests_waiting": 7 if full else 0,
                      "num_preemptions_total": 4 if k >= 6 else 0})
    (trace / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    header = {"format": "gpulens-recording", "version": 1, "backend": "test", "gpus": [{"index": 0, "uuid": "GPU-test-0", "name": "NVIDIA H100",
                                                                                     "memory_total_bytes": 80_000_000_000}]}
    samples = [{"type": "sample", "t": T + k, "gpu": 0, "uuid": "GPU-test-0", "memory_used_bytes": 74e9, "memory_total_bytes": 80e9} for k in range(60)]
    (trace / "recording.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [header, *samples]))
    db = tmp_path / "s.db"
    assert main(["replay", str(trace), "--store", str(db), "--service", "chat"]) == 0
    from gpulens.diagnose import diagnose

    with Store(db, readonly=True) as s:
        [f] = [f for f in diagnose(s) if f.kind == "memory_headroom"]
    assert f.evidence["waiting_requests_max"] == 7 and f.evidence["preemptions"] == 4
    assert f.start == T + 20 and f.end == T + 35
