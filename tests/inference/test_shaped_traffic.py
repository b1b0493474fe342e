"""Shaped traffic against a local streaming server whose cost follows the prompt and output length
(tests/inference/inference_test_servers.py `completions`: TTFT = ttft_ms + prefill_us × uncached
prompt tokens, then one token every itl_ms), with a real tokenizer the test trains itself."""

from __future__ import annotations

import json
import random
import statistics
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest

from gpulens.bench.serve import LoadSpec, Target, run_load
from gpulens.bench.serve.datasets import load_dataset
from gpulens.bench.serve.prompts import COMMON_WORDS
from gpulens.bench.serve.tokens import HfTokenizer, parse_length_spec
from gpulens.bench.serve.traffic import TrafficOptions, plan_traffic
from gpulens.cli.main import main
from gpulens.errors import BadInputError

tokenizers = pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory) -> Path:
    """A real BPE tokenizer.json, trained here on a small corpus (never downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    rng = random.Random(7)
    words = list(COMMON_WORDS) + ["gpu", "kernel", "warp", "tensor", "batch", "cache", "token", "prefill"]
    corpus = [" ".join(rng.choice(words) for _ in range(30)) for _ in range(400)]
    corpus += ["unusual words like zyxglorp and quixotic flummox appear rarely"] * 2
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=600, special_tokens=["[UNK]"]))
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def _log(base: str, key: str) -> list[dict]:
    with urllib.request.urlopen(f"{base}/log/{key}") as r:
        return json.loads(r.read())


def _spec(base: str, query: str, opts: TrafficOptions, *, kind: str = "completions", rate: float | None = 10,
          concurrency: int | None = None, duration: float | None = 2.0, requests: int | None = None,
          max_tokens: int = 8) -> LoadSpec:
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    url = f"{base}{path}?{query}"
    plan = plan_traffic(opts, url=url, kind=kind, model="m", stream=True, prompt="hi", max_tokens=max_tokens,
                        rate=rate, ramp_to=None, duration_seconds=duration, max_requests=requests)
    return LoadSpec(Target(url, method="POST", headers={"Content-Type": "application/json"}, kind=kind), rate=rate,
                    concurrency=concurrency, duration_seconds=duration, max_requests=requests, workload=plan.workload,
                    timeout_seconds=10)


def _slope(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Theil-Sen: the median of pairwise slopes, and the intercept at the residuals' 10th
    percentile. A busy shared CPU only ever delays a request, so a low quantile of the residuals
    is the server's own time and the median slope ignores the few delayed requests."""
    pairs = [(ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(len(xs)) for j in range(i + 1, len(xs)) if abs(xs[j] - xs[i]) > 30]
    b = statistics.median(pairs)
    return b, statistics.quantiles([y - b * x for x, y in zip(xs, ys, strict=True)], n=10)[0]


def test_prompt_lengths_are_token_exact_and_move_ttft_as_the_server_predicts(test_server, tokenizer_json):
    """Done-when: shaped input lengths change TTFT by the server's prefill cost (1 ms a token),
    and every prompt is exactly as long as planned, counted by the same tokenizer on both sides."""
    # 1 ms a token (not 300 µs): the 20-400 token prompts then spread TTFT over ~380 ms, so the 15 %
    # on the slope allows ~3x more scheduling noise per request on a loaded runner than before.
    q = f"ttft_ms=20&itl_ms=5&prefill_us=1000&tok={tokenizer_json}&log=shape-in"
    opts = TrafficOptions(input_tokens="uniform:20-400", output_tokens="6", tokenizer=str(tokenizer_json), seed=3)
    spec = _spec(test_server, q, opts, rate=12, duration=2.0)
    assert spec.workload.token_basis == "tokenizer"
    res = run_load(spec)
    ok = [r for r in res.records if r.status == "ok"]
    assert len(ok) == res.summary.requests.total == 24
    served = _log(test_server, "shape-in")
    tok = HfTokenizer(tokenizer_json)
    planned = {p.input_tokens for p in spec.workload.requests}
    assert sorted(len(s["tokens"]) for s in served) == sorted(r.input_tokens for r in ok)
    assert all(r.input_tokens in planned for r in ok)
    # the planned counts are the tokenizer's own count of the text sent, and inside the spec
    for p in spec.workload.requests[:10]:
        text = json.loads(p.body)["prompt"]
        assert tok.count(text) == p.input_tokens and 20 <= p.input_tokens <= 400
    assert max(r.input_tokens for r in ok) - min(r.input_tokens for r in ok) > 150  # lengths really vary
    slope, intercept = _slope([r.input_tokens for r in ok], [r.ttft for r in ok])
    assert slope == pytest.approx(1000e-6, rel=0.15)
    # The server's fixed 20 ms. A loaded machine adds its delay to every request alike (CI measured
    # 24.1 ms on a busy 2-core runner), so the margin above is wider than below, where nothing but
    # a clock started late could put it.
    assert 0.020 - 0.003 <= intercept <= 0.020 + 0.012
    # e2e = TTFT + 5 more tokens at 5 ms: the same slope, 25 ms higher
    assert all(r.output_tokens == 6 for r in ok)
    slope, intercept = _slope([r.input_tokens for r in ok], [r.latency for r in ok])
    assert slope == pytest.approx(1000e-6, rel=0.15)
    assert 0.045 - 0.004 <= intercept <= 0.045 + 0.020  # six sends, each a chance of delay
    s = res.summary
    assert s.input_tokens == sum(r.input_tokens for r in ok)
    assert s.input_tokens_per_second == pytest.approx(s.input_tokens / s.duration_seconds)


def test_fixed_length_prompts_are_exactly_that_long(test_server, tokenizer_json):
    q = f"ttft_ms=5&itl_ms=1&tok={tokenizer_json}&log=shape-fixed"
    spec = _spec(test_server, q, TrafficOptions(input_tokens="128", tokenizer=str(tokenizer_json), seed=1),
                 rate=20, duration=0.5)
    run_load(spec)
    served = _log(test_server, "shape-fixed")
    assert len(served) == 10 and {len(s["tokens"]) for s in served} == {128}
    # random words: no two prompts share a first block, so no prefix cache helps by accident
    assert len({tuple(s["tokens"][:16]) for s in served}) == 10


def test_output_lengths_are_enforced_with_ignore_eos_and_shortfalls_are_counted(test_server):
    q = "ttft_ms=5&itl_ms=2&eos_at=3&log=shape-out"
    spec = _spec(test_server, q, TrafficOptions(output_tokens="uniform:5-12", seed=2), rate=20, duration=0.5)
    assert spec.workload.token_basis == "estimate"  # no tokenizer: labelled as an estimate
    res = run_load(spec)
    served = _log(test_server, "shape-out")
    assert all(s["ignore_eos"] is True for s in served)
    assert [r.output_tokens for r in res.records] == [r.planned_output_tokens for r in res.records]
    assert {r.planned_output_tokens for r in res.records} <= set(range(5, 13))
    assert res.summary.output_tokens_short == 0

    spec = _spec(test_server, "ttft_ms=5&itl_ms=2&eos_at=3", TrafficOptions(output_tokens="8", ignore_eos=False),
                 rate=20, duration=0.5)
    res = run_load(spec)
    assert {r.output_tokens for r in res.records} == {3}
    assert res.summary.output_tokens_short == 10


def test_shared_prefixes_are_sent_as_configured_and_show_what_caching_buys(test_server, tokenizer_json):
    """Done-when: K prefixes of N tokens ahead of unique suffixes; a server with a prefix cache
    prefills only the suffix once a group's prefix is cached, so TTFT falls by N × the prefill cost."""
    # 1 ms a token (was 400 µs): the 256 cached tokens are worth 256 ms, so the 25 % below is 64 ms
    q = f"ttft_ms=10&itl_ms=2&prefill_us=1000&tok={tokenizer_json}&log=shape-prefix&cache=shape-prefix"
    opts = TrafficOptions(input_tokens="32", prefix_tokens=256, prefix_groups=3, tokenizer=str(tokenizer_json), seed=5)
    spec = _spec(test_server, q, opts, rate=15, duration=1.2, max_tokens=2)
    res = run_load(spec)
    served = _log(test_server, "shape-prefix")
    assert len(served) == 18 and {len(s["tokens"]) for s in served} == {288}
    prefixes = [tuple(s["tokens"][:256]) for s in served]
    assert len(set(prefixes)) == 3 and sorted(prefixes.count(p) for p in set(prefixes)) == [6, 6, 6]
    assert len({tuple(s["tokens"][256:]) for s in served}) == 18  # each suffix its own
    # the first request of each group prefills everything; the rest only what follows the cached blocks
    assert [s["prefilled"] for s in served[:3]] == [288] * 3
    assert all(s["prefilled"] <= 32 for s in served[3:])
    recs = sorted(res.records, key=lambda r: r.intended)
    # medians, not means: a loaded runner delays a request here and there, and one delayed cold
    # request of three would move a mean by a third of its delay
    cold = statistics.median(r.ttft for r in recs[:3])
    warm = statistics.median(r.ttft for r in recs[3:])
    assert cold - warm == pytest.approx(256 * 1000e-6, rel=0.25)
    assert res.summary.workload["prefix_groups"] == 3


SHAREGPT = [
    {"id": "a", "conversations": [{"from": "human", "value": "what is a warp on a gpu"},
                                  {"from": "gpt", "value": "a warp is a group of threads that run together on the gpu"}]},
    {"id": "b", "conversations": [{"from": "system", "value": "be brief"},
                                  {"from": "human", "value": "explain the kv cache"},
                                  {"from": "gpt", "value": "it keeps keys and values"}]},
    {"id": "c", "conversations": [{"from": "human", "value": "tensor cores"},
                                  {"from": "gpt", "value": "matrix units in the gpu that multiply small tiles very fast indeed"}]},
]


def test_sharegpt_file_is_read_and_sampled_with_its_lengths(test_server, tokenizer_json, tmp_path, capsys):
    """Done-when: a ShareGPT file's prompts are sent, and each asks for as many tokens as its
    recorded answer has; the JSON carries the lengths."""
    data = tmp_path / "sharegpt.json"
    data.write_text(json.dumps(SHAREGPT))
    tok = HfTokenizer(tokenizer_json)
    ds = load_dataset(data)
    assert ds.format == "sharegpt" and len(ds.conversations) == 3
    url = f"{test_server}/v1/completions?ttft_ms=5&itl_ms=1&tok={tokenizer_json}&log=sharegpt"
    rc = main(["bench", "serve", "--url", url, "--rate", "20", "--requests", "9", "--dataset", str(data),
               "--tokenizer", str(tokenizer_json), "--seed", "4", "--format", "json", "--no-store"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    served = _log(test_server, "sharegpt")
    want = {}
    for c in SHAREGPT:
        turns = c["conversations"]
        i = next(k for k, t in enumerate(turns) if t["from"] == "human")
        prompt_tokens = sum(tok.count(t["value"]) for t in turns[: i + 1])
        want[prompt_tokens] = tok.count(turns[i + 1]["value"])
    assert len(served) == 9
    assert {len(s["tokens"]) for s in served} == set(want)  # every conversation sampled
    for s in served:
        assert s["max_tokens"] == want[len(s["tokens"])]
    assert sorted(out["input_lens"]) == sorted(len(s["tokens"]) for s in served)
    assert out["token_basis"] == "tokenizer" and out["workload"]["source"] == "dataset:sharegpt"


def test_chat_jsonl_multi_turn_resends_history_one_turn_after_the_other(test_server, tmp_path):
    data = tmp_path / "chat.jsonl"
    conv = [{"role": "user", "content": "one two three"}, {"role": "assistant", "content": "four five"},
            {"role": "user", "content": "six seven"}, {"role": "assistant", "content": "eight"},
            {"role": "user", "content": "nine ten eleven twelve"}]
    data.write_text(json.dumps({"messages": conv}) + "\n" + json.dumps({"messages": conv[:1], "output_tokens": 3}) + "\n")
    ds = load_dataset(data)
    assert ds.format == "chat-jsonl" and len(ds.conversations) == 2
    opts = TrafficOptions(dataset=str(data), multi_turn=True, seed=0)
    spec = _spec(test_server, "ttft_ms=5&itl_ms=1&log=multiturn", opts, kind="chat", rate=None, concurrency=1,
                 duration=None, requests=4)
    res = run_load(spec)
    assert res.summary.requests.ok == 4
    served = _log(test_server, "multiturn")
    # one user plays whole conversations: the 3-turn one resends 1, 3 then 5 messages, in order
    three = [s for s in served if s["messages"] != 1 or len(s["tokens"]) == 3]
    sizes = [(s["messages"], len(s["tokens"])) for s in served]
    assert (1, 3) in sizes and (3, 7) in sizes and (5, 12) in sizes
    i1, i3, i5 = sizes.index((1, 3)), sizes.index((3, 7)), sizes.index((5, 12))
    assert i1 < i3 < i5 and three


def test_server_tokenize_endpoint_counts_tokens(test_server):
    spec = _spec(test_server, "ttft_ms=5&itl_ms=1&log=server-tok", TrafficOptions(input_tokens="40", tokenizer="server"),
                 rate=20, duration=0.3)
    assert spec.workload.token_basis == "server"
    run_load(spec)
    assert {len(s["tokens"]) for s in _log(test_server, "server-tok")} == {40}


@pytest.mark.parametrize(("text", "mean"), [("64", 64), ("uniform:10-30", 20), ("normal:100,10", 100)])
def test_length_specs(text, mean):
    spec = parse_length_spec(text)
    rng = random.Random(0)
    xs = [spec.sample(rng) for _ in range(2000)]
    assert statistics.fmean(xs) == pytest.approx(mean, rel=0.03) and min(xs) >= 1


def test_length_spec_from_a_file_of_observed_lengths(tmp_path):
    f = tmp_path / "lens.txt"
    f.write_text("10\n20\n30\n")
    spec = parse_length_spec(f"file:{f}")
    assert {spec.sample(random.Random(i)) for i in range(50)} == {10, 20, 30}


@pytest.mark.parametrize("text", ["0", "uniform:5-2", "normal:abc", "zipf:3", "uniform:-5", "file:/no/such/file"])
def test_bad_length_spec_is_one_sentence(text):
    with pytest.raises(BadInputError) as e:
        parse_length_spec(text)
    assert "--input-tokens" in str(e.value)


@pytest.mark.parametrize(("content", "needle"), [
    ("[{\"id\": 1}]", "conversations"),
    ("{\"prompt\": 3}\n", "prompt"),
    ("not json\n", "not JSON"),
    ("{\"prompt\": \"x\", \"output_tokens\": 0}\n", "output_tokens"),
    ("[{\"conversations\": [{\"from\": \"robot\", \"value\": \"x\"}]}]", "robot"),
])
def test_bad_dataset_is_one_sentence(tmp_path, content, needle):
    f = tmp_path / "d.json"
    f.write_text(content)
    with pytest.raises(BadInputError) as e:
        load_dataset(f)
    assert needle in str(e.value)


def test_traffic_options_that_do_not_fit_are_refused(test_server):
    base = dict(url=f"{test_server}/v1/completions", kind="completions", model="m", stream=True, prompt="hi",
                max_tokens=8, rate=1.0, ramp_to=None, duration_seconds=1.0, max_requests=None)
    for opts, needle in ((TrafficOptions(multi_turn=True), "--multi-turn"),
                         (TrafficOptions(prefix_groups=3), "--prefix-groups"),
                         (TrafficOptions(speed=2), "--replay-arrivals")):
        with pytest.raises(BadInputError, match=needle.replace("-", "\\-")):
            plan_traffic(opts, **base)
    with pytest.raises(BadInputError, match="OpenAI-compatible"):
        plan_traffic(TrafficOptions(input_tokens="8"), **{**base, "kind": "http"})
    with pytest.raises(BadInputError, match="tokenizer"):
        plan_traffic(TrafficOptions(input_tokens="8", tokenizer="/no/such/tokenizer.json"), **base)


def test_worker_processes_send_distinct_planned_requests(test_server):
    spec = _spec(test_server, "ttft_ms=2&itl_ms=1&log=shape-workers", TrafficOptions(input_tokens="24", seed=9),
                 rate=40, duration=0.5)
    res = run_load(replace(spec, workers=2))
    served = _log(test_server, "shape-workers")
    assert res.summary.requests.ok == len(served) == 20
    assert len({tuple(s["tokens"]) for s in served}) == 20  # each planned request sent once, none twice
    assert not any("sent again" in w for w in res.summary.warnings)


def test_a_run_longer_than_its_workload_says_prompts_were_resent(test_server):
    spec = _spec(test_server, "ttft_ms=2&itl_ms=1", TrafficOptions(input_tokens="8"), rate=None, concurrency=2,
                 duration=None, requests=3)
    res = run_load(replace(spec, max_requests=8))  # planned for 3, run for 8
    assert res.summary.requests.ok == 8
    assert any("8 requests from a workload of 3 distinct ones" in w for w in res.summary.warnings)
