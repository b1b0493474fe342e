"""Write what every open monitor holds when the process ends, however it ends.

A job that never calls `close()` (the README's snippets do not) ends in one of three ways: the
interpreter exits normally (`atexit` runs), a job runner sends SIGTERM (Slurm, Kubernetes,
torchrun: the default action kills the process before `atexit`), or SIGKILL (nothing can run).
Each open monitor registers its `close` here; one `atexit` hook and one SIGTERM handler close them
all. The SIGTERM handler flushes from a thread of its own (gpulens.signals says why) and never
steals the user's: one installed before ours is called after the flush, one installed after ours
replaces it (and a handler that exits still runs `atexit`), and a default action is carried out
afterwards (the process dies by the same signal, so its exit status is what the runner expects).
SIG_IGN is left alone.
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
_flush_state = "idle"  # SIGTERM's flush: idle, flushing (in its thread), done (pass SIGTERM on)
current_pid = os.getpid()  # kept at each fork (no system call on a hot path): a monitor made in another is a copy


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


def _forget_in_child() -> None:
    """A forked child (a DataLoader worker, a multiprocessing pool) holds copies of the parent's
    monitors and their unwritten rows: the parent writes them. Closing the copies at the child's
    exit or SIGTERM (DataLoader terminates a worker that does not stop) stored every row twice."""
    global _flush_state, _lock, current_pid
    _lock = threading.Lock()  # another thread may have held it at the fork: in the child, for good
    _closers.clear()
    _flush_state = "idle"
    current_pid = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


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
    """Two passes. The first hands the flush to a thread and returns at once: the handler runs in the
    main thread, which may hold a monitor's lock right now (inside `send`), and a flush here would
    wait for it forever. The thread flushes once that lock is let go, then sends SIGTERM again; the
    second pass does what SIGTERM would have done without us."""
    global _flush_state
    if _flush_state == "idle":
        _flush_state = "flushing"
        # not a daemon: an interpreter that exits meanwhile waits for the records to be written
        threading.Thread(target=_flush_then_resignal, name="gpulens-exit-flush").start()
        return
    if _flush_state == "flushing":
        return  # the runner's second SIGTERM: the flush's own, when it is done, ends the process
    previous = _previous_sigterm
    if callable(previous):
        previous(signum, frame)
        return
    # The default action: die by SIGTERM, as the process would have without us.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _flush_then_resignal() -> None:
    global _flush_state
    try:
        close_all()
    finally:
        _flush_state = "done"
        os.kill(os.getpid(), signal.SIGTERM)
