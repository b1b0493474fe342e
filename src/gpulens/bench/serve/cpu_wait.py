"""How long the calling thread has been runnable but waiting for a CPU (Linux schedstat).

On a machine whose cores are busy (the server under test on the same host, other work) this is
what a load tester loses to contention rather than to its own work: a send due while its thread
waits for a CPU leaves late, and a closed loop sends fewer requests. Runs report it per worker,
beside their CPU time, so a low throughput or a late schedule can be told apart from a slow tool.
"""

from __future__ import annotations

from pathlib import Path

_PATHS = (Path("/proc/thread-self/schedstat"), Path("/proc/self/schedstat"))


def runnable_wait_seconds() -> float | None:
    """Seconds this thread (else the process's main thread) has waited on a run queue since it
    started; None where the kernel does not say (not Linux, schedstats off)."""
    for path in _PATHS:
        try:
            return int(path.read_text().split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            continue
    return None
