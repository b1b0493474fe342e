"""A monitor's way to its node agent: records are buffered in memory and sent in batches by a thread.

`send(record)` only appends to a bounded buffer (the caller never waits for the socket); a thread
sends what is buffered every `interval_seconds` (sooner once a batch is full) over one connection,
one batch at a time (`workload.wire`), and keeps a batch until the agent answers that it is stored.
While the agent is away (restarting, not started yet) batches stay buffered and the thread retries
with a backoff of at most `MAX_BACKOFF_SECONDS`; the same batch goes again under the same sequence
number, so the agent stores it once even when it stored it and died before answering. The buffer
holds `max_buffered_records`; beyond, the oldest records go, counted in `records_dropped`.
`close()` sends what is left, waiting up to its timeout for an agent that is away.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import deque
from typing import Any

from gpulens.workload.wire import (
    ENV_AGENT,
    MAX_BATCH_RECORDS,
    MAX_LINE_BYTES,
    AgentAddress,
    WireFormatError,
    decode_reply,
    encode_batch,
    parse_address,
)

log = logging.getLogger(__name__)

MAX_BACKOFF_SECONDS = 2.0
CLOSE_TIMEOUT_SECONDS = 15.0  # how long close() waits for an agent that is away (within a pod's grace period)
DEFAULT_BATCH_RECORDS = 500


def agent_address_for(agent: str | None, store: object) -> AgentAddress | None:
    """Where a monitor sends its records: `agent` when given ("off": the store), else the store when
    a `Store` object is passed, else $GPULENS_AGENT when set, else None (a store file)."""
    if agent is not None:
        return parse_address(agent, what="agent=")
    if store is not None and not isinstance(store, str | os.PathLike):  # a Store the caller opened: theirs
        return None
    env = os.environ.get(ENV_AGENT, "").strip()
    return parse_address(env, what=f"${ENV_AGENT}") if env else None


class AgentSender:
    def __init__(
        self,
        address: AgentAddress,
        *,
        max_buffered_records: int = 200_000,
        batch_records: int = DEFAULT_BATCH_RECORDS,
        interval_seconds: float = 0.25,
        reply_timeout_seconds: float = 30.0,
        name: str = "gpulens-agent-sender",
    ):
        self.address = address
        self.sender = uuid.uuid4().hex
        self.max_buffered_records = max(1, max_buffered_records)
        self.batch_records = max(1, min(batch_records, MAX_BATCH_RECORDS))
        self.interval_seconds = interval_seconds
        self.reply_timeout_seconds = reply_timeout_seconds
        self._buf: deque[dict[str, Any]] = deque()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._stop = False
        self._closing = False
        self._seq = 0
        self._inflight: tuple[int, bytes, int] | None = None  # (seq, encoded line, records)
        self._sock: socket.socket | None = None
        self._reader: Any = None
        self._reachable = True
        self.records_sent = 0  # stored by the agent (acknowledged)
        self.records_refused = 0  # acknowledged, but the agent could not read them (a bad record)
        self.records_dropped = 0  # never sent: the buffer was full, or a record alone is over the caps
        self.batches_sent = 0
        self.send_failures = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ the caller's side
    def send(self, record: dict[str, Any]) -> None:
        """Buffer one record (never blocks on the socket)."""
        with self._lock:
            if len(self._buf) >= self.max_buffered_records:
                self._buf.popleft()
                self.records_dropped += 1
                if self.records_dropped == 1:
                    log.error("gpulens: %d records wait for the agent at %s: the oldest are dropped from now on "
                              "(AgentSender.records_dropped)", self.max_buffered_records, self.address)
            self._buf.append(record)
            full = len(self._buf) >= self.batch_records
        if full:
            self._wake.set()

    @property
    def pending(self) -> int:
        """Records given and not yet stored by the agent."""
        with self._lock:
            return len(self._buf) + (self._inflight[2] if self._inflight else 0)

    def flush(self, timeout_seconds: float = 10.0) -> bool:
        """Send everything buffered now; True once the agent has stored it all."""
        deadline = time.monotonic() + timeout_seconds
        self._wake.set()
        with self._idle:
            while self._buf or self._inflight is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._idle.wait(min(left, 0.5))
                self._wake.set()
        return True

    def close(self, timeout_seconds: float = CLOSE_TIMEOUT_SECONDS) -> bool:
        """Send what is left (waiting up to `timeout_seconds` for the agent), then stop. True if
        nothing was lost. Idempotent."""
        if self._stop:
            return self.pending == 0
        self._closing = True  # retry quickly: the process is about to end
        ok = self.flush(timeout_seconds)
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=5.0)
        self._disconnect()
        if not ok:
            log.error("gpulens: %d records could not be sent to the agent at %s before the monitor closed; they are lost.",
                      self.pending, self.address)
        return ok

    # ------------------------------------------------------------ the thread
    def _run(self) -> None:
        backoff = 0.0
        while not self._stop:
            self._wake.wait(backoff or self.interval_seconds)
            self._wake.clear()
            if self._stop:
                break
            while not self._stop:
                if self._inflight is None and not self._next_batch():
                    with self._idle:
                        self._idle.notify_all()
                    break
                if not self._deliver():
                    cap = 0.2 if self._closing else MAX_BACKOFF_SECONDS
                    backoff = min(cap, max(0.05, backoff * 2))
                    break
                backoff = 0.0
                with self._idle:
                    self._idle.notify_all()

    def _next_batch(self) -> bool:
        """Take the next batch off the buffer and encode it once (a retry sends the same bytes)."""
        with self._lock:
            n = min(len(self._buf), self.batch_records)
            if not n:
                return False
            records = [self._buf.popleft() for _ in range(n)]
        while True:
            self._seq += 1
            line = encode_batch(self.sender, self._seq, records)
            if len(line) <= MAX_LINE_BYTES:
                break
            self._seq -= 1
            if len(records) == 1:  # one record alone over the cap: it can never be sent
                self.records_dropped += 1
                log.error("gpulens: a %s record of %d bytes is over the agent's cap; it is dropped", records[0].get("kind"), len(line))
                return self._next_batch()
            half = len(records) // 2
            with self._lock:
                self._buf.extendleft(reversed(records[half:]))
            records = records[:half]
        with self._lock:
            self._inflight = (self._seq, line, len(records))
        return True

    def _connect(self) -> None:
        a = self.address
        if a.path is not None:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(self.reply_timeout_seconds)
            try:
                s.connect(a.path)
            except BaseException:
                s.close()
                raise
        else:
            s = socket.create_connection((a.host, a.port), timeout=self.reply_timeout_seconds)
        self._sock = s
        self._reader = s.makefile("rb")

    def _disconnect(self) -> None:
        for c in (self._reader, self._sock):
            try:
                if c is not None:
                    c.close()
            except OSError:
                pass
        self._sock = self._reader = None

    def _deliver(self) -> bool:
        assert self._inflight is not None
        seq, line, n = self._inflight
        try:
            if self._sock is None:
                self._connect()
            self._sock.sendall(line)  # type: ignore[union-attr]
            raw = self._reader.readline(64 * 1024)
            if not raw:
                raise ConnectionResetError("the agent closed the connection")
            reply = decode_reply(raw)
        except (OSError, WireFormatError) as e:
            self._disconnect()
            self.send_failures += 1
            if self._reachable:
                self._reachable = False
                log.warning("gpulens: the agent at %s cannot be reached (%s); records are kept (up to %d) and sent "
                            "when it answers.", self.address, e, self.max_buffered_records)
            return False
        if reply.seq != seq or (not reply.ok and reply.retry):
            if reply.seq == seq:
                self.send_failures += 1
                log.debug("gpulens: the agent refused batch %d for now: %s", seq, reply.error)
            else:
                self._disconnect()  # out of step: start a fresh connection
            return False
        with self._lock:
            self._inflight = None
        if reply.ok:
            self.records_sent += n - reply.skipped
            self.records_refused += reply.skipped
            self.batches_sent += 1
        else:
            self.records_dropped += n
            log.error("gpulens: the agent at %s refused %d records: %s", self.address, n, reply.error)
        if not self._reachable:
            self._reachable = True
            log.info("gpulens: the agent at %s answers again.", self.address)
        return True
