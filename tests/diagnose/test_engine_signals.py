"""Engines' own signals first (issue 23 item 5): where an engine reports KV-cache use, waiting
requests and preemptions, `memory_headroom` reads them, not device memory.

Each rule is tested both ways (cause present: a finding naming the numbers; cause absent: none),
on stores built here: the real engine captures in ../shared/data/engine-metrics scraped through
the scraper (their gauges set where a test needs a loaded engine), GPU memory samples and request
events written directly.
"""

from __future__ import annotations

import re

import pytest

from gpulens.diagnose import DiagnoseScope, diagnose
from gpulens.diagnose.engine_signals import EngineView, preemption_steps, saturations
from gpulens.store import Store
from gpulens.vocab import gpu as G
from gpulens.vocab import names as N
from gpulens.workload.inference.scrape import EngineScraper

T0 = 1_800_000_000.0
CARD_BYTES = 150e9
SERVICE = "chat"
HOST = "h"


def _set(text: str, metric: str, value: float) -> str:
    """The capture with every sample of `metric` set to `value` (the engine under load)."""
    out, n = re.subn(rf"^({re.escape(metric)}(?:{{[^}}]*}})?) \S+$", rf"\g<1> {value}", text, flags=re.M)
    assert n, metric
    return out


def _scrape(store: Store, text: str, t: float) -> None:
    EngineScraper("", store, service=SERVICE, host=HOST, clock=lambda: t).scrape_once(text)


def _gpu_memory(store: Store, used_ratio, seconds: int = 120, gpu: str = "0") -> None:
    """One GPU's memory each second; `used_ratio(i)` is the share of the card in use at second i."""
    labels = {"host": HOST, "gpu": gpu}
    for i in range(seconds):
        store.write(G.GPU_MEMORY_USED_BYTES, labels, T0 + i, used_ratio(i) * CARD_BYTES)
        store.write(G.GPU_MEMORY_TOTAL_BYTES, labels, T0 + i, CARD_BYTES)


def _requests(store: Store, n: int = 100, *, every: float = 1.0, latency: float = 0.4, queue=lambda i: 0.0) -> None:
    for i in range(n):
        end = T0 + 2 + i * every + latency + queue(i)
        arrival = end - latency - queue(i)
        store.event(N.EV_REQUEST, end, {"service": SERVICE, "model": "m", "host": HOST},
                    {"arrival": arrival, "start": arrival + queue(i), "end": end, "status": "ok"})


def _headroom(store: Store) -> list:
    store.flush()
    return [f for f in diagnose(store, DiagnoseScope(service=SERVICE)) if f.kind == "memory_headroom"]


# ------------------------------------------------------------------ engine signals present
KV_GAUGE = {"vllm": "vllm:kv_cache_usage_perc", "vllm_legacy": "vllm:gpu_cache_usage_perc", "sglang": "sglang:token_usage"}
WAITING_GAUGE = {"vllm": "vllm:num_requests_waiting", "vllm_legacy": "vllm:num_requests_waiting", "sglang": "sglang:num_queue_reqs"}


@pytest.mark.parametrize("capture", sorted(KV_GAUGE))
def test_preallocating_engine_with_a_comfortable_kv_cache_is_no_finding(capture, shared_data, store):
    """92 % of the card held from the start (vLLM's gpu_memory_utilization), the engine's cache a
    quarter used, nothing waiting: the engine's own readings say there is room."""
    text = (shared_data / "engine-metrics" / f"{capture}.txt").read_text()
    for k in range(0, 120, 5):
        _scrape(store, _set(text, KV_GAUGE[capture], 0.2 + (k % 3) * 0.03), T0 + k)
    _gpu_memory(store, lambda i: 0.92)
    _requests(store)
    assert _headroom(store) == []


def test_engine_readings_decide_over_device_memory(shared_data, store):
    """Device memory that would be a finding without engine readings (it grows to 96 % while
    serving) is none when the engine's own cache stays comfortable and nothing is preempted."""
    text = (shared_data / "engine-metrics" / "vllm.txt").read_text()
    for k in range(0, 120, 5):
        _scrape(store, _set(text, "vllm:kv_cache_usage_perc", 0.3), T0 + k)
    _gpu_memory(store, lambda i: min(0.96, 0.5 + 0.46 * i / 90))
    _requests(store)
    assert _headroom(store) == []


