"""The Grafana export's energy per generated token, evaluated by Prometheus's own engine
(`promtool test rules`) over series the agent exports: the GPUs' energy counter over the tokens an
engine counted (its counter, else its per-request histogram's sum), the host picker honoured, and
dcgm-exporter's mJ brought back to joules. Each case's answer is worked out by hand in the test."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from testlib import which_or_skip

from gpulens.export.grafana import grafana_dashboard

WATTS, TOKENS_PER_SECOND = 300.0, 100.0  # so 3 J per generated token on host a
STEP_S = 60  # one sample a minute, over 20 minutes


def _expr(names: str, host: str = ".*") -> str:
    panel = next(p for p in grafana_dashboard(metric_names=names)["panels"] if p["title"] == "Inference: over the range")
    (expr,) = [t["expr"] for t in panel["targets"] if t["legendFormat"] == "energy per generated token"]
    expr = expr.replace("$__range", "10m").replace("$host", host)
    return re.sub(r"\$service\b", ".*", expr)


def _ramp(per_second: float) -> str:
    return f"0+{per_second * STEP_S:g}x20"


def _check(tmp_path: Path, series: dict[str, str], cases: list[tuple[str, float]]) -> None:
    promtool = which_or_skip("promtool")
    spec = tmp_path / "test.yml"
    spec.write_text(yaml.safe_dump({"tests": [{
        "interval": f"{STEP_S}s",
        "input_series": [{"series": s, "values": v} for s, v in series.items()],
        "promql_expr_test": [{"expr": e, "eval_time": "15m", "exp_samples": [{"labels": "{}", "value": want}]} for e, want in cases],
    }]}))
    done = subprocess.run([promtool, "test", "rules", str(spec)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_joules_per_token_from_the_engines_counter_or_its_histogram(tmp_path: Path) -> None:
    svc = '{service="chat", host="a"}'
    energy = {'gpu_energy_joules_total{gpu="0", host="a"}': _ramp(WATTS),
              'gpu_energy_joules_total{gpu="0", host="b"}': _ramp(5 * WATTS)}  # another host, another job
    counter = {f"infer_output_tokens_total{svc}": _ramp(TOKENS_PER_SECOND)}
    histogram = {f"infer_request_output_tokens_sum{svc}": _ramp(TOKENS_PER_SECOND / 2)}
    # Host a only: 300 J/s over 100 tokens/s. Every host: (300 + 1500) J/s over the same tokens.
    _check(tmp_path, energy | counter, [(_expr("gpulens", "a"), 3.0), (_expr("gpulens"), 18.0)])
    # No engine counter: the histogram's sum counts the tokens (50/s here).
    _check(tmp_path, energy | histogram, [(_expr("gpulens", "a"), 6.0)])
    # Both: the counter, not the two added (which would give 2.0).
    _check(tmp_path, energy | counter | histogram, [(_expr("gpulens", "a"), 3.0)])


def test_dcgm_names_read_millijoules_as_joules(tmp_path: Path) -> None:
    series = {'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0", Hostname="a"}': _ramp(WATTS * 1000),
              'infer_output_tokens_total{service="chat", host="a"}': _ramp(TOKENS_PER_SECOND)}
    _check(tmp_path, series, [(_expr("dcgm", "a"), 3.0)])


def test_training_has_no_prometheus_energy_per_token() -> None:
    """Training's tokens reach Prometheus only as a tokens-per-second gauge: no count to divide by."""
    panel = next(p for p in grafana_dashboard()["panels"] if p["title"] == "Training: over the range")
    assert not [t for t in panel["targets"] if "energy" in t["expr"]]


@pytest.mark.parametrize("names", ["gpulens", "dcgm"])
def test_the_stat_is_shown_in_joules_per_token(names: str) -> None:
    panel = next(p for p in grafana_dashboard(metric_names=names)["panels"] if p["title"] == "Inference: over the range")
    override = next(o for o in panel["fieldConfig"]["overrides"] if o["matcher"]["options"] == "energy per generated token")
    assert override["properties"][0]["value"] == "short"
