"""A scrape is bounded (issue 27, item 4): an endless body, a page of 50,000 models and a page that
would write too many series are refused whole (nothing written), counted by cause, logged once per
cause and shown on /metrics; a scrape trickled for ever is cut by its timeout, and at once by the
agent's stop. Real local HTTP servers, a real store."""

from __future__ import annotations

import logging
import threading
import time
import tracemalloc
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from testlib import free_port, wait_until

from gpulens.gpu import FakeBackend
from gpulens.pipeline import NodeConfig, build_node
from gpulens.vocab import names as N
from gpulens.workload.inference.scrape import EngineScraper, ScrapeRefusedError, ScrapeUnavailableError


def _vllm_page(models: int) -> str:
    lines = ["# TYPE vllm:num_requests_running gauge"]
    lines += [f'vllm:num_requests_running{{model_name="m{i}"}} 1' for i in range(models)]
    lines += ["# TYPE vllm:num_requests_waiting gauge"]
    lines += [f'vllm:num_requests_waiting{{model_name="m{i}"}} 2' for i in range(models)]
    return "\n".join(lines) + "\n"


class _Engine:
    """/metrics as `mode` says: 'page' serves `text`; 'endless' streams samples for ever; 'trickle'
    sends a byte every 50 ms for ever (after `page_first` normal answers)."""

    def __init__(self, mode: str = "page", text: str = "", page_first: int = 0):
        self.mode, self.text, self.page_first = mode, text, page_first
        self.requests = 0
        self.stop = threading.Event()
        owner = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                owner.requests += 1
                mode = "page" if owner.requests <= owner.page_first else owner.mode
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                if mode == "page":
                    body = owner.text.encode()
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.end_headers()
                chunk = b'vllm:num_requests_running{model_name="m"} 1\n' * 1000
                try:
                    while not owner.stop.is_set():
                        self.wfile.write(chunk if mode == "endless" else b"#")
                        self.wfile.flush()
                        if mode == "trickle":
                            owner.stop.wait(0.05)
                except OSError:
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def engine():
    made: list[_Engine] = []

    def make(*a, **kw) -> _Engine:  # noqa: ANN002, ANN003
        made.append(_Engine(*a, **kw))
        return made[-1]

    yield make
    for e in made:
        e.close()


def test_an_endless_body_is_refused_at_the_byte_bound_without_filling_memory(engine, store, caplog):
    e = engine("endless")
    s = EngineScraper(e.url, store, service="svc", max_bytes=2 * 2**20, timeout_seconds=30)
    tracemalloc.start()
    try:
        with pytest.raises(ScrapeRefusedError) as err:
            s.scrape_once()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert err.value.cause == "body too large" and "2097152 bytes" in err.value.message
    assert peak < 8 * 2**20  # the bound, read in chunks, plus their join: not the stream
    with caplog.at_level(logging.WARNING, logger="gpulens.workload.inference.scrape"):
        s.scrape_safely()
        s.scrape_safely()
    assert s.refused["body too large"] == 2
    assert sum("body too large" in r.getMessage() or "larger than" in r.getMessage() for r in caplog.records) == 1
    assert store.metric_names() == []


def test_pages_of_many_models_are_refused_before_they_are_parsed(engine, store, caplog):
    e = engine(text=_vllm_page(20_000))  # 1.8 MB: under the byte bound, 40,000 samples over the sample bound
    s = EngineScraper(e.url, store, service="svc")
    with caplog.at_level(logging.WARNING, logger="gpulens.workload.inference.scrape"):
        for _ in range(3):
            s.scrape_safely()
        e.text = _vllm_page(50_000)  # the page: 4.5 MB, past the byte bound
        s.scrape_safely()
    assert s.refused == {"too many samples": 3, "body too large": 1}
    assert len([r for r in caplog.records if "40000 samples" in r.getMessage()]) == 1  # one line per cause
    assert store.metric_names() == []


def test_a_page_that_would_write_too_many_series_is_refused_whole_then_a_smaller_one_is_kept(engine, store):
    e = engine(text=_vllm_page(40))
    s = EngineScraper(e.url, store, service="svc", max_series=50)
    with pytest.raises(ScrapeRefusedError) as err:
        s.scrape_once()
    assert err.value.cause == "too many series" and "(40 models)" in err.value.message
    assert store.metric_names() == []
    e.text = _vllm_page(3)
    assert s.scrape_once().models == ["m0", "m1", "m2"]
    assert len(store.series(N.INFER_IN_FLIGHT, {})) == 3


def test_a_trickled_answer_is_cut_by_the_timeout_and_by_stop(engine, store):
    e = engine("trickle")
    s = EngineScraper(e.url, store, service="svc", timeout_seconds=0.5)
    with pytest.raises(ScrapeUnavailableError, match="within 0.5 s"):
        s.scrape_once()
    s = EngineScraper(e.url, store, service="svc", timeout_seconds=60)
    worker = threading.Thread(target=s.scrape_safely)
    worker.start()
    wait_until(lambda: e.requests >= 2, 60, "the second scrape to be under way")
    s.stop()
    worker.join(30)  # the stop cuts it at once; uncut, it would run to its 60 s timeout
    assert not worker.is_alive()
    assert s.errors == 0  # a scrape cut by stop is not a failure to report


def test_the_agents_stop_cuts_a_scrape_blocked_on_its_socket(engine, tmp_path):
    e = engine("trickle", text=_vllm_page(1), page_first=1)  # the start-up scrape succeeds, the next trickles
    node = build_node(NodeConfig(backend=FakeBackend(gpus=1), store_path=tmp_path / "s.db", alerts=None, colocation=False,
                                 listen=("127.0.0.1", free_port()), scrape_urls=[e.url], scrape_seconds=0.01,
                                 evaluate_seconds=0.01, interval_seconds=0.01))
    for sink in node.sinks:  # a scrape timeout of 60 s (the agent's is 5 s): a stop that waited for it
        for scraper in getattr(sink, "scrapers", []):  # stands well apart from a loaded machine's delays
            scraper.timeout = 60.0
    try:
        stats: list = []
        runner = threading.Thread(target=lambda: stats.append(node.run()))
        runner.start()
        wait_until(lambda: e.requests >= 2, 60, "the agent's second scrape to be under way")
        t0 = time.monotonic()
        node.loop.stop_event.set()  # what SIGTERM does
        runner.join(40)
        assert not runner.is_alive() and time.monotonic() - t0 < 20.0  # the scrape timeout is 60 s
    finally:
        node.close()


def test_refusals_are_counted_on_metrics(engine, tmp_path):
    import urllib.request

    e = engine(text=_vllm_page(1))
    node = build_node(NodeConfig(backend=FakeBackend(gpus=1), store_path=tmp_path / "s.db", alerts=None, colocation=False,
                                 listen=("127.0.0.1", free_port()), scrape_urls=[e.url]))
    try:
        e.text = _vllm_page(20_000)
        for s in node.sinks:
            for scraper in getattr(s, "scrapers", []):
                scraper.scrape_safely()
        body = urllib.request.urlopen(node.metrics_url, timeout=10).read().decode()
        assert f'gpulens_scrape_refused_total{{cause="too many samples",service="default",url="{e.url}"}} 1.0' in body
        assert 'cause="body too large"' in body  # every cause is there from the start, at 0
    finally:
        node.close()
