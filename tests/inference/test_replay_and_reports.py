"""Recorded arrivals replayed (the bundled H200 session, a store, a mooncake trace), goodput, the
`vllm bench serve` keys of the JSON, and the HTML report opened in Chromium."""

from __future__ import annotations

import json
import re
from contextlib import contextmanager

import pytest

from gpulens.bench.serve import LoadSpec, Target, parse_slos, run_load, sweep
from gpulens.bench.serve.arrivals import load_arrivals
from gpulens.cli.main import main
from gpulens.errors import BadInputError

SPEED = 4.0


def _recorded_gaps(h200_trace) -> tuple[list[float], int]:
    """Ground truth straight from the file: the request events' arrival gaps."""
    rows = [json.loads(x) for x in (h200_trace / "events.jsonl").read_text().splitlines()]
    arrivals = sorted(r["arrival"] for r in rows if r.get("kind") == "request")
    serving = sum(1 for r in rows if r.get("kind") == "request" and r.get("phase", "").startswith("infer_"))
    return [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)], serving


def test_replaying_the_h200_session_keeps_its_count_and_burstiness(timed_server, h200_trace):
    """Done-when: as many requests as the session's serving phases recorded, with inter-arrival
    times whose distribution a two-sample KS test does not tell from the recording's at 5 %."""
    from scipy.stats import ks_2samp

    gaps, serving = _recorded_gaps(h200_trace)
    rec = load_arrivals(h200_trace, speed=SPEED)
    assert rec.format == "trace" and len(rec.times_seconds) == serving == 106
    res = run_load(LoadSpec(Target(f"{timed_server}/fixed/replay?ms=2"), arrivals=rec.times_seconds,
                            duration_seconds=None))
    s = res.summary
    assert s.requests.total == s.requests.ok == 106 and s.arrival == "replay"
    sent = sorted(r.sent for r in res.records)
    sent_gaps = [(b - a) * SPEED for a, b in zip(sent, sent[1:], strict=False)]
    assert ks_2samp(gaps, sent_gaps).pvalue > 0.05
    # and it is the recording's burstiness, not a Poisson stream's: the gaps' spread is kept. A Poisson
    # stream's CV is 1.0 against the recording's ~1.47 (a ratio of ~0.68). A loaded machine that holds
    # the sender sends what fell due at once: a gap of 0 and a longer one, a larger spread (one 0.6 s
    # hold in the 10 s run raises the CV by 5-20 %), so the margin above is the wider one.
    cv = lambda xs: (sum((x - sum(xs) / len(xs)) ** 2 for x in xs) / len(xs)) ** 0.5 / (sum(xs) / len(xs))  # noqa: E731
    assert 0.85 * cv(gaps) <= cv(sent_gaps) <= 1.5 * cv(gaps), (cv(sent_gaps), cv(gaps))


