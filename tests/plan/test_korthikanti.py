"""Megatron activation memory per layer against Korthikanti et al. 2022 (equations of section 4,
the GPT-3 175B, 530B and 1T shapes of its Table 3: s = 2048, micro-batch 1)."""

from __future__ import annotations

import pytest

from gpulens.errors import BadInputError
from gpulens.plan.megatron import MegatronShape, activation_bytes, layer_activation_items

# (name, heads a, hidden h, layers L, tensor-parallel t) from the paper's Table 3
SHAPES = [("gpt-3 175b", 96, 12288, 96, 8), ("530b", 128, 20480, 105, 8), ("1t", 160, 25600, 128, 8)]
S, B = 2048, 1


def _paper(a, h, t, mode):
    sbh = S * B * h
    return {
        "none": sbh * (34 + 5 * a * S / h),
        "tp": sbh * (10 + 24 / t + 5 * a * S / (h * t)),
        "tp+sp": sbh / t * (34 + 5 * a * S / h),
        "selective": 34 * sbh / t,
        "full": 2 * sbh,
    }[mode]


@pytest.mark.parametrize("name,a,h,layers,t", SHAPES)
def test_layer_activation_matches_the_paper(name, a, h, layers, t):
    x = MegatronShape(seq=S, micro_batch=B, hidden=h, heads=a, layers=layers)
    one = MegatronShape(seq=S, micro_batch=B, hidden=h, heads=a)
    cases = {
        "none": dict(tensor_parallel=1),
        "tp": dict(tensor_parallel=t),
        "tp+sp": dict(tensor_parallel=t, sequence_parallel=True),
        "selective": dict(tensor_parallel=t, sequence_parallel=True, recompute="selective"),
        "full": dict(tensor_parallel=t, recompute="full"),
    }
    for mode, kw in cases.items():
        got = sum(layer_activation_items(one, **kw).values())
        assert got == pytest.approx(_paper(a, h, t, mode), rel=0.05), (name, mode)
        assert activation_bytes(x, **kw) == pytest.approx(layers * got)


def test_the_papers_175b_figures():
    # "for GPT-3 175B, 5as/h = 80": the attention core outweighs the 34 of everything else
    a, h = 96, 12288
    assert 5 * a * S / h == 80
    one = MegatronShape(seq=S, micro_batch=B, hidden=h, heads=a)
    full = sum(layer_activation_items(one, tensor_parallel=8, sequence_parallel=True).values())
    selective = sum(layer_activation_items(one, tensor_parallel=8, sequence_parallel=True, recompute="selective").values())
    assert 1 - selective / full == pytest.approx(80 / 114, rel=0.01)  # selective recompute saves 70 %


def test_tensor_parallel_must_divide_heads():
    with pytest.raises(BadInputError):
        layer_activation_items(MegatronShape(S, B, 12288, 96), tensor_parallel=7)
