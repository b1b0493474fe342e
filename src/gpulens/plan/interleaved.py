"""The interleaved 1F1B pipeline schedule (`--virtual-stages V`): each of the p pipeline stages holds
V model chunks of L / (p V) layers instead of one chunk of L / p (Narayanan et al. 2021, "Efficient
Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", section 2.2.2).

- Bubble: the p - 1 warm-up / cool-down slots each last one chunk's forward + backward, 1/V of a
  stage's, so the bubble time over the ideal compute time is (p - 1) / (V m) instead of (p - 1) / m
  (m = micro-batches per step per pipeline: --grad-accum here); a step is m + (p - 1) / V
  micro-batch slots.
- Communication: "the amount of communication also increases by v" (same section): every
  micro-batch crosses V times as many stage boundaries, each way.
- Memory: the first stage keeps what Megatron-LM's interleaved schedule has in flight when its first
  backward runs: num_warmup_microbatches = 2 (p - rank - 1) + (V - 1) p chunk-micro-batches, plus the
  one whose forward precedes the first backward (NVIDIA/Megatron-LM
  megatron/core/pipeline_parallel/schedules.py, forward_backward_pipelining_with_interleaving), capped
  at all V m of them; on rank 0 that is p V + p - 1 chunks of L / (p V) layers = L (1 + (p - 1) / (p V))
  layers, the factor Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
  Models", section 4.2.3) give for the interleaved schedule (their m is the number of interleaving
  stages, our V). Plain 1F1B (V = 1) keeps min(p, m) micro-batches of L / p layers = L.
- Megatron's requirements: the layers split into p V equal chunks, and the number of micro-batches
  is a multiple of p ("number of microbatches is not divisible by pipeline-parallel size when using
  interleaved schedule", the same file, Megatron-Core 0.7).
"""

from __future__ import annotations

from gpulens.errors import BadInputError


def check_schedule(virtual_stages: int, pipeline_parallel: int, micro_batches: int) -> None:
    """Refuse an interleaved schedule Megatron-LM would not run (one sentence, exit 2)."""
    v, p, m = virtual_stages, pipeline_parallel, micro_batches
    if v < 1:
        raise BadInputError(f"--virtual-stages must be at least 1, not {v}.",
                            hint="Pass --virtual-stages 1 (plain 1F1B) or 2 or more (interleaved).")
    if v > 1 and p < 2:
        raise BadInputError(f"--virtual-stages {v} interleaves model chunks across pipeline stages, and --pp is {p}.",
                            hint="Add --pp 2 or more, or drop --virtual-stages.")
    if v > 1 and m % p:
        raise BadInputError(f"The interleaved schedule needs the micro-batches per step (--grad-accum {m}) to be a "
                            f"multiple of --pp {p} (Megatron-LM's rule).",
                            hint=f"Pass --grad-accum {p * max(1, -(-m // p))}, or drop --virtual-stages.")


def check_layers(num_layers: int, pipeline_parallel: int, virtual_stages: int, model_name: str) -> None:
    """Megatron-LM splits the layers into p x V equal model chunks."""
    chunks = pipeline_parallel * virtual_stages
    if virtual_stages > 1 and num_layers % chunks:
        raise BadInputError(f"--pp {pipeline_parallel} x --virtual-stages {virtual_stages} = {chunks} model chunks do not "
                            f"split {model_name}'s {num_layers} layers evenly.",
                            hint="Pick degrees whose product divides the number of layers.")


def bubble_slots(pipeline_parallel: int, virtual_stages: int = 1) -> float:
    """Micro-batch slots (one stage's forward + backward of one micro-batch) the first stage waits."""
    return (pipeline_parallel - 1) / virtual_stages


def bubble_over_compute_ratio(pipeline_parallel: int, virtual_stages: int, micro_batches: int) -> float:
    """The paper's bubble time fraction: bubble time / ideal compute time = (p - 1) / (V m)."""
    return bubble_slots(pipeline_parallel, virtual_stages) / micro_batches


def first_stage_layers_in_flight(num_layers: int, pipeline_parallel: int, virtual_stages: int,
                                 micro_batches: int) -> float:
    """Layers' worth of one micro-batch's activations the first stage holds at its peak."""
    p, v, m = pipeline_parallel, virtual_stages, micro_batches
    if v == 1:
        return num_layers / p * min(p, m)
    chunks = (m * v) if m == p else min(2 * (p - 1) + (v - 1) * p + 1, m * v)
    return num_layers / (p * v) * chunks


def last_stage_layers_in_flight(num_layers: int, pipeline_parallel: int, virtual_stages: int,
                                micro_batches: int) -> float:
    """The same on the last stage when it computes the loss: under 1F1B one micro-batch of L / p
    layers; interleaved, (V - 1) p warm-up chunks and the current one (rank p - 1 in the same code)."""
    p, v, m = pipeline_parallel, virtual_stages, micro_batches
    if v == 1:
        return num_layers / p
    chunks = (m * v) if m == p else min((v - 1) * p + 1, m * v)
    return num_layers / (p * v) * chunks
