"""From the traffic options of `bench serve` to a run's workload and schedule: one entry point,
`plan_traffic`, so the CLI only parses and the library decides."""

from __future__ import annotations

from dataclasses import dataclass

from gpulens.bench.serve.arrivals import MOONCAKE_BLOCK_TOKENS, RecordedArrivals, load_arrivals
from gpulens.bench.serve.datasets import load_dataset
from gpulens.bench.serve.tokens import make_tokenizer, parse_length_spec
from gpulens.bench.serve.workload import (
    MAX_PLANNED,
    BodyFormat,
    Workload,
    from_dataset,
    planned_count,
    synthetic,
)
from gpulens.errors import BadInputError


@dataclass(frozen=True)
class TrafficOptions:
    input_tokens: str | None = None  # a length spec (tokens.parse_length_spec)
    output_tokens: str | None = None
    tokenizer: str | None = None  # a tokenizer.json / HF folder, "server", or None (an estimate)
    ignore_eos: bool | None = None  # None: on when --output-tokens shapes the output
    dataset: str | None = None
    multi_turn: bool = False
    prefix_tokens: int = 0
    prefix_groups: int = 1
    replay: str | None = None
    replay_service: str | None = None
    speed: float = 1.0
    replay_lengths: bool = False
    seed: int | None = None

    @property
    def shaped(self) -> bool:
        return bool(self.input_tokens or self.output_tokens or self.dataset or self.prefix_tokens
                    or (self.replay and self.replay_lengths) or self.tokenizer)


@dataclass(frozen=True)
class PlannedTraffic:
    workload: Workload | None
    arrivals: RecordedArrivals | None


def plan_traffic(opts: TrafficOptions, *, url: str, kind: str, model: str, stream: bool, prompt: str,
                 max_tokens: int, rate: float | None, ramp_to: float | None, duration_seconds: float | None,
                 max_requests: int | None, sweep: bool = False) -> PlannedTraffic:
    """The workload (None: every request sends the target's own body) and the recorded arrivals
    (None: a rate or a concurrency). A sweep's probes go above its starting load, so it plans the
    most distinct requests (MAX_PLANNED) rather than the first probe's count."""
    arrivals = None
    if opts.replay is not None:
        arrivals = load_arrivals(opts.replay, speed=opts.speed, service=opts.replay_service).head(
            max_requests=max_requests, duration_seconds=duration_seconds)
    elif opts.replay_service or opts.replay_lengths or opts.speed != 1.0:
        raise BadInputError("--speed, --replay-service and --replay-lengths go with --replay-arrivals.",
                            hint="Add --replay-arrivals SOURCE, or leave them out.")
    if opts.multi_turn and not opts.dataset:
        raise BadInputError("--multi-turn replays a dataset's conversations.", hint="Add --dataset PATH of chat conversations.")
    if opts.prefix_groups != 1 and not opts.prefix_tokens:
        raise BadInputError("--prefix-groups needs --prefix-tokens.", hint="E.g. --prefix-tokens 512 --prefix-groups 4.")
    if not opts.shaped:
        return PlannedTraffic(None, arrivals)
    if kind == "http":
        raise BadInputError("Shaped traffic (token lengths, datasets, prefixes) needs an OpenAI-compatible endpoint.",
                            hint="Point --url at /v1/completions or /v1/chat/completions.")
    if opts.dataset and (opts.input_tokens or opts.prefix_tokens):
        raise BadInputError("--dataset brings its own prompts: leave out --input-tokens and --prefix-tokens.",
                            hint="Use --output-tokens to override the dataset's output lengths.")
    if opts.multi_turn and kind != "chat":
        raise BadInputError("--multi-turn resends a chat's history: it needs /v1/chat/completions.",
                            hint="Point --url at /v1/chat/completions.")
    ins = parse_length_spec(opts.input_tokens, "--input-tokens") if opts.input_tokens else None
    outs = parse_length_spec(opts.output_tokens, "--output-tokens") if opts.output_tokens else None
    tok = make_tokenizer(opts.tokenizer, url=url, model=model)
    ignore_eos = opts.ignore_eos if opts.ignore_eos is not None else outs is not None or (arrivals is not None and opts.replay_lengths)
    fmt = BodyFormat(kind, model, stream, ignore_eos)
    if arrivals is not None:
        count = len(arrivals.times_seconds)
    elif sweep:
        count = MAX_PLANNED if max_requests is None else min(max_requests, MAX_PLANNED)
    else:
        count = planned_count(rate, ramp_to, duration_seconds, max_requests)
    if opts.dataset:
        wl = from_dataset(fmt, tok, load_dataset(opts.dataset), count, output_tokens=outs,
                          default_max_tokens=max_tokens, multi_turn=opts.multi_turn, seed=opts.seed)
    else:
        recorded = arrivals if arrivals is not None and opts.replay_lengths else None
        wl = synthetic(fmt, tok, count, input_tokens=ins, output_tokens=outs, default_prompt=prompt,
                       default_max_tokens=max_tokens, prefix_tokens=opts.prefix_tokens,
                       prefix_groups=opts.prefix_groups, seed=opts.seed,
                       lengths=None if recorded is None else recorded.lengths,
                       blocks=None if recorded is None or opts.prefix_tokens else recorded.block_ids,
                       block_tokens=MOONCAKE_BLOCK_TOKENS)
    return PlannedTraffic(wl, arrivals)
