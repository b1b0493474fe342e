"""`demo --fleet` stops its processes under one deadline: SIGTERM to all, then SIGKILL to those still
running when the grace period is over (it waited the grace period for each in turn)."""

from __future__ import annotations

import signal
import subprocess
import sys

from gpulens.fleet.procs import stop_processes

STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(600)"


class _Recorded(subprocess.Popen):
    waits: list[float]

    def wait(self, timeout=None):  # noqa: ANN001, ANN201
        if timeout is not None:
            type(self).waits.append(timeout)
        return super().wait(timeout)


def test_processes_that_ignore_sigterm_are_killed_under_one_deadline():
    _Recorded.waits = []
    procs = [_Recorded([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, text=True) for _ in range(3)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"  # SIGTERM is ignored from here on
    stop_processes(procs, grace_seconds=1.0)
    assert [p.returncode for p in procs] == [-signal.SIGKILL] * 3
    # the grace period is shared: what the later waits were given is what the first left over
    assert sum(_Recorded.waits) <= 1.0 + 1e-6, _Recorded.waits
    for p in procs:
        p.stdout.close()


def test_processes_that_stop_on_sigterm_are_not_killed():
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(2)]
    stop_processes(procs, grace_seconds=60.0)
    assert [p.returncode for p in procs] == [-signal.SIGTERM] * 2
