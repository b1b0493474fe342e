"""Notifiers: the log, a file (one JSON line per alert) and a webhook that receives Alertmanager's
webhook body, so anything that takes Alertmanager webhooks takes gpulens's. The webhook posts from
a background thread with bounded retries and one deadline per attempt: a receiver that is down,
hangs, trickles or answers garbage never slows evaluation or shutdown; what cannot be delivered is
logged, counted (gpulens_notifications_failed_total) and kept in the store for the next start.

Exactly once per alert state: a receiver has `DEFAULT_TIMEOUT_SECONDS` to answer (a slow 200 is a
delivery, not a failure to retry and keep); a refusal that another attempt would get again (a 3xx,
a 4xx other than 408 / 429) is recorded as failed with its reason, said once, and neither retried
nor kept. Secrets: the webhook's URL is only ever shown redacted (`http_client.redact_url`); its
credentials go as an `Authorization` header; the store keeps undelivered bodies under the
notifier's redacted URL, and the URL to send them to is the one configured at the next start."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from gpulens import errors, http_client
from gpulens.alerts.engine import AlertState
from gpulens.errors import BadInputError

if TYPE_CHECKING:
    from gpulens.store import Store

log = logging.getLogger("gpulens.alerts")
# What is read of a receiver's answer (its status is what counts): the rest is not waited for.
RECEIVER_ANSWER_MAX_BYTES = 64 * 1024
# How long one attempt may take, answer included. Generous on purpose: an attempt cut while the
# receiver is still answering is sent again, and the receiver gets the alert twice.
DEFAULT_TIMEOUT_SECONDS = 10.0


class Notifier(Protocol):
    def send(self, alerts: list[AlertState]) -> None: ...

    def close(self) -> None: ...


class LogNotifier:
    def send(self, alerts: list[AlertState]) -> None:
        for a in alerts:
            level = logging.INFO if a.state == "resolved" else logging.WARNING
            log.log(level, "alert %s %s [%s] %s", a.state, a.rule, a.severity, a.summary)

    def close(self) -> None:
        pass


class FileNotifier:
    """Appends one JSON object per alert notification (Alertmanager's alert fields plus gpulens's)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            if self.path.is_dir():  # touch() passes on a folder; every notification would then fail
                raise IsADirectoryError(21, "it is a folder")
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.touch()
        except OSError as e:
            raise BadInputError(f"Cannot write alert notifications to {self.path}: {e.strerror}.", hint="Give --notify file:PATH in a writable folder.") from None

    def send(self, alerts: list[AlertState]) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            for a in alerts:
                line = {**a.alertmanager(), "rule": a.rule, "severity": a.severity, "value": json_number(a.value)}
                f.write(json.dumps(line, allow_nan=False) + "\n")

    def close(self) -> None:
        pass


def json_number(v: float | None) -> float | str | None:
    """A value as JSON can hold it: a non-finite one as Prometheus spells it ("+Inf", "-Inf",
    "NaN"), since JSON has no Infinity."""
    if v is None or math.isfinite(v):
        return v
    return "NaN" if math.isnan(v) else ("+Inf" if v > 0 else "-Inf")


def webhook_body(alerts: list[AlertState], *, receiver: str = "gpulens") -> dict:
    """Alertmanager's webhook body (version 4) for one group of alerts."""
    am = [a.alertmanager() for a in alerts]
    common_labels = dict(set.intersection(*(set(a["labels"].items()) for a in am))) if am else {}
    common_ann = dict(set.intersection(*(set(a["annotations"].items()) for a in am))) if am else {}
    return {
        "version": "4",
        "groupKey": "{}:" + json.dumps(sorted(common_labels.items())),
        "truncatedAlerts": 0,
        "status": "firing" if any(a["status"] == "firing" for a in am) else "resolved",
        "receiver": receiver,
        "groupLabels": {},
        "commonLabels": common_labels,
        "commonAnnotations": common_ann,
        "externalURL": "",
        "alerts": am,
    }


# Notifications that could not be delivered (or were dropped), per notifier kind, for this
# process: exported as gpulens_notifications_failed_total{notifier=...}.
_FAILED: dict[str, int] = {}
_FAILED_LOCK = threading.Lock()


