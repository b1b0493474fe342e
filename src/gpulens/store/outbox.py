"""Repository of undelivered alert notifications: what a webhook could not deliver (given up,
dropped from a full queue, or still queued at shutdown) waits here for the next notifier of the
same target, and is removed once delivered. Bounded: the oldest go beyond `MAX_KEPT` per target.
A target is the notifier's name as it may be shown (a webhook's redacted URL), never a secret."""

from __future__ import annotations

import time

from gpulens.store.store import Store

MAX_KEPT = 10_000


def keep_undelivered(store: Store, target: str, body: bytes) -> int:
    with store._transaction() as conn:
        oid = conn.execute("INSERT INTO notification_outbox (target, body, created) VALUES (?, ?, ?)",
                           (target, body, time.time())).lastrowid
        conn.execute(
            "DELETE FROM notification_outbox WHERE target = ? AND id <= "
            "(SELECT id FROM notification_outbox WHERE target = ? ORDER BY id DESC LIMIT 1 OFFSET ?)",
            (target, target, MAX_KEPT),
        )
    return int(oid)


def undelivered(store: Store, target: str) -> list[tuple[int, bytes]]:
    """(id, body) of what waits for `target`, oldest first."""
    with store._guard("read") as conn:
        rows = conn.execute("SELECT id, body FROM notification_outbox WHERE target = ? ORDER BY id", (target,)).fetchall()
    return [(int(i), bytes(b)) for i, b in rows]


def forget_delivered(store: Store, outbox_id: int) -> None:
    with store._guard("write to") as conn:
        conn.execute("DELETE FROM notification_outbox WHERE id = ?", (outbox_id,))


def retarget(store: Store, old: str, new: str) -> int:
    """Move what waits under `old` to `new` (a store written before targets were redacted kept the
    plain URL): returns how many moved."""
    with store._transaction() as conn:
        return int(conn.execute("UPDATE notification_outbox SET target = ? WHERE target = ?", (new, old)).rowcount)
