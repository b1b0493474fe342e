"""The agent's ingest listener: workloads' record batches in, over a Unix socket or loopback TCP.

One thread runs an asyncio loop that accepts connections and reads one line (one batch,
`workload.wire`) at a time from each; the thread count is 1 whatever the clients do. A decoded
batch is handed to the node's loop through a bounded queue (`IngestQueue`), and its connection
waits for the loop's answer (stored, duplicate, or "try again") before reading the next line.
Bounds, each refusal counted in `IngestCounters`:
- more than `max_connections` open connections: the new one is closed at once;
- a line over `MAX_LINE_BYTES` or a batch over `MAX_BATCH_RECORDS`: answered "refused" (not to be
  retried) and, for an over-long line, the connection closed (the rest of the line cannot be read);
- `max_queued_batches` already waiting for the loop: answered "busy, try again";
- a batch the loop has not stored within `reply_timeout_seconds`: answered "try again" (if the
  loop stores it later, the copy sent again is recognised as a duplicate);
- a line begun and not ended within `line_timeout_seconds`: the connection is closed (counted as
  `stalled`), so a stuck or hostile client cannot hold one of the connection slots with half a line.
  A connection between lines may stay idle as long as it likes: a monitor keeps its one connection
  open and sends when it has records.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import queue
import socket
import stat
import threading
from dataclasses import dataclass, field
from typing import Any

from gpulens.errors import BadInputError, PortInUseError
from gpulens.workload.wire import (
    MAX_LINE_BYTES,
    AgentAddress,
    Batch,
    Reply,
    WireFormatError,
    decode_batch,
    encode_reply,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IngestLimits:
    max_connections: int = 256
    max_queued_batches: int = 256
    reply_timeout_seconds: float = 30.0
    line_timeout_seconds: float = 30.0  # from a line's first byte to its end (a 4 MiB batch over loopback takes milliseconds)
    socket_mode: int = 0o666  # who may connect is decided by the socket's directory (a hostPath in Kubernetes)


@dataclass
class IngestCounters:
    connections: int = 0
    connections_refused: int = 0  # over max_connections
    batches: int = 0  # answered as stored or duplicate
    records: int = 0  # stored
    records_skipped: int = 0  # in stored batches, but unreadable (no time, an unknown kind, a bad field)
    duplicates: int = 0  # batches sent again after a lost answer, stored once
    batches_refused: int = 0  # malformed or over the caps
    busy: int = 0  # answered "try again": queue full, store failing, or too slow
    stalled: int = 0  # connections closed with a line begun and not ended in time


class PendingBatch:
    """A batch waiting for the loop; `resolve` may be called from any thread, once."""

    __slots__ = ("batch", "_loop", "_future")

    def __init__(self, batch: Batch, loop: asyncio.AbstractEventLoop):
        self.batch = batch
        self._loop = loop
        self._future: asyncio.Future[Reply] = loop.create_future()

    def resolve(self, reply: Reply) -> None:
        def set_result() -> None:
            if not self._future.done():
                self._future.set_result(reply)

        with contextlib.suppress(RuntimeError):  # the server's loop has ended: nobody waits any more
            self._loop.call_soon_threadsafe(set_result)


IngestQueue = queue.Queue  # of PendingBatch, bounded by IngestLimits.max_queued_batches


def _bind_unix(path: str, mode: int) -> socket.socket:
    """A listening Unix socket at `path`: a stale one (its agent was killed) is replaced, a live one
    or a file that is not a socket is a sentence (exit 2)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode):
            raise BadInputError(f"--ingest {path} exists and is not a socket; gpulens will not replace it.",
                                hint="Remove it or choose another path for --ingest.")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)  # nobody listens: left behind by an agent that was killed
        else:
            raise PortInUseError(f"Another process already takes workload records on {path}.",
                                 hint="Stop the other agent, or give this one another --ingest path.")
        finally:
            probe.close()
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(path)
        os.chmod(path, mode)
        s.listen(128)
    except OSError as e:
        s.close()
        raise BadInputError(f"Cannot listen for workload records on {path}: {e.strerror or e}.",
                            hint="Choose a writable directory for --ingest unix:PATH.") from None
    return s


def _bind_tcp(host: str, port: int) -> socket.socket:
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        return socket.create_server((host, port), family=family, backlog=128)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise PortInUseError(f"Port {port} on {host} is already in use; workload records cannot be taken there.",
                                 hint="Choose another port for --ingest, or stop what holds it.") from None
        raise BadInputError(f"Cannot listen for workload records on {host}:{port}: {e.strerror or e}.",
                            hint="Use 127.0.0.1:PORT or unix:PATH.") from None


