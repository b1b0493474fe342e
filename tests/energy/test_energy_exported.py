"""The agent's /metrics carries each GPU's energy counter: `gpu_energy_joules_total`, typed counter,
equal to the sample's NVML total energy, and dcgm-exporter's name in mJ under --metric-names dcgm
(the series the Grafana J/token stat reads)."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpulens import FakeBackend
from gpulens.exporter.exposition import render_text
from gpulens.exporter.prometheus import LatestReadings, make_registry
from gpulens.vocab.gpu import GPU_ENERGY_JOULES_TOTAL, METRICS_BY_NAME


def _families(metric_names: str) -> tuple[dict, list]:
    now = [1000.0]
    fake = FakeBackend(gpus=2, clock=lambda: now[0])
    fake.sample()
    now[0] += 10.0
    readings = LatestReadings(host="node-a", gpus=fake.gpus())
    samples = fake.sample()  # a second sample: the counter has moved on
    readings.update(samples)
    text = render_text(make_registry(readings, metric_names=metric_names)).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}, samples


def test_energy_counter_is_exported_per_gpu_in_joules() -> None:
    fams, samples = _families("gpulens")
    fam = fams[GPU_ENERGY_JOULES_TOTAL.removesuffix("_total")]
    assert fam.type == "counter"
    got = {s.labels["gpu"]: s.value for s in fam.samples if s.name == GPU_ENERGY_JOULES_TOTAL}
    assert got == {"0": pytest.approx(samples[0].energy_joules), "1": pytest.approx(samples[1].energy_joules)}
    assert all(v > 0 for v in got.values())


def test_energy_counter_under_dcgm_names_is_millijoules() -> None:
    fams, samples = _families("dcgm")
    dcgm = METRICS_BY_NAME[GPU_ENERGY_JOULES_TOTAL].dcgm_name
    fam = fams[dcgm]
    got = {s.labels["gpu"]: s.value for s in fam.samples}
    assert got == {"0": pytest.approx(samples[0].energy_joules * 1000), "1": pytest.approx(samples[1].energy_joules * 1000)}
