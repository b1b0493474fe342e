"""What a Megatron-LM training step spends beyond the evenly spread FLOPs and traffic of the speed
model (plan/speed.py): the output layer on the last pipeline stage and the pace it sets.

Output layer on the last stage. Megatron-LM builds the word embedding on the first pipeline stage
(`pre_process`) and the output layer and the loss on the last (`post_process`:
`GPTModel.post_language_model_processing`, `parallel_lm_logits` then the vocab-parallel cross-entropy;
NVIDIA/Megatron-LM megatron/model/gpt_model.py at de7dc40f (the sc21 scripts, Narayanan et al.
2021) and d898a899 (Korthikanti et al. 2022)). The logit GEMM is split over the vocabulary across
the tensor-parallel group (1/t each) and lies outside the checkpointed transformer layers, so full
recomputation never runs it again: 2 h V FLOPs per token forward, 4 h V backward (Narayanan et al.
2021, appendix: "6BshV FLOPs in total" for the logit layer). With interleaved stages the head is the
last model chunk of the last device, which still runs all of its chunks one after another, so its
work per micro-batch is its layers plus the head either way.

1F1B (and its interleaved form) runs at its slowest stage's pace (Narayanan et al. 2021, 2.2: each
stage alternates one forward and one backward, and every send blocks on its receiver: the
p2p_communication.py of both commits waits on each batch_isend_irecv). The last stage, the
heaviest, never idles once its first micro-batch arrives: its neighbour's backward plus next forward
take less than the last stage's forward plus backward. So a step is the first micro-batch's forward
through the p - 1 other stages, m micro-batches at the last stage's pace, and the last backward
through the p - 1 other stages again: m slots at the last stage's time and the bubble's (p - 1) / V
slots at the other stages' time. The first stage's embedding lookup is a gather, not a GEMM, and is
not priced.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpulens.plan.activations import _loss_bytes
from gpulens.plan.catalog import GpuSpec
from gpulens.plan.links import ring_gather_or_scatter
from gpulens.plan.memory import TrainSetup
from gpulens.plan.models import ModelSpec


@dataclass(frozen=True)
class OutputLayerSeconds:
    """Per micro-batch, on one GPU: the output layer's GEMMs and the loss's memory traffic as the
    last stage runs them, and the share the evenly spread speed model already put on every GPU."""

    last_stage_compute_seconds: float
    last_stage_memory_seconds: float
    spread_compute_seconds: float
    spread_memory_seconds: float

    @property
    def last_stage_seconds(self) -> float:
        return self.last_stage_compute_seconds + self.last_stage_memory_seconds

    @property
    def spread_seconds(self) -> float:
        return self.spread_compute_seconds + self.spread_memory_seconds


def output_layer_seconds(m: ModelSpec, setup: TrainSetup, precision: str, *, matmul_flops_per_second: float,
                         bandwidth_bytes_per_second: float) -> OutputLayerSeconds:
    """The output layer of a Megatron run (`setup.megatron`): on the last stage, 6 h V FLOPs per
    token (4 h V when a frozen base computes no weight gradient) at the matmul rate and the loss's
    3 passes over its tensors (as speed.training_speed counts them), both never recomputed, split
    over the tensor- and context-parallel ranks; spread, what training_speed counted for it: the
    same FLOPs in train_flops_per_token (which never recomputes the head either) and the loss
    traffic (x 1.5 under full recomputation), divided over all t x p x cp GPUs."""
    tokens = setup.micro_batch * setup.seq_len
    hv = m.hidden_size * m.vocab_size
    no_wgrad = 2 if setup.lora is not None else 0  # speed.training_speed: 2 N fewer with a frozen base
    per_hv = 6 - no_wgrad  # FLOPs per token per h x V entry
    loss = 3 * _loss_bytes(m, precision, tokens, setup.loss)
    t, cp, mp = setup.tensor_parallel, setup.context_parallel, setup.model_parallel
    flops_s = hv * tokens / matmul_flops_per_second
    loss_s = loss / bandwidth_bytes_per_second
    return OutputLayerSeconds(
        last_stage_compute_seconds=per_hv * flops_s / t / cp,
        last_stage_memory_seconds=loss_s / t / cp,
        spread_compute_seconds=per_hv * flops_s / mp / cp,
        spread_memory_seconds=loss_s * (1.5 if setup.grad_ckpt else 1.0) / mp / cp,
    )


def pipeline_step_seconds(per_micro_seconds: float, head: OutputLayerSeconds | None, micro_batches: int,
                          bubble_slots: float) -> tuple[float, float, float]:
    """(step time of the micro-batch slots, its compute part over the spread model's, its memory
    part over it): m slots at the last stage's pace, the bubble at the other stages' (module
    docstring). Without a head (not a Megatron run) every slot takes `per_micro_seconds`."""
    slots = micro_batches + bubble_slots
    if head is None:
        return slots * per_micro_seconds, 0.0, 0.0
    d_compute = micro_batches * (head.last_stage_compute_seconds - head.spread_compute_seconds) \
        - bubble_slots * head.spread_compute_seconds
    d_memory = micro_batches * (head.last_stage_memory_seconds - head.spread_memory_seconds) \
        - bubble_slots * head.spread_memory_seconds
    return slots * per_micro_seconds + d_compute + d_memory, d_compute, d_memory


def scatter_gather_p2p_seconds(message_bytes: float, setup: TrainSetup, gpu: GpuSpec,
                               link_bytes_per_second: float) -> float:
    """One stage-to-stage send of a `message_bytes` activation (or its gradient) on one GPU, as
    Megatron-LM sends it without sequence parallelism: split into t chunks, each TP rank sends its
    1/t over its own link (its own NIC across nodes), and the receivers all-gather the chunks over
    the TP group (`--scatter-gather-tensors-in-pipeline`, on by default: `_communicate` in
    megatron/p2p_communication.py, `split_tensor_into_1d_equal_chunks` then `gather_split_1d_tensor`,
    at de7dc40f and d898a899; Narayanan et al. 2021, 4.1: each chunk "using the rank's own
    InfiniBand card", then "an all-gather over NVLink"). Under sequence parallelism each rank
    already holds s/t of the sequence and sends that, with no gather (d898a899 applies the
    optimisation only `if ... not args.sequence_parallel`)."""
    t = setup.tensor_parallel
    if setup.sequence_parallel or t <= 1:
        return message_bytes / t / link_bytes_per_second
    gather = ring_gather_or_scatter(message_bytes, t, gpu, gpus_per_node=setup.gpus_per_node,
                                    inter_node_bytes_per_second=setup.inter_node_bytes_per_second)
    return message_bytes / t / link_bytes_per_second + gather.seconds
