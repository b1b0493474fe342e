"""Recorded arrivals for `--replay-arrivals SOURCE`: when each request of a recording arrived, and
its prompt and output lengths where recorded. SOURCE is

- a gpulens store (SQLite file): its `request` events, optionally of one service;
- a trace folder or its `events.jsonl`: the `request` events (`arrival`, else `intended`, else
  `start`), such as the bundled H200 session's;
- a mooncake-format JSONL trace: `{"timestamp": ms, "input_length": N, "output_length": N, ...}`.

Times come back in seconds from the first arrival, in order, divided by `speed`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulens.errors import BadInputError, refuse_special_file
from gpulens.safe_parse import UnsafeValue, json_value
from gpulens.units import MAX_RECORDED_TIME_SECONDS
from gpulens.vocab.names import EV_REQUEST

SQLITE_MAGIC = b"SQLite format 3\x00"
MOONCAKE_BLOCK_TOKENS = 512  # the block size of mooncake's published traces' hash_ids
SOURCE_HINT = ("Give a gpulens store, a trace folder (or its events.jsonl) with request events, or a "
               "mooncake JSONL trace ({\"timestamp\": ms, \"input_length\", \"output_length\"}).")


@dataclass(frozen=True)
class RecordedArrivals:
    times_seconds: tuple[float, ...]  # from the first arrival, sorted, already divided by the speed
    input_tokens: tuple[int | None, ...]
    output_tokens: tuple[int | None, ...]
    source: str
    format: str  # "store", "trace" or "mooncake"
    speed: float = 1.0
    # mooncake: each request's `hash_ids`, one per MOONCAKE_BLOCK_TOKENS-token block of its prompt;
    # requests whose ids agree from the start share that prefix. None for other formats.
    block_ids: tuple[tuple[int, ...], ...] | None = None

    @property
    def lengths(self) -> list[tuple[int | None, int | None]]:
        return list(zip(self.input_tokens, self.output_tokens, strict=True))

    def head(self, *, max_requests: int | None, duration_seconds: float | None) -> RecordedArrivals:
        """The first `max_requests` arrivals, those before `duration_seconds`, or both."""
        n = len(self.times_seconds)
        if duration_seconds is not None:
            n = sum(1 for t in self.times_seconds if t < duration_seconds)
        if max_requests is not None:
            n = min(n, max_requests)
        return RecordedArrivals(self.times_seconds[:n], self.input_tokens[:n], self.output_tokens[:n],
                                self.source, self.format, self.speed,
                                None if self.block_ids is None else self.block_ids[:n])


def load_arrivals(source: str | Path, *, speed: float = 1.0, service: str | None = None) -> RecordedArrivals:
    if not speed > 0:
        raise BadInputError(f"--speed must be above zero, not {speed:g}.", hint="Give --speed 2 to replay twice as fast.")
    p = Path(source)
    if p.is_dir():
        p = p / "events.jsonl"
    refuse_special_file(p, "the recording", hint=SOURCE_HINT)
    try:
        with p.open("rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError as e:
        raise BadInputError(f"Cannot read the recording {p}: {e.strerror}.", hint=SOURCE_HINT) from None
    blocks_by_row = None
    if head == SQLITE_MAGIC:
        rows, fmt = _from_store(p, service), "store"
    else:
        rows, fmt, blocks_by_row = _from_jsonl(p)
    if service is not None and fmt != "store":
        raise BadInputError("--replay-service picks a service of a gpulens store; this recording is a file.",
                            hint="Leave --replay-service out, or give a store.")
    if not rows:
        what = f" of service {service!r}" if service else ""
        raise BadInputError(f"The recording {p} has no request arrivals{what}.", hint=SOURCE_HINT)
    order = sorted(range(len(rows)), key=lambda k: rows[k][0])
    t0 = rows[order[0]][0]
    blocks = None if blocks_by_row is None else tuple(blocks_by_row[k] for k in order)
    return RecordedArrivals(tuple((rows[k][0] - t0) / speed for k in order), tuple(rows[k][1] for k in order),
                            tuple(rows[k][2] for k in order), str(source), fmt, speed, blocks)


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) and v >= 1 else None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _request_row(d: dict) -> tuple[float, int | None, int | None] | None:
    t = next((x for k in ("arrival", "intended", "start") if (x := _num(d.get(k))) is not None), None)
    return None if t is None else (t, _int(d.get("prompt_tokens")), _int(d.get("output_tokens")))


def _from_store(path: Path, service: str | None) -> list[tuple[float, int | None, int | None]]:
    from gpulens.store import Store

    with Store(path) as s:
        events = s.events(EV_REQUEST, labels={"service": service} if service else None)
    return [row for e in events if (row := _request_row(e.data)) is not None]


def _from_jsonl(path: Path) -> tuple[list[tuple[float, int | None, int | None]], str, list[tuple[int, ...]] | None]:
    rows: list[tuple[float, int | None, int | None]] = []
    blocks: list[tuple[int, ...]] = []
    fmt = None
    with path.open(encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json_value(line, in_line=True)
            except UnsafeValue as e:
                raise BadInputError(f"Line {n} of the recording {path} cannot be read: {e}.", hint=SOURCE_HINT) from None
            if not isinstance(d, dict):
                continue
            if d.get("kind") == EV_REQUEST:
                fmt = fmt or "trace"
                row = _request_row(d)
            elif "timestamp" in d and ("input_length" in d or "output_length" in d):
                fmt = fmt or "mooncake"
                ts = _num(d.get("timestamp"))
                row = None if ts is None else (ts / 1000.0, _int(d.get("input_length")), _int(d.get("output_length")))
                ids = d.get("hash_ids")
                if row is not None:
                    blocks.append(tuple(int(h) for h in ids if isinstance(h, int)) if isinstance(ids, list) else ())
            else:
                continue
            if row is not None:
                if not 0 <= row[0] <= MAX_RECORDED_TIME_SECONDS:  # also inf and nan: a wait without end
                    raise BadInputError(f"Line {n} of the recording {path} has the arrival time {row[0]:g} s, "
                                        "not a time from 1970 to 2100.", hint=SOURCE_HINT)
                rows.append(row)
    return rows, fmt or "trace", (blocks if fmt == "mooncake" and len(blocks) == len(rows) else None)
