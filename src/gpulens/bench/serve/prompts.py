"""Synthetic prompts of an exact token count: random words that are one token each, checked by
counting the whole prompt and corrected until the count is right.

Random words (not one repeated word) so that two prompts share no prefix by accident: a server's
prefix cache then only helps where `--prefix-tokens` asks it to.
"""

from __future__ import annotations

import random

from gpulens.bench.serve.tokens import HfTokenizer, Tokenizer

# Common English words; in every widely used BPE vocabulary each is one token after a space.
COMMON_WORDS = tuple("""
time year people way day man thing woman life child world school state family student group country
problem hand part place case week company system program question work government number night point
home water room mother area money story fact month lot right study book eye job word business issue
side kind head house service friend father power hour game line end member law car city community name
president team minute idea kid body information back parent face others level office door health person
art war history party result change morning reason research girl guy moment air teacher force education
foot boy age policy process music market sense nation plan college interest death experience effect class
control care field development role effort rate heart drug show leader light voice wife police mind price
report decision son view relationship town road arm difference value building action model season society
tax director position player record paper space ground form event official matter center couple site
project activity star table need court oil situation cost industry figure street image phone data picture
practice piece land product doctor wall patient worker news test movie north love support technology step
baby computer type attention film tree source organization hair window evidence population truth
""".split())
MAX_FIX_ROUNDS = 8


def word_pool(tokenizer: Tokenizer, rng: random.Random, size: int = 400) -> tuple[str, ...]:
    """Words the tokenizer counts as one token each (after a space). For a local tokenizer they
    come from its own vocabulary, so any model's tokenizer yields a pool; otherwise the common
    English words (the prompt's count is checked and corrected either way)."""
    if isinstance(tokenizer, HfTokenizer):
        candidates = [w.lstrip("Ġ▁") for w in tokenizer.vocabulary()]
        candidates = sorted({w for w in candidates if w.isascii() and w.isalpha() and w.islower() and len(w) >= 3})
        rng.shuffle(candidates)
        pool = [w for w in candidates[: size * 4] if tokenizer.count(f"x {w}") - tokenizer.count("x") == 1][:size]
        if len(pool) >= 20:
            return tuple(pool)
        pool = [w for w in COMMON_WORDS if tokenizer.count(f"x {w}") - tokenizer.count("x") == 1]
        if len(pool) >= 20:
            return tuple(pool)
    return COMMON_WORDS


def exact_prompt(tokenizer: Tokenizer, tokens: int, rng: random.Random, pool: tuple[str, ...],
                 prefix: str = "") -> tuple[str, int]:
    """(text, its token count): `prefix` followed by random words, `tokens` counted over the
    whole text. The count is the tokenizer's, so it is exact even when the target was missed."""
    base = tokenizer.count(prefix) if prefix else 0
    want = max(tokens - base, 0)
    words = [rng.choice(pool) for _ in range(want)]

    def text_of(ws: list[str]) -> str:
        body = " ".join(ws)
        return f"{prefix} {body}" if prefix and body else (prefix or body)

    text = text_of(words)
    count = tokenizer.count(text)
    for _ in range(MAX_FIX_ROUNDS):
        if count == tokens:
            break
        if count < tokens:
            words.extend(rng.choice(pool) for _ in range(tokens - count))
        else:
            del words[max(len(words) - max(count - tokens, 1), 0):]
        text = text_of(words)
        count = tokenizer.count(text)
    return text, count
