"""Issue 27 item 8: credentials in a webhook URL become an `Authorization: Basic` header, and neither
they nor secret-looking query values (token, api_key, sig...) appear in any log, error, store table
or output: the agent runs with a planted secret against real receivers (one that accepts, one that
answers 500 until given up and kept for the next start, one that refuses with 401), and every
output is searched for it."""

from __future__ import annotations

import base64
import logging
import os
import sqlite3
import subprocess
import sys

import pytest
from http_receiver import HttpReceiver, alert

from gpulens.alerts.notify import WebhookNotifier, build_notifier
from gpulens.errors import BadInputError
from gpulens.http_client import redact_url
from gpulens.store import Store
from gpulens.store.outbox import undelivered

PASSWORD = "pw-PLANTED-7c1f"
TOKEN = "tok-PLANTED-93ab"
PLANTED = (PASSWORD, TOKEN)


def _basic(user: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{PASSWORD}".encode()).decode()


def _leaks(text: str | bytes) -> list[str]:
    data = text.encode() if isinstance(text, str) else text
    return [s for s in PLANTED if s.encode() in data or base64.b64encode(s.encode()) in data]


def _store_text(db) -> dict[str, str]:  # noqa: ANN001
    """Every text or blob cell of every table, by table.column."""
    out: dict[str, list[str]] = {}
    with sqlite3.connect(db) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            for _, col, *_ in conn.execute(f'PRAGMA table_info("{table}")').fetchall():
                cells = conn.execute(f'SELECT "{col}" FROM "{table}" WHERE typeof("{col}") IN (\'text\', \'blob\')').fetchall()
                out[f"{table}.{col}"] = [c[0] if isinstance(c[0], str) else bytes(c[0]).decode("utf-8", "replace") for c in cells]
    return {k: "\n".join(v) for k, v in out.items()}


def test_no_planted_secret_in_any_output_of_the_agent(tmp_path):
    ok, failing, refusing = HttpReceiver(200), HttpReceiver(500), HttpReceiver(401)
    db = tmp_path / "s.db"
    jsonl = tmp_path / "alerts.jsonl"
    hooks = [f"webhook:http://alice:{PASSWORD}@127.0.0.1:{ok.url.split(':')[2]}?token={TOKEN}&team=gpu",
             f"webhook:http://bob:{PASSWORD}@127.0.0.1:{failing.url.split(':')[2]}?api_key={TOKEN}",
             f"webhook:http://carol:{PASSWORD}@127.0.0.1:{refusing.url.split(':')[2]}?sig={TOKEN}"]
    cmd = [sys.executable, "-m", "gpulens", "--verbose", "agent", "--backend", "fake:1", "--store", str(db),
           "--interval", "100ms", "--duration", "2s", "--listen", "off", "--fault", "xid:79@0.3s:gpu=0",
           "--notify", "log", "--notify", f"file:{jsonl}"]
    for h in hooks:
        cmd += ["--notify", h]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=tmp_path,
                             env={**os.environ, "NO_COLOR": "1"})
        assert run.returncode == 0, run.stderr
        listed = subprocess.run([sys.executable, "-m", "gpulens", "alerts", "list", "--store", str(db)],
                                capture_output=True, text=True, timeout=60, env={**os.environ, "NO_COLOR": "1"})
        assert listed.returncode == 0, listed.stderr
    finally:
        for rx in (ok, failing, refusing):
            rx.close()
    # the alerting path ran: every receiver was posted to, with the credentials as a header and the
    # query string as configured (kept for sending)
    assert ok.requests and failing.requests and refusing.requests
    path, headers, alerts = ok.requests[0]
    assert "GpuXid" in alerts and headers.get("Authorization") == _basic("alice")
    assert path == f"/hook?token={TOKEN}&team=gpu" or path.endswith(f"?token={TOKEN}&team=gpu")
    assert failing.requests[0][1].get("Authorization") == _basic("bob")
    assert "500" in run.stderr and "401" in run.stderr  # the failures were logged...
    assert "***@127.0.0.1" in run.stderr  # ...naming the receiver, redacted
    # nothing shows the secret: logs, outputs, every file written, every cell of the store
    assert not _leaks(run.stdout) and not _leaks(run.stderr), run.stderr
    assert not _leaks(listed.stdout + listed.stderr)
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert jsonl in written and db in written
    assert {p.name: _leaks(p.read_bytes()) for p in written} == {p.name: [] for p in written}
    cells = _store_text(db)
    assert {k: _leaks(v) for k, v in cells.items()} == {k: [] for k in cells}
    kept = cells["notification_outbox.target"]
    assert kept and "***@127.0.0.1" in kept  # the failing receiver's notification waits, under a redacted name