def count_failure(kind: str, n: int = 1) -> None:
    with _FAILED_LOCK:
        _FAILED[kind] = _FAILED.get(kind, 0) + n


def notifications_failed() -> dict[str, int]:
    """Failed or dropped notifications so far, per notifier kind."""
    with _FAILED_LOCK:
        return dict(_FAILED)


class DeliveryError(OSError):
    """A receiver that answered with something other than 2xx, or not within the deadline.
    `permanent`: another attempt would get the same answer (a redirect, a 4xx other than 408 / 429)."""

    def __init__(self, message: str, *, status: int = 0, permanent: bool = False):
        super().__init__(message)
        self.status = status
        self.permanent = permanent


def is_permanent(status: int) -> bool:
    """A refusal that retrying cannot change: a redirect (not followed for a POST: a loop, or a
    moved receiver the URL should name), or a 4xx but 408 Request Timeout and 429 Too Many Requests."""
    return 300 <= status < 400 or (400 <= status < 500 and status not in (408, 429))


class WebhookNotifier:
    """POSTs Alertmanager webhook bodies from a background thread.

    Each attempt has one overall deadline, `timeout_seconds`, for connecting, sending and reading
    the whole answer (a receiver that trickles a byte a second is cut off at it); `retries`
    attempts with exponential backoff from `backoff_seconds`; a permanent refusal (`is_permanent`)
    ends the delivery at once, logged once per status, and is not kept. Any exception ends that
    delivery, never the thread. A full queue drops the oldest body (counted, logged). `close`
    returns within `close_timeout_seconds` plus one attempt. With a `store`, what is not delivered
    (given up, dropped, or still queued at close) is kept there under `target` (the redacted URL,
    never the secret) and sent again by the next notifier with the same target, after a restart
    too; a body is removed once delivered."""

    kind = "webhook"

    def __init__(
        self,
        url: str,
        *,
        retries: int = 3,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        backoff_seconds: float = 0.5,
        max_queue: int = 256,
        close_timeout_seconds: float = 5.0,
        store: Store | None = None,
        target: str | None = None,
    ):
        shown = http_client.redact_url(url)
        try:
            parts = urllib.parse.urlsplit(url)
        except ValueError:
            parts = None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise BadInputError(f"The webhook URL {shown!r} is not an http(s) URL.", hint="Write --notify webhook:http://HOST:PORT/PATH.")
        try:
            parts.port  # noqa: B018 - raises on a port that is not a number
        except ValueError:
            raise BadInputError(f"The webhook URL {shown!r} has a port that is not a number.", hint="Write --notify webhook:http://HOST:PORT/PATH.") from None
        self._url = url  # what is sent to, credentials and all: in memory only, never shown
        self.url = shown  # what logs, errors and the store see
        self.target = target or shown  # the outbox's key for this notifier
        self.retries = max(1, retries)
        self.timeout_seconds = timeout_seconds
        self.backoff_seconds = backoff_seconds
        self.close_timeout_seconds = close_timeout_seconds
        self.max_queue = max(1, max_queue)
        self.store = store
        self.delivered = 0
        self.failed = 0  # bodies given up on (after every retry), or dropped
        self.dropped = 0  # of those, pushed out of a full queue
        self.refused = 0  # of those, refused for good by the receiver (not retried, not kept)
        self.last_error: str | None = None  # why the last delivery failed
        self._refusals_said: set[int] = set()  # statuses already logged: a refusal is said once
        self._q: deque[tuple[bytes, int | None]] = deque()
        self._cond = threading.Condition()
        self._busy = False
        self._closing = False
        self._stop = threading.Event()
        self._cancel = http_client.Cancel()  # close() cuts the attempt under way with it
        if store is not None:
            if url != self.target:
                _outbox_retarget(store, url, self.target)  # an older store kept them under the plain URL
            for oid, body in _outbox_pending(store, self.target):
                self._q.append((body, oid))
            if self._q:
                log.info("webhook %s: %d notification(s) kept from before are sent again", self.url, len(self._q))
        self._thread = threading.Thread(target=self._run, name="gpulens-webhook", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ queue
    def send(self, alerts: list[AlertState]) -> None:
        self._enqueue(json.dumps(webhook_body(alerts)).encode(), None)

    def _enqueue(self, body: bytes, outbox_id: int | None) -> None:
        with self._cond:
            if len(self._q) >= self.max_queue:
                old, old_id = self._q.popleft()
                self.dropped += 1
                self._give_up(old, old_id)
                if self.dropped == 1 or self.dropped % 100 == 0:
                    log.error("webhook %s: queue full (%d), dropped the oldest notification (%d dropped so far%s)",
                              self.url, self.max_queue, self.dropped, "; kept in the store" if self.store else "")
            self._q.append((body, outbox_id))
            self._cond.notify_all()

    def _give_up(self, body: bytes, outbox_id: int | None, *, keep: bool = True) -> None:
        self.failed += 1
        count_failure(self.kind)
        if self.store is not None and not keep:
            if outbox_id is not None:
                self._forget(outbox_id)
            return
        if self.store is not None and outbox_id is None:
            try:
                _outbox_keep(self.store, self.target, body)
            except Exception as e:  # noqa: BLE001 - the store failing (a full disk) must not stop notifying
                log.error("webhook %s: could not keep an undelivered notification in the store: %s", self.url, e)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._q and not self._closing:
                    self._cond.wait()
                if not self._q or self._stop.is_set():
                    return
                body, oid = self._q.popleft()
                self._busy = True
            try:
                self._deliver(body, oid)
            except Exception:  # noqa: BLE001 - one delivery failing never ends the thread
                log.exception("webhook %s: delivery failed", self.url)
                self._give_up(body, oid)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    # ------------------------------------------------------------ delivery
    def _post(self, body: bytes) -> None:
        """One attempt, bounded by `timeout_seconds` overall (the seam cuts a trickling answer at it);
        the retries are `_deliver`'s, so that shutdown can cut the backoff short. No proxy: as before."""
        resp = http_client.post(self._url, body=body, headers={"Content-Type": "application/json"},
                                timeout_seconds=self.timeout_seconds, max_bytes=RECEIVER_ANSWER_MAX_BYTES,
                                over_limit="truncate", env_proxy=False, cancel=self._cancel)
        if not resp.ok:
            where = f" (to {http_client.redact_url(resp.headers['location'])})" if "location" in resp.headers else ""
            raise DeliveryError(f"the receiver answered {resp.status} {resp.reason}{where}", status=resp.status,
                                permanent=is_permanent(resp.status))

    def _refused(self, body: bytes, outbox_id: int | None, e: DeliveryError) -> None:
        """A refusal for good: recorded as failed with its reason, said once per status, not kept."""
        self.refused += 1
        if e.status not in self._refusals_said:
            self._refusals_said.add(e.status)
            log.error("webhook %s: %s; not retried and not kept (a redirect or a refusal is answered again to every "
                      "attempt): fix the URL or the receiver. Later refusals like it are counted, not logged.", self.url, e)
        self._give_up(body, outbox_id, keep=False)

    def _deliver(self, body: bytes, outbox_id: int | None) -> None:
        for attempt in range(self.retries):
            try:
                self._post(body)
            except Exception as e:  # noqa: BLE001 - a garbage status line, a short body, a reset: all retried
                self.last_error = str(e)
                if isinstance(e, DeliveryError) and e.permanent:
                    self._refused(body, outbox_id, e)
                    return
                if attempt + 1 == self.retries:
                    log.error("webhook %s: giving up after %d attempts: %s", self.url, self.retries, e)
                    self._give_up(body, outbox_id)
                    return
                if self._stop.wait(self.backoff_seconds * 2**attempt):
                    log.error("webhook %s: not delivered before shutdown: %s", self.url, e)
                    self._give_up(body, outbox_id)
                    return
                continue
            self.delivered += 1
            if outbox_id is not None:
                self._forget(outbox_id)
            return

    def _forget(self, outbox_id: int) -> None:
        if self.store is None:
            return
        try:
            _outbox_forget(self.store, outbox_id)
        except Exception as e:  # noqa: BLE001
            log.debug("webhook %s: could not clear a notification from the store: %s", self.url, e)

    def flush(self, timeout_seconds: float = 5.0) -> bool:
        """Wait until everything queued was delivered or given up. True if it emptied in time."""
        deadline = time.monotonic() + timeout_seconds
        with self._cond:
            while self._q or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self) -> None:
        """Deliver what is queued within `close_timeout_seconds`; then stop (the attempt under way is
        cut) and keep the rest in the store. Never blocks longer than that plus one attempt."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(self.close_timeout_seconds)
        if self._thread.is_alive():
            self._stop.set()
            self._cancel.set()
            self._thread.join(self.timeout_seconds)
        with self._cond:
            left, self._q = list(self._q), deque()
        for body, oid in left:
            self._give_up(body, oid)
        if left:
            log.error("webhook %s: %d notification(s) not delivered before shutdown%s", self.url, len(left),
                      "; kept in the store for the next start" if self.store else "")


def _outbox_pending(store: Store, url: str) -> list[tuple[int, bytes]]:
    from gpulens.store.outbox import undelivered

    try:
        return undelivered(store, url)
    except Exception as e:  # noqa: BLE001 - an unreadable outbox must not stop the agent
        log.error("webhook %s: could not read the notifications kept in the store: %s", url, e)
        return []


def _outbox_retarget(store: Store, old: str, new: str) -> None:
    from gpulens.store.outbox import retarget

    try:
        retarget(store, old, new)
    except Exception as e:  # noqa: BLE001 - as an unreadable outbox
        log.error("webhook %s: could not re-key the notifications kept in the store: %s", new, e)


def _outbox_keep(store: Store, url: str, body: bytes) -> None:
    from gpulens.store.outbox import keep_undelivered

    keep_undelivered(store, url, body)


def _outbox_forget(store: Store, outbox_id: int) -> None:
    from gpulens.store.outbox import forget_delivered

    forget_delivered(store, outbox_id)


class MultiNotifier:
    def __init__(self, notifiers: Sequence[Notifier]):
        self.notifiers = list(notifiers)

    def send(self, alerts: list[AlertState]) -> None:
        for n in self.notifiers:
            try:
                n.send(alerts)
            except OSError as e:  # the file's disk is full or it went away: one line, not a traceback
                count_failure(getattr(n, "kind", type(n).__name__.lower().removesuffix("notifier")))
                log.error("notifier %s failed: %s", type(n).__name__, e)
            except Exception:  # one broken notifier must not silence the others
                count_failure(getattr(n, "kind", type(n).__name__.lower().removesuffix("notifier")))
                log.exception("notifier %s failed", type(n).__name__)

    def close(self) -> None:
        for n in self.notifiers:
            try:
                n.close()
            except Exception:  # noqa: BLE001 - closing one must not keep the others open
                log.exception("notifier %s failed to close", type(n).__name__)


def build_notifier(specs: Sequence[str], *, store: Store | None = None) -> MultiNotifier:
    """'log', 'file:PATH', 'webhook:URL' -> notifiers. With `store`, webhooks keep what they could
    not deliver there and send it again on the next start."""
    out: list[Notifier] = []
    targets: dict[str, int] = {}  # webhooks whose redacted URLs are alike keep their outboxes apart
    for spec in specs:
        kind, _, arg = spec.partition(":")
        if kind == "log" and not arg:
            out.append(LogNotifier())
        elif kind == "file" and arg:
            out.append(FileNotifier(arg))
        elif kind == "webhook" and arg:
            shown = http_client.redact_url(arg)
            targets[shown] = targets.get(shown, 0) + 1
            out.append(WebhookNotifier(arg, store=store, target=shown if targets[shown] == 1 else f"{shown} #{targets[shown]}"))
        else:
            shown_spec = f"{kind}:{http_client.redact_url(arg)}" if "//" in arg else spec
            raise BadInputError(f"Cannot read --notify {errors.shown(shown_spec)}.", hint="Use log, file:PATH or webhook:URL (e.g. webhook:http://127.0.0.1:9093/hook).")
    return MultiNotifier(out)
