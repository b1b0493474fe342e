"""Write what every open monitor holds when the process ends, however it ends.

A job that never calls `close()` (the README's snippets do not) ends in one of three ways: the
interpreter exits normally (`atexit` runs), a job runner sends SIGTERM (Slurm, Kubernetes,
torchrun: the default action kills the process before `atexit`), or SIGKILL (nothing can run).
Each open monitor registers its `close` here; one `atexit` hook and one SIGTERM handler close them
all. The SIGTERM handler never steals the user's: one installed before ours is called after the
flush, one installed after ours replaces it (and a handler that exits still runs `atexit`), and a
default action is carried out afterwards (the process dies by the same signal, so its exit status
is what the runner expects). SIG_IGN is left alone.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

_lock = threading.Lock()
_closers: dict[int, Callable[[], None]] = {}  # id(monitor) -> its close, in registration order
_hooked = False
_previous_sigterm: Any = None


def register(owner: object, close: Callable[[], None]) -> None:
    """Close `owner` (call `close`) at interpreter exit or SIGTERM, unless it was closed before."""
    global _hooked
    with _lock:
        _closers[id(owner)] = close
        if _hooked:
            return
        _hooked = True
    atexit.register(close_all)
    _hook_sigterm()


def unregister(owner: object) -> None:
    with _lock:
        _closers.pop(id(owner), None)


def close_all() -> None:
    """Close every registered monitor, newest first; one failing never stops the others."""
    with _lock:
        closers = list(_closers.values())[::-1]
        _closers.clear()
    for close in closers:
        try:
            close()
        except Exception:  # at exit, a failing store must not hide the others' records
            log.exception("gpulens: a monitor could not write its last records at exit")


def _hook_sigterm() -> None:
    global _previous_sigterm
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread; atexit still covers a clean exit
    try:
        previous = signal.getsignal(signal.SIGTERM)
    except (ValueError, OSError):
        return
    if previous is signal.SIG_IGN or previous is None:  # ignored on purpose, or set outside Python
        return
    _previous_sigterm = previous
    signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum: int, frame: Any) -> None:
    close_all()
    previous = _previous_sigterm
    if callable(previous):
        previous(signum, frame)
        return
    # The default action: die by SIGTERM, as the process would have without us.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
