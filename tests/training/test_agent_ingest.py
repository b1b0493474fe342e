"""Workloads reach the node agent over its socket (issue 24, item 3), with real processes.

A `TrainingMonitor` and an `InferenceMonitor`, each in its own process, send to a running
`gpulens agent --backend fake:2 --ingest unix:…`; the agent is stopped by SIGTERM, started again,
killed by SIGKILL, started again, all while they run. Once they exit cleanly, every step and every
request is in the store exactly once.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
from collections import Counter
from pathlib import Path

import pytest
from testlib import wait_until

from gpulens.store import Store
from gpulens.vocab import names as N
from gpulens.workload.wire import Batch, Reply, decode_batch, decode_reply, encode_batch

SRC = Path(__file__).resolve().parents[2] / "src"

WORKLOAD = textwrap.dedent('''
    import json, sys, time
    from pathlib import Path
    kind, address, progress, stop = sys.argv[1:5]
    n = 0
    if kind == "train":
        from gpulens.workload.training.monitor import TrainingMonitor
        mon = TrainingMonitor(job="sock-job", agent=address, flush_interval_seconds=0.05)
        def forever():
            while True:
                yield None
        for _ in mon.data(forever()):
            with mon.step(samples=4, tokens=64) as s:
                time.sleep(0.002)  # the step's own work
                s.loss = 1.0
            n += 1
            if n % 50 == 0:
                Path(progress).write_text(str(n))
                if Path(stop).exists():
                    break
        mon.close()
        dropped = mon.sender.records_dropped
    else:
        from gpulens.workload.inference.monitor import InferenceMonitor
        mon = InferenceMonitor(service="sock-svc", model="m", agent=address)
        while True:
            h = mon.start_request()
            time.sleep(0.004)  # serving it
            h.token(); h.token()
            h.finish("ok" if n % 7 else "error", output_tokens=2)
            n += 1
            if n % 25 == 0:
                Path(progress).write_text(str(n))
                if Path(stop).exists():
                    break
        mon.close()
        dropped = mon.dropped_rows
    print(json.dumps({"done": n, "dropped": dropped}))
''')


@pytest.fixture
def sock_dir():
    d = tempfile.mkdtemp(prefix="gl-", dir="/tmp")  # a Unix socket path must stay under 108 bytes
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("GPULENS_AGENT", None)
    return env


def _start_agent(store: Path, sock: Path, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpulens", "agent", "--backend", "fake:2", "--store", str(store), "--listen", "off",
         "--interval", "200ms", "--ingest", f"unix:{sock}"],
        env=_env(), stdout=subprocess.DEVNULL, stderr=log.open("ab"))

    def listening() -> bool:
        assert proc.poll() is None, f"the agent exited with {proc.returncode}: {log.read_text()[-2000:]}"
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(str(sock))
                return True
            except OSError:
                return False

    wait_until(listening, 30, "the agent's ingest socket")
    return proc


def _counts(store_path: Path) -> tuple[int, int]:
    with Store(store_path, readonly=True) as s:
        return len(s.events(N.EV_TRAIN_STEP)), len(s.events(N.EV_REQUEST))


def _progress(p: Path) -> int:
    try:
        return int(p.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def test_monitors_in_two_processes_lose_nothing_while_the_agent_is_stopped_killed_and_restarted(tmp_path, sock_dir):
    store, sock, log = tmp_path / "node.db", sock_dir / "ingest.sock", tmp_path / "agent.log"
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    stop = tmp_path / "stop"
    prog = {k: tmp_path / f"{k}.progress" for k in ("train", "infer")}
    agent = _start_agent(store, sock, log)
    workloads = {k: subprocess.Popen([sys.executable, str(script), k, f"unix:{sock}", str(prog[k]), str(stop)],
                                     env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for k in ("train", "infer")}
    try:
        wait_until(lambda: all(c > 0 for c in _counts(store)), 60, "steps and requests stored by the agent")
        for sig in (signal.SIGTERM, signal.SIGKILL):
            agent.send_signal(sig)
            agent.wait(30)
            # the workloads go on while the agent is away, and their records wait for it
            marks = {k: _progress(p) for k, p in prog.items()}
            wait_until(lambda m=marks: all(_progress(p) >= m[k] + 100 for k, p in prog.items()), 60,
                       "the workloads to keep running without the agent")
            agent = _start_agent(store, sock, log)
            before = _counts(store)
            wait_until(lambda b=before: all(a > c for a, c in zip(_counts(store), b, strict=True)), 60,
                       "the restarted agent to store what waited")
        stop.write_text("")
        results = {}
        for k, w in workloads.items():
            out, err = w.communicate(timeout=60)
            assert w.returncode == 0, err[-3000:]
            results[k] = json.loads(out.strip().splitlines()[-1])
        assert results["train"]["dropped"] == 0 and results["infer"]["dropped"] == 0
        # close() returned once the agent had stored everything: it is there now, each once
        assert _counts(store) == (results["train"]["done"], results["infer"]["done"])
    finally:
        for w in workloads.values():
            if w.poll() is None:
                w.kill()
        agent.send_signal(signal.SIGTERM)
        agent.wait(30)
    with Store(store, readonly=True) as s:
        steps = Counter(e.data["step"] for e in s.events(N.EV_TRAIN_STEP))
        assert sorted(steps) == list(range(results["train"]["done"])) and set(steps.values()) == {1}
        (step_series,) = s.query(N.TRAIN_STEP_SECONDS, {N.TRAIN_JOB_LABEL: "sock-job"}, resolution="raw")
        assert len(step_series.t) == results["train"]["done"]
        totals = {d.key.labels["status"]: max(d.value) for d in s.query(N.INFER_REQUESTS_TOTAL, {"service": "sock-svc"}, resolution="raw")}
        n = results["infer"]["done"]
        assert totals == {"error": len(range(0, n, 7)), "ok": n - len(range(0, n, 7))}  # the monitor's own counters
        assert len(s.events(N.EV_INFER_START)) == 1 and len(s.events(N.EV_TRAIN_START)) == 1
        assert {e.labels["service"] for e in s.events(N.EV_REQUEST)} == {"sock-svc"}
    assert not sock.exists()  # a stopped agent removes its socket


# ---------------------------------------------------------------- the listener's bounds, over a real socket
def _agent_node(tmp_path, sock_dir, listen=None, **limits):  # noqa: ANN001, ANN003, ANN202
    from gpulens.pipeline import NodeConfig, build_node
    from gpulens.pipeline.ingest_server import IngestLimits
    from gpulens.workload.wire import AgentAddress

    return build_node(NodeConfig(backend="fake:1", store_path=tmp_path / "s.db", alerts=None, colocation=False, listen=listen,
                                 ingest=AgentAddress(path=str(sock_dir / "i.sock")), ingest_limits=IngestLimits(**limits)))


def _exchange(sock: socket.socket, line: bytes) -> Reply:
    sock.sendall(line)
    with sock.makefile("rb") as f:
        return decode_reply(f.readline())


def test_a_batch_is_stored_once_when_it_comes_again_and_bad_batches_are_refused_and_counted(tmp_path, sock_dir):
    import threading

    node = _agent_node(tmp_path, sock_dir)
    stop = threading.Event()
    # the loop's part, as the sampling loop does on every frame
    loop = threading.Thread(target=lambda: [node.ingest.drain() for _ in iter(lambda: stop.wait(0.02), True)])
    loop.start()
    try:
        rec = {"kind": N.EV_TRAIN_STEP, N.TRAIN_JOB_LABEL: "j", "rank": 0, "host": "h", "t_start": 1.7e9, "t_end": 1.7e9 + 1, "step": 0}
        bad = {"kind": "not_a_kind", "t": 1.7e9}
        with socket.socket(socket.AF_UNIX) as c:
            c.connect(str(sock_dir / "i.sock"))
            c.settimeout(10)
            line = encode_batch("s1", 1, [rec, bad])
            assert _exchange(c, line) == Reply(1, ok=True, stored=1, skipped=1)
            again = _exchange(c, line)  # its answer "was lost": the same batch again
            assert again.ok and again.duplicate
            refused = _exchange(c, b'{"v": 1, "sender": "s1", "seq": 2, "records": {}}\n')
            assert not refused.ok and not refused.retry and refused.seq == 2
        assert node.ingest.counters.batches_refused == 1 and node.ingest.counters.duplicates == 1
    finally:
        stop.set()
        loop.join()
        node.close()
    with Store(tmp_path / "s.db", readonly=True) as s:
        assert len(s.events(N.EV_TRAIN_STEP)) == 1
        assert s.get_meta("ingest_seq:s1") == "1"


def test_connections_over_the_cap_are_closed_and_counted(tmp_path, sock_dir):
    node = _agent_node(tmp_path, sock_dir, max_connections=2)
    conns = []
    try:
        for _ in range(3):
            c = socket.socket(socket.AF_UNIX)
            c.connect(str(sock_dir / "i.sock"))
            c.settimeout(10)
            conns.append(c)
        assert conns[2].recv(1) == b""  # closed at once
        assert wait_until(lambda: node.ingest.counters.connections_refused == 1, 10, "the refusal counted")
    finally:
        for c in conns:
            c.close()
        node.close()


def test_wire_round_trip_and_caps():
    b = decode_batch(encode_batch("abc", 3, [{"kind": N.EV_REQUEST, "end": 1.0, "loss": float("nan")}]))
    assert isinstance(b, Batch) and b.seq == 3 and b.records[0]["kind"] == N.EV_REQUEST
    from gpulens.workload.wire import MAX_BATCH_RECORDS, WireFormatError

    with pytest.raises(WireFormatError, match="cap"):
        decode_batch(encode_batch("abc", 1, [{}] * (MAX_BATCH_RECORDS + 1)))


@pytest.mark.parametrize("text", ["10.0.0.1:9", "unix:", "nonsense", "127.0.0.1:0", "unix:/" + "x" * 200])
def test_a_bad_ingest_address_is_one_sentence_and_exit_2(tmp_path, text):
    proc = subprocess.run([sys.executable, "-m", "gpulens", "agent", "--backend", "fake", "--store", str(tmp_path / "s.db"),
                           "--listen", "off", "--duration", "1s", "--ingest", text], env=_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "--ingest" in proc.stderr


def test_half_a_batch_is_cut_off_an_idle_connection_is_not_and_metrics_count_both(tmp_path, sock_dir):
    """A client that sends half a line and stops would hold a connection slot for good; a monitor
    whose connection waits between batches must not be cut off. /metrics counts what happened."""
    import urllib.request

    node = _agent_node(tmp_path, sock_dir, listen=("127.0.0.1", 0), line_timeout_seconds=0.5)
    try:
        idle, stuck = socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)
        for c in (idle, stuck):
            c.connect(str(sock_dir / "i.sock"))
            c.settimeout(10)
        stuck.sendall(b'{"v": 1, "sender": "s", "seq": 1, "rec')  # and nothing more
        assert stuck.recv(1) == b""  # closed by the agent once the line's time ran out
        assert node.ingest.counters.stalled == 1
        assert node.ingest.counters.connections == 2 and idle.fileno() >= 0
        idle.sendall(b"\n")  # the idle one, past the same deadline, is still served: an empty line is refused, not cut off
        assert not decode_reply(idle.makefile("rb").readline()).retry
        port = node.server.server_address[1]
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert 'gpulens_ingest_connections_total{outcome="stalled"} 1.0' in text
        assert 'gpulens_ingest_batches_total{outcome="refused"} 1.0' in text
        assert 'gpulens_ingest_batches_total{outcome="stored"} 0.0' in text  # every outcome from 0
        idle.close()
        stuck.close()
    finally:
        node.close()


PRELOADED_SERVER = textwrap.dedent('''
    import os, sys
    from gpulens.workload.inference import InferenceMonitor
    serving = InferenceMonitor(service="preload", agent=sys.argv[1])  # in the master, as under gunicorn --preload
    with serving.request() as r:
        r.token()
    children = []
    for _ in range(2):  # two workers, forked after the monitor was made
        pid = os.fork()
        if pid == 0:
            for _ in range(20):
                with serving.request() as r:
                    r.token()
            sys.exit(0)  # through the interpreter: the worker's sender hands the agent what is left
        children.append(pid)
    for pid in children:
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    serving.close()
    print(" ".join(map(str, [os.getpid(), *children])))
''')


def test_a_monitor_made_before_a_fork_sends_from_each_worker_over_its_own_connection(tmp_path, sock_dir):
    """gunicorn --preload with the node agent: each forked worker's requests reach the agent once,
    under the worker's pid; the master's sender socket is never written from a worker."""
    store, sock, log = tmp_path / "node.db", sock_dir / "ingest.sock", tmp_path / "agent.log"
    script = tmp_path / "server.py"
    script.write_text(PRELOADED_SERVER)
    agent = _start_agent(store, sock, log)
    try:
        done = subprocess.run([sys.executable, str(script), f"unix:{sock}"], env=_env(), capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "Traceback" not in done.stderr and "could not start over" not in done.stderr, done.stderr
        master, *workers = map(int, done.stdout.split())
        wait_until(lambda: _counts(store)[1] >= 41, 60, "the 41 requests stored by the agent")
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(30)
    with Store(store, readonly=True) as s:
        by_pid = Counter(e.data["pid"] for e in s.events(N.EV_REQUEST))
        started = sorted(e.data["pid"] for e in s.events(N.EV_INFER_START))
        counted = {d.key.labels[N.PID_LABEL]: d.value[-1] for d in s.query(N.INFER_REQUESTS_TOTAL)}
        in_flight = {d.key.labels[N.PID_LABEL] for d in s.query(N.INFER_IN_FLIGHT)}
    assert by_pid == {master: 1, workers[0]: 20, workers[1]: 20}, by_pid
    assert started == sorted([master, *workers])
    # each worker's own request counter is its own series, as with a store file
    assert counted == {str(master): 1.0, str(workers[0]): 20.0, str(workers[1]): 20.0}, counted
    assert in_flight == {str(master), *map(str, workers)}