def test_replay_from_a_store_and_with_recorded_lengths(test_server, replayed_store, capsys):
    rec = load_arrivals(replayed_store)
    assert rec.format == "store" and len(rec.times_seconds) == 106
    assert set(rec.input_tokens) == {256} and set(rec.output_tokens) == {32}
    with pytest.raises(BadInputError, match="service"):
        load_arrivals(replayed_store, service="no-such-service")
    url = f"{test_server}/v1/completions?ttft_ms=2&itl_ms=0.2&log=replay-lengths"
    rc = main(["bench", "serve", "--url", url, "--replay-arrivals", str(replayed_store), "--speed", "40",
               "--replay-lengths", "--requests", "20", "--format", "json", "--no-store"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["completed"] == 20 and out["arrival"] == "replay"
    assert set(out["input_lens"]) == {256} and set(out["output_lens"]) == {32}


def test_replayed_arrivals_print_their_table(test_server, tmp_path, capsys):
    """Issue 27: the table format crashed on a valid file (a replay has no target rate to print)."""
    f = tmp_path / "mooncake.jsonl"
    f.write_text("\n".join(json.dumps({"timestamp": t, "input_length": 8, "output_length": 2}) for t in (0, 10, 20)) + "\n")
    rc = main(["bench", "serve", "--url", f"{test_server}/v1/completions?ttft_ms=1&itl_ms=0.1", "--replay-arrivals", str(f),
               "--no-store", "--format", "table"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "replay arrivals" in out.out and "requests: 3 (3 ok" in out.out, out.out
    assert "Traceback" not in out.out + out.err


def test_mooncake_trace_is_read_in_milliseconds_with_its_lengths(tmp_path):
    f = tmp_path / "mooncake.jsonl"
    rows = [{"timestamp": 0, "input_length": 600, "output_length": 20, "hash_ids": [0, 1]},
            {"timestamp": 1500, "input_length": 900, "output_length": 5, "hash_ids": [0, 2]},
            {"timestamp": 500, "input_length": 100, "output_length": 50, "hash_ids": [3]}]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    rec = load_arrivals(f, speed=2)
    assert rec.format == "mooncake"
    assert rec.times_seconds == pytest.approx((0.0, 0.25, 0.75))  # sorted, seconds, halved by --speed 2
    assert rec.input_tokens == (600, 100, 900) and rec.output_tokens == (20, 50, 5)
    assert rec.head(max_requests=2, duration_seconds=None).times_seconds == pytest.approx((0.0, 0.25))


@pytest.mark.parametrize(("content", "needle"), [("", "no request arrivals"), ("{oops\n", "not JSON")])
def test_bad_recording_is_one_sentence(tmp_path, content, needle):
    f = tmp_path / "r.jsonl"
    f.write_text(content)
    with pytest.raises(BadInputError, match=needle):
        load_arrivals(f)
    with pytest.raises(BadInputError, match="speed"):
        load_arrivals(f, speed=0)


def test_json_carries_the_vllm_bench_serve_keys_with_its_definitions(test_server, capsys):
    """Done-when: vLLM's keys, TPOT excluding the first token. The server sends the first token at
    40 ms and then one every 10 ms: TPOT is 10 ms (with the first token counted it would be 14 ms)."""
    url = f"{test_server}/v1/completions?ttft_ms=40&itl_ms=10"
    rc = main(["bench", "serve", "--url", url, "--rate", "10", "--duration", "1s", "--max-tokens", "10",
               "--slo", "ttft<=10s", "--slo", "tpot<=5s", "--format", "json", "--no-store"])  # met even when loaded
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", "p99"):
            assert f"{stat}_{metric}_ms" in out, (stat, metric)
    for key in ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
                "request_goodput", "output_throughput", "total_token_throughput", "max_output_tokens_per_s",
                "max_concurrent_requests", "input_lens", "output_lens", "ttfts", "itls", "errors"):
        assert key in out, key
    assert out["completed"] == 10 and out["failed"] == 0 and out["total_output_tokens"] == 100
    # The definitions, from the JSON's own per-request lists (a loaded machine moves the times, not
    # these identities; how close they come to the server's 40 / 10 ms is benchmarks/bench_serve.py's):
    # TPOT excludes the first token: (e2el - TTFT) / (tokens - 1) per request, so its mean is
    # (mean e2el - mean TTFT) / 9; ITL is the mean gap between tokens; e2el runs to the body's end.
    assert all(len(gaps) == 9 for gaps in out["itls"]) and out["output_lens"] == [10] * 10
    assert out["mean_tpot_ms"] == pytest.approx((out["mean_e2el_ms"] - out["mean_ttft_ms"]) / 9, rel=1e-6)
    assert out["mean_itl_ms"] == pytest.approx(sum(map(sum, out["itls"])) / 90 * 1e3, rel=1e-6)
    to_last_token_ms = [(ttft + sum(gaps)) * 1e3 for ttft, gaps in zip(out["ttfts"], out["itls"], strict=True)]
    assert out["mean_e2el_ms"] >= sum(to_last_token_ms) / 10 * (1 - 1e-9)
    # lower bounds a late client cannot break: the server answers its first token 40 ms after arrival
    assert out["median_ttft_ms"] >= 40.0 and min(out["ttfts"]) >= 0.040
    assert out["mean_e2el_ms"] >= 40 + 9 * 10 * 0.5
    assert out["request_throughput"] == pytest.approx(out["completed"] / out["duration"])
    assert out["output_throughput"] == pytest.approx(100 / out["duration"])
    assert out["request_goodput"] == pytest.approx(out["request_throughput"])  # every request met both
    assert (out["request_rate"], out["burstiness"], out["max_concurrency"]) == (10, "inf", None)  # constant spacing
    # gpulens's own schema is kept beside them
    assert out["ttft"]["p50"] >= 0.040 and out["goodput_ratio"] == 1.0  # from the intended send: never less
    assert out["concurrency"]["max"] >= 1


def test_concurrency_distribution_of_a_closed_loop(timed_server):
    s = run_load(LoadSpec(Target(f"{timed_server}/fixed/conc?ms=20"), concurrency=4, duration_seconds=1)).summary
    c = s.concurrency
    assert c.p50 == 4 and c.max == 4 and 3.5 < c.mean <= 4


def test_goodput_sweep_finds_the_rate_at_which_99_percent_of_requests_meet_the_slo(timed_server):
    """A one-at-a-time 20 ms server (capacity 50 req/s): below it every request is served within
    ~40 ms; above it the backlog grows and requests miss 250 ms, so the goodput ratio falls (at 10 %
    over capacity the backlog passes 250 ms after 2.3 s of the 2.5 s probe: 8 % of its requests
    miss). 250 ms, not 100: below capacity a loaded machine must now hold two requests 230 ms, not
    80, to cost a probe its 99 %."""
    spec = LoadSpec(Target(f"{timed_server}/capacity/goodput?ms=20"), rate=20, duration_seconds=2.5)
    result = sweep(spec, parse_slos(["latency<=250ms"]), tolerance_ratio=0.1, min_goodput_ratio=0.99)
    assert result.best is not None and 35 <= result.best <= 55, [(p.value, p.passed) for p in result.probes]
    for p in result.probes:
        assert p.passed == (p.result.summary.goodput_ratio >= 0.99)
    with pytest.raises(BadInputError, match="goodput"):
        run_load(spec, parse_slos(["latency<=250ms"]), min_goodput_ratio=1.5)
    with pytest.raises(BadInputError, match="per-request"):
        run_load(spec, [], min_goodput_ratio=0.9)


@contextmanager
def _chromium_page(url: str):
    """Debian's chromium through Playwright, opened after the load run: Playwright's sync API holds
    an event loop on this thread while it is open, and the load tester needs its own."""
    from testlib import which_or_skip

    chromium = which_or_skip("chromium")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, headless=True,
                              args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        try:
            page = b.new_page(viewport={"width": 1200, "height": 900})
            page.goto(url)
            page.wait_for_function("Array.from(document.images).every(i => i.complete)")
            yield page
        finally:
            b.close()


def test_html_report_of_a_run_opens_with_its_charts(test_server, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "run.html"
    url = f"{test_server}/v1/chat/completions?ttft_ms=20&itl_ms=3"
    rc = main(["bench", "serve", "--url", url, "--rate", "20", "--duration", "1s", "--input-tokens", "uniform:10-50",
               "--output-tokens", "6", "--slo", "p99_ttft<=10s", "--report", str(out), "--no-store"])  # met even when loaded
    assert rc == 0
    text = out.read_text()
    assert "<script" not in text and not re.search(r"""src=['"](?!data:)""", text)
    for chart in ("ttft_distribution", "itl_distribution", "latency_distribution", "ttft_by_prompt_tokens", "send_lag"):
        assert f"data-chart='{chart}'" in text, chart
    with _chromium_page(out.as_uri()) as page:
        widths = page.locator("figure img").evaluate_all("els => els.map(e => e.naturalWidth)")
        assert len(widths) == 5 and min(widths) >= 300
        assert page.locator("tr[data-slo='p99_ttft<=10s'] td.met").count() == 1
        assert "input tokens/s" in page.locator("table.summary").inner_text()


def test_html_report_of_a_sweep_draws_latency_against_rate(timed_server, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "sweep.html"
    rc = main(["bench", "serve", "--url", f"{timed_server}/capacity/report?ms=20", "--sweep", "--rate", "20",
               "--duration", "1s", "--slo", "p99_latency<=150ms", "--max-probes", "4", "--report", str(out),
               "--no-store", "--no-fail", "--format", "json"])
    assert rc == 0
    probes = json.loads(capsys.readouterr().out)["probes"]
    assert len(probes) == 4
    for p in probes:  # each probe carries vLLM's figures too, without the per-request lists
        assert p["completed"] == p["requests"]["ok"] and "p99_e2el_ms" in p and "ttfts" not in p
    with _chromium_page(out.as_uri()) as page:
        assert page.locator("figure[data-chart='latency_vs_rate'] img").evaluate("e => e.naturalWidth") >= 600
        assert "Highest load meeting every SLO" in page.locator("p.best").inner_text()


def test_goodput_verdict_reads_as_a_share_in_the_table(test_server, capsys):
    url = f"{test_server}/v1/completions?ttft_ms=10&itl_ms=2"
    rc = main(["bench", "serve", "--url", url, "--rate", "10", "--duration", "0.5s", "--max-tokens", "4",
               "--slo", "ttft<=2s", "--goodput", "0.5", "--no-store"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "SLO goodput>=50%: 100.00% met" in text
    assert "(reported; --goodput judges per request)" in text


def test_mooncake_replay_rebuilds_the_recorded_prefix_sharing(test_server, tmp_path, capsys):
    """Requests whose hash_ids agree from the start share those 512-token blocks, as recorded; a
    server with a prefix cache then prefills only what was not seen before."""
    f = tmp_path / "mooncake.jsonl"
    rows = [{"timestamp": 0, "input_length": 1100, "output_length": 4, "hash_ids": [7, 8, 9]},
            {"timestamp": 40, "input_length": 1200, "output_length": 4, "hash_ids": [7, 8, 10]},
            {"timestamp": 80, "input_length": 600, "output_length": 4, "hash_ids": [7, 11]},
            {"timestamp": 120, "input_length": 700, "output_length": 4, "hash_ids": [12, 13]}]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert load_arrivals(f).block_ids == ((7, 8, 9), (7, 8, 10), (7, 11), (12, 13))
    url = f"{test_server}/v1/completions?ttft_ms=2&itl_ms=1&log=mooncake&cache=mooncake"
    rc = main(["bench", "serve", "--url", url, "--replay-arrivals", str(f), "--replay-lengths", "--no-store",
               "--format", "json"])
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["completed"] == 4
    served = _log_of(test_server, "mooncake")
    assert [len(s["tokens"]) for s in served] == [1100, 1200, 600, 700]
    toks = [s["tokens"] for s in served]
    assert toks[0][:1024] == toks[1][:1024] and toks[0][1024:1040] != toks[1][1024:1040]
    assert toks[2][:512] == toks[0][:512] and toks[2][512:528] != toks[0][512:528]
    assert toks[3][:512] != toks[0][:512]
    # the cache (16-token blocks) reuses 1,024 tokens for the second, 512 for the third, none for the fourth
    assert [s["prefilled"] for s in served] == [1100, 1200 - 1024, 600 - 512, 700]


def _log_of(base: str, key: str) -> list[dict]:
    import urllib.request

    with urllib.request.urlopen(f"{base}/log/{key}") as r:
        return json.loads(r.read())