@pytest.mark.parametrize("capture", ["vllm", "vllm_legacy"])
def test_full_kv_cache_with_waiting_requests_and_preemptions_is_a_finding_with_those_numbers(capture, shared_data, store):
    text = (shared_data / "engine-metrics" / f"{capture}.txt").read_text()
    for k, (kv, waiting, preempted) in enumerate([(0.3, 0, 0), (0.6, 0, 0), (0.97, 12, 7), (0.95, 9, 35), (0.4, 0, 35)]):
        loaded = _set(_set(_set(text, KV_GAUGE[capture], kv), WAITING_GAUGE[capture], waiting),
                      "vllm:num_preemptions_total", preempted)
        _scrape(store, loaded, T0 + 10 * k)
    _gpu_memory(store, lambda i: 0.92)
    _requests(store)
    [f] = _headroom(store)
    assert f.evidence["kv_cache_usage_max_ratio"] == pytest.approx(0.97)
    assert f.evidence["waiting_requests_max"] == 12 and f.evidence["preemptions"] == 35
    assert "97%" in f.summary and "12 requests waited" in f.summary and "35 running requests were preempted" in f.summary
    assert (f.start, f.end) == (T0 + 20, T0 + 30)
    assert f.labels["service"] == SERVICE


def test_sglang_full_token_pool_with_a_queue_is_a_finding(shared_data, store):
    text = (shared_data / "engine-metrics" / "sglang.txt").read_text()
    for k in range(6):
        full = k in (2, 3)
        _scrape(store, _set(_set(text, "sglang:token_usage", 0.98 if full else 0.5), "sglang:num_queue_reqs", 5 if full else 0), T0 + 5 * k)
    [f] = _headroom(store)
    assert f.evidence["kv_cache_usage_max_ratio"] == pytest.approx(0.98) and f.evidence["waiting_requests_max"] == 5


def _view(kv=(), waiting=(), preemptions=()) -> EngineView:
    return EngineView({"service": SERVICE}, list(kv), list(waiting), list(preemptions))


def test_full_kv_cache_with_nothing_waiting_is_the_engine_using_its_reservation():
    """KV near full alone is no saturation: the engine fills what it reserved."""
    assert saturations(_view(kv=[(T0 + i, 0.97) for i in range(10)], waiting=[(T0 + i, 0.0) for i in range(10)])) == []
    assert saturations(_view(kv=[(T0 + i, 0.97) for i in range(10)])) == []  # no queue reading at all


def test_waiting_requests_with_a_roomy_cache_are_not_memory():
    """A queue beside a half-empty cache is load (the queueing finding's), not memory."""
    assert saturations(_view(kv=[(T0 + i, 0.5) for i in range(10)], waiting=[(T0 + i, 8.0) for i in range(10)])) == []


def test_a_waiting_reading_joins_only_a_kv_reading_close_in_time():
    kv = [(T0, 0.97), (T0 + 100, 0.2)]
    assert saturations(_view(kv=kv, waiting=[(T0 + 100, 4.0)])) == []  # the queue came 100 s after the full cache
    [s] = saturations(_view(kv=kv, waiting=[(T0 + 2, 4.0)]))
    assert s.waiting_max == 4 and s.kv_usage_max_ratio == pytest.approx(0.97)


def test_preemptions_alone_are_saturation_and_the_first_reading_is_a_baseline():
    """A preemption means a sequence could not get a KV block, whatever the sampled usage; what the
    counter held at the first reading happened before the scope and is not counted."""
    counter = [(T0, 50.0), (T0 + 5, 50.0), (T0 + 10, 53.0), (T0 + 15, 2.0)]  # a restart at +15 s
    assert preemption_steps(counter) == [(T0 + 10, 3.0), (T0 + 15, 2.0)]
    [s] = saturations(_view(kv=[(T0 + 10, 0.7)], preemptions=counter))
    assert s.preemptions == 5 and (s.start, s.end) == (T0 + 10, T0 + 15)
    assert saturations(_view(kv=[(T0, 0.7)], preemptions=[(T0, 50.0), (T0 + 5, 50.0)])) == []


