"""Starting a server for one configuration, waiting until it answers, and stopping it.

Ready means the URL answers with anything but a connection error, a 5xx or a 503-style "not yet"
(vLLM and SGLang answer 503 or refuse connections while they load weights). The time from the
start to the first such answer is the configuration's cold start.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO

from gpulens import http_client
from gpulens.errors import GpulensError

READY_POLL_SECONDS = 0.1
READY_TIMEOUT_SECONDS = 2.0  # one health check
STOP_GRACE_SECONDS = 10.0


@dataclass
class StartedServer:
    proc: subprocess.Popen | None
    cold_start_seconds: float | None
    failure: str | None  # why it never became ready
    err: IO[bytes] | None = None  # its standard error, for the last line when it dies

    def died(self) -> str | None:
        """One sentence when the server has exited since it became ready, else None."""
        if self.proc is None or self.proc.poll() is None:
            return None
        return f"the server exited with code {self.proc.returncode}" + self._last_line()

    def _last_line(self) -> str:
        if self.err is None or self.err.closed:
            return ""
        self.err.seek(0)
        tail = self.err.read().decode(errors="replace").strip().splitlines()[-1:] or [""]
        return f": {tail[0][:300]}" if tail[0] else ""

    def stop(self) -> None:
        try:
            self._stop()
        finally:
            if self.err is not None:
                self.err.close()

    def _stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, STOP_GRACE_SECONDS), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


def _answers(url: str) -> bool:
    """One health check: the status alone (no body read, no redirect followed, no proxy: the server is local)."""
    try:
        r = http_client.get(url, timeout_seconds=READY_TIMEOUT_SECONDS, max_bytes=0, follow_redirects=False, env_proxy=False)
    except GpulensError:  # not up yet (or a URL that never will be: the caller's timeout says so)
        return False
    return r.status < 500


def start_server(argv: Sequence[str], ready_url: str, *, timeout_seconds: float, env: Mapping[str, str] | None = None) -> StartedServer:
    """Start `argv` in its own process group and wait until `ready_url` answers."""
    err = tempfile.TemporaryFile()
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(list(argv), stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
                                env=dict(os.environ, **(env or {})))
    except OSError as e:
        err.close()
        return StartedServer(None, None, f"cannot start the server command: {e}")
    server = StartedServer(proc, None, None, err)
    try:
        while time.monotonic() - t0 < timeout_seconds:
            if proc.poll() is not None:
                server.failure = f"the server exited with code {proc.returncode} before it was ready" + server._last_line()
                return server
            if _answers(ready_url):
                server.cold_start_seconds = time.monotonic() - t0
                return server
            time.sleep(READY_POLL_SECONDS)
    except KeyboardInterrupt:
        server.stop()
        raise
    server.failure = f"the server did not answer at {http_client.redact_url(ready_url)} within {timeout_seconds:.0f} s"
    server.stop()
    return server
