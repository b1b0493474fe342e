"""Signal handlers that cannot deadlock the thread they interrupt.

Python runs a signal handler in the main thread between two bytecodes, possibly while that thread
holds a lock: `threading.Event.set()` takes the event's own lock, which every `wait()` holds for a
moment, and a monitor's flush takes the monitor's. Called from the handler, either waits forever
for a lock its own thread holds: an agent then never stops after SIGTERM (about one stop in 300 for
a loop that waits 0.5 ms at a time; rarer, never gone, at the agent's 200 ms). So the handlers here
only write a byte to a pipe, and a thread of their own reads it and does the work, taking locks as
any other thread does: after the interrupted thread lets go.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable

_actions: dict[int, Callable[[int], None]] = {}  # signum -> what the relay runs for it
_relay_lock = threading.Lock()
_write_end: int | None = None  # the pipe the handler writes to; its relay thread starts once


def on_signals(signals: Iterable[signal.Signals], action: Callable[[int], None]) -> bool:
    """Run `action(signum)` in the relay thread each time one of `signals` arrives (a later call for
    the same signal replaces the action). False where handlers cannot be set (not the main thread):
    the caller's other ways to stop still work."""
    global _write_end
    if threading.current_thread() is not threading.main_thread():
        return False
    with _relay_lock:
        if _write_end is None:
            read_end, _write_end = os.pipe()
            os.set_blocking(_write_end, False)
            threading.Thread(target=_relay, args=(read_end,), name="gpulens-signal-relay", daemon=True).start()
        for sig in signals:
            _actions[int(sig)] = action
            signal.signal(sig, _handler)
    return True


def _handler(signum: int, frame: object) -> None:
    if _write_end is None:
        return
    try:
        os.write(_write_end, bytes([signum]))
    except OSError:  # the pipe is full: signals are already on their way to the relay
        pass


def _relay(read_end: int) -> None:
    while True:
        for signum in os.read(read_end, 64):
            action = _actions.get(signum)
            try:
                if action is not None:
                    action(signum)
            except Exception:  # the relay outlives a failing action: the next signal still arrives
                logging.getLogger(__name__).exception("gpulens: the action for signal %d failed", signum)


def _reset_in_child() -> None:
    """A forked child has no relay thread, and its pipe is the parent's: a signal there would stop
    the parent. The child gets the default actions back (and sets its own handlers if it wants)."""
    global _write_end, _relay_lock
    _relay_lock = threading.Lock()
    if _write_end is None:
        return
    for signum in _actions:
        signal.signal(signum, signal.SIG_DFL)
    _actions.clear()
    os.close(_write_end)
    _write_end = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)
