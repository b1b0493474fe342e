"""Repository of the alerts' own tables: the alert history (one row per alert, its lifecycle) and
silences. The alert engine keeps its state here so other processes see the same alerts."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from gpulens.errors import shown
from gpulens.store.decode import damaged_row, json_column
from gpulens.store.store import Store


@dataclass
class AlertRow:
    """One stored alert. Times are unix seconds."""

    rule: str
    severity: str
    labels: dict[str, str]
    state: str  # pending | firing | resolved
    active_since: float
    value: float
    summary: str
    advice: str
    annotations: dict[str, str] = field(default_factory=dict)
    fired_at: float | None = None
    resolved_at: float | None = None
    silenced: bool = False
    fingerprint: str = ""
    id: int | None = None


@dataclass(frozen=True)
class SilenceRow:
    id: int
    matchers: tuple[tuple[str, str, str], ...]  # (label, op, value), op one of = != =~ !~
    starts_at: float
    ends_at: float
    comment: str


_ALERT_COLS = ("fingerprint, rule, severity, labels, state, active_since, fired_at, resolved_at, value, "
               "summary, advice, annotations, silenced")


def save_alert(store: Store, a: AlertRow) -> int:
    """Insert the alert (when it has no id yet) or update it. Returns its id."""
    row = (a.fingerprint, a.rule, a.severity, json.dumps(a.labels, sort_keys=True), a.state, a.active_since,
           a.fired_at, a.resolved_at, a.value, a.summary, a.advice, json.dumps(a.annotations), int(a.silenced))
    with store._guard("write to") as conn:
        if a.id is None:
            cur = conn.execute(f"INSERT INTO alert_history ({_ALERT_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", row)
            return int(cur.lastrowid or 0)
        conn.execute(
            "UPDATE alert_history SET fingerprint=?, rule=?, severity=?, labels=?, state=?, active_since=?, "
            "fired_at=?, resolved_at=?, value=?, summary=?, advice=?, annotations=?, silenced=? WHERE id=?",
            (*row, a.id),
        )
        return a.id


def delete_alert(store: Store, alert_id: int) -> None:
    with store._guard("write to") as conn:
        conn.execute("DELETE FROM alert_history WHERE id = ?", (alert_id,))


def load_alerts(store: Store, *, active_only: bool = False, limit: int | None = None) -> list[AlertRow]:
    """Alerts, newest first; only those not resolved with `active_only`."""
    sql = f"SELECT id, {_ALERT_COLS} FROM alert_history"
    if active_only:
        sql += " WHERE state != 'resolved'"
    sql += " ORDER BY active_since DESC, id DESC"
    args: tuple = ()
    if limit:
        sql += " LIMIT ?"
        args = (int(limit),)
    with store._guard("read") as conn:
        rows = conn.execute(sql, args).fetchall()
    path = store.path
    return [
        AlertRow(rule=r[2], severity=r[3], labels=json_column(r[4], path, "alert_history", r[0], "labels"),
                 state=r[5], active_since=r[6], value=r[9], summary=r[10], advice=r[11],
                 annotations=json_column(r[12], path, "alert_history", r[0], "annotations"), fired_at=r[7],
                 resolved_at=r[8], silenced=bool(r[13]), fingerprint=r[1], id=r[0])
        for r in rows
    ]


def insert_silence(
    store: Store, matchers: list[tuple[str, str, str]], *, starts_at: float, ends_at: float, comment: str
) -> SilenceRow:
    with store._guard("write to") as conn:
        cur = conn.execute(
            "INSERT INTO alert_silences (matchers, starts_at, ends_at, comment, created_at) VALUES (?, ?, ?, ?, ?)",
            (json.dumps(matchers), starts_at, ends_at, comment, starts_at),
        )
    return SilenceRow(int(cur.lastrowid or 0), tuple(tuple(m) for m in matchers), starts_at, ends_at, comment)  # type: ignore[misc]


def list_silences(store: Store, now: float | None = None) -> list[SilenceRow]:
    """All silences, or only those still in force at `now`."""
    sql = "SELECT id, matchers, starts_at, ends_at, comment FROM alert_silences"
    args: tuple = ()
    if now is not None:
        sql += " WHERE ends_at > ?"
        args = (now,)
    with store._guard("read") as conn:
        rows = conn.execute(sql + " ORDER BY id", args).fetchall()
    return [SilenceRow(r[0], _matchers(store, r[0], r[1]), r[2], r[3], r[4]) for r in rows]


def _matchers(store: Store, silence_id: int, text: str) -> tuple[tuple[str, str, str], ...]:
    matchers = json_column(text, store.path, "alert_silences", silence_id, "matchers", list)
    if not all(type(m) is list and len(m) == 3 and all(type(x) is str for x in m) for m in matchers):
        raise damaged_row(store.path, "alert_silences", silence_id, "matchers", f"is not a list of [label, op, value] ({shown(text)})")
    return tuple((m[0], m[1], m[2]) for m in matchers)


def expire_silence(store: Store, silence_id: int, now: float) -> bool:
    """End an active silence at `now`. False when there is no such active silence."""
    with store._guard("write to") as conn:
        n = conn.execute(
            "UPDATE alert_silences SET ends_at = ? WHERE id = ? AND ends_at > ?", (now, silence_id, now)
        ).rowcount
    return n > 0
