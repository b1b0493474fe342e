"""The wire between a workload's monitor and its node's agent: the address, the framing, the caps.

One encoding, JSON lines (no new dependency). A connection carries batches one at a time, each a
single line, answered by a single line:

    -> {"v": 1, "sender": "3f2a…", "seq": 7, "records": [{"kind": "train_step", "t_end": …, …}, …]}
    <- {"seq": 7, "ok": true, "stored": 250, "skipped": 0, "duplicate": false}
    <- {"seq": 7, "ok": false, "retry": true, "error": "the store cannot be written now"}

A record is what `gpulens replay` imports from a trace's events.jsonl (a `kind`, its times and
fields, and its own labels: `train_job`/`rank`/`host` or `service`/`model`/`host`), so the agent
reads it through the same importers (`workload.importers`). `sender` names one monitor for its
life and `seq` counts its batches from 1: a batch sent again after a lost answer (the agent was
killed between its commit and its reply) is recognised and stored once. The caps bound what one
line may cost the agent; a batch over them is refused (counted there), never half-read.

Both sides import this module: the monitors (workload) and the agent (pipeline), which sits above.
"""

from __future__ import annotations

import ipaddress
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulens.errors import BadInputError, shown
from gpulens.vocab import names as N

ENV_AGENT = "GPULENS_AGENT"  # the node agent's address for monitors that are given none (the chart sets it)
WIRE_VERSION = 1
MAX_LINE_BYTES = 4 * 1024 * 1024  # one batch, encoded
MAX_BATCH_RECORDS = 2_000
MAX_UNIX_PATH_BYTES = 107  # sockaddr_un.sun_path less its terminating NUL (Linux)
DEFAULT_SOCKET_NAME = "ingest.sock"

# The record kinds a monitor sends; the agent refuses (and counts) any other.
TRAINING_KINDS = (N.EV_TRAIN_START, N.EV_TRAIN_STEP, N.EV_TRAIN_OOM, N.EV_TRAIN_NAN, N.EV_TRAIN_STEP_OUTLIER,
                  N.EV_TRAIN_EVAL, N.TRAIN_LOSS, N.TRAIN_CHECKPOINT_SECONDS)
INFERENCE_KINDS = (N.EV_INFER_START, N.EV_REQUEST, N.EV_COLD_START, N.REC_INFER_GAUGES)
WIRE_KINDS = frozenset(TRAINING_KINDS + INFERENCE_KINDS)


class WireFormatError(ValueError):
    """A line that is not a batch this version reads (the agent answers it with `error`); `seq` is
    the batch's number when the line gave one."""

    def __init__(self, message: str, seq: int = 0):
        super().__init__(message)
        self.seq = seq


@dataclass(frozen=True)
class AgentAddress:
    """Where an agent takes records: a Unix socket `path`, or a loopback `host`:`port`."""

    path: str | None = None
    host: str | None = None
    port: int | None = None

    @property
    def is_unix(self) -> bool:
        return self.path is not None

    def __str__(self) -> str:
        if self.path is not None:
            return f"unix:{self.path}"
        host = f"[{self.host}]" if self.host and ":" in self.host else self.host
        return f"{host}:{self.port}"


def _bad(what: str, text: str, why: str) -> BadInputError:
    return BadInputError(f"{what} {shown(text)} {why}",
                         hint="Write unix:/PATH/TO/SOCKET or 127.0.0.1:PORT (or off).")


def parse_address(text: str, *, what: str = "The agent address") -> AgentAddress | None:
    """'unix:PATH' | 'HOST:PORT' on loopback | 'off' (None). Anything else is one sentence (exit 2).
    Only loopback is accepted for TCP: the socket has no authentication."""
    text = str(text).strip()
    if text.lower() == "off":
        return None
    if text.startswith("unix:"):
        path = text[len("unix:"):]
        if not path:
            raise _bad(what, text, "names no socket path.")
        if len(os.fsencode(path)) > MAX_UNIX_PATH_BYTES:
            raise BadInputError(f"{what} {text!r} is longer than a Unix socket path may be ({MAX_UNIX_PATH_BYTES} bytes).",
                                hint="Choose a shorter path, e.g. under $XDG_RUNTIME_DIR or /run/gpulens.")
        return AgentAddress(path=path)
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise _bad(what, text, "is neither unix:PATH nor HOST:PORT.")
    host = host.strip("[]")
    try:
        p = int(port)
        if not 1 <= p <= 65535:
            raise ValueError
    except ValueError:
        raise _bad(what, text, "has no port number between 1 and 65535.") from None
    if host != "localhost":
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise BadInputError(f"{what} {text!r} is not a loopback address; the ingest socket has no authentication.",
                                hint="Use unix:PATH (a hostPath directory in Kubernetes) or 127.0.0.1:PORT.")
    return AgentAddress(host=host, port=p)


