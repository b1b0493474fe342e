"""The GPU catalog: lookups (names, aliases, NVML names), sources, user cards and prices."""

from __future__ import annotations

import pytest
import yaml

from gpulens.plan import UnknownGpuError, UnsupportedPrecisionError, all_gpus, find_gpu
from gpulens.plan.catalog import builtin_gpus

REQUIRED = ["T4", "L4", "A10", "A10G", "L40S", "A100-40GB", "A100-80GB", "H100-SXM", "H100-PCIe", "H200", "B200",
            "RTX-3090", "RTX-4090", "MI300X", "V100-SXM2-32GB", "V100-SXM2-16GB", "A800-80GB", "H800-SXM", "RTX-A6000"]


def test_required_cards_are_present_with_sources_and_no_prices():
    names = {g.name for g in builtin_gpus()}
    assert set(REQUIRED) <= names
    for g in builtin_gpus():
        assert g.sources and all(s.strip() for s in g.sources), g.name
        assert g.hourly_price is None and g.purchase_price is None  # prices only from the user
        assert g.memory_bytes > 0 and g.memory_bandwidth_bytes_per_second > 0
        if g.bf16_dense_flops and g.fp8_dense_flops:
            assert g.fp8_dense_flops >= g.bf16_dense_flops  # dense figures, both


@pytest.mark.parametrize("name,expected", [
    ("h200", "H200"), ("H100-SXM", "H100-SXM"), ("h100_sxm", "H100-SXM"), ("NVIDIA H200", "H200"),
    ("NVIDIA H100 80GB HBM3", "H100-SXM"), ("NVIDIA H100 PCIe", "H100-PCIe"), ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
    ("NVIDIA A100-SXM4-40GB", "A100-40GB"), ("Tesla T4", "T4"), ("NVIDIA GeForce RTX 4090", "RTX-4090"),
    ("AMD Instinct MI300X", "MI300X"), ("l40s", "L40S"),
])
def test_find_gpu_names_aliases_and_nvml_names(name, expected):
    assert find_gpu(name).name == expected


def test_h200_figures_and_mfu_views():
    g = find_gpu("h200")
    assert g.bf16_dense_flops == pytest.approx(989.5e12)
    assert g.bf16_tflops == pytest.approx(989.5)
    assert g.memory_bytes == 150_109_880_320  # what PyTorch sees on the recorded card
    assert g.memory_bandwidth_bytes_per_second == pytest.approx(4.8e12)


def test_unknown_gpu_suggests_closest_names():
    with pytest.raises(UnknownGpuError) as e:
        find_gpu("h10")
    assert "H100" in str(e.value)
    assert e.value.exit_code == 2


def test_precision_the_card_lacks():
    with pytest.raises(UnsupportedPrecisionError, match="FP8"):
        find_gpu("a100-80gb").peak_flops("fp8")
    with pytest.raises(UnsupportedPrecisionError, match="BF16"):
        find_gpu("t4").peak_flops("bf16")
    assert find_gpu("t4").peak_flops("fp16") == pytest.approx(65e12)


def test_user_cards_and_prices_from_config(isolated_plan_config):
    isolated_plan_config.write_text(yaml.safe_dump({
        "currency": "EUR",
        "prices": {"h100-sxm": 2.5, "NVIDIA H200": {"hourly": 3.0, "purchase": 30000}},
        "gpus": [{"name": "Lab-Card", "memory_gb": 32, "bandwidth_gbps": 1000, "bf16_tflops": 200}],
    }))
    assert find_gpu("H100-SXM").hourly_price == 2.5
    h200 = find_gpu("h200")
    assert (h200.hourly_price, h200.purchase_price) == (3.0, 30000)
    lab = find_gpu("lab-card")
    assert lab.user_defined and lab.bf16_dense_flops == pytest.approx(200e12)
    assert "Lab-Card" in {g.name for g in all_gpus()}
    assert find_gpu("l4").hourly_price is None


def test_broken_user_config_is_one_clear_error(isolated_plan_config):
    from gpulens.errors import BadInputError

    isolated_plan_config.write_text("gpus: [{name: x}]\n")
    with pytest.raises(BadInputError, match="memory_gb"):
        find_gpu("h200")


@pytest.mark.parametrize("name,suggested", [("h100-sxn", "H100-SXM"), ("h100-xyz", None), ("NVIDIA H100 80GB HBM3 foo", None)])
def test_near_misses_are_refused_not_prefix_matched(name, suggested):
    with pytest.raises(UnknownGpuError) as e:
        find_gpu(name)
    assert e.value.exit_code == 2
    if suggested:
        assert suggested in e.value.suggestions


def test_nvl_parts_are_their_own_entries_with_their_figures():
    h100nvl = find_gpu("NVIDIA H100 NVL")
    assert h100nvl.name == "H100-NVL" and h100nvl.memory_bytes == 95_830 << 20 and h100nvl.marketing_memory_gb == 94
    assert h100nvl.memory_bandwidth_bytes_per_second == pytest.approx(3.9e12)
    h200nvl = find_gpu("NVIDIA H200 NVL")
    assert h200nvl.name == "H200-NVL"
    assert h200nvl.bf16_dense_flops == pytest.approx(835.5e12)  # not the SXM's 989.5
    assert find_gpu("NVIDIA H200").bf16_dense_flops == pytest.approx(989.5e12)


@pytest.mark.parametrize("name", ["NVIDIA GeForce RTX 4090 Laptop GPU", "RTX 3090 Max-Q", "rtx-4090-mobile"])
def test_laptop_parts_are_refused_with_what_to_do(name):
    with pytest.raises(UnknownGpuError) as e:
        find_gpu(name)
    assert "Laptop" in e.value.hint and "plan config" in e.value.hint


@pytest.mark.parametrize("name, mib", [("t4", 15_360), ("l40s", 46_068), ("h100-sxm", 81_559), ("l4", 23_034),
                                       ("a10g", 23_028), ("a100-40gb", 40_960), ("b200", 183_359),
                                       ("a800-80gb", 81_920), ("v100-sxm2-16gb", 16_160)])
def test_capacity_is_what_nvidia_smi_prints_not_the_datasheet_size(name, mib):
    """A T4 sold as 16 GB shows 15,360 MiB in nvidia-smi; planning at 16 GiB called too much a fit."""
    g = find_gpu(name)
    assert g.memory_bytes == mib << 20 and g.memory_source == "nvidia-smi memory.total"
    assert g.marketing_memory_gb is not None  # the datasheet size stays, for the listing


def test_a_card_without_an_nvidia_smi_figure_says_its_capacity_is_the_datasheet_size():
    assert find_gpu("h100-pcie").memory_source == "datasheet size read as GiB"
    assert find_gpu("h200").memory_source == "measured"