def test_spans_far_apart_are_separate_findings(store):
    labels = {"service": SERVICE, "model": "m", "host": HOST, "source": "vllm"}
    for k, (kv, waiting) in enumerate([(0.97, 3), (0.2, 0), (0.2, 0), (0.2, 0), (0.2, 0), (0.98, 6)]):
        store.write(N.INFER_KV_CACHE_USAGE_RATIO, labels, T0 + 20 * k, kv)
        store.write(N.INFER_QUEUE_DEPTH, labels, T0 + 20 * k, waiting)
    found = _headroom(store)
    assert [(f.start, f.evidence["waiting_requests_max"]) for f in found] == [(T0, 3), (T0 + 100, 6)]


# ------------------------------------------------------------------ no engine signals: device memory
@pytest.mark.parametrize("capture", ["tgi", "triton", "trtllm"])
def test_engines_without_kv_readings_fall_back_to_device_memory(capture, shared_data, store):
    """TGI, Triton and TensorRT-LLM captures carry no KV-cache gauge: device memory decides as
    before, so memory that grows to 96 % of the card while serving is a finding."""
    text = (shared_data / "engine-metrics" / f"{capture}.txt").read_text()
    for k in range(0, 120, 10):
        _scrape(store, text, T0 + k)
    _gpu_memory(store, lambda i: min(0.96, 0.5 + 0.46 * i / 90))
    _requests(store)
    [f] = _headroom(store)
    assert f.evidence["used_ratio"] == pytest.approx(0.96, abs=0.005)


def test_device_memory_growing_while_serving_is_a_finding(store):
    _gpu_memory(store, lambda i: min(0.96, 0.5 + 0.46 * i / 90))
    _requests(store)
    [f] = _headroom(store)
    assert "GPU memory reached 96%" in f.summary


def test_flat_device_memory_from_the_start_with_healthy_latency_is_a_preallocation(store):
    _gpu_memory(store, lambda i: 0.92 + 0.005 * (i % 2))
    _requests(store)
    assert _headroom(store) == []


def test_flat_device_memory_with_requests_queueing_is_still_a_finding(store):
    """A pre-allocation is forgiven only while latency is healthy: queued requests may be waiting for memory."""
    _gpu_memory(store, lambda i: 0.92)
    _requests(store, 100, every=0.3, latency=0.1, queue=lambda i: i * 0.05)
    [f] = _headroom(store)
    assert f.evidence["used_ratio"] == pytest.approx(0.92)


def test_flat_device_memory_with_failing_requests_is_still_a_finding(store):
    _gpu_memory(store, lambda i: 0.92)
    _requests(store)
    for i in range(10):
        t = T0 + 3 + i * 5
        store.event(N.EV_REQUEST, t, {"service": SERVICE, "model": "m", "host": HOST},
                    {"arrival": t - 0.1, "start": t - 0.1, "end": t, "status": "error"})
    assert len(_headroom(store)) == 1


def test_flatness_is_judged_per_gpu(store):
    """An engine holding 92 % of GPU 0 beside a GPU 1 whose memory moves is still a flat reservation;
    growth on the full GPU itself is not."""
    _gpu_memory(store, lambda i: 0.92)
    _gpu_memory(store, lambda i: 0.1 + 0.2 * (i % 10) / 10, gpu="1")
    _requests(store)
    assert _headroom(store) == []
    _gpu_memory(store, lambda i: min(0.96, 0.5 + 0.46 * i / 90), gpu="2")
    [f] = _headroom(store)
    assert f.evidence["used_ratio"] == pytest.approx(0.96, abs=0.005)


def test_a_window_the_engine_did_not_report_on_falls_back_to_device_memory(store):
    """Engine readings decide only where they are: a later window without them is judged on device memory."""
    labels = {"service": SERVICE, "model": "m", "host": HOST, "source": "vllm"}
    for k in range(5):
        store.write(N.INFER_KV_CACHE_USAGE_RATIO, labels, T0 - 300 + 5 * k, 0.2)
    _gpu_memory(store, lambda i: min(0.96, 0.5 + 0.46 * i / 90))
    _requests(store)
    [f] = _headroom(store)
    assert "GPU memory reached 96%" in f.summary
