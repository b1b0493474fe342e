"""Expert parallelism (`--ep N`) for MoE training, inside data parallelism.

Layout (GShard, Lepikhin et al. 2021, section 2.2; Switch Transformer, Fedus et al. 2022, section
2.2; Megatron-Core MoE docs, "Expert Parallelism"; DeepSpeed-MoE's `ep_size`): the --gpus data-
parallel ranks are cut into groups of N consecutive ranks. Each GPU of a group holds E/N of the E
experts of every MoE layer, with their gradients and optimizer states; the attention, norms,
routers, shared experts, embedding and output head are replicated on every GPU as under plain
data parallelism. Gradients: the replicated parameters' are reduced over all dp GPUs; an expert's
over the GPUs that hold the same expert, the expert-data-parallel group of dp/N GPUs (one per EP
group: `expert_data_parallel` in Megatron-Core, the "expert data parallel group" of DeepSpeed-MoE).
ZeRO stage 1/2 shard each part over its own gradient group: the replicated parameters over dp,
the experts over dp/N (DeepSpeed-MoE partitions expert parameters over the expert-data-parallel
group). ZeRO-3 is refused: DeepSpeed's engine asserts "MoE not supported with Stage 3"
(deepspeed/runtime/engine.py, `_configure_zero_optimizer`).

Per MoE layer and micro-batch, each GPU runs two all-to-alls in the forward (dispatch the routed
tokens to their experts' GPUs, combine the outputs back) and two in the backward (their
gradients), each moving tokens x top-k x hidden x activation bytes x capacity factor per GPU
(full recomputation runs the forward's two again). The capacity factor is 1.0: dropless routing,
every routed token computed (Megatron-Core's default, `--moe-expert-capacity-factor` unset), with
the experts' load assumed balanced, so each GPU computes tokens x top-k expert rows as without
EP: the FLOPs and the saved activations per GPU are unchanged. The all-to-alls are not overlapped
with compute (Megatron-Core can overlap them with `--overlap-moe-expert-parallel-comm`; not
modelled) and priced by `links.all_to_all`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpulens.errors import BadInputError
from gpulens.plan.catalog import GpuSpec
from gpulens.plan.links import all_to_all
from gpulens.plan.models import ModelSpec
from gpulens.plan.zero import ZeroStates, zero_states

CAPACITY_FACTOR = 1.0  # dropless (Megatron-Core's default); Switch Transformer trains at 1.0-1.25 (section 2.2)


def all_to_alls_per_layer(grad_ckpt: bool) -> int:
    """Dispatch + combine in the forward and in the backward; full recomputation reruns the forward's."""
    return 6 if grad_ckpt else 4


def check_expert_parallel(m: ModelSpec, ep: int, *, data_parallel: int, zero_stage: int, megatron: bool,
                          lora: bool) -> None:
    """One sentence (exit 2) for each --ep that is not meaningful."""
    if ep < 1:
        raise BadInputError(f"--ep must be at least 1, not {ep}.", hint="Pass --ep 1 (no expert parallelism) or more.")
    if ep == 1:
        return
    if not m.is_moe:
        raise BadInputError(f"--ep splits a MoE's experts over GPUs, and {m.name} is a dense model.",
                            hint="Drop --ep, or plan a MoE (e.g. --model mixtral-8x7b).")
    if megatron:
        raise BadInputError("--ep is planned inside data parallelism; with --tp/--pp/--cp it is not modelled.",
                            hint="Drop --tp/--pp/--cp and plan the MoE with --gpus, --zero and --ep.")
    if lora:
        raise BadInputError("LoRA is planned with plain data parallelism; --ep with LoRA is not modelled.",
                            hint="Drop --ep for LoRA.")
    if m.num_experts % ep:
        raise BadInputError(f"--ep {ep} does not divide {m.name}'s {m.num_experts} experts.",
                            hint="Pick an --ep that divides the number of experts.")
    if data_parallel % ep:
        raise BadInputError(f"--ep {ep} does not divide the {data_parallel} data-parallel GPUs.",
                            hint="Pick an --ep that divides --gpus.")
    if zero_stage >= 3:
        raise BadInputError("--ep with --zero 3 is not modelled: DeepSpeed refuses MoE under ZeRO-3 ('MoE not "
                            "supported with Stage 3').", hint="Use --zero 1 or 2 with --ep.")


@dataclass(frozen=True)
class ExpertSplit:
    """The parameters an EP layout splits, and the groups each part's gradients are reduced over."""

    expert_params: int  # every expert of every MoE layer (the whole model)
    replicated_params: int  # the rest: attention, norms, routers, shared experts, embedding, head
    expert_parallel: int
    data_parallel: int

    @property
    def expert_params_per_gpu(self) -> float:
        return self.expert_params / self.expert_parallel

    @property
    def expert_data_parallel(self) -> int:
        """The GPUs holding the same experts: their gradients are reduced (and ZeRO-sharded) over these."""
        return self.data_parallel // self.expert_parallel

    def to_dict(self) -> dict[str, Any]:
        return {"expert_parallel": self.expert_parallel, "expert_data_parallel": self.expert_data_parallel,
                "expert_params": self.expert_params, "expert_params_per_gpu": self.expert_params_per_gpu,
                "replicated_params": self.replicated_params, "capacity_factor": CAPACITY_FACTOR}


