"""Helpers for tests, importable from any test folder (`from testlib import free_port`).

Test folders have their own conftest.py files, so `from conftest import …` would pick whichever
conftest Python imported first; this module has a name of its own.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now and not handed out before in this run: two
    calls in a row (a test's metrics and dashboard ports) can otherwise get the same port back, and
    the second server then fails to bind."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


_free_port = free_port  # older spelling used by some tests


def which_or_skip(binary: str) -> str:
    """Path of an installed program; skips the test (fails under CI) when it is missing."""
    path = shutil.which(binary)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{binary} is not installed; .ci/run should install it")
        pytest.skip(f"{binary} is not installed (run .ci/run or apt-get install it)")
    return path


def import_or_skip(module: str, why: str):
    """pytest.importorskip, except under CI, where a missing test dependency fails the test (the set-up
    should have installed it) instead of letting the test pass by skipping."""
    try:
        return __import__(module, fromlist=["_"])
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail(f"{module} is not installed under CI: {why}")
        pytest.skip(f"{module} is not installed: {why}")


def can_mount() -> bool:
    """Whether this process may mount a tmpfs (root on Linux, with mount(8))."""
    return sys.platform == "linux" and os.geteuid() == 0 and shutil.which("mount") is not None


@contextmanager
def tiny_tmpfs(tmp_path: Path, size: str, name: str = "tiny", *, nr_inodes: int | None = None) -> Iterator[Path]:
    """A folder on a real tmpfs of `size` (mount's spelling: "64k", "16m") and at most `nr_inodes`
    files and folders, unmounted afterwards; skips the test where mounting is not allowed (not root,
    no mount(8), or a sandbox that refuses it)."""
    if not can_mount():
        pytest.skip("needs root to mount a tiny tmpfs")
    mnt = tmp_path / name
    mnt.mkdir()
    options = f"size={size}" + (f",nr_inodes={nr_inodes}" if nr_inodes is not None else "")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs is not allowed here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill_disk(folder: Path, name: str = "filler") -> Path:
    """Write zeros to `folder/name` until its disk is full; returns the file. Unbuffered: a buffered
    file keeps the bytes its last write could not place and raises ENOSPC again when it closes (CI
    failed a full-disk test that way, at the filler's `with` line)."""
    path = folder / name
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)  # a partial write returns short; the next one raises
        except OSError:
            pass
    return path


def wait_until(cond, timeout: float = 60.0, what: str = "the condition", *, interval: float = 0.02):  # noqa: ANN001, ANN201
    """Poll `cond()` until it returns something true, and return that; fail naming `what` after
    `timeout` seconds. For a test that waits for something to happen (a thread, a server, a file); a
    test that needs time to pass drives a `gpulens.clock.FakeClock` instead. The default is generous
    on purpose: a condition that holds returns at once, and a loaded 2-core CI runner can take many
    seconds to start a thread or a process; only a condition that never comes pays the whole wait."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        if got := cond():
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def wait_http(url: str, proc=None, timeout: float = 60.0, log=None, *, until=None, interval: float = 0.2,  # noqa: ANN001
              what: str | None = None) -> bytes:
    """Poll `url` until it answers (and, with `until`, until `until(body)` holds); return the body.
    Fail at once if `proc` exits first, and on failure add `log`'s tail: a Path, or a function
    that returns the text (called only then)."""
    import time
    import urllib.request

    name = what or (proc.args[0] if proc is not None else url)

    def tail() -> str:
        if callable(log):
            return ": " + str(log())[-2000:]
        return (": " + log.read_text()[-2000:]) if log is not None and log.exists() else ""

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{name} exited with {proc.returncode} before {url} came up{tail()}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                body = r.read()
            if until is None or until(body):
                return body
        except OSError:
            pass
        time.sleep(interval)
    raise AssertionError(f"{what} did not come up at {url}{tail()}" if what else f"{url} did not come up{tail()}")


def replay_diagnose_and_report(h200_trace, tmp_path, capsys, extra_events: list[dict]) -> str:  # noqa: ANN001
    """The H200 session with `extra_events` appended to its events, replayed into a store, then
    `diagnose` and `report` on it (each must exit 0); returns what they wrote to stderr."""
    import json

    from gpulens.cli.main import main

    trace = tmp_path / "trace"
    trace.mkdir()
    (trace / "telemetry.jsonl").write_bytes((h200_trace / "telemetry.jsonl").read_bytes())
    lines = (h200_trace / "events.jsonl").read_text().splitlines()
    (trace / "events.jsonl").write_text("\n".join(lines + [json.dumps(e) for e in extra_events]) + "\n")
    db = str(tmp_path / "s.db")
    assert main(["replay", str(trace), "--store", db]) == 0
    capsys.readouterr()
    assert main(["diagnose", "--store", db]) == 0
    assert main(["report", "-o", str(tmp_path / "r.html"), "--store", db]) == 0
    return capsys.readouterr().err
