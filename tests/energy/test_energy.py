"""`gpulens energy`: joules per workload from NVML's energy counter, checked against a hand
computation from the recorded H200 session's raw files (docs/energy.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpulens.cli.main import main
from gpulens.data import bundled_colocation_trace, bundled_trace
from gpulens.energy import counter_joules, power_joules, workload_energy
from gpulens.pipeline.ingest import import_trace
from gpulens.store import Store


def _hand_training_joules_per_token(trace: Path) -> float:
    """The documented hand computation: the telemetry line nearest the first step's start and the
    one nearest the last step's end, energy_mj difference, over the steps' tokens."""
    steps = [json.loads(line) for line in (trace / "events.jsonl").open() if '"train_step"' in line]
    tele = [json.loads(line) for line in (trace / "telemetry.jsonl").open()]
    tele = [x for x in tele if x.get("energy_mj") is not None]
    start, end = steps[0]["t_start"], steps[-1]["t_end"]
    near = lambda t: min(tele, key=lambda x: abs(x["t"] - t))  # noqa: E731
    joules = (near(end)["energy_mj"] - near(start)["energy_mj"]) / 1000.0
    return joules / sum(s["tokens"] for s in steps)


def test_training_joules_per_token_matches_the_hand_computation(replayed_store: Path) -> None:
    with Store(replayed_store, readonly=True) as st:
        rows = workload_energy(st, job="h200-demo")
    assert [r.workload for r in rows] == ["training"]
    r = rows[0]
    hand = _hand_training_joules_per_token(bundled_trace())
    assert r.method == "energy_counter" and r.note == ""
    steps = [json.loads(line) for line in (bundled_trace() / "events.jsonl").open() if '"train_step"' in line]
    assert r.tokens == sum(s["tokens"] for s in steps) and r.steps == len(steps)
    assert r.joules_per_token == pytest.approx(hand, rel=0.02)
    assert r.joules_per_sample == pytest.approx(r.joules / r.samples)
    assert r.mean_watts == pytest.approx(r.joules / r.seconds)


def test_serving_gets_joules_per_request_and_per_generated_token(replayed_store: Path) -> None:
    with Store(replayed_store, readonly=True) as st:
        (r,) = workload_energy(st, service="h200-demo")
    assert r.workload == "serving" and r.requests == 106
    assert r.joules_per_request == pytest.approx(r.joules / 106)
    assert r.tokens == 106 * 32
    assert r.joules_per_token == pytest.approx(r.joules / r.tokens)


def test_counter_and_power_agree_on_a_constant_draw() -> None:
    t = [float(i) for i in range(11)]
    watts = [300.0] * 11
    counter = [1000.0 + 300.0 * x for x in t]
    a, b = counter_joules(t, counter, 2.5, 7.5), power_joules(t, watts, 2.5, 7.5)
    assert a is not None and b is not None
    assert a.joules == pytest.approx(1500.0) and b.joules == pytest.approx(1500.0)
    assert a.mean_watts == pytest.approx(300.0)
    assert (a.method, b.method) == ("energy_counter", "power_integral")


def test_a_counter_reset_counts_from_zero_not_negative() -> None:
    # 100 J/s; the driver reloads between t=2 and t=3 and the counter restarts near zero.
    t = [0.0, 1.0, 2.0, 3.0, 4.0]
    counter = [5000.0, 5100.0, 5200.0, 100.0, 200.0]
    got = counter_joules(t, counter, 0.0, 4.0)
    assert got is not None and got.joules == pytest.approx(400.0)


def test_a_span_no_reading_covers_has_no_figure() -> None:
    assert counter_joules([0.0, 1.0], [0.0, 10.0], 5.0, 6.0) is None
    assert power_joules([0.0], [100.0], 0.0, 1.0) is None


@pytest.fixture(scope="module")
def colocated_store(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("coloc") / "coloc.db"
    with Store(path) as s:
        import_trace(bundled_colocation_trace(), s)
    return path


def test_missing_counter_integrates_power_and_a_shared_gpu_says_so(colocated_store: Path) -> None:
    with Store(colocated_store, readonly=True) as st:
        rows = {r.workload: r for r in workload_energy(st)}
    assert set(rows) == {"training", "serving"}
    for r in rows.values():
        assert r.method == "power_integral" and "integrate the power readings" in r.note
        assert r.shared_with and "not split" in r.note
    assert rows["training"].shared_with == ["serving h200-demo"]


def test_cli_json_and_a_workload_that_is_not_there(replayed_store: Path, capsys) -> None:
    assert main(["energy", "--store", str(replayed_store), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {r["workload"] for r in out} == {"training", "serving"}
    for key in ("workload", "name", "gpu", "start", "end", "joules", "mean_watts", "tokens", "joules_per_token"):
        assert key in out[0]
    assert main(["energy", "--store", str(replayed_store), "--job", "nope"]) == 2
    assert "no records of job 'nope'" in " ".join(capsys.readouterr().err.split())


def test_cli_refuses_a_store_that_does_not_exist(tmp_path: Path, capsys) -> None:
    assert main(["energy", "--store", str(tmp_path / "none.db")]) == 2
    assert "There is no store" in capsys.readouterr().err
