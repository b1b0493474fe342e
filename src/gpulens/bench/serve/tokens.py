"""Token counts for shaped traffic: length specs (`N`, `uniform:A-B`, `normal:MEAN,SD`,
`file:PATH`) and the tokenizer that makes a prompt exactly N tokens long.

Three ways to count, named in every result as `token_basis`:
- `tokenizer`: a local `tokenizer.json` (or a Hugging Face folder holding one) through the
  `tokenizers` library: exact for the model that tokenizer belongs to;
- `server`: the server's own `POST /tokenize` (vLLM and SGLang have one): exact for what it serves;
- `estimate`: no tokenizer, one English word taken as one token: a labelled estimate, typically
  within 10-30 % of a real BPE count.
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol
from urllib.parse import urlsplit, urlunsplit

from gpulens import http_client
from gpulens.errors import BadInputError, refuse_special_file

# The longest prompt or output a length spec may ask for: 2^20 tokens, past the context window of
# nearly every served model. Beyond it a prompt is not a benchmark but a hang (building 1e30 words).
MAX_LENGTH_TOKENS = 1 << 20

TokenBasis = Literal["tokenizer", "server", "estimate"]
SPEC_HINT = "Give N, uniform:A-B, normal:MEAN,SD or file:PATH (one observed length per line), e.g. --input-tokens uniform:100-300."


class Tokenizer(Protocol):
    basis: TokenBasis

    def count(self, text: str) -> int: ...


@dataclass(frozen=True)
class LengthSpec:
    """A distribution of token counts, sampled with the run's seed. Samples are at least 1."""

    text: str
    kind: Literal["fixed", "uniform", "normal", "file"]
    a: float = 0.0
    b: float = 0.0
    observed: tuple[int, ...] = ()

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            n = self.a
        elif self.kind == "uniform":
            n = rng.randint(int(self.a), int(self.b))
        elif self.kind == "normal":
            n = round(rng.gauss(self.a, self.b))
        else:
            n = rng.choice(self.observed)
        return max(1, min(int(n), MAX_LENGTH_TOKENS))

    @property
    def mean(self) -> float:
        if self.kind == "fixed":
            return self.a
        if self.kind == "uniform":
            return (self.a + self.b) / 2
        if self.kind == "normal":
            return self.a
        return sum(self.observed) / len(self.observed)


def parse_length_spec(text: str, what: str = "--input-tokens") -> LengthSpec:
    """`N`, `uniform:A-B`, `normal:MEAN,SD` or `file:PATH`; bad input is one sentence."""
    raw = str(text).strip()
    kind, sep, rest = raw.partition(":")
    try:
        if not sep:
            n = int(raw)
            if n < 1:
                raise ValueError
            spec = LengthSpec(raw, "fixed", float(n))
        elif kind == "uniform":
            lo, _, hi = rest.partition("-")
            a, b = int(lo), int(hi)
            if not 1 <= a <= b:
                raise ValueError
            spec = LengthSpec(raw, "uniform", a, b)
        elif kind == "normal":
            m, _, sd = rest.partition(",")
            mean, dev = float(m), float(sd)
            if not (mean >= 1 and dev >= 0 and math.isfinite(mean + dev)):
                raise ValueError
            spec = LengthSpec(raw, "normal", mean, dev)
        elif kind == "file":
            return LengthSpec(raw, "file", observed=_observed_lengths(Path(rest), what))
        else:
            raise BadInputError(f"Cannot read {what} {raw!r}: unknown kind {kind!r}.", hint=SPEC_HINT)
    except ValueError:
        raise BadInputError(f"Cannot read {what} {raw!r}.", hint=SPEC_HINT) from None
    if max(spec.a, spec.b) > MAX_LENGTH_TOKENS:
        raise BadInputError(f"{what} {raw!r} asks for more than {MAX_LENGTH_TOKENS:,} tokens.",
                            hint=f"Give lengths of at most {MAX_LENGTH_TOKENS:,} tokens, e.g. {what} uniform:100-300.")
    return spec


