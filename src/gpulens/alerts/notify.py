"""Notifiers: the log, a file (one JSON line per alert) and a webhook that receives Alertmanager's
webhook body, so anything that takes Alertmanager webhooks takes gpulens's. The webhook posts from
a background thread with bounded retries: a receiver that is down never slows evaluation; what
cannot be delivered is logged and dropped."""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from gpulens.alerts.engine import AlertState
from gpulens.errors import BadInputError

log = logging.getLogger("gpulens.alerts")


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
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.touch()
        except OSError as e:
            raise BadInputError(f"Cannot write alert notifications to {self.path}: {e.strerror}.", hint="Give --notify file:PATH in a writable folder.") from None

    def send(self, alerts: list[AlertState]) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            for a in alerts:
                f.write(json.dumps({**a.alertmanager(), "rule": a.rule, "severity": a.severity, "value": a.value}) + "\n")

    def close(self) -> None:
        pass


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


class WebhookNotifier:
    """POSTs Alertmanager webhook bodies from a background thread.

    `retries` attempts per body with exponential backoff from `backoff_seconds`, each with
    `timeout_seconds`; a full queue drops the oldest body (logged). `close` waits at most
    `close_timeout_seconds` for what is queued."""

    def __init__(
        self,
        url: str,
        *,
        retries: int = 3,
        timeout_seconds: float = 2.0,
        backoff_seconds: float = 0.5,
        max_queue: int = 256,
        close_timeout_seconds: float = 5.0,
    ):
        if not url.startswith(("http://", "https://")):
            raise BadInputError(f"The webhook URL {url!r} is not an http(s) URL.", hint="Write --notify webhook:http://HOST:PORT/PATH.")
        self.url = url
        self.retries = max(1, retries)
        self.timeout_seconds = timeout_seconds
        self.backoff_seconds = backoff_seconds
        self.close_timeout_seconds = close_timeout_seconds
        self.delivered = 0
        self.failed = 0
        self._q: queue.Queue[bytes | None] = queue.Queue(maxsize=max_queue)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpulens-webhook", daemon=True)
        self._thread.start()

    def send(self, alerts: list[AlertState]) -> None:
        body = json.dumps(webhook_body(alerts)).encode()
        while True:
            try:
                self._q.put_nowait(body)
                return
            except queue.Full:
                try:
                    self._q.get_nowait()
                    self._q.task_done()
                    self.failed += 1
                    log.error("webhook %s: queue full, dropped the oldest notification", self.url)
                except queue.Empty:
                    pass

    def _post(self, body: bytes) -> None:
        req = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=self.timeout_seconds) as resp:  # noqa: S310 - user-given URL
            resp.read()

    def _run(self) -> None:
        while True:
            body = self._q.get()
            if body is None:
                self._q.task_done()
                return
            try:
                self._deliver(body)
            finally:
                self._q.task_done()

    def _deliver(self, body: bytes) -> None:
        for attempt in range(self.retries):
            try:
                self._post(body)
                self.delivered += 1
                break
            except (urllib.error.URLError, OSError, ValueError) as e:
                if attempt + 1 == self.retries:
                    self.failed += 1
                    log.error("webhook %s: giving up after %d attempts: %s", self.url, self.retries, e)
                elif self._stop.wait(self.backoff_seconds * 2**attempt):
                    self.failed += 1
                    log.error("webhook %s: not delivered before shutdown: %s", self.url, e)
                    break

    def flush(self, timeout_seconds: float = 5.0) -> bool:
        """Wait until the queue is empty (for tests and shutdown). True if it emptied in time."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            if self._q.unfinished_tasks == 0:
                return True
            time.sleep(0.02)
        return False

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(self.close_timeout_seconds)
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join(self.close_timeout_seconds)


class MultiNotifier:
    def __init__(self, notifiers: Sequence[Notifier]):
        self.notifiers = list(notifiers)

    def send(self, alerts: list[AlertState]) -> None:
        for n in self.notifiers:
            try:
                n.send(alerts)
            except Exception:  # one broken notifier must not silence the others
                log.exception("notifier %s failed", type(n).__name__)

    def close(self) -> None:
        for n in self.notifiers:
            n.close()


def build_notifier(specs: Sequence[str]) -> MultiNotifier:
    """'log', 'file:PATH', 'webhook:URL' -> notifiers."""
    out: list[Notifier] = []
    for spec in specs:
        kind, _, arg = spec.partition(":")
        if kind == "log" and not arg:
            out.append(LogNotifier())
        elif kind == "file" and arg:
            out.append(FileNotifier(arg))
        elif kind == "webhook" and arg:
            out.append(WebhookNotifier(arg))
        else:
            raise BadInputError(f"Cannot read --notify {spec!r}.", hint="Use log, file:PATH or webhook:URL (e.g. webhook:http://127.0.0.1:9093/hook).")
    return MultiNotifier(out)
