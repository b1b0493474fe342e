"""Prompt datasets for `--dataset PATH`, read into conversations:

- ShareGPT JSON: a list of `{"conversations": [{"from": "human"|"gpt"|"system", "value": ...}, ...]}`;
- plain JSONL: one `{"prompt": ..., "output_tokens": N}` per line (`output_tokens` optional);
- chat JSONL: one `{"messages": [{"role": ..., "content": ...}, ...]}` per line (`output_tokens` optional).

The format is told from the content, not the file name. Every bad file is one sentence naming the
line (or entry) that is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulens.errors import BadInputError
from gpulens.safe_parse import json_lines, load_json, read_text

_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bard": "assistant",
          "bing": "assistant", "assistant": "assistant", "model": "assistant", "system": "system"}
FORMAT_HINT = ("Give ShareGPT JSON (a list of {\"conversations\": [{\"from\", \"value\"}]}), JSONL of "
               "{\"prompt\", \"output_tokens\"} or JSONL of {\"messages\": [{\"role\", \"content\"}]}.")


@dataclass(frozen=True, slots=True)
class Message:
    role: str  # "system", "user" or "assistant"
    content: str


@dataclass(frozen=True, slots=True)
class Conversation:
    messages: tuple[Message, ...]
    output_tokens: int | None = None  # the file's own output length for a one-turn prompt


@dataclass(frozen=True)
class Dataset:
    path: str
    format: str  # "sharegpt", "jsonl" or "chat-jsonl"
    conversations: tuple[Conversation, ...]


def load_dataset(path: str | Path) -> Dataset:
    p = Path(path)
    text = read_text(p, "the dataset", hint=f"Give --dataset PATH of a readable file. {FORMAT_HINT}")
    stripped = text.lstrip()
    if stripped.startswith("["):
        data = load_json(text, f"the dataset {p}", hint=FORMAT_HINT)
        if not isinstance(data, list):
            raise BadInputError(f"The dataset {p} is not a JSON list.", hint=FORMAT_HINT)
        convs = tuple(c for i, entry in enumerate(data) if (c := _sharegpt(entry, p, i)) is not None)
        fmt = "sharegpt"
    else:
        rows = list(json_lines(text, f"the dataset {p}", hint=FORMAT_HINT))
        convs = tuple(c for n, row in rows if (c := _jsonl(row, p, n)) is not None)
        fmt = "chat-jsonl" if rows and isinstance(rows[0][1], dict) and "messages" in rows[0][1] else "jsonl"
    if not convs:
        raise BadInputError(f"The dataset {p} holds no prompt to send.", hint=FORMAT_HINT)
    return Dataset(str(p), fmt, convs)


def _sharegpt(entry: Any, path: Path, i: int) -> Conversation | None:
    turns = entry.get("conversations") if isinstance(entry, dict) else None
    if not isinstance(turns, list):
        raise BadInputError(f"Entry {i} of the dataset {path} has no \"conversations\" list.", hint=FORMAT_HINT)
    msgs = []
    for t in turns:
        if not isinstance(t, dict) or not isinstance(t.get("value"), str):
            raise BadInputError(f"Entry {i} of the dataset {path} has a turn without a text \"value\".", hint=FORMAT_HINT)
        role = _ROLES.get(str(t.get("from", "")).lower())
        if role is None:
            raise BadInputError(f"Entry {i} of the dataset {path} has a turn from {t.get('from')!r}.",
                                hint="ShareGPT turns come \"from\" human, gpt or system.")
        msgs.append(Message(role, t["value"]))
    return Conversation(tuple(msgs)) if any(m.role == "user" for m in msgs) else None


def _jsonl(row: Any, path: Path, n: int) -> Conversation | None:
    if not isinstance(row, dict):
        raise BadInputError(f"Line {n} of the dataset {path} is not a JSON object.", hint=FORMAT_HINT)
    out = row.get("output_tokens")
    if out is not None and (not isinstance(out, int) or isinstance(out, bool) or out < 1):
        raise BadInputError(f"Line {n} of the dataset {path} has output_tokens {out!r}: it must be a whole number of 1 or more.",
                            hint=FORMAT_HINT)
    if "messages" in row:
        msgs = row["messages"]
        if not isinstance(msgs, list) or not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in msgs):
            raise BadInputError(f"Line {n} of the dataset {path} has messages without text \"content\".", hint=FORMAT_HINT)
        conv = tuple(Message(_ROLES.get(str(m.get("role", "user")).lower(), "user"), m["content"]) for m in msgs)
        return Conversation(conv, out) if any(m.role == "user" for m in conv) else None
    if not isinstance(row.get("prompt"), str):
        raise BadInputError(f"Line {n} of the dataset {path} has neither a text \"prompt\" nor \"messages\".", hint=FORMAT_HINT)
    return Conversation((Message("user", row["prompt"]),), out)
