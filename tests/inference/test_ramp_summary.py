"""`bench serve --rate A --ramp-to B` says it ramped: the summary line read "A req/s constant"."""

from __future__ import annotations

import json

from gpulens.cli.main import main


def test_a_ramp_is_said_as_a_ramp(test_server, tmp_path, capsys):
    url = f"{test_server}/v1/completions?ttft_ms=1&itl_ms=0.1"
    args = ["bench", "serve", "--url", url, "--rate", "10", "--ramp-to", "40", "--duration", "1s", "--max-tokens", "2", "--no-store"]
    assert main(args) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "10 → 40 req/s ramp (constant arrivals)" in out and "req/s constant over" not in out, out
    assert main([*args, "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["target_rate"] == 10 and d["target_ramp_to"] == 40
