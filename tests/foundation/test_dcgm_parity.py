"""`--metric-names dcgm` against dcgm-exporter's own default-counters.csv: every default field is
exported with the CSV's type and help, except the ones docs/metrics.md lists as missing (and says why);
MIG instances are their own series; GPM fields are absent, not zero, where the GPU has no GPM."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpulens.exporter.exposition import render_text
from gpulens.exporter.prometheus import make_registry
from gpulens.exporter.readings import LatestReadings
from gpulens.gpu import FakeBackend
from gpulens.gpu.fake import schedule_fault

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
PARITY_FLOOR = 22  # the bar: at least 22 of dcgm-exporter's default fields


def default_counters(shared_data: Path) -> dict[str, tuple[str, str]]:
    """field -> (type, help) for the uncommented lines of default-counters.csv."""
    out = {}
    for line in (shared_data / "dcgm-exporter" / "default-counters.csv").read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, kind, help_text = (p.strip() for p in line.split(",", 2))
        out[name] = (kind, help_text)
    return out


def _dcgm_text(fake: FakeBackend) -> str:
    readings = LatestReadings(host="node-a", gpus=fake.gpus())
    fake.sample()
    readings.update(fake.sample())  # the second sample: GPM is a rate between two
    return render_text(make_registry(readings, metric_names="dcgm")).decode()


def _documented_missing() -> set[str]:
    section = DOC.read_text().split("### dcgm-exporter parity", 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(DCGM_FI_[A-Z0-9_]+)` \|", section, re.M))


def test_default_fields_are_exported_with_the_csv_type_and_help(shared_data):
    csv = default_counters(shared_data)
    text = _dcgm_text(FakeBackend(gpus=2))
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", text, re.M))
    labels = set(re.findall(r'[{,]([A-Za-z_]+)="', text))
    present, wrong = set(), []
    for name, (kind, help_text) in csv.items():
        if kind == "label":
            if name in labels:
                present.add(name)
            continue
        if name not in types:
            continue
        present.add(name)
        if types[name] != kind or helps[name] != help_text:
            wrong.append((name, types[name], kind, helps[name]))
    assert wrong == []
    missing = set(csv) - present
    assert missing == _documented_missing(), "docs/metrics.md must list exactly the default fields not exported"
    assert len(present) >= PARITY_FLOOR + 1, f"{len(present)} of {len(csv)}"  # +1: the driver-version label


def test_labels_are_dcgm_exporters():
    text = _dcgm_text(FakeBackend(gpus=2))
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    s = next(x for x in fams["DCGM_FI_DEV_GPU_TEMP"].samples if x.labels["gpu"] == "1")
    assert s.labels == {"gpu": "1", "UUID": "GPU-fake-0000-0001", "pci_bus_id": "00000000:02:00.0", "device": "nvidia1",
                        "modelName": "NVIDIA H200", "Hostname": "node-a",
                        "DCGM_FI_DRIVER_VERSION": "580.159.04"}


def test_mig_instances_are_their_own_series():
    fake = FakeBackend(gpus=2)
    schedule_fault(fake, "mig:3g.71gb+1g.18gb@0s:gpu=1")
    fams = {f.name: f for f in text_string_to_metric_families(_dcgm_text(fake))}
    fb = [(s.labels["gpu"], s.labels.get("GPU_I_ID", ""), s.labels.get("GPU_I_PROFILE", ""), s.value)
          for s in fams["DCGM_FI_DEV_FB_TOTAL"].samples]
    # GPU 1 is in MIG mode: its instances only, as dcgm-exporter's default (no parent series to count twice)
    assert sorted(fb) == [("0", "", "", pytest.approx(150_754_820_096 / 2**20)),
                          ("1", "1", "3g.71gb", pytest.approx(71e9 / 2**20)),
                          ("1", "2", "1g.18gb", pytest.approx(18e9 / 2**20))]
    tensor = sorted((s.labels["gpu"], s.labels.get("GPU_I_ID", "")) for s in fams["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"].samples)
    assert tensor == [("0", ""), ("1", "1"), ("1", "2")]  # in MIG mode GPM is per instance only


def test_gpm_fields_are_absent_not_zero_without_gpm():
    fake = FakeBackend(gpus=1, model="NVIDIA A100-SXM4-80GB")
    for field in ("graphics_active_ratio", "sm_active_ratio", "sm_occupancy_ratio", "tensor_active_ratio", "dram_active_ratio"):
        fake.unsupported(0, field)  # what NvmlBackend reports where nvmlGpmQueryDeviceSupport says no
    text = _dcgm_text(fake)
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" not in text and "DCGM_FI_PROF_GR_ENGINE_ACTIVE" not in text
    assert "DCGM_FI_PROF_PCIE_TX_BYTES{" in text  # not GPM: still there


def test_a_bad_mig_profile_is_one_clear_sentence():
    from gpulens.errors import BadInputError

    with pytest.raises(BadInputError, match="MIG profile"):
        schedule_fault(FakeBackend(gpus=1), "mig:big@0s")
