"""A monitor never loses what it was given: the README's and docs' snippets, run as written in a
process that simply ends (no `close()`), store every step and request; SIGTERM from a job runner
flushes too, without stealing the user's own handler; a store that refuses writes costs a bounded,
counted buffer."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from testlib import wait_until

from gpulens.store import Store
from gpulens.workload.inference import InferenceMonitor

REPO = Path(__file__).resolve().parents[2]
STEPS = 60

# What a user's job supplies around the snippet: a loader, a model, an optimizer, a generator.
PRELUDE = f"""
class _Loss:
    def backward(self): pass
class _Out:
    loss = _Loss()
class _Batch(list):
    def numel(self): return 8 * len(self)
loader = [_Batch(range(4)) for _ in range({STEPS})]
model = lambda batch: _Out()
class _Opt:
    def step(self): pass
    def zero_grad(self): pass
opt = _Opt()
n_tokens, n_params = 32, 1_000_000
def save(*a): pass
def evaluate(*a): pass
def generate(prompt): return iter(range(5))
prompt = "hello"
def load_model(): return object()
"""


def python_block(doc: str, anchor: str) -> str:
    """The ```python block of `doc` that contains `anchor`."""
    blocks = re.findall(r"```python\n(.*?)```", (REPO / doc).read_text(), flags=re.S)
    found = [b for b in blocks if anchor in b]
    assert len(found) == 1, f"{doc}: expected one python block with {anchor!r}, found {len(found)}"
    return found[0]


def run_script(tmp_path: Path, code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    script = tmp_path / "job.py"
    script.write_text(PRELUDE + code)
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=timeout)


def counts(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as conn:
        return dict(conn.execute("SELECT kind, COUNT(*) FROM events GROUP BY kind").fetchall())


def test_the_readme_snippet_run_as_written_stores_every_step_and_request(tmp_path):
    done = run_script(tmp_path, python_block("README.md", "InferenceMonitor("))
    assert done.returncode == 0, done.stderr
    got = counts(tmp_path / ".gpulens" / "gpulens.db")
    assert got.get("train_step") == STEPS
    assert got.get("request") == 1


@pytest.mark.parametrize("requests", [5, 30])
def test_the_readme_serving_snippet_in_a_loop_stores_every_request(tmp_path, requests):
    """The issue's cases: 5 requests stored 0, a 30-request job stored 29."""
    block = python_block("README.md", "InferenceMonitor(")
    serving = block[block.index("serving = "):]
    head, body = serving.split("\n", 1)
    code = f"from gpulens import InferenceMonitor\n{head}\nfor _ in range({requests}):\n{textwrap.indent(body, '    ')}"
    done = run_script(tmp_path, code)
    assert done.returncode == 0, done.stderr
    assert counts(tmp_path / ".gpulens" / "gpulens.db").get("request") == requests


def test_the_training_doc_snippet_stores_every_step(tmp_path):
    code = python_block("docs/training.md", "mon.evaluation()")
    done = run_script(tmp_path, code)
    assert done.returncode == 0, done.stderr
    got = counts(tmp_path / "run.db")
    assert got.get("train_step") == STEPS
    assert got.get("train_eval") == 1  # step 0 is a multiple of 500


def test_the_inference_doc_snippet_behind_a_real_asgi_app_stores_every_request(tmp_path):
    pytest.importorskip("fastapi")
    code = "from fastapi import FastAPI\n" + python_block("docs/inference.md", "add_middleware(InferenceMiddleware")
    code += textwrap.dedent("""
        from starlette.testclient import TestClient
        @app.get("/v1/chat")
        def chat():
            return {"ok": True}
        with TestClient(app) as client:
            for _ in range(7):
                assert client.get("/v1/chat").status_code == 200
    """)
    done = run_script(tmp_path, code)
    assert done.returncode == 0, done.stderr
    got = counts(tmp_path / ".gpulens" / "gpulens.db")
    assert got.get("request") == 7
    assert got.get("cold_start") == 1


SIGTERM_JOB = """
import signal, sys, time
from gpulens import InferenceMonitor, TrainingMonitor
{before}
serving = InferenceMonitor("job.db", service="chat", model="m")
mon = TrainingMonitor(job="ft", store="job.db")
{after}
for _ in range(12):
    with serving.request() as r:
        r.token()
    with mon.step(samples=1):
        pass
print("ready", flush=True)
time.sleep(600)
"""


def run_until_sigterm(tmp_path: Path, before: str = "", after: str = "") -> subprocess.CompletedProcess:
    script = tmp_path / "job.py"
    script.write_text(SIGTERM_JOB.format(before=before, after=after))
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_sigterm_from_a_job_runner_flushes_and_the_process_still_dies_by_it(tmp_path):
    done = run_until_sigterm(tmp_path)
    assert done.returncode == -signal.SIGTERM, done.stderr
    got = counts(tmp_path / "job.db")
    assert got.get("request") == 12 and got.get("train_step") == 12


def test_a_users_sigterm_handler_installed_before_still_runs_after_the_flush(tmp_path):
    before = ("def mine(signum, frame):\n    print('mine ran', flush=True)\n    sys.exit(7)\n"
              "signal.signal(signal.SIGTERM, mine)")
    done = run_until_sigterm(tmp_path, before=before)
    assert done.returncode == 7 and "mine ran" in done.stdout, done.stderr
    got = counts(tmp_path / "job.db")
    assert got.get("request") == 12 and got.get("train_step") == 12


def test_a_users_sigterm_handler_installed_after_is_left_in_place(tmp_path):
    after = ("def mine(signum, frame):\n    print('mine ran', flush=True)\n    sys.exit(5)\n"
             "signal.signal(signal.SIGTERM, mine)")
    done = run_until_sigterm(tmp_path, after=after)
    assert done.returncode == 5 and "mine ran" in done.stdout, done.stderr
    got = counts(tmp_path / "job.db")  # its sys.exit runs atexit, which flushes
    assert got.get("request") == 12 and got.get("train_step") == 12


def test_a_store_that_refuses_writes_costs_a_bounded_counted_buffer(tmp_path):
    db = tmp_path / "locked.db"
    Store(db).close()
    store = Store(db, batch_size=20, max_pending_rows=100, busy_timeout_seconds=0.05)
    mon = InferenceMonitor(store, service="chat", flush_interval_seconds=None)
    blocker = sqlite3.connect(db, timeout=0.05)
    blocker.execute("BEGIN EXCLUSIVE")  # another process holds the write lock: every flush fails
    for _ in range(200):
        with mon.request() as r:
            r.token()
    held = mon.pending_rows
    assert 0 < held <= 3 * (100 + 20)  # samples, events and rows of series not yet created: each bounded
    dropped = mon.dropped_rows
    assert dropped > 0
    blocker.rollback()
    blocker.close()
    mon.close()
    stored = wait_until(lambda: counts(db).get("request"), what="the buffered requests to be committed")
    assert 0 < stored < 200  # what was held is written; what was dropped is gone, and counted
    assert mon.dropped_rows == dropped and mon.pending_rows == 0
    store.close()


FORKED_WORKER_JOB = """
import multiprocessing as mp, sys, time
from gpulens.workload.inference import InferenceMonitor
from gpulens.workload.training import TrainingMonitor

def worker(how, ready):
    ready.set()
    if how == "exit":
        sys.exit(0)  # a child that ends through the interpreter runs the atexit hook it inherited
    time.sleep(600)

if __name__ == "__main__":
    serving = InferenceMonitor(service="chat", store="job.db")
    mon = TrainingMonitor(job="ft", store="job.db")
    for _ in range(12):
        with serving.request() as r:
            r.token()
        with mon.step(samples=1):
            pass
    ctx = mp.get_context("fork")
    for how in ("terminate", "exit"):  # DataLoader terminates a worker that does not stop
        ready = ctx.Event()
        p = ctx.Process(target=worker, args=(how, ready))
        p.start()
        if how == "terminate":
            assert ready.wait(60)  # the worker runs its own code: the fork is behind it
            p.terminate()
        p.join()
"""


def test_a_forked_worker_never_writes_the_parents_rows_again(tmp_path):
    """A DataLoader worker or a pool process is a fork of the job: it holds copies of the monitors'
    unwritten rows, which its exit or SIGTERM used to flush as well (every request stored twice)."""
    script = tmp_path / "job.py"
    script.write_text(FORKED_WORKER_JOB)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert done.returncode == 0, done.stderr
    got = counts(tmp_path / "job.db")
    assert got.get("request") == 12 and got.get("train_step") == 12, got


FORKED_USER_JOB = """
import os, sys, threading
from gpulens.errors import MonitorUsageError
from gpulens.workload.inference import InferenceMonitor
from gpulens.workload.training import TrainingMonitor

serving = InferenceMonitor(service="chat", store="job.db")  # made before the fork, as under gunicorn --preload
mon = TrainingMonitor(job="ft", store="job.db")
with serving.request() as r:
    r.token()
print("parent", os.getpid(), flush=True)
pid = os.fork()
if pid == 0:
    def serve():
        for _ in range(5):
            with serving.request() as r:  # in the fork: the monitor starts over here on first use
                r.token()
    threads = [threading.Thread(target=serve) for _ in range(2)]  # two threads race to that first use
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        with mon.step(samples=1):
            pass
    except MonitorUsageError as e:
        print("refused:", e, flush=True)
    print("child", os.getpid(), flush=True)
    sys.exit(0)  # as a gunicorn worker ends: through the interpreter, which writes what the child buffered
os.waitpid(pid, 0)
"""


def test_an_inference_monitor_made_before_a_fork_records_in_the_fork_too(tmp_path):
    """gunicorn --preload: the monitor is made in the master and used in each forked worker. The
    worker's requests are stored, under its own pid, each once; the parent's once; a TrainingMonitor
    (a DataLoader worker has no steps of its own) still refuses."""
    script = tmp_path / "job.py"
    script.write_text(FORKED_USER_JOB)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "could not start over" not in done.stderr, done.stderr
    assert "refused: this TrainingMonitor was made in process" in done.stdout, done.stdout
    pids = {line.split()[0]: int(line.split()[1]) for line in done.stdout.splitlines() if line.startswith(("parent", "child"))}
    with sqlite3.connect(tmp_path / "job.db") as conn:
        rows = conn.execute("SELECT kind, json_extract(data, '$.pid') FROM events WHERE kind IN ('request', 'infer_start')").fetchall()
    assert sorted(rows) == sorted([("infer_start", pids["parent"]), ("infer_start", pids["child"]),
                                   ("request", pids["parent"])] + [("request", pids["child"])] * 10), rows


FORK_WITHOUT_A_STORE = """
import os, sys
from gpulens.workload.inference import InferenceMonitor

serving = InferenceMonitor(service="chat", store="job.db", flush_interval_seconds=None)
pid = os.fork()
if pid == 0:
    os.rename("job.db", "moved.db")
    os.mkdir("job.db")  # what the fork finds at the store path cannot be opened
    for _ in range(3):
        with serving.request() as r:  # served all the same
            r.token()
    print("served", flush=True)
    sys.exit(0)
assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
"""


def test_a_fork_that_cannot_open_the_store_says_so_once_and_serves(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(FORK_WITHOUT_A_STORE)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert done.returncode == 0 and "served" in done.stdout, done.stderr
    assert done.stderr.count("could not start over") == 1 and "Traceback" not in done.stderr, done.stderr


FORK_THAT_FAILS_AFTER_OPENING = """
import os, sys
from gpulens.errors import StoreError
from gpulens.store import Store
from gpulens.workload.inference import InferenceMonitor

serving = InferenceMonitor(service="chat", store="job.db", flush_interval_seconds=None)
parents = serving.store
pid = os.fork()
if pid == 0:
    def refuse(*a, **k):
        raise StoreError("the disk is full")
    Store.event = refuse  # the worker opens its own store, then cannot write its first row
    with serving.request() as r:
        r.token()
    print("new store closed:", serving.store is not parents and serving.store._conn is None, flush=True)
    print("parent's copy untouched:", parents._conn is not None, flush=True)
    sys.exit(0)
assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
"""


def test_a_fork_that_fails_after_opening_its_store_closes_it(tmp_path):
    """The start-over opened a connection and then failed: that connection is closed at once (not
    left to the garbage collector), and the parent's copy is never touched."""
    script = tmp_path / "job.py"
    script.write_text(FORK_THAT_FAILS_AFTER_OPENING)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert done.returncode == 0, done.stderr
    assert "new store closed: True" in done.stdout and "parent's copy untouched: True" in done.stdout, done.stdout
    assert done.stderr.count("could not start over") == 1 and "Traceback" not in done.stderr, done.stderr
