"""What each request of a run sends: planned before the run starts, so that the send path only
picks the next ready-made request (bytes on the wire) and never tokenizes or encodes JSON.

A workload comes from shaped synthetic traffic (`--input-tokens`, `--output-tokens`, shared
prefixes), from a dataset (`--dataset`), or from a recording's lengths (`--replay-arrivals`).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from gpulens.bench.serve.datasets import Dataset, Message
from gpulens.bench.serve.prompts import exact_prompt, word_pool
from gpulens.bench.serve.tokens import LengthSpec, Tokenizer
from gpulens.errors import BadInputError

MAX_PLANNED = 10_000  # distinct requests planned at most; a longer run cycles through them (and says so)
CLOSED_LOOP_PLANNED = 2_000  # a closed loop bounded only by time: how many to plan


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    body: bytes
    input_tokens: int  # counted by the workload's tokenizer (token_basis)
    output_tokens: int  # max_tokens asked for
    prefix_group: int | None = None
    conversation: int | None = None
    turn: int = 0


@dataclass(frozen=True)
class Workload:
    requests: tuple[PlannedRequest, ...]
    token_basis: str  # "tokenizer", "server" or "estimate"
    source: str  # "synthetic", "dataset:<format>" or "replay"
    # Multi-turn: the indices of each conversation's requests, turn by turn. A closed-loop user
    # plays one conversation at a time, each turn after the previous answer.
    conversations: tuple[tuple[int, ...], ...] | None = None
    prefix_tokens: int = 0
    prefix_groups: int = 0
    ignore_eos: bool = False

    def describe(self) -> dict:
        ins = [r.input_tokens for r in self.requests]
        outs = [r.output_tokens for r in self.requests]
        return {
            "source": self.source, "token_basis": self.token_basis, "planned_requests": len(self.requests),
            "input_tokens_mean": sum(ins) / len(ins), "input_tokens_min": min(ins), "input_tokens_max": max(ins),
            "output_tokens_mean": sum(outs) / len(outs), "output_tokens_min": min(outs), "output_tokens_max": max(outs),
            "prefix_tokens": self.prefix_tokens, "prefix_groups": self.prefix_groups,
            "conversations": None if self.conversations is None else len(self.conversations),
            "ignore_eos": self.ignore_eos,
        }


@dataclass(frozen=True)
class BodyFormat:
    """How a request body is written for the target."""

    kind: str  # "completions" or "chat"
    model: str
    stream: bool
    ignore_eos: bool = False  # also ask for exactly max_tokens (vLLM, SGLang: ignore_eos, min_tokens)

    def body(self, messages: Sequence[Message], max_tokens: int) -> bytes:
        d: dict[str, object] = {"model": self.model, "max_tokens": max_tokens, "stream": self.stream, "temperature": 0}
        if self.kind == "chat":
            d["messages"] = [{"role": m.role, "content": m.content} for m in messages]
        else:
            d["prompt"] = "\n\n".join(m.content for m in messages)
        if self.stream:
            d["stream_options"] = {"include_usage": True}
        if self.ignore_eos:
            d["ignore_eos"] = True
            d["min_tokens"] = max_tokens
        return json.dumps(d).encode()


def planned_count(rate: float | None, ramp_to: float | None, duration: float | None, max_requests: int | None) -> int:
    """How many distinct requests to plan for a run of this shape."""
    if rate is not None and duration is not None:
        mean = rate if ramp_to is None else (rate + ramp_to) / 2
        n = math.ceil(mean * duration) + 1
        n = n if max_requests is None else min(n, max_requests)
    elif max_requests is not None:
        n = max_requests
    else:
        n = CLOSED_LOOP_PLANNED
    return max(1, min(n, MAX_PLANNED))


def synthetic(fmt: BodyFormat, tokenizer: Tokenizer, count: int, *, input_tokens: LengthSpec | None,
              output_tokens: LengthSpec | None, default_prompt: str, default_max_tokens: int,
              prefix_tokens: int = 0, prefix_groups: int = 1, seed: int | None = None,
              lengths: Sequence[tuple[int | None, int | None]] | None = None,
              blocks: Sequence[tuple[int, ...]] | None = None, block_tokens: int = 512) -> Workload:
    """`count` requests of random words, each `input_tokens` long (plus a shared prefix of
    `prefix_tokens` from one of `prefix_groups` prefixes, assigned round-robin), asking for
    `output_tokens`. `lengths` (a recording's (input, output) per request) overrides both specs
    where it has a value. Without an input spec every request sends `default_prompt`.
    `blocks` (a mooncake trace's hash_ids per request) rebuilds the recording's prefix sharing:
    each id is one `block_tokens`-token text, the same for every request that names it, so
    requests whose ids agree from the start share that prefix as they did when recorded."""
    if prefix_tokens < 0 or prefix_groups < 1:
        raise BadInputError("--prefix-tokens must be 0 or more and --prefix-groups 1 or more.",
                            hint="E.g. --prefix-tokens 512 --prefix-groups 4.")
    rng = random.Random(seed)
    pool = word_pool(tokenizer, rng)
    prefixes = [exact_prompt(tokenizer, prefix_tokens, rng, pool)[0] for _ in range(prefix_groups)] if prefix_tokens else []
    out: list[PlannedRequest] = []
    fixed_prompt = None
    block_text: dict[int, str] = {}

    def of_block(h: int) -> str:
        if h not in block_text:
            block_text[h] = exact_prompt(tokenizer, block_tokens, random.Random((seed or 0) * 1_000_003 + h), pool)[0]
        return block_text[h]

    for i in range(count):
        rec_in, rec_out = lengths[i] if lengths is not None else (None, None)
        n_out = rec_out if rec_out else (output_tokens.sample(rng) if output_tokens else default_max_tokens)
        n_in = rec_in if rec_in else (input_tokens.sample(rng) if input_tokens else None)
        group = i % prefix_groups if prefixes else None
        prefix = prefixes[group] if group is not None else ""
        target = (n_in or 0) + (prefix_tokens if group is not None else 0)
        if blocks is not None and n_in and blocks[i]:
            # the recorded length includes its blocks; the last, partial one is this request's own
            prefix = " ".join(of_block(h) for h in blocks[i][: n_in // block_tokens])
        if n_in is None and not prefix:
            if fixed_prompt is None:
                fixed_prompt = (default_prompt, tokenizer.count(default_prompt))
            text, counted = fixed_prompt
        else:
            text, counted = exact_prompt(tokenizer, target, rng, pool, prefix)
        out.append(PlannedRequest(fmt.body([Message("user", text)], n_out), counted, n_out, group))
    return Workload(tuple(out), tokenizer.basis, "synthetic" if lengths is None else "replay",
                    prefix_tokens=prefix_tokens, prefix_groups=prefix_groups if prefixes else 0,
                    ignore_eos=fmt.ignore_eos)


def from_dataset(fmt: BodyFormat, tokenizer: Tokenizer, dataset: Dataset, count: int, *,
                 output_tokens: LengthSpec | None, default_max_tokens: int, multi_turn: bool = False,
                 seed: int | None = None) -> Workload:
    """Requests sampled from `dataset` with `seed`. One turn (default): each conversation's first
    user message, asking for as many tokens as the recorded answer to it has (or `output_tokens`).
    Multi-turn: every user turn of a conversation, each resending the history before it with the
    recorded answers, so the prompt grows turn by turn as a chat's does."""
    rng = random.Random(seed)
    order = list(range(len(dataset.conversations)))
    rng.shuffle(order)
    out: list[PlannedRequest] = []
    convs: list[tuple[int, ...]] = []
    while len(out) < count:
        for ci in order:
            conv = dataset.conversations[ci]
            turns = _turns(conv.messages)
            if not multi_turn:
                turns = turns[:1]
            idx = []
            for t, (history, answer) in enumerate(turns):
                if output_tokens is not None:
                    n_out = output_tokens.sample(rng)
                elif conv.output_tokens and len(turns) == 1:
                    n_out = conv.output_tokens
                elif answer is not None:
                    n_out = max(1, tokenizer.count(answer))
                else:
                    n_out = default_max_tokens
                counted = sum(tokenizer.count(m.content) for m in history)
                idx.append(len(out))
                out.append(PlannedRequest(fmt.body(history, n_out), counted, n_out, None, len(convs), t))
            convs.append(tuple(idx))
            if len(out) >= count:
                break
    return Workload(tuple(out), tokenizer.basis, f"dataset:{dataset.format}",
                    conversations=tuple(convs) if multi_turn else None, ignore_eos=fmt.ignore_eos)


def _turns(messages: Sequence[Message]) -> list[tuple[list[Message], str | None]]:
    """(the messages sent for this user turn, the recorded answer to it) for each user turn."""
    out = []
    for i, m in enumerate(messages):
        if m.role != "user":
            continue
        nxt = messages[i + 1] if i + 1 < len(messages) else None
        out.append((list(messages[: i + 1]), nxt.content if nxt is not None and nxt.role == "assistant" else None))
    return out
