"""A signal that lands while the main thread holds a lock still stops the process (gpulens.signals).

Python runs a handler in the main thread between two bytecodes; a handler that takes a lock that
thread holds waits forever. Both windows are opened on purpose here, deterministically: the main
thread takes the lock, signals itself, and only lets go after the handler has run."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def _run(tmp_path: Path, code: str) -> subprocess.CompletedProcess:
    script = tmp_path / "job.py"
    script.write_text(f"import sys; sys.path.insert(0, {str(SRC)!r})\n" + textwrap.dedent(code))
    # a deadlock is the failure: the generous timeout only bounds how long the test waits to see one
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)


def test_sigterm_while_the_stop_event_lock_is_held_still_stops_the_loop(tmp_path):
    """The agent's loop waits on its stop event; every wait holds the event's lock for a moment (an
    agent once ignored SIGTERM for good that way). Setting the event from the handler would wait for
    that lock in the very thread that holds it."""
    done = _run(tmp_path, """
        import os, signal, time
        from gpulens.cli.agent import install_stop_handlers
        from gpulens.pipeline.loop import StopEvent

        stop = StopEvent()
        install_stop_handlers(stop)
        with stop._cond:  # the lock Event.wait holds between its check and its sleep
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # bytecodes: the handler runs among them, the lock still held
                time.sleep(0)
        print("stopped" if stop.wait(60) else "not stopped", flush=True)
    """)
    assert done.returncode == 0 and done.stdout.strip() == "stopped", done.stderr


def test_sigterm_while_a_monitor_is_mid_record_flushes_once_it_lets_go(tmp_path):
    """A job runner's SIGTERM lands while the job's main thread is inside the monitor (holding its
    lock): the flush waits for the lock, not forever, then the process dies by SIGTERM as it would
    have without gpulens, with every request stored."""
    done = _run(tmp_path, """
        import os, signal, time
        from gpulens.workload.inference import InferenceMonitor

        mon = InferenceMonitor(service="chat", store="job.db")
        for _ in range(12):
            with mon.request() as r:
                r.token()
        with mon._lock:  # what record() holds while it buffers a request
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):
                time.sleep(0)
        time.sleep(60)  # the flush's own SIGTERM ends the process long before this
        print("still alive", flush=True)
    """)
    assert done.returncode == -signal.SIGTERM, (done.returncode, done.stdout, done.stderr)
    with sqlite3.connect(tmp_path / "job.db") as db:
        assert db.execute("SELECT COUNT(*) FROM events WHERE kind = 'request'").fetchone()[0] == 12


def test_a_forked_child_dies_by_its_own_sigterm_and_leaves_the_parent_running(tmp_path):
    """The relay's pipe is the parent's: a child's signal written there would stop the parent, and
    the child, with no relay, would not stop at all."""
    done = _run(tmp_path, """
        import os, signal
        from gpulens.cli.agent import install_stop_handlers
        from gpulens.pipeline.loop import StopEvent

        stop = StopEvent()
        install_stop_handlers(stop)
        pid = os.fork()
        if pid == 0:
            os.kill(os.getpid(), signal.SIGTERM)
            signal.pause()  # not reached: the default action ends the child
            os._exit(3)
        _, status = os.waitpid(pid, 0)
        print(os.WTERMSIG(status) if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}",
              "parent stopped" if stop.wait(1) else "parent running", flush=True)
    """)
    assert done.returncode == 0 and done.stdout.split() == [str(int(signal.SIGTERM)), "parent", "running"], \
        (done.stdout, done.stderr)
