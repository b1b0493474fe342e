"""Waiting on the rig's processes: a free port, an HTTP endpoint that comes up, a condition that
becomes true. Every wait is on a condition with a deadline, never a fixed sleep; a process that dies
first ends the wait at once with one sentence (FleetStartError, exit 3)."""

from __future__ import annotations

import contextlib
import logging
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from gpulens.errors import UnavailableError

log = logging.getLogger(__name__)

T = TypeVar("T")


class FleetStartError(UnavailableError):
    """A process of the fleet rig did not come up (or a condition did not hold in time)."""


def free_ports(count: int) -> list[int]:
    """`count` different TCP ports on 127.0.0.1, free right now: each socket stays bound until all
    are picked, so the OS cannot hand the same port back twice (one port per rig process)."""
    with contextlib.ExitStack() as held:
        socks = [held.enter_context(socket.socket()) for _ in range(count)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def log_tail(path: Path, chars: int = 2000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def wait_for(cond: Callable[[], T], timeout: float, what: str, *, interval: float = 0.2) -> T:
    """Poll `cond()` until it returns something true, and return it; FleetStartError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        if got := cond():
            return got
        if time.monotonic() > deadline:
            raise FleetStartError(f"Timed out after {timeout:g} s waiting for {what}.", hint="Its log is in the rig's work folder.")
        time.sleep(interval)


def wait_http(url: str, proc: subprocess.Popen, timeout: float, log: Path, what: str) -> bytes:
    """Poll `url` until it answers; fail at once, with the tail of `log`, if `proc` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            last = (log_tail(log).strip().splitlines() or [""])[-1]
            raise FleetStartError(f"{what} exited with {proc.returncode} before {url} came up{': ' + last if last else ''}.",
                                  hint=f"Its whole log: {log}.")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                return r.read()
        except OSError:
            time.sleep(0.2)
    raise FleetStartError(f"{what} did not come up at {url} in {timeout:g} s.", hint=f"Its log: {log}.")


def stop_processes(procs: Iterable[subprocess.Popen], grace_seconds: float = 20.0) -> None:
    """SIGTERM every process still running, then wait for them all; SIGKILL those still running when
    `grace_seconds` have passed. One deadline for all: waiting `grace_seconds` for each in turn let
    a stop with two stuck processes take three times as long."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace_seconds
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            what = " ".join(map(str, p.args)) if isinstance(p.args, list | tuple) else str(p.args)
            log.warning("pid %d (%s) did not stop within %g s of SIGTERM; killed", p.pid, what[:80], grace_seconds)
            p.kill()
            p.wait()

