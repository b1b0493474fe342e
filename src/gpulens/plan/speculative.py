"""Speculative decoding with a draft model (Leviathan, Kalman, Matias 2023, "Fast Inference from
Transformers via Speculative Decoding", ICML; arXiv 2211.17192).

Each step the draft model proposes K tokens (K of its own decode steps), and the target model
scores all of them in one forward of K + 1 positions per sequence (the K guesses and the position
after them). Each guess is accepted with probability alpha, independently (the paper's
simplifying assumption, its Section 3.1), and the first rejection ends the run; the target's own
token at that position comes free. The number of tokens one step yields per sequence is then
(Eq. 1, Theorem 3.8):

    E = (1 - alpha^(K + 1)) / (1 - alpha)

and the time per output token is (K x draft decode step + one verification step) / E.

Both steps are priced by `serve.serving_speed`, not by constants: the draft's decode step is the
draft model's own decode step at the same batch; the verification step is the target's decode step
with K + 1 tokens per sequence (`ServeSetup.step_tokens`): it reads the weights and the KV cache
once, as one decode step does, and computes (K + 1) x batch tokens. At small batch the step is
memory-bound and costs about one decode step, so speculation speeds decoding up by nearly E / (1 +
K x draft/target); at large batch the (K + 1) x batch tokens make it compute-bound, it costs up to
K + 1 decode steps, and speculation slows decoding (the paper's Section 3.4 assumes spare compute).

Memory: the draft's weights and its KV cache share the GPUs with the target's (vLLM splits its KV
blocks between the two models, the same number of blocks each), and each sequence keeps K
lookahead slots for the guesses.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from gpulens.errors import BadInputError
from gpulens.plan.models import ModelSpec

if TYPE_CHECKING:
    from gpulens.plan.catalog import GpuSpec
    from gpulens.plan.serve import ServeSetup, ServeSpeed
    from gpulens.plan.speed import Efficiency

DEFAULT_SPECULATIVE_TOKENS = 4  # K (the paper's gamma); vLLM's examples use num_speculative_tokens 5, SGLang 4
SPECULATIVE_RUNTIMES = ("vllm", "sglang")  # engines that run a separate draft model


def expected_tokens_per_step(acceptance_ratio: float, speculative_tokens: int) -> float:
    """Tokens one speculative step yields per sequence, in expectation: (1 - a^(K+1)) / (1 - a)
    (Leviathan et al. 2023, Eq. 1); K + 1 when every guess is accepted, 1 when none is."""
    a, k = acceptance_ratio, speculative_tokens
    if a >= 1.0:
        return float(k + 1)
    return (1 - a ** (k + 1)) / (1 - a)


@dataclass(frozen=True)
class SpeculativeSetup:
    """A draft model proposing `tokens` (K) guesses a step, each accepted with `acceptance_ratio`."""

    draft: ModelSpec
    acceptance_ratio: float  # alpha: the per-token acceptance probability (0 < alpha < 1)
    tokens: int = DEFAULT_SPECULATIVE_TOKENS  # K (gamma): guesses the draft makes per step

    def check(self, target: ModelSpec, setup: ServeSetup) -> None:
        """Refuse what the mechanism does not cover (one sentence, exit 2)."""
        d = self.draft
        if not 0.0 < self.acceptance_ratio < 1.0:
            raise BadInputError(f"--acceptance-rate must lie strictly between 0 and 1, not {self.acceptance_ratio:g}.",
                                hint="Give the draft's per-token acceptance probability, e.g. --acceptance-rate 0.7.")
        if not 1 <= self.tokens <= 32:
            raise BadInputError(f"--speculative-tokens must be between 1 and 32, not {self.tokens}.",
                                hint="vLLM and SGLang use 3 to 7 guesses per step.")
        if d.vocab_size != target.vocab_size:
            raise BadInputError(f"The draft {d.name} has a vocabulary of {d.vocab_size:,} tokens and {target.name} one of "
                                f"{target.vocab_size:,}: the target cannot verify another tokenizer's guesses.",
                                hint="Pick a draft of the target's family (e.g. llama-3.2-1b for llama-3-70b).")
        if d.params >= target.params:
            raise BadInputError(f"The draft {d.name} ({d.params / 1e9:.1f} B parameters) is not smaller than {target.name} "
                                f"({target.params / 1e9:.1f} B): a draft that costs as much as the target cannot speed it up.",
                                hint="Pick a draft of a few percent of the target's size.")
        if setup.runtime not in SPECULATIVE_RUNTIMES:
            raise BadInputError(f"Speculative decoding with a draft model is modelled for --runtime vllm or sglang, not "
                                f"{setup.runtime} (transformers' assisted generation runs one sequence and adapts K "
                                "itself; TGI speculates with Medusa heads or n-grams, not a draft model).",
                                hint="Add --runtime vllm, or drop --draft-model.")
        from gpulens.plan.serve import tensor_parallel_problem

        why = tensor_parallel_problem(d, setup.tensor_parallel)
        if why:
            raise BadInputError(f"The draft runs at the target's tensor parallelism {setup.tensor_parallel}, and {why}.",
                                hint="Pick a draft whose heads split over the TP group, or a smaller --tp.")

    def speed(self, m: ModelSpec, setup: ServeSetup, gpu: GpuSpec, eff: Efficiency) -> ServeSpeed:
        """What `serve.serving_speed` returns for a setup holding this draft (it calls this)."""
        return speculative_speed(m, setup, gpu, eff)

    def to_dict(self) -> dict[str, Any]:
        return {"draft_model": self.draft.name, "speculative_tokens": self.tokens, "acceptance_ratio": self.acceptance_ratio}


@dataclass
class SpeculativeSpeed:
    """What one speculative step costs and yields at a batch, beside plain decoding."""

    draft_model: str
    speculative_tokens: int  # K
    acceptance_ratio: float  # alpha (an input, not a prediction)
    expected_new_tokens: float  # per sequence per step: (1 - alpha^(K+1)) / (1 - alpha)
    draft_step_seconds: float  # one draft decode step at the batch
    verify_seconds: float  # the target's forward of K + 1 tokens per sequence
    verify_bound: str  # "memory" or "compute": what limits the verification
    step_seconds: float  # K draft steps + the verification
    plain_tpot_seconds: float  # the target's TPOT without speculation
    tpot_seconds: float  # step / expected tokens
    speedup_ratio: float  # plain TPOT / speculative TPOT (< 1: speculation slows decoding)
    draft_prefill_seconds: float  # the draft's own prefill, added to the TTFT

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def speculative_speed(m: ModelSpec, setup: ServeSetup, gpu: GpuSpec, eff: Efficiency) -> ServeSpeed:
    """`serve.serving_speed` with a draft model: the target's own decode step, its verification step
    of K + 1 tokens per sequence and the draft's decode step, each priced by `serving_speed`; TPOT is
    (K x draft step + verification) / expected tokens, and the draft's prefill adds to the TTFT."""
    from gpulens.plan.serve import serving_speed

    spec = setup.speculative
    assert spec is not None
    plain_setup = replace(setup, speculative=None, step_tokens=1)
    plain = serving_speed(m, plain_setup, gpu, eff)
    verify = serving_speed(m, replace(plain_setup, step_tokens=spec.tokens + 1), gpu, eff)
    draft = serving_speed(spec.draft, plain_setup, gpu, eff)
    k = spec.tokens
    e = expected_tokens_per_step(spec.acceptance_ratio, k)
    step = k * draft.tpot_seconds + verify.tpot_seconds
    tpot = step / e
    ttft = plain.ttft_seconds + draft.prefill_seconds
    req = ttft + setup.new_tokens * tpot
    b = setup.batch
    info = SpeculativeSpeed(
        draft_model=spec.draft.name, speculative_tokens=k, acceptance_ratio=spec.acceptance_ratio,
        expected_new_tokens=e, draft_step_seconds=draft.tpot_seconds, verify_seconds=verify.tpot_seconds,
        verify_bound=verify.bound, step_seconds=step, plain_tpot_seconds=plain.tpot_seconds, tpot_seconds=tpot,
        speedup_ratio=plain.tpot_seconds / tpot, draft_prefill_seconds=draft.prefill_seconds,
    )
    return replace(
        plain, ttft_seconds=ttft, prefill_seconds=plain.prefill_seconds + draft.prefill_seconds, tpot_seconds=tpot,
        decode_tokens_per_second=b / tpot, request_seconds=req, requests_per_second=b / req,
        output_tokens_per_second=b * setup.new_tokens / req, bound=verify.bound,
        tensor_parallel_seconds=(k * draft.tensor_parallel_seconds + verify.tensor_parallel_seconds) / e,
        prefill_tensor_parallel_seconds=plain.prefill_tensor_parallel_seconds + draft.prefill_tensor_parallel_seconds,
        speculative=info,
    )


def break_even_batch(m: ModelSpec, setup: ServeSetup, gpu: GpuSpec, eff: Efficiency, limit: int = 4096) -> int | None:
    """The smallest power-of-two batch up to `limit` at which speculation no longer speeds decoding
    up (None: it helps at every one of them)."""
    from gpulens.plan.serve import serving_speed

    b = 1
    while b <= limit:
        s = serving_speed(m, replace(setup, batch=b), gpu, eff).speculative
        if s is not None and s.speedup_ratio <= 1.0:
            return b
        b *= 2
    return None
