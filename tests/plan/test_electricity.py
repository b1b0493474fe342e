"""`gpulens plan --electricity-usd-per-kwh`: the GPUs' electricity cost from their TDP, a share of
it (--power-fraction) and the site's PUE, equal to the hand computation from the catalog's TDP and
the plan's own throughput; the assumption is printed; the shaping options refuse to be ignored."""

from __future__ import annotations

import json
import math

import pytest

from gpulens.cli.main import main


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["plan", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _tdp(capsys, gpu: str) -> float:
    rc, out, _ = _run(capsys, "gpus", "--format", "json")
    assert rc == 0
    return next(g["tdp_watts"] for g in json.loads(out) if g["name"].lower() == gpu)


def test_training_electricity_is_tdp_times_fraction_times_pue_times_price(capsys) -> None:
    tdp = _tdp(capsys, "h200")
    args = ("--model", "llama-3-8b", "--gpu", "h200", "--gpus", "8", "--zero", "3", "--grad-ckpt",
            "--electricity-usd-per-kwh", "0.12", "--power-fraction", "0.7", "--pue", "1.3")
    rc, out, _ = _run(capsys, *args, "--format", "json")
    assert rc == 0
    d = json.loads(out)
    e = d["electricity"]
    kw = 8 * tdp * 0.7 * 1.3 / 1000  # 8 GPUs x 700 W x 0.7 x PUE 1.3 = 5.096 kW
    per_hour = kw * 0.12
    per_million = per_hour / 3600 / d["speed"]["tokens_per_second"] * 1e6
    assert math.isclose(e["kilowatts"], kw) and math.isclose(e["usd_per_hour"], per_hour)
    assert math.isclose(e["usd_per_million_tokens"], per_million)
    rc, out, _ = _run(capsys, *args)
    text = " ".join(out.split())
    assert f"Electricity {kw:,.3g} kW · {per_hour:,.3f} USD/hour at 0.12 USD/kWh · {per_million:.3g} USD per million trained tokens" in text
    assert "draws 0.7 x its 700 W TDP" in text and "PUE of 1.3" in text  # the assumption, said


def test_serving_prices_the_replicas_gpus_per_output_token(capsys) -> None:
    tdp = _tdp(capsys, "h100-sxm")
    rc, out, _ = _run(capsys, "--model", "llama-3-70b", "--workload", "infer", "--gpu", "h100-sxm", "--gpus", "4",
                      "--runtime", "vllm", "--electricity-usd-per-kwh", "0.3", "--format", "json")
    assert rc == 0
    d = json.loads(out)
    e = d["electricity"]
    assert e["gpus"] == 4 and e["pue"] == 1.0 and e["power_fraction"] == 1.0
    per_hour = 4 * tdp / 1000 * 0.3
    assert math.isclose(e["usd_per_hour"], per_hour)
    assert math.isclose(e["usd_per_million_tokens"], per_hour / 3600 / d["speed"]["output_tokens_per_second"] * 1e6)


def test_no_price_no_electricity(capsys) -> None:
    rc, out, _ = _run(capsys, "--model", "llama-3-8b", "--gpu", "h200", "--format", "json")
    assert rc == 0 and json.loads(out)["electricity"] is None


@pytest.mark.parametrize(("argv", "needle"), [
    (("--pue", "1.2"), "--pue shapes the electricity cost"),
    (("--power-fraction", "0.5"), "--power-fraction shapes the electricity cost"),
    (("--electricity-usd-per-kwh", "0.1", "--pue", "0.5"), "--pue must be between 1 and 5"),
    (("--electricity-usd-per-kwh", "-1"), "--electricity-usd-per-kwh must be between"),
])
def test_bad_electricity_options_are_one_sentence_and_exit_2(capsys, argv, needle) -> None:
    rc, out, err = _run(capsys, "--model", "llama-3-8b", "--gpu", "h200", *argv)
    assert rc == 2 and needle in err and "Traceback" not in err + out