def test_a_kept_notification_goes_to_the_url_configured_at_the_next_start(tmp_path, caplog):
    """The outbox keeps the redacted URL only; the next start sends with the credentials it is given."""
    caplog.set_level(logging.DEBUG, logger="gpulens")
    rx = HttpReceiver(500)
    url = f"http://alice:{PASSWORD}@127.0.0.1:{rx.url.split(':')[2]}?token={TOKEN}"
    with Store(tmp_path / "s.db") as st:
        hook = WebhookNotifier(url, retries=1, timeout_seconds=2.0, store=st)
        hook.send([alert(0)])
        assert hook.flush(10)
        hook.close()
        assert [t for t, in st._conn.execute("SELECT target FROM notification_outbox")] == [redact_url(url)]
        rx.status = 200
        hook = WebhookNotifier(url, retries=1, timeout_seconds=2.0, store=st)
        assert hook.flush(10)
        hook.close()
        assert undelivered(st, redact_url(url)) == []
    rx.close()
    assert [r[2] for r in rx.requests] == [["0"], ["0"]]
    assert all(r[1].get("Authorization") == _basic("alice") for r in rx.requests)
    assert not _leaks("\n".join(r.getMessage() for r in caplog.records))


def test_an_older_store_that_kept_the_plain_url_is_re_keyed(tmp_path):
    from gpulens.store.outbox import keep_undelivered

    url = f"http://alice:{PASSWORD}@127.0.0.1:9/hook?token={TOKEN}"
    with Store(tmp_path / "s.db") as st:
        keep_undelivered(st, url, b"{}")  # what an earlier gpulens wrote
        WebhookNotifier(url, retries=1, timeout_seconds=0.5, close_timeout_seconds=0.1, store=st).close()
        assert not _leaks("\n".join(t for t, in st._conn.execute("SELECT target FROM notification_outbox")))


@pytest.mark.parametrize("spec", [f"webhook:ftp://alice:{PASSWORD}@host/?token={TOKEN}",
                                  f"webhook:http://alice:{PASSWORD}@host:port/?token={TOKEN}",
                                  f"webhok:http://alice:{PASSWORD}@host/?token={TOKEN}"])
def test_errors_about_a_webhook_url_do_not_show_its_secrets(spec):
    with pytest.raises(BadInputError) as e:
        build_notifier([spec])
    assert not _leaks(str(e.value) + str(getattr(e.value, "hint", "")))
    assert "***" in str(e.value)


@pytest.mark.parametrize(("url", "shown"), [
    ("http://alice:pw@host/hook?token=T", "http://***@host/hook?token=***"),
    ("https://host:8443/x?a=1&api_key=K&Signature=S&X-Amz-Credential=C", "https://host:8443/x?a=1&api_key=***&Signature=***&X-Amz-Credential=***"),
    ("http://host/p?password=p&session_id=s&auth=a&secret=s&keep=1", "http://host/p?password=***&session_id=***&auth=***&secret=***&keep=1"),
    ("http://user@host/", "http://***@host/"),
    ("http://host/plain?x=1", "http://host/plain?x=1"),
])
def test_redact_url(url, shown):
    assert redact_url(url) == shown