def default_socket_path(store_path: str | os.PathLike[str]) -> Path:
    """The agent's socket when `--ingest` is not given: beside its store and named after it
    (gpulens.db -> gpulens.ingest.sock), so agents whose stores share a folder (a fleet on one
    machine, a replay beside a live agent) each have their own."""
    store = Path(store_path).resolve()
    return store.parent / f"{store.stem}.{DEFAULT_SOCKET_NAME}"


def runtime_socket_path(store_path: str | os.PathLike[str]) -> Path | None:
    """$XDG_RUNTIME_DIR/gpulens/<store's id>.sock, for a store whose folder is too deep for a socket."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if not runtime:
        return None
    import hashlib

    tag = hashlib.sha256(str(Path(store_path).resolve()).encode()).hexdigest()[:12]
    return Path(runtime) / "gpulens" / f"{tag}.sock"


# ------------------------------------------------------------------ batches
@dataclass(frozen=True)
class Batch:
    sender: str
    seq: int
    records: list[dict[str, Any]]


def encode_batch(sender: str, seq: int, records: list[dict[str, Any]]) -> bytes:
    return (json.dumps({"v": WIRE_VERSION, "sender": sender, "seq": seq, "records": records},
                       separators=(",", ":"), default=_json_default, allow_nan=True) + "\n").encode()


def _json_default(o: Any) -> Any:
    try:
        return float(o)  # a numpy or torch scalar
    except (TypeError, ValueError):
        return str(o)


def decode_batch(line: bytes) -> Batch:
    """A batch from one line; WireFormatError (a sentence) when it is not one, or exceeds the caps."""
    if len(line) > MAX_LINE_BYTES:
        raise WireFormatError(f"a batch of {len(line)} bytes is over the {MAX_LINE_BYTES}-byte cap")
    try:
        doc = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        raise WireFormatError("the line is not JSON") from None
    if not isinstance(doc, dict) or doc.get("v") != WIRE_VERSION:
        raise WireFormatError(f"the line is not a version-{WIRE_VERSION} batch")
    sender, seq, records = doc.get("sender"), doc.get("seq"), doc.get("records")
    if not isinstance(sender, str) or not 1 <= len(sender) <= 64:
        raise WireFormatError("the batch names no sender")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        raise WireFormatError("the batch has no sequence number")
    if not isinstance(records, list):
        raise WireFormatError("the batch has no list of records", seq)
    if len(records) > MAX_BATCH_RECORDS:
        raise WireFormatError(f"a batch of {len(records)} records is over the {MAX_BATCH_RECORDS}-record cap", seq)
    return Batch(sender, seq, records)


@dataclass(frozen=True)
class Reply:
    seq: int
    ok: bool
    stored: int = 0
    skipped: int = 0
    duplicate: bool = False
    retry: bool = True  # when not ok: whether sending the same batch again may succeed
    error: str = ""


def encode_reply(r: Reply) -> bytes:
    d: dict[str, Any] = {"seq": r.seq, "ok": r.ok}
    if r.ok:
        d.update(stored=r.stored, skipped=r.skipped, duplicate=r.duplicate)
    else:
        d.update(retry=r.retry, error=r.error)
    return (json.dumps(d) + "\n").encode()


def decode_reply(line: bytes) -> Reply:
    try:
        d = json.loads(line)
        return Reply(seq=int(d["seq"]), ok=bool(d["ok"]), stored=int(d.get("stored", 0)), skipped=int(d.get("skipped", 0)),
                     duplicate=bool(d.get("duplicate", False)), retry=bool(d.get("retry", True)), error=str(d.get("error", "")))
    except (ValueError, KeyError, TypeError):
        raise WireFormatError("the agent's answer is not a reply") from None
