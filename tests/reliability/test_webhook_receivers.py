"""The webhook notifier against receivers that refuse, answer 500, hang, trickle, or send garbage:
no alert is lost or sent twice, the thread survives, and close() is bounded (issue 18, point 4).

The receiver is a real TCP server: its first `bad` connections misbehave, the rest answer 200 and
record the alert they got."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from gpulens.alerts.engine import AlertState
from gpulens.alerts.notify import WebhookNotifier, notifications_failed
from gpulens.store import Store


def _alert(i: int) -> AlertState:
    return AlertState(rule="GpuXid", severity="critical", labels={"gpu": "0", "n": str(i)}, state="firing",
                      active_since=1_700_000_000.0 + i, value=79.0, summary=f"alert {i}", advice="", fingerprint=f"f{i}")


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return body


BEHAVIOURS = {
    "500": lambda c: c.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n"),
    "garbage status": lambda c: c.sendall(b"NOT HTTP AT ALL\r\n\r\n"),
    "short body": lambda c: c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort"),
    "reset": lambda c: c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"),
    "hang": lambda c: time.sleep(3),
    "trickle": lambda c: [c.sendall(b"H") or time.sleep(0.2) for _ in range(300)],  # 60 s, until the client cuts
}


class Receiver:
    def __init__(self, behaviour: str, bad: int):
        self.behaviour, self.bad = BEHAVIOURS[behaviour], bad
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.got: list[str] = []
        self.connections = 0
        self._stop = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._handle, args=(conn, self.connections), daemon=True).start()

    def _handle(self, conn: socket.socket, n: int) -> None:
        try:
            body = _read_request(conn)
            if n <= self.bad:
                self.behaviour(conn)
            else:
                self.got += [a["labels"]["n"] for a in json.loads(body)["alerts"]]
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self._stop = True
        self.sock.close()


@pytest.mark.parametrize("behaviour", sorted(BEHAVIOURS))
def test_every_alert_arrives_once_past_a_broken_receiver(behaviour):
    rx = Receiver(behaviour, bad=2)
    # 2.5 s an attempt (it was 0.5): a good receiver that a loaded machine answers late would have its
    # attempt cut after it had stored the alert, and the retry would bring that alert twice
    hook = WebhookNotifier(f"http://127.0.0.1:{rx.port}/hook", retries=4, timeout_seconds=2.5, backoff_seconds=0.01)
    try:
        for i in range(5):
            hook.send([_alert(i)])
        assert hook.flush(60)
        assert sorted(rx.got) == [str(i) for i in range(5)]  # none lost, none twice
        assert hook._thread.is_alive()
    finally:
        hook.close()
        rx.close()


def test_a_trickling_receiver_is_cut_at_the_deadline_not_per_read():
    rx = Receiver("trickle", bad=100)
    hook = WebhookNotifier(f"http://127.0.0.1:{rx.port}/hook", retries=1, timeout_seconds=0.5, backoff_seconds=0.01)
    try:
        before = notifications_failed().get("webhook", 0)
        started = time.monotonic()
        hook.send([_alert(0)])
        assert hook.flush(30)
        assert time.monotonic() - started < 20  # a per-read timeout would read all 300 bytes: 60 s
        assert hook.failed == 1 and notifications_failed()["webhook"] == before + 1
    finally:
        hook.close()
        rx.close()


def test_a_full_queue_drops_the_oldest_and_close_is_bounded(tmp_path):
    blackhole = socket.socket()
    blackhole.bind(("127.0.0.1", 0))
    blackhole.listen(1)
    port = blackhole.getsockname()[1]
    with Store(tmp_path / "s.db") as st:
        hook = WebhookNotifier(f"http://127.0.0.1:{port}/hook", retries=1, timeout_seconds=2.0, max_queue=4,
                               close_timeout_seconds=0.5, store=st)
        for i in range(300):  # used to block forever once 256 were queued
            hook.send([_alert(i)])
        assert hook.dropped >= 300 - 4 - 1
        started = time.monotonic()
        hook.close()
        # close_timeout_seconds plus one attempt (2.5 s), with 3 s for a loaded machine; a close that
        # tried every queued body (5 attempts of 2 s) could not end before 10 s
        assert time.monotonic() - started < 0.5 + 2.0 + 3.0
        assert not hook._thread.is_alive()
    blackhole.close()


def test_undelivered_alerts_are_kept_and_sent_after_a_restart(tmp_path):
    db = tmp_path / "s.db"
    rx = Receiver("500", bad=10**6)  # down for the first notifier's whole life
    url = f"http://127.0.0.1:{rx.port}/hook"
    with Store(db) as st:
        hook = WebhookNotifier(url, retries=2, timeout_seconds=0.5, backoff_seconds=0.01, store=st)
        for i in range(3):
            hook.send([_alert(i)])
        assert hook.flush(20) and hook.failed == 3 and hook.delivered == 0
        hook.close()
    rx.bad = 0  # the receiver is back; a new agent starts on the same store
    with Store(db) as st:
        hook = WebhookNotifier(url, retries=2, timeout_seconds=0.5, backoff_seconds=0.01, store=st)
        hook.send([_alert(3)])
        assert hook.flush(20)
        hook.close()
    assert sorted(rx.got) == ["0", "1", "2", "3"]
    with Store(db) as st:  # delivered: nothing left to send a third time
        hook = WebhookNotifier(url, retries=1, timeout_seconds=0.5, store=st)
        assert hook.flush(5)
        hook.close()
    assert sorted(rx.got) == ["0", "1", "2", "3"]
    rx.close()


def test_a_url_with_a_bad_port_is_bad_input():
    from gpulens.errors import BadInputError

    with pytest.raises(BadInputError, match="port"):
        WebhookNotifier("http://127.0.0.1:notaport/hook")
