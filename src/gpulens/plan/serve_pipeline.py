"""Pipeline-parallel serving (`--pp N` with `--workload infer`): N stages of a replica, each on
its own tensor-parallel group of `--tp` GPUs (GPUs per replica = tp x pp).

Memory: a stage holds layers / N of the transformer blocks and of the KV cache (vLLM
`get_pp_indices`, TensorRT-LLM "Memory usage": "each rank stores only some portion of the
weights"); the first stage also holds the input embedding, the last the final norm and the output
head. The heaviest stage is priced (the last: head + norm; with tied embeddings the first and the
last each hold the table, as vLLM's last rank builds its own ParallelLMHead from it).

Speed (vLLM pipeline parallelism, docs "Distributed inference and serving"; the stage schedule is
Megatron-LM's, Narayanan et al. 2021, section 2.2): the scheduler keeps N micro-batches in flight
(vLLM's N virtual engines, one per stage), so a batch of b sequences runs as min(b, N) micro-batches
of ceil(b / min(b, N)). One micro-batch's decode step passes every stage in turn:

    TPOT = sum of the N stage times at one micro-batch + (N - 1) stage-to-stage sends

which is the whole model's decode step at that micro-batch (the stages' shares of the weights, the
KV cache and the layers' launches add up to the whole) plus the sends. The other micro-batches
fill the other stages meanwhile, so each stage is busy at most N x one stage time per cycle, which
the cycle above never exceeds (stages taken as equal): every sequence gets one token per TPOT and

    throughput = b / TPOT.

At batch 1 this is the one-stage TPOT plus the sends (pipelining buys nothing); at a large batch
a micro-batch reads the stage's weights for b / N sequences only, so the gain over one stage at the
same batch lies between 1x (weight-read-bound) and N x (KV-read- or compute-bound). The prefill
passes the stages once for the whole batch: the one-stage prefill plus the sends of the prompt's
activations. Not modelled: uneven stages (the head on the last stage is priced in memory, not in
the cycle), the sampled tokens' broadcast back to the first stage, bubbles when micro-batches
differ in size.

A send (vLLM `send_tensor_dict(..., all_gather_group=tp_group)`): each stage hands over the
intermediate tensors of vLLM's Llama-family models, hidden_states and residual (two tensors of
tokens x hidden x 2 bytes; vllm/model_executor/models/llama.py, LlamaModel.forward returns
IntermediateTensors with both); each TP rank sends 1/tp of each to its peer on the next stage,
which all-gathers them over its TP group (`links.ring_gather_or_scatter`). A point-to-point send
is priced as one step of NCCL's tuner (`links.NCCL_PROTOCOLS`: base + one hop's latency + bytes
over the link, the faster protocol); a boundary between two nodes goes over the network (`--gpus-
per-node`, `--inter-node-gbps`), the others over the node's interconnect.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from gpulens.errors import BadInputError
from gpulens.plan.catalog import GpuSpec
from gpulens.plan.links import NCCL_PROTOCOLS, Link, collective_link, intra_node_link, ring_gather_or_scatter
from gpulens.plan.models import ModelSpec

# TGI's launcher shards only with --num-shard (tensor parallelism); transformers' generate runs one GPU
PIPELINE_RUNTIMES = ("vllm", "sglang", "trtllm")
PIPELINE_TENSORS = 2  # hidden_states and residual (vLLM's Llama-family IntermediateTensors)


def check_pipeline(m: ModelSpec, runtime: str, pp: int, *, speculative: bool) -> None:
    """Refuse a pipeline split the engines do not run: one sentence, exit 2."""
    if pp <= 1:
        return
    if runtime not in PIPELINE_RUNTIMES:
        what = "transformers' generate runs on one GPU" if runtime == "hf" else "TGI shards only by tensor parallelism (--num-shard)"
        raise BadInputError(f"--pp {pp} splits a model into pipeline stages, and {what}.",
                            hint="Use --runtime vllm, sglang or trtllm with --pp, or drop --pp (use --tp).")
    if m.num_layers % pp:
        ok = [d for d in range(2, min(m.num_layers, 64) + 1) if m.num_layers % d == 0][:6]
        # gpulens splits evenly; vLLM's VLLM_PP_LAYER_PARTITION can split unevenly, which is not modelled
        raise BadInputError(f"--pp {pp} does not split {m.name}'s {m.num_layers} layers evenly.",
                            hint=f"Use --pp {', '.join(map(str, ok)) or '1'} (degrees that divide the layers).")
    if speculative:
        raise BadInputError(f"--pp {pp} with --draft-model: speculative decoding is planned on one pipeline stage only.",
                            hint="Drop --draft-model, or drop --pp.")


def micro_batches(batch: int, pp: int) -> tuple[int, int]:
    """(micro-batches in flight, sequences in the largest): min(b, N) of ceil(b / min(b, N))."""
    count = max(1, min(batch, pp))
    return count, -(-batch // count)


def heaviest_stage_rest_params(m: ModelSpec) -> int:
    """Parameters outside the blocks on the heaviest stage: the last (head + final norm), or with
    tied embeddings the table the first and the last stage each hold."""
    rest = m.params - m.block_params
    if m.tie_word_embeddings or m.encoder:
        return rest
    return rest - m.vocab_size * m.hidden_size  # the input embedding sits on the first stage


def boundaries_across_nodes(tp: int, pp: int, gpus_per_node: int) -> int:
    """Stage boundaries whose two stages sit on different nodes (stage i on GPUs [i tp, (i+1) tp))."""
    return sum(1 for i in range(1, pp) if (i * tp) // gpus_per_node != (i * tp - 1) // gpus_per_node)


@dataclass(frozen=True)
class PipelineSends:
    """The N - 1 stage-to-stage hand-overs of one forward, one micro-batch."""

    seconds: float
    sends: int  # stage boundaries
    inter_node_sends: int  # of them, over the network
    message_bytes: float  # per boundary: the intermediate tensors, whole
    link: str  # the slowest link a boundary crosses


def _p2p_seconds(message_bytes: float, link: Link) -> float:
    """One point-to-point send, priced as one hop of NCCL's tuner with the faster protocol."""
    return min(p.base_seconds + p.step_seconds[link.kind] + message_bytes / (link.nccl_bytes_per_second * p.bandwidth_share)
               for p in NCCL_PROTOCOLS)