def expert_split(m: ModelSpec, ep: int, data_parallel: int) -> ExpertSplit:
    experts = m.moe_layers * m.expert_params_per_layer()
    return ExpertSplit(experts, m.params - experts, ep, data_parallel)


def add_states(a: ZeroStates, b: ZeroStates) -> ZeroStates:
    return ZeroStates(weights=a.weights + b.weights, gradients=a.gradients + b.gradients,
                      optimizer_states=a.optimizer_states + b.optimizer_states,
                      fp32_gradient_partition=a.fp32_gradient_partition + b.fp32_gradient_partition,
                      gathered_largest_module=a.gathered_largest_module + b.gathered_largest_module,
                      gradients_freed_at_step=a.gradients_freed_at_step, layout=a.layout)


def expert_parallel_states(split: ExpertSplit, *, stage: int, layout: str, weight_bytes: int,
                           state_bytes_per_param: float, amp: bool) -> tuple[ZeroStates, ZeroStates]:
    """(replicated part, this GPU's experts): each sharded by ZeRO over its own gradient group."""
    kw = dict(stage=stage, layout=layout, weight_bytes=weight_bytes, state_bytes_per_param=state_bytes_per_param, amp=amp)
    rep = zero_states(split.replicated_params, gpus=split.data_parallel, **kw)  # type: ignore[arg-type]
    exp = zero_states(split.expert_params_per_gpu, gpus=split.expert_data_parallel, **kw)  # type: ignore[arg-type]
    return rep, exp


def partition_params(m: ModelSpec, *, ep: int, data_parallel: int, zero_stage: int) -> float:
    """Parameters whose optimizer step one GPU runs: its share of the replicated parameters and of
    its own experts (ZeRO >= 1 shards each over its gradient group), or all it holds."""
    if ep == 1:
        return m.params / (data_parallel if zero_stage >= 1 and data_parallel > 1 else 1)
    s = expert_split(m, ep, data_parallel)
    rep = s.replicated_params / (data_parallel if zero_stage >= 1 else 1)
    exp = s.expert_params_per_gpu / (s.expert_data_parallel if zero_stage >= 1 else 1)
    return rep + exp


def local_linear_params(m: ModelSpec, ep: int) -> int:
    """Linear parameters one GPU holds (what autocast caches a 16-bit copy of)."""
    if ep == 1:
        return m.linear_params
    experts = m.moe_layers * m.expert_params_per_layer()
    return int(m.linear_params - experts + experts / ep)


def gradient_ring_seconds(split: ExpertSplit, bytes_per_gradient: float, bus_bytes_per_second: float) -> float:
    """The gradient all-reduces: the replicated part's over dp, the experts' over dp/N (a group of
    one reduces nothing), as the data-parallel ring's bandwidth term (speed.py)."""
    dp, edp = split.data_parallel, split.expert_data_parallel
    rep = 2 * (dp - 1) / dp * split.replicated_params * bytes_per_gradient
    exp = 2 * (edp - 1) / edp * split.expert_params_per_gpu * bytes_per_gradient
    return (rep + exp) / bus_bytes_per_second


@dataclass(frozen=True)
class AllToAllTime:
    seconds_per_micro_batch: float  # every all-to-all of every MoE layer, one micro-batch, one GPU
    one_seconds: float  # one all-to-all
    buffer_bytes: float  # what each GPU holds for one all-to-all (it sends (N - 1)/N of it)
    count: int  # all-to-alls per micro-batch
    link: str


def all_to_all_time(m: ModelSpec, gpu: GpuSpec, *, ep: int, tokens: int, activation_bytes: int, grad_ckpt: bool,
                    gpus_per_node: int, inter_node_bytes_per_second: float) -> AllToAllTime:
    buffer = tokens * m.experts_per_token * m.hidden_size * activation_bytes * CAPACITY_FACTOR
    one = all_to_all(buffer, ep, gpu, gpus_per_node=gpus_per_node, inter_node_bytes_per_second=inter_node_bytes_per_second)
    count = m.moe_layers * all_to_alls_per_layer(grad_ckpt)
    return AllToAllTime(count * one.seconds, one.seconds, buffer, count, one.link.name)


def expert_parallel_memory(m: ModelSpec, ep: int, data_parallel: int, *, stage: int, layout: str, weight_bytes: int,
                           state_bytes_per_param: float, amp: bool) -> tuple[ZeroStates, dict[str, Any], int, str]:
    """(model states of one GPU, the figures the plan shows, its Linear parameters, a note)."""
    split = expert_split(m, ep, data_parallel)
    rep, exp = expert_parallel_states(split, stage=stage, layout=layout, weight_bytes=weight_bytes,
                                      state_bytes_per_param=state_bytes_per_param, amp=amp)
    figures = split.to_dict() | {"expert_weights_bytes": int(exp.weights), "expert_gradients_bytes": int(exp.gradients),
                                 "expert_optimizer_states_bytes": int(exp.optimizer_states),
                                 "experts_per_gpu": m.num_experts // ep, "num_experts": m.num_experts}
    note = (f"Expert parallelism {ep}: each GPU holds {m.num_experts // ep} of {m.num_experts} experts per MoE layer; "
            f"expert gradients reduced over {split.expert_data_parallel} GPU(s), the rest over {data_parallel}; "
            f"balanced dropless routing (capacity factor {CAPACITY_FACTOR:g}), so activations as without EP")
    return add_states(rep, exp), figures, local_linear_params(m, ep), note
