"""The alert lifecycle: pending → firing → resolved, `for` durations, de-duplication by label set,
silences, and the history, all kept in the store (so `gpulens alerts list` in another process, and
an agent restarted mid-incident, see the same alerts and nobody is paged twice)."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Literal

from gpulens.alerts.rules import Rule, render_template
from gpulens.alerts.source import LabelKey
from gpulens.alerts.xid import xid_info
from gpulens.errors import BadInputError
from gpulens.store import Store

log = logging.getLogger(__name__)

AlertStatus = Literal["pending", "firing", "resolved"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS alert_history (
  id INTEGER PRIMARY KEY,
  fingerprint TEXT NOT NULL,
  rule TEXT NOT NULL,
  severity TEXT NOT NULL,
  labels TEXT NOT NULL,
  state TEXT NOT NULL,              -- pending | firing | resolved
  active_since REAL NOT NULL,       -- the condition first held
  fired_at REAL,
  resolved_at REAL,
  value REAL,
  summary TEXT NOT NULL,
  advice TEXT NOT NULL,
  annotations TEXT NOT NULL,
  silenced INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS alert_history_by_state ON alert_history (state, active_since);
CREATE TABLE IF NOT EXISTS alert_silences (
  id INTEGER PRIMARY KEY,
  matchers TEXT NOT NULL,           -- [[label, op, value], ...], op one of = != =~ !~
  starts_at REAL NOT NULL,
  ends_at REAL NOT NULL,
  comment TEXT NOT NULL,
  created_at REAL NOT NULL
);
"""


