"""`gpulens tune serve --server-cmd` against a real local ASGI server (the middleware on it) whose
latency depends on a batching knob.

The server's times are twice the example's defaults (a 40 ms forward pass + 4 ms a request), the
SLO 300 ms, the probes 1.2 s at rates from 15 req/s: the same sweeps as 20 ms + 2 ms, 150 ms, 0.6 s
from 30 req/s, scaled in time, but a loaded runner must now hold a request ~200 ms, not ~100, to
fail a probe below capacity and flip a verdict."""

from __future__ import annotations

import json

from testlib import free_port, wait_http

from gpulens.cli.main import main
from gpulens.runs import list_runs
from gpulens.store import Store
from gpulens.vocab import names as N

SLOWER = "--base-ms 40 --per-item-ms 4"  # twice the example server's 20 ms + 2 ms a request


def test_tune_serve_picks_the_batch_with_the_highest_rate_meeting_the_slo(capsys, tmp_path, server_script):
    store = tmp_path / "tune.db"
    url = f"http://127.0.0.1:{free_port()}/generate"
    # One forward pass takes 40 ms + 4 ms per request in the batch: a batch of 1 sustains about
    # 22 req/s, a batch of 4 about 70, a batch of 16 far more.
    html = tmp_path / "serve.html"
    rc = main(["tune", "serve", "--store", str(store), "--format", "json", "--html", str(html), "--url", url, "--slo", "p99_latency<=300ms",
               "--server-cmd", server_script + f" --port {{port}} --max-batch {{max_batch}} --load-seconds 0.3 {SLOWER}",
               "--knob", "max_batch=4,1,16", "--rate", "15", "--duration", "1.2s", "--tolerance", "25%", "--max-probes", "5"])
    out = capsys.readouterr().out
    assert rc == 0, out
    r = json.loads(out)
    assert r["baseline"]["knobs"] == {"max_batch": "4"}
    one, sixteen = r["trials"]
    assert one["changed"] == {"max_batch": "1"} and one["verdict"] == "rolled_back"
    assert sixteen["changed"] == {"max_batch": "16"} and sixteen["verdict"] == "kept"
    assert r["best"]["knobs"] == {"max_batch": "16"}
    assert r["best"]["requests_per_second"] > r["baseline"]["requests_per_second"] > one["requests_per_second"]
    # The capacity brackets do not overlap, so the speed-up's interval lies above 1.
    assert r["best"]["ci"][0] > 1
    for t in (r["baseline"], *r["trials"]):
        assert t["cold_start_seconds"] >= 0.3  # the server answers 503 while it "loads"
    page = html.read_text()
    assert "cold start" in page and "max_batch=16" in page
    assert "--max-batch 16" in r["reproduce"]["best"] and "--max-batch 4" in r["reproduce"]["baseline"]
    with Store(store) as s:
        assert len(list_runs(s, kind="tune-serve")) == 3
        # The middleware on each server wrote its requests to the tune's store.
        assert s.series(N.INFER_LATENCY_SECONDS, {"service": "batching-example"})


def test_tune_serve_without_server_cmd_only_takes_client_knobs(capsys, tmp_path):
    rc = main(["tune", "serve", "--store", str(tmp_path / "s.db"), "--url", "http://127.0.0.1:9/x", "--slo", "p99_latency<=1s",
               "--knob", "max_num_seqs=64,128"])
    assert rc == 2
    assert "only the client's knobs" in capsys.readouterr().err


def test_a_server_that_cannot_be_reached_is_exit_3_in_one_sentence(capsys, tmp_path):
    """An outside system, not the user's input (docs/tune.md); bench serve says the same with 3."""
    rc = main(["tune", "serve", "--store", str(tmp_path / "s.db"), "--url", f"http://127.0.0.1:{free_port()}/x",
               "--slo", "p99_latency<=1s", "--knob", "max_connections=8,32", "--yes"])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 3, err
    assert "could not be reached" in err and ".." not in err and "Traceback" not in err


def test_tune_serve_without_server_cmd_tunes_the_clients_connection_limit(capsys, tmp_path, server_script):
    import shlex
    import subprocess

    port = free_port()
    server = subprocess.Popen([*shlex.split(server_script), "--port", str(port), "--max-batch", "16", "--load-seconds", "0",
                               *shlex.split(SLOWER)],
                              env={**__import__("os").environ, "GPULENS_STORE": str(tmp_path / "server.db")})
    try:
        wait_http(f"http://127.0.0.1:{port}/generate", server, timeout=60, interval=0.1, what="the example server")
        # One connection serializes the requests, so the server never gets to batch them.
        rc = main(["tune", "serve", "--store", str(tmp_path / "tune.db"), "--format", "json",
                   "--url", f"http://127.0.0.1:{port}/generate", "--slo", "p99_latency<=300ms",
                   "--knob", "max_connections=1,64", "--rate", "15", "--duration", "1.2s", "--tolerance", "25%",
                   "--max-probes", "5"])
        out = capsys.readouterr().out
        assert rc == 0, out
        r = json.loads(out)
        (trial,) = r["trials"]
        assert trial["changed"] == {"max_connections": "64"} and trial["verdict"] == "kept", trial["reason"]
        assert "--max-connections 64" in r["reproduce"]["best"] and "cold_start_seconds" not in trial
    finally:
        server.terminate()
        server.wait(10)


