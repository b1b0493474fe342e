"""The alert lifecycle: pending → firing → resolved, `for` durations, de-duplication by label set,
silences, and the history, all kept in the store (so `gpulens alerts list` in another process, and
an agent restarted mid-incident, see the same alerts and nobody is paged twice)."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Literal

from gpulens.alerts.rules import Rule, render_template
from gpulens.alerts.source import LabelKey
from gpulens.errors import BadInputError, StoreError
from gpulens.store import Store
from gpulens.store import alert_state as repo
from gpulens.vocab.xid import xid_info

log = logging.getLogger(__name__)

AlertStatus = Literal["pending", "firing", "resolved"]

@dataclass
class AlertState(repo.AlertRow):
    """One alert (a rule firing for one label set). Times are unix seconds. The fields are the store's
    row (store.alert_state.AlertRow); `state` is one of AlertStatus."""

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
    row = repo.insert_silence(store, matchers, starts_at=starts_at, ends_at=ends_at, comment=comment)
    return Silence(row.id, row.matchers, row.starts_at, row.ends_at, row.comment)


def list_silences(store: Store, now: float | None = None) -> list[Silence]:
    """All silences, or only those still in force at `now`."""
    return [Silence(r.id, r.matchers, r.starts_at, r.ends_at, r.comment) for r in repo.list_silences(store, now)]


def expire_silence(store: Store, silence_id: int, now: float) -> None:
    if not repo.expire_silence(store, silence_id, now):
        raise BadInputError(f"There is no active silence {silence_id}.", hint="See `gpulens alerts silence --list`.")


# ---------------------------------------------------------------- history
def load_alerts(store: Store, *, active_only: bool = False, limit: int | None = None) -> list[AlertState]:
    return [AlertState(**asdict(r)) for r in repo.load_alerts(store, active_only=active_only, limit=limit)]


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
        # Alerts still open from a previous run carry on: no second page for the same incident.
        self.active: dict[str, AlertState] = {a.fingerprint: a for a in load_alerts(store, active_only=True)}
        # Durations (`for`, repeats) on the step's duration clock: when each alert became active and
        # was last notified. Alerts carried over from a previous run get theirs at the first step.
        self._since: dict[str, float] = {}
        self._last_notified: dict[str, float] = {}
        self._carried = set(self.active)
        self._unsaved: dict[str, AlertState] = {}  # alerts whose history could not be written yet

    def step(self, now: float, results: list[RuleResult], *, duration_clock: float | None = None) -> list[AlertState]:
        """Advance every alert to `now` (unix seconds; the alert times). `for` and repeat durations
        are measured on `duration_clock` (a monotonic reading, so a wall-clock step neither fires a
        pending alert early nor holds one back), by default on `now` itself."""
        mono = now if duration_clock is None else duration_clock
        if self._carried:
            for fp in self._carried & set(self.active):
                a = self.active[fp]
                self._since[fp] = mono - max(0.0, now - a.active_since)
                self._last_notified[fp] = mono - max(0.0, now - (a.fired_at or a.active_since))
            self._carried.clear()
        if self._unsaved:
            self._retry_unsaved()
        # Silences mark alerts only: with no alert to mark (most evaluations) the store is not asked.
        silences = list_silences(self.store, now) if self.active or any(r.vector for r in results) else []
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
                    self._since[fp] = mono
                a.value = value
                a.silenced = any(s.matches(a.labels, now) for s in silences)
                if a.state == "pending" and mono - self._since.get(fp, mono) >= res.for_seconds:
                    a.state, a.fired_at = "firing", max(now, a.active_since)  # never before it began
                    a.summary = render_template(rule.summary, a.labels, value)
                    self._save(a)
                    self._event(a, now)
                    if not a.silenced:
                        to_notify.append(a)
                        self._last_notified[fp] = mono
                elif a.state == "firing" and not a.silenced and mono - self._last_notified.get(fp, mono) >= self.repeat_seconds:
                    to_notify.append(a)
                    self._last_notified[fp] = mono
        for fp, a in list(self.active.items()):
            if fp in seen:
                continue
            del self.active[fp]
            self._last_notified.pop(fp, None)
            self._since.pop(fp, None)
            if a.state == "pending":
                self._delete(a)  # never fired: not part of the history
                continue
            a.state, a.resolved_at = "resolved", max(now, a.fired_at or a.active_since)  # an alert carried over a clock set back
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
        """Write the alert to its history. While the store cannot be written (a full disk) the alert
        lives on in memory and notifies as usual; it is written at the next step that can."""
        try:
            a.id = repo.save_alert(self.store, a)
            self._unsaved.pop(a.fingerprint, None)
        except StoreError as e:
            if not self._unsaved:
                log.warning("alert history not written (kept in memory until the store can be written): %s", e)
            self._unsaved[a.fingerprint] = a

    def _retry_unsaved(self) -> None:
        for a in list(self._unsaved.values()):
            self._save(a)
            if a.fingerprint in self._unsaved:
                return  # still failing: try again next step

    def _delete(self, a: AlertState) -> None:
        self._unsaved.pop(a.fingerprint, None)
        if a.id is not None:
            try:
                repo.delete_alert(self.store, a.id)
            except StoreError as e:
                log.debug("a pending alert's row stays (the store cannot be written): %s", e)

    def _event(self, a: AlertState, now: float) -> None:
        # The timeline (dashboard, reports) reads alerts as store events beside XIDs and phases.
        self.store.event("alert", now, a.labels, {"rule": a.rule, "state": a.state, "severity": a.severity,
                                                  "value": a.value, "summary": a.summary, "silenced": a.silenced})
