"""Issue 27 item 7: a notification is delivered exactly once per alert state. A receiver that answers
200 late got it (no resend, nothing kept for the next start); a refusal that every attempt would get
again (a redirect, a 4xx other than 408 / 429) is recorded as failed with its reason, said once,
and neither retried nor kept; the file notifier writes JSON (no `Infinity`).

The receivers are real HTTP servers on loopback."""

from __future__ import annotations

import json
import logging
import math
import os

import pytest
from http_receiver import HttpReceiver, alert

from gpulens.alerts.notify import FileNotifier, WebhookNotifier, build_notifier
from gpulens.errors import BadInputError
from gpulens.store import Store
from gpulens.store.outbox import undelivered


def test_a_200_that_comes_late_is_delivered_once_and_not_kept(tmp_path):
    """Was: the default 2 s deadline cut the attempt, so the receiver got the alert 3 times and the
    store kept it to send a fourth time at the next start."""
    rx = HttpReceiver(200, delay_seconds=2.5)
    with Store(tmp_path / "s.db") as st:
        hook = WebhookNotifier(rx.url, store=st, backoff_seconds=0.01)  # the default deadline
        try:
            hook.send([alert(0)])
            assert hook.flush(30)
            assert rx.alerts == ["0"] and hook.delivered == 1 and hook.failed == 0
        finally:
            hook.close()
        assert undelivered(st, hook.target) == []
    rx.close()


@pytest.mark.parametrize("status", [301, 308, 400, 401, 403, 404, 410])
def test_a_permanent_refusal_is_said_once_and_neither_retried_nor_kept(tmp_path, caplog, status):
    rx = HttpReceiver(status)
    if status in (301, 308):
        rx.location = rx.url  # a redirect to itself: a loop
    db = tmp_path / "s.db"
    caplog.set_level(logging.DEBUG, logger="gpulens")
    with Store(db) as st:
        hook = WebhookNotifier(rx.url, retries=4, timeout_seconds=2.0, backoff_seconds=0.01, store=st)
        try:
            for i in range(3):
                hook.send([alert(i)])
            assert hook.flush(20)
            assert rx.alerts == ["0", "1", "2"]  # one attempt each: another would be refused alike
            assert hook.failed == 3 and hook.refused == 3 and hook.delivered == 0
            assert str(status) in (hook.last_error or "")
        finally:
            hook.close()
        assert undelivered(st, hook.target) == []  # not kept to be refused again at every start
    said = [r for r in caplog.records if "not retried" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.ERROR and str(status) in said[0].getMessage()
    with Store(db) as st:  # the next start sends nothing again
        WebhookNotifier(rx.url, retries=1, timeout_seconds=2.0, store=st).close()
    assert rx.alerts == ["0", "1", "2"]
    rx.close()


@pytest.mark.parametrize("status", [408, 429, 503])
def test_a_passing_refusal_is_retried_and_kept(tmp_path, status):
    rx = HttpReceiver(status)
    with Store(tmp_path / "s.db") as st:
        hook = WebhookNotifier(rx.url, retries=3, timeout_seconds=2.0, backoff_seconds=0.01, store=st)
        try:
            hook.send([alert(0)])
            assert hook.flush(20)
            assert rx.alerts == ["0", "0", "0"] and hook.refused == 0 and hook.failed == 1
        finally:
            hook.close()
        assert len(undelivered(st, hook.target)) == 1  # sent again at the next start
    rx.close()


def test_the_file_notifier_writes_json_for_values_json_cannot_hold(tmp_path):
    path = tmp_path / "alerts.jsonl"
    FileNotifier(path).send([alert(0, math.inf), alert(1, -math.inf), alert(2, math.nan), alert(3, 2.5)])
    lines = path.read_text().splitlines()

    def strict(text: str) -> None:
        raise ValueError(f"not JSON: {text}")

    values = [json.loads(line, parse_constant=strict)["value"] for line in lines]  # Infinity / NaN refused
    assert values == ["+Inf", "-Inf", "NaN", 2.5]


def test_a_notification_file_that_is_a_folder_is_refused_at_start(tmp_path):
    """touch() passed on a folder, and each notification then logged an IsADirectoryError traceback."""
    with pytest.raises(BadInputError, match="it is a folder") as e:
        build_notifier([f"file:{tmp_path}"])
    assert e.value.exit_code == 2


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_notification_file_whose_disk_is_full_logs_one_line(caplog):
    notifier = build_notifier(["file:/dev/full"])
    with caplog.at_level(logging.ERROR, logger="gpulens.alerts"):
        notifier.send([alert(0)])
    [record] = caplog.records
    assert "No space left on device" in record.getMessage() and record.exc_info is None  # no traceback