def test_the_stream_knob_rewrites_an_openai_body():
    from gpulens.bench.serve import LoadSpec, Target, openai_body
    from gpulens.tune.serve import _client_load

    body = openai_body("completions", model="m", prompt="p", max_tokens=4, stream=True)
    base = LoadSpec(Target("http://127.0.0.1:1/v1/completions", "POST", body, kind="completions"), rate=1)
    off = _client_load(base, {"stream": "false", "max_connections": "8"})
    assert not off.target.stream and json.loads(off.target.body)["stream"] is False
    assert "stream_options" not in json.loads(off.target.body) and off.max_connections == 8


def test_tune_serve_beginner_mode_proposes_the_batching_limit_written_in_the_server_command(capsys, tmp_path, server_script):
    url = f"http://127.0.0.1:{free_port()}/generate"
    rc = main(["tune", "serve", "--store", str(tmp_path / "tune.db"), "--format", "json", "--yes", "--url", url,
               "--slo", "p99_latency<=300ms",
               "--server-cmd", server_script + f" --port {{port}} --max-batch {{max_batch=2}} --load-seconds 0 {SLOWER}",
               "--rate", "15", "--duration", "1.2s", "--tolerance", "25%", "--max-probes", "5"])
    out = capsys.readouterr().out
    assert rc == 0, out
    r = json.loads(out)
    assert r["baseline"]["knobs"] == {"max_batch": "2"}
    assert any(n.startswith("beginner mode: proposed max_batch=2,4,8,1") for n in r["notes"])
    tried = [t["changed"]["max_batch"] for t in r["trials"]]
    assert tried == ["4", "8", "1"]
    assert r["trials"][0]["verdict"] == "kept"  # about 40 req/s with batches of 2, about 70 with 4
    assert r["trials"][-1]["verdict"] == "rolled_back"  # a batch of one sustains about 22
    assert r["best"]["knobs"]["max_batch"] in ("4", "8")


def test_serving_proposals_go_smaller_first_when_memory_is_short():
    from gpulens.tune.knobs import propose_serving

    assert propose_serving("max_num_seqs", "256").values == ("256", "512", "1024", "128")
    assert propose_serving("max_num_seqs", "256", ["memory_headroom"]).values == ("256", "128", "512", "1024")
    assert propose_serving("max_num_seqs", "1").values == ("1", "2", "4")
    assert propose_serving("temperature", "1") is None
    # the engine's token budget per step and its KV-cache memory share (issue 26: not only batch limits)
    assert propose_serving("max_num_batched_tokens", "8192").values == ("8192", "16384", "32768", "4096")
    assert propose_serving("gpu_memory_utilization", "0.9").values == ("0.9", "0.95", "0.8")
    assert propose_serving("mem_fraction_static", "0.9", ["memory_headroom"]).values == ("0.9", "0.8", "0.95")
    assert propose_serving("cuda_memory_fraction", "0.95").values == ("0.95", "0.85")
    assert propose_serving("gpu_memory_utilization", "0.5").values == ("0.5", "0.55")
    assert propose_serving("gpu_memory_utilization", "1.5") is None
    assert propose_serving("gpu_memory_utilization", "most") is None


def test_a_server_that_dies_under_load_fails_its_trial_and_is_rolled_back(capsys, tmp_path, server_script):
    url = f"http://127.0.0.1:{free_port()}/generate"
    rc = main(["tune", "serve", "--store", str(tmp_path / "tune.db"), "--format", "json", "--url", url,
               "--slo", "p99_latency<=150ms",
               "--server-cmd", server_script + " --port {port} --max-batch {max_batch} --load-seconds 0 --crash-above-batch 6",
               "--knob", "max_batch=4,16", "--rate", "30", "--duration", "0.6s", "--tolerance", "25%", "--max-probes", "5"])
    out = capsys.readouterr().out
    assert rc == 0, out
    r = json.loads(out)
    (trial,) = r["trials"]
    assert trial["verdict"] == "failed"
    assert "the server exited with code 1" in trial["reason"] and "CUDA out of memory" in trial["reason"]
    assert "rolled back to max_batch=4" in trial["reason"]
    assert r["best"]["knobs"] == {"max_batch": "4"}
