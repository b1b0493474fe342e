"""Idle and slow connections cannot exhaust the dashboard (issue 18, point 7): 1,100 half-open
connections and a trickled request head, while a real client still gets answers."""

from __future__ import annotations

import socket
import time

import httpx

from gpulens.web import create_app
from gpulens.web.guard import GuardedH11Protocol


def _closed_by_server(sock: socket.socket, within_seconds: float) -> bool:
    sock.settimeout(within_seconds)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def test_a_real_client_gets_answers_past_1100_idle_connections(replayed_store, dashboard_server):
    with dashboard_server(create_app(store_path=replayed_store, allowed_hosts=["127.0.0.1"])) as d:
        idle = []
        try:
            for _ in range(1100):
                s = socket.create_connection(("127.0.0.1", d.port))
                idle.append(s)
            r = httpx.get(f"{d.base}/api/meta", timeout=10)
            assert r.status_code == 200
            r = httpx.get(f"{d.base}/", timeout=10)
            assert r.status_code == 200
            # the oldest idle connections were closed to make room
            assert _closed_by_server(idle[0], 5.0)
        finally:
            for s in idle:
                s.close()


def test_a_trickled_request_head_is_cut_at_the_header_timeout(replayed_store, dashboard_server, monkeypatch):
    monkeypatch.setattr(GuardedH11Protocol, "header_timeout_seconds", 0.5)
    with dashboard_server(create_app(store_path=replayed_store, allowed_hosts=["127.0.0.1"])) as d:
        slow = socket.create_connection(("127.0.0.1", d.port))
        silent = socket.create_connection(("127.0.0.1", d.port))
        try:
            started = time.monotonic()
            head = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
            cut = False
            for i in range(40):  # one byte every 0.1 s would take 4 s; the deadline is 0.5 s
                try:
                    slow.sendall(head[i:i + 1] or b"a")
                except OSError:
                    cut = True
                    break
                if _closed_by_server(slow, 0.1):
                    cut = True
                    break
            assert cut and time.monotonic() - started < 3.0
            assert _closed_by_server(silent, 2.0)  # never sent a byte: closed too
            assert httpx.get(f"{d.base}/api/meta", timeout=10).status_code == 200
        finally:
            slow.close()
            silent.close()


def test_keep_alive_requests_still_work(replayed_store, dashboard_server):
    with dashboard_server(create_app(store_path=replayed_store, allowed_hosts=["127.0.0.1"])) as d, httpx.Client(base_url=d.base) as c:
        for _ in range(5):
            assert c.get("/api/meta").status_code == 200
