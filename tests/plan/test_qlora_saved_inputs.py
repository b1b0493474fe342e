"""QLoRA: bitsandbytes' MatMul4Bit saves its input for backward whenever the input needs a
gradient, so each NF4 Linear keeps what a frozen torch Linear under LoRA drops (plan/lora.py)."""

from __future__ import annotations

import pytest

from gpulens.plan import preset
from gpulens.plan.lora import LoraSetup, layer_delta_per_token


@pytest.mark.parametrize("targets", ["all", "qv"])
def test_nf4_linears_keep_their_inputs(targets):
    m = preset("llama-2-7b")
    lora = layer_delta_per_token(m, LoraSetup("lora", 8, targets), 2)
    qlora = layer_delta_per_token(m, LoraSetup("qlora", 8, targets), 2)
    # q/k/v share the attention norm's output, gate/up the MLP norm's; down keeps the SwiGLU product;
    # o_proj's input is the attention output the attention kernel keeps anyway
    assert qlora - lora == 2 * (m.hidden_size + m.hidden_size + m.intermediate_size)