@dataclass
class AlertState:
    """One alert (a rule firing for one label set). Times are unix seconds."""

    rule: str
    severity: str
    labels: dict[str, str]
    state: AlertStatus
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

    def to_json(self) -> dict:
        return asdict(self)

    def alertmanager(self) -> dict:
        """This alert as Alertmanager's webhook and API write one."""
        ends = _rfc3339(self.resolved_at) if self.resolved_at is not None else "0001-01-01T00:00:00Z"
        return {
            "status": "resolved" if self.state == "resolved" else "firing",
            "labels": dict(self.labels),
            "annotations": {"summary": self.summary, "advice": self.advice, **self.annotations},
            "startsAt": _rfc3339(self.fired_at if self.fired_at is not None else self.active_since),
            "endsAt": ends,
            "generatorURL": "",
            "fingerprint": self.fingerprint,
        }


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def fingerprint(labels: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(sorted(labels.items())).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- silences
@dataclass(frozen=True)
class Silence:
    id: int
    matchers: tuple[tuple[str, str, str], ...]
    starts_at: float
    ends_at: float
    comment: str

    def matches(self, labels: dict[str, str], now: float) -> bool:
        if not self.starts_at <= now < self.ends_at:
            return False
        for label, op, value in self.matchers:
            v = labels.get(label, "")
            ok = {"=": v == value, "!=": v != value}.get(op)
            if ok is None:
                hit = re.fullmatch(value, v) is not None
                ok = hit if op == "=~" else not hit
            if not ok:
                return False
        return True


_MATCHER = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(=~|!~|!=|=)(.*)$")


def parse_matcher(text: str) -> tuple[str, str, str]:
    """'alertname=GpuXid', 'gpu!=3', 'xid=~"79|48"' -> (label, op, value)."""
    m = _MATCHER.match(text.strip())
    if not m:
        raise BadInputError(f"Cannot read the matcher {text!r}.", hint='Write LABEL=VALUE, LABEL!=VALUE or LABEL=~"REGEX", e.g. alertname=GpuXid.')
    label, op, value = m.group(1), m.group(2), m.group(3).strip().strip('"')
    if op in ("=~", "!~"):
        try:
            re.compile(value)
        except re.error as e:
            raise BadInputError(f"The matcher {text!r} has a bad regular expression: {e}.", hint="Fix the pattern.") from None
    return label, op, value


def add_silence(store: Store, matchers: list[tuple[str, str, str]], *, starts_at: float, ends_at: float, comment: str = "") -> Silence:
    if not matchers:
        raise BadInputError("A silence needs at least one matcher.", hint="Give e.g. alertname=GpuXid gpu=0.")
    if ends_at <= starts_at:
        raise BadInputError("A silence must end after it starts.", hint="Give a positive --for, e.g. --for 2h.")
    store.ensure_schema(SCHEMA)
    with store.lock:
        cur = store.connection.execute(
            "INSERT INTO alert_silences (matchers, starts_at, ends_at, comment, created_at) VALUES (?, ?, ?, ?, ?)",
            (json.dumps(matchers), starts_at, ends_at, comment, starts_at),
        )
    return Silence(int(cur.lastrowid or 0), tuple(tuple(m) for m in matchers), starts_at, ends_at, comment)  # type: ignore[misc]


def list_silences(store: Store, now: float | None = None) -> list[Silence]:
    """All silences, or only those still in force at `now`."""
    store.ensure_schema(SCHEMA)
    sql = "SELECT id, matchers, starts_at, ends_at, comment FROM alert_silences"
    args: tuple = ()
    if now is not None:
        sql += " WHERE ends_at > ?"
        args = (now,)
    with store.lock:
        rows = store.connection.execute(sql + " ORDER BY id", args).fetchall()
    return [Silence(r[0], tuple(tuple(m) for m in json.loads(r[1])), r[2], r[3], r[4]) for r in rows]  # type: ignore[misc]


def expire_silence(store: Store, silence_id: int, now: float) -> None:
    store.ensure_schema(SCHEMA)
    with store.lock:
        n = store.connection.execute("UPDATE alert_silences SET ends_at = ? WHERE id = ? AND ends_at > ?", (now, silence_id, now)).rowcount
    if n == 0:
        raise BadInputError(f"There is no active silence {silence_id}.", hint="See `gpulens alerts silence --list`.")


# ---------------------------------------------------------------- history
def load_alerts(store: Store, *, active_only: bool = False, limit: int | None = None) -> list[AlertState]:
    store.ensure_schema(SCHEMA)
    sql = ("SELECT id, fingerprint, rule, severity, labels, state, active_since, fired_at, resolved_at, value, "
           "summary, advice, annotations, silenced FROM alert_history")
    if active_only:
        sql += " WHERE state != 'resolved'"
    sql += " ORDER BY active_since DESC, id DESC"
    if limit:
        sql += f" LIMIT {int(limit)}"
    with store.lock:
        rows = store.connection.execute(sql).fetchall()
    return [
        AlertState(rule=r[2], severity=r[3], labels=json.loads(r[4]), state=r[5], active_since=r[6], value=r[9],
                   summary=r[10], advice=r[11], annotations=json.loads(r[12]), fired_at=r[7], resolved_at=r[8],
                   silenced=bool(r[13]), fingerprint=r[1], id=r[0])
        for r in rows
    ]


# ---------------------------------------------------------------- the engine
@dataclass
class RuleResult:
    """A rule's answer at one evaluation: the label sets for which its condition holds, with values."""

    rule: Rule
    for_seconds: float
    vector: dict[LabelKey, float]


class AlertEngine:
    def __init__(
        self,
        store: Store,
        notify: Callable[[list[AlertState]], None] | None = None,
        *,
        repeat_seconds: float = 4 * 3600.0,
    ):
        self.store = store
        self.notify = notify or (lambda alerts: None)
        self.repeat_seconds = repeat_seconds
        store.ensure_schema(SCHEMA)
        # Alerts still open from a previous run carry on: no second page for the same incident.
        self.active: dict[str, AlertState] = {a.fingerprint: a for a in load_alerts(store, active_only=True)}
        self._last_notified: dict[str, float] = {fp: a.fired_at or a.active_since for fp, a in self.active.items()}

    def step(self, now: float, results: list[RuleResult]) -> list[AlertState]:
        """Advance every alert to `now`. Returns the active alerts plus those resolved in this step."""
        silences = list_silences(self.store, now)
        seen: set[str] = set()
        to_notify: list[AlertState] = []
        resolved: list[AlertState] = []
        for res in results:
            rule = res.rule
            for key, value in res.vector.items():
                labels = self._labels(rule, key)
                fp = fingerprint(labels)
                seen.add(fp)
                a = self.active.get(fp)
                if a is None:
                    a = self._new(rule, labels, fp, now, value)
                    self.active[fp] = a
                a.value = value
                a.silenced = any(s.matches(a.labels, now) for s in silences)
                if a.state == "pending" and now - a.active_since >= res.for_seconds:
                    a.state, a.fired_at = "firing", now
                    a.summary = render_template(rule.summary, a.labels, value)
                    self._save(a)
                    self._event(a, now)
                    if not a.silenced:
                        to_notify.append(a)
                        self._last_notified[fp] = now
                elif a.state == "firing" and not a.silenced and now - self._last_notified.get(fp, now) >= self.repeat_seconds:
                    to_notify.append(a)
                    self._last_notified[fp] = now
        for fp, a in list(self.active.items()):
            if fp in seen:
                continue
            del self.active[fp]
            self._last_notified.pop(fp, None)
            if a.state == "pending":
                self._delete(a)  # never fired: not part of the history
                continue
            a.state, a.resolved_at = "resolved", now
            a.silenced = any(s.matches(a.labels, now) for s in silences)
            self._save(a)
            self._event(a, now)
            resolved.append(a)
            if not a.silenced:
                to_notify.append(a)
        if to_notify:
            try:
                self.notify(to_notify)
            except Exception:  # a notifier must never stop evaluation
                log.exception("notifying %d alerts failed", len(to_notify))
        return list(self.active.values()) + resolved

    def _labels(self, rule: Rule, key: LabelKey) -> dict[str, str]:
        labels = dict(key)
        labels.update(rule.labels)
        labels["alertname"] = rule.name
        labels["severity"] = xid_info(labels.get("xid")).severity if rule.severity == "xid" else rule.severity
        return labels

    def _new(self, rule: Rule, labels: dict[str, str], fp: str, now: float, value: float) -> AlertState:
        annotations = {"pack": rule.pack}
        if rule.severity == "xid":
            info = xid_info(labels.get("xid"))
            annotations.update(meaning=info.meaning, action=info.action)
        a = AlertState(
            rule=rule.name, severity=labels["severity"], labels=labels, state="pending", active_since=now, value=value,
            summary=render_template(rule.summary, labels, value),
            advice=annotations.get("action") or render_template(rule.advice, labels, value),
            annotations=annotations, fingerprint=fp,
        )
        self._save(a)
        return a

    def _save(self, a: AlertState) -> None:
        row = (a.fingerprint, a.rule, a.severity, json.dumps(a.labels, sort_keys=True), a.state, a.active_since,
               a.fired_at, a.resolved_at, a.value, a.summary, a.advice, json.dumps(a.annotations), int(a.silenced))
        with self.store.lock:
            conn = self.store.connection
            if a.id is None:
                cur = conn.execute(
                    "INSERT INTO alert_history (fingerprint, rule, severity, labels, state, active_since, fired_at, "
                    "resolved_at, value, summary, advice, annotations, silenced) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", row
                )
                a.id = cur.lastrowid
            else:
                conn.execute(
                    "UPDATE alert_history SET fingerprint=?, rule=?, severity=?, labels=?, state=?, active_since=?, "
                    "fired_at=?, resolved_at=?, value=?, summary=?, advice=?, annotations=?, silenced=? WHERE id=?",
                    (*row, a.id),
                )

    def _delete(self, a: AlertState) -> None:
        if a.id is not None:
            with self.store.lock:
                self.store.connection.execute("DELETE FROM alert_history WHERE id = ?", (a.id,))

    def _event(self, a: AlertState, now: float) -> None:
        # The timeline (dashboard, reports) reads alerts as store events beside XIDs and phases.
        self.store.event("alert", now, a.labels, {"rule": a.rule, "state": a.state, "severity": a.severity,
                                                  "value": a.value, "summary": a.summary, "silenced": a.silenced})