def pipeline_sends(tokens: int, hidden: int, act_bytes: float, tp: int, pp: int, gpu: GpuSpec, *,
                   gpus_per_node: int, inter_node_bytes_per_second: float) -> PipelineSends:
    """The sends of `tokens` tokens' intermediate tensors across the N - 1 boundaries."""
    if pp <= 1:
        return PipelineSends(0.0, 0, 0, 0.0, "")
    tensor = tokens * hidden * act_bytes
    crossing = boundaries_across_nodes(tp, pp, gpus_per_node)
    intra = intra_node_link(gpu)
    net = collective_link(gpu, gpus_per_node + 1, gpus_per_node=gpus_per_node,
                          inter_node_bytes_per_second=inter_node_bytes_per_second)
    gather = ring_gather_or_scatter(tensor, tp, gpu, gpus_per_node=gpus_per_node,
                                    inter_node_bytes_per_second=inter_node_bytes_per_second).seconds if tp > 1 else 0.0

    def boundary(link: Link) -> float:
        return PIPELINE_TENSORS * (_p2p_seconds(tensor / tp, link) + gather)

    seconds = (pp - 1 - crossing) * boundary(intra) + crossing * boundary(net)
    return PipelineSends(seconds, pp - 1, crossing, PIPELINE_TENSORS * tensor, (net if crossing else intra).name)


def stage_note(m: ModelSpec, pp: int) -> str:
    return (f"pipeline stage of {m.num_layers // pp} layers: 1/{pp} of the blocks and of the KV cache per GPU, "
            "the heaviest stage's embedding or head on top")


@dataclass(frozen=True)
class PipelineSpeed:
    """What pipelining adds to a serving speed (ServeSpeed.pipeline)."""

    stages: int
    micro_batches: int  # in flight: min(batch, stages)
    micro_batch: int  # sequences in the largest
    stages_seconds: float  # one micro-batch's decode step through every stage (the whole model's step)
    send_seconds: float  # of each decode step: the N - 1 stage-to-stage sends
    prefill_send_seconds: float  # of the prefill, likewise
    inter_node_sends: int
    link: str  # the slowest link a boundary crosses

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def pipelined_speed(m: ModelSpec, setup: Any, gpu: GpuSpec, whole: Any, step_at: Callable[[int], Any]) -> Any:
    """The module docstring's model, from the one-stage speeds serve.serving_speed gives (passed in,
    so this module does not import it back): `whole` at the full batch (its prefill) and
    `step_at(size)` at one micro-batch (its decode step)."""
    pp, b, k = setup.pipeline_parallel, setup.batch, setup.new_tokens
    count, size = micro_batches(b, pp)
    step = step_at(size) if size != b else whole
    act = 4 if setup.matmul_dtype == "fp32" else 2
    kw = {"gpus_per_node": setup.gpus_per_node, "inter_node_bytes_per_second": setup.inter_node_bytes_per_second}
    send = pipeline_sends(size * setup.step_tokens, m.hidden_size, act, setup.tensor_parallel, pp, gpu, **kw)
    pre = pipeline_sends(b * setup.prefill_tokens, m.hidden_size, act, setup.tensor_parallel, pp, gpu, **kw)
    tpot, prefill = step.tpot_seconds + send.seconds, whole.prefill_seconds + pre.seconds
    req = prefill + k * tpot
    info = PipelineSpeed(pp, count, size, step.tpot_seconds, send.seconds, pre.seconds, send.inter_node_sends, send.link)
    return replace(whole, batch=b, prefill_seconds=prefill, ttft_seconds=prefill, tpot_seconds=tpot,
                   decode_tokens_per_second=b / tpot, request_seconds=req, requests_per_second=b / req,
                   output_tokens_per_second=b * k / req, bound=step.bound,
                   tensor_parallel_seconds=step.tensor_parallel_seconds, pipeline=info)
