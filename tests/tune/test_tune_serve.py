"""`gpulens tune serve --server-cmd` against a real local ASGI server (the middleware on it) whose
latency depends on a batching knob."""

from __future__ import annotations

import json

from testlib import free_port

from gpulens.cli.main import main
from gpulens.runs import list_runs
from gpulens.store import Store
from gpulens.workload import names as N


def test_tune_serve_picks_the_batch_with_the_highest_rate_meeting_the_slo(capsys, tmp_path, server_script):
    store = tmp_path / "tune.db"
    url = f"http://127.0.0.1:{free_port()}/generate"
    # One forward pass takes 20 ms + 2 ms per request in the batch: a batch of 1 sustains about
    # 45 req/s, a batch of 4 about 140, a batch of 16 far more.
    rc = main(["tune", "serve", "--store", str(store), "--format", "json", "--url", url, "--slo", "p99_latency<=150ms",
               "--server-cmd", server_script + " --port {port} --max-batch {max_batch} --load-seconds 0.3",
               "--knob", "max_batch=4,1,16", "--rate", "30", "--duration", "0.6s", "--tolerance", "25%", "--max-probes", "5"])
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