def _observed_lengths(path: Path, what: str) -> tuple[int, ...]:
    refuse_special_file(path, "the lengths file", hint="Give a text file with one token count per line.")
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").split()
    except OSError as e:
        raise BadInputError(f"Cannot read the lengths file {path} of {what}: {e.strerror}.", hint=SPEC_HINT) from None
    try:
        floats = [float(x) for x in lines]
    except ValueError:
        raise BadInputError(f"The lengths file {path} of {what} holds something other than numbers.",
                            hint="Write one token count per line.") from None
    big = next((x for x in floats if not x <= MAX_LENGTH_TOKENS), None)  # also inf and nan
    if big is not None:
        raise BadInputError(f"The lengths file {path} of {what} holds {big:g}, more than {MAX_LENGTH_TOKENS:,} tokens.",
                            hint=f"Write token counts of at most {MAX_LENGTH_TOKENS:,}, one per line.")
    values = tuple(int(x) for x in floats)
    values = tuple(v for v in values if v >= 1)
    if not values:
        raise BadInputError(f"The lengths file {path} of {what} has no length of 1 or more.", hint="Write one token count per line.")
    return values


class HfTokenizer:
    """A local tokenizer.json through the `tokenizers` library (no special tokens counted: the
    server adds its own, e.g. a BOS, the same for every request)."""

    basis: TokenBasis = "tokenizer"

    def __init__(self, path: str | Path):
        p = Path(path)
        file = p / "tokenizer.json" if p.is_dir() else p
        if not file.is_file():
            raise BadInputError(f"No tokenizer at {path}: expected a tokenizer.json or a folder holding one.",
                                hint="Give --tokenizer PATH/tokenizer.json (a Hugging Face model folder works too).")
        try:
            from tokenizers import Tokenizer as _Tok
        except ImportError:
            raise BadInputError("--tokenizer needs the `tokenizers` library, which is not installed.",
                                hint="Install the tokens extra: pip install 'gpulens[tokens]' (or leave --tokenizer out for an estimate).") from None
        try:
            self._tok = _Tok.from_file(str(file))
        except Exception as e:  # the library raises a bare Exception for a malformed file
            raise BadInputError(f"Cannot read the tokenizer {file}: {e}.", hint="Give a tokenizer.json saved by Hugging Face tokenizers.") from None
        self.path = str(file)

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def vocabulary(self) -> list[str]:
        return list(self._tok.get_vocab())


class ServerTokenizer:
    """The server's `POST /tokenize` (vLLM, SGLang): counts with the tokenizer it serves with."""

    basis: TokenBasis = "server"

    def __init__(self, url: str, model: str, timeout_seconds: float = 10.0):
        p = urlsplit(url)
        self.url = urlunsplit((p.scheme, p.netloc, "/tokenize", p.query, ""))  # a ?token= goes along
        self.model = model
        self.timeout = timeout_seconds
        self.count("probe")  # fails now, with a clear sentence, where the server has no /tokenize

    def count(self, text: str) -> int:
        body = json.dumps({"model": self.model, "prompt": text, "add_special_tokens": False}).encode()
        try:
            resp = http_client.post(self.url, body=body, headers={"Content-Type": "application/json"},
                                    timeout_seconds=self.timeout, idempotent=True, max_bytes=16 * 2**20)
            if not resp.ok:
                raise ValueError(f"HTTP {resp.status}")
            data = resp.json()
        except (http_client.HttpUnavailableError, ValueError) as e:
            raise BadInputError(f"The server's {http_client.redact_url(self.url)} did not count tokens ({getattr(e, 'reason', e)}).",
                                hint="Give --tokenizer PATH to a local tokenizer.json instead.") from None
        n = data.get("count") if isinstance(data, dict) else None
        if n is None and isinstance(data, dict) and isinstance(data.get("tokens"), list):
            n = len(data["tokens"])
        if not isinstance(n, int):
            raise BadInputError(f"The server's {http_client.redact_url(self.url)} answered without a token count.",
                                hint="Give --tokenizer PATH to a local tokenizer.json instead.")
        return n


_WORD = re.compile(r"\S+")


class EstimateTokenizer:
    """No tokenizer: one whitespace-separated word is taken as one token."""

    basis: TokenBasis = "estimate"

    def count(self, text: str) -> int:
        return len(_WORD.findall(text))


def make_tokenizer(spec: str | None, *, url: str, model: str) -> Tokenizer:
    """`--tokenizer PATH`, `--tokenizer server` (the target's /tokenize), or None (an estimate)."""
    if spec is None:
        return EstimateTokenizer()
    if spec == "server":
        return ServerTokenizer(url, model)
    return HfTokenizer(spec)