@dataclass
class IngestServer:
    address: AgentAddress
    limits: IngestLimits = field(default_factory=IngestLimits)

    def __post_init__(self) -> None:
        self.queue: IngestQueue = queue.Queue(maxsize=self.limits.max_queued_batches)
        self.counters = IngestCounters()
        self._open = 0
        self._closing = False
        a = self.address
        self._sock = _bind_unix(a.path, self.limits.socket_mode) if a.path is not None else _bind_tcp(a.host or "127.0.0.1", a.port or 0)
        if a.path is None and not a.port:
            self.address = AgentAddress(host=a.host, port=self._sock.getsockname()[1])
        self._loop = asyncio.new_event_loop()
        self._server: Any = None
        self._handlers: set[asyncio.Task[Any]] = set()
        self._busy: set[asyncio.Task[Any]] = set()  # handlers between a batch read and its answer written
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpulens-ingest", daemon=True)
        self._thread.start()
        self._started.wait(10)

    # ------------------------------------------------------------ the server's thread
    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        limit = MAX_LINE_BYTES + 1
        if self.address.path is not None:
            self._server = await asyncio.start_unix_server(self._handle, sock=self._sock, limit=limit)
        else:
            self._server = await asyncio.start_server(self._handle, sock=self._sock, limit=limit)
        self._stopped = asyncio.Event()
        self._started.set()
        await self._stopped.wait()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if self._open >= self.limits.max_connections or self._closing:
            self.counters.connections_refused += 1
            writer.close()
            return
        self._open += 1
        self.counters.connections += 1
        if task is not None:
            self._handlers.add(task)
        try:
            while not self._closing:
                try:
                    line = await self._read_line(reader)
                except (ValueError, asyncio.LimitOverrunError):  # a line over the cap: the rest cannot be read
                    self.counters.batches_refused += 1
                    await self._answer(writer, Reply(0, ok=False, retry=False,
                                                     error=f"a batch is over the {MAX_LINE_BYTES}-byte cap"))
                    break
                except asyncio.TimeoutError:
                    self.counters.stalled += 1
                    break
                if not line:
                    break
                if task is not None:
                    self._busy.add(task)
                try:
                    reply = await self._take(line)
                    if not await self._answer(writer, reply):
                        break
                finally:
                    self._busy.discard(task)  # type: ignore[arg-type]
        except (ConnectionError, OSError):
            pass
        finally:
            self._open -= 1
            if task is not None:
                self._handlers.discard(task)
            with contextlib.suppress(Exception):
                writer.close()

    async def _read_line(self, reader: asyncio.StreamReader) -> bytes:
        """The next line: no deadline for its first byte (an idle connection is fine), then
        `line_timeout_seconds` for the rest of it. b"" when the client closed."""
        first = await reader.read(1)
        if not first or first == b"\n":
            return first
        return first + await asyncio.wait_for(reader.readline(), self.limits.line_timeout_seconds)

    async def _take(self, line: bytes) -> Reply:
        try:
            batch = decode_batch(line)
        except WireFormatError as e:
            self.counters.batches_refused += 1
            return Reply(e.seq, ok=False, retry=False, error=str(e))
        if self._closing:
            self.counters.busy += 1
            return Reply(batch.seq, ok=False, error="the agent is stopping")
        pending = PendingBatch(batch, self._loop)
        try:
            self.queue.put_nowait(pending)
        except queue.Full:
            self.counters.busy += 1
            return Reply(batch.seq, ok=False, error="the agent is busy")
        try:
            return await asyncio.wait_for(pending._future, self.limits.reply_timeout_seconds)
        except asyncio.TimeoutError:
            self.counters.busy += 1
            return Reply(batch.seq, ok=False, error="the agent did not store the batch in time")

    async def _answer(self, writer: asyncio.StreamWriter, reply: Reply) -> bool:
        try:
            writer.write(encode_reply(reply))
            await asyncio.wait_for(writer.drain(), 10.0)
            return True
        except (ConnectionError, OSError, asyncio.TimeoutError):
            return False

    # ------------------------------------------------------------ the node's side
    def stop_accepting(self) -> None:
        """Take no new batch (those already queued are still answered); remove the socket file."""
        self._closing = True
        if self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)
        if self.address.path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.address.path)

    def close(self) -> None:
        """Answer what is still queued with "try again", let the answers go out, stop the thread."""
        self.stop_accepting()
        while True:
            try:
                pending = self.queue.get_nowait()
                pending.resolve(Reply(pending.batch.seq, ok=False, error="the agent is stopping"))
            except queue.Empty:
                break

        async def finish() -> None:
            if self._busy:  # answers on their way out; idle connections are simply closed
                await asyncio.wait(list(self._busy), timeout=2.0)
            for t in list(self._handlers):
                t.cancel()
            self._stopped.set()

        if self._thread.is_alive():
            with contextlib.suppress(RuntimeError):
                asyncio.run_coroutine_threadsafe(finish(), self._loop)
            self._thread.join(5.0)
        with contextlib.suppress(OSError):
            self._sock.close()
