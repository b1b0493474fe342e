"""Repository of trace claims: how far each recorded trace is imported into this store, and which
import is running on it now.

A trace is known by the sha256 of its telemetry file's first line(s) (`pipeline.ingest.trace_identity`),
so a copy elsewhere or a file that has grown is the same trace. Its row says up to
which recorded time everything is stored (`position_t`); an import advances it in the very
transaction that commits the rows it covers (`advance`, from the store's commit hook), so a kill at
any moment leaves the row and the samples in agreement, and the next import continues after
`position_t`. One import runs on a trace at a time (`owner`); a second one waits for it, and an
owner whose process is gone (kill -9) is taken over.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpulens.errors import TraceError
from gpulens.store.store import Store


@dataclass(frozen=True, slots=True)
class TraceClaim:
    trace_id: str
    position_t: float | None  # None: nothing of the trace is stored yet
    samples: int
    prefix_bytes: int
    prefix_sha: str


class ClaimLostError(TraceError):
    """Another import took this trace over (it judged this one gone): this one must stop writing."""


def _process_start(pid: int) -> str:
    """The process's start time in clock ticks since boot (Linux), so a reused pid is not mistaken
    for the owner; "" where /proc does not say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def this_owner() -> str:
    pid = os.getpid()
    return f"{pid}:{_process_start(pid)}"


def owner_alive(owner: str) -> bool:
    """Whether the process named by an owner string still runs. A store in WAL mode is shared by
    processes of one machine only, so the pid (and its start time) says it."""
    pid_s, _, start = owner.partition(":")
    try:
        pid = int(pid_s)
        os.kill(pid, 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True  # runs, as another user
    return not start or _process_start(pid) in ("", start)


def owner_pid(owner: str) -> str:
    return owner.partition(":")[0]


def take(store: Store, trace_id: str, path: str, owner: str) -> TraceClaim | str:
    """Claim the trace for `owner`: its claim (a new one when the trace is new to this store), or the
    owner string of the live import that holds it now."""
    with store._transaction("import into") as conn:
        row = conn.execute("SELECT position_t, samples, prefix_bytes, prefix_sha, owner FROM trace_claims WHERE trace_id = ?",
                           (trace_id,)).fetchone()
        if row is None:
            conn.execute("INSERT INTO trace_claims (trace_id, path, owner, updated) VALUES (?, ?, ?, ?)",
                         (trace_id, path, owner, time.time()))
            return TraceClaim(trace_id, None, 0, 0, "")
        if row[4] and row[4] != owner and owner_alive(row[4]):
            return str(row[4])
        conn.execute("UPDATE trace_claims SET owner = ?, path = ?, updated = ? WHERE trace_id = ?",
                     (owner, path, time.time(), trace_id))
        return TraceClaim(trace_id, row[0], int(row[1]), int(row[2]), str(row[3]))


def begin(store: Store, trace_id: str, owner: str, *, prefix_bytes: int, prefix_sha: str, restart: bool) -> None:
    """Record the file as this import found it (the prefix a later, grown file must keep); with
    `restart` (--force) the trace counts as not imported yet."""
    with store._transaction("import into") as conn:
        _check_owner(conn, trace_id, owner)
        conn.execute("UPDATE trace_claims SET prefix_bytes = ?, prefix_sha = ?, updated = ? WHERE trace_id = ?",
                     (prefix_bytes, prefix_sha, time.time(), trace_id))
        if restart:
            conn.execute("UPDATE trace_claims SET position_t = NULL, samples = 0 WHERE trace_id = ?", (trace_id,))


def commit_hook(trace_id: str, owner: str, progress: Callable[[], tuple[float | None, int]]) -> Callable[[Any], None]:
    """For `Store.commit_hook`: inside every transaction that commits rows of the import, move the
    claim to `progress()` (the recorded time those rows reach, and the samples imported in all)."""

    def advance(conn: Any) -> None:
        _check_owner(conn, trace_id, owner)
        position_t, samples = progress()
        if position_t is None:
            return
        conn.execute(
            "UPDATE trace_claims SET position_t = max(coalesce(position_t, ?), ?), samples = ?, updated = ? WHERE trace_id = ?",
            (position_t, position_t, samples, time.time(), trace_id),
        )

    return advance


def release(store: Store, trace_id: str, owner: str) -> None:
    """The import ended (done, stopped or failed): others may import the trace now."""
    with store._transaction("import into") as conn:
        conn.execute("UPDATE trace_claims SET owner = NULL WHERE trace_id = ? AND owner = ?", (trace_id, owner))


def _check_owner(conn: Any, trace_id: str, owner: str) -> None:
    row = conn.execute("SELECT owner, path FROM trace_claims WHERE trace_id = ?", (trace_id,)).fetchone()
    if row is None or row[0] != owner:
        raise ClaimLostError(
            f"Another import (pid {owner_pid(row[0]) if row and row[0] else 'unknown'}) took over the trace "
            f"{row[1] if row else trace_id}; this one stopped, and what it stored is kept.",
            hint="Let that import finish; running `gpulens replay` again afterwards imports whatever is still missing.",
        )
