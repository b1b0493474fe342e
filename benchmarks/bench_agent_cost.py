"""What `gpulens agent` costs as a user runs it, beside the floor of its visible work (issue 28).

The agent is the README's command, a real subprocess:

    gpulens agent --backend fake:N --interval 1s --listen off --store <tmp>/gpulens.db

and its CPU is read from /proc/<pid>/stat (utime + stime) over a window after start-up. Beside each
agent, in the same run and at the same time (so the machine's load falls on both alike), runs a
**floor loop**: a plain Python process doing the same visible work and nothing else - 30
prometheus-client gauges per GPU set every interval, and the rows the agent stores for a frame
inserted into a WAL SQLite file (the agent's schema of raw samples), committed on the agent's cadence.

Cases: 8 and 64 GPUs at 1 Hz and 10 Hz with `--listen off`; 8 GPUs at 1 Hz with /metrics on
(nobody scraping, and scraped every 15 s as Prometheus does; the floor then serves its gauges with
prometheus-client's own server, scraped alike). Start-up apart: the CPU-seconds of the process until
it is sampling (its banner, printed just before the first sample), beside the floor's start-up.

Goals (issue 28): 8 GPUs x 1 Hz <= 1.5x the floor and <= 0.3 % of a core; 8 GPUs x 10 Hz <= 1.5x the
floor; start-up <= 0.5 CPU-seconds. The window is GPULENS_BENCH_AGENT_SECONDS (default 180 s; e.g.
20 for a quick check, where figures are coarser: /proc counts CPU in 10 ms ticks).

    python benchmarks/bench_agent_cost.py            # this benchmark alone, printed as dicts
    python benchmarks/run_all.py agent_cost          # the same in run_all's table
"""

# (no `from __future__ import annotations`: run_all.py loads this file outside sys.modules, where
# dataclasses cannot resolve string annotations)

import os
import re
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve()
CLK_TCK = os.sysconf("SC_CLK_TCK")
GAUGES_PER_GPU = 30
COMMIT_SECONDS = 1.0  # the agent commits before each evaluation of its alert rules, every second
SCRAPE_SECONDS = 15.0  # Prometheus's default scrape interval
WARMUP_SECONDS = 6.0  # past the first commit, roll-up and evaluation
START_TIMEOUT_SECONDS = 120.0
READY_LINE = "gpulens agent"  # the agent's banner, printed once it is about to sample
FLOOR_READY = "floor ready"


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2 :].split()  # the name may hold spaces: count after it
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rows_per_gpu_frame() -> int:
    """How many rows the agent stores for one fake GPU's sample (the floor inserts as many)."""
    from gpulens import FakeBackend, Store
    from gpulens.pipeline.writer import SampleWriter

    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "count.db") as st:
        return SampleWriter(st, host="bench").write_samples(FakeBackend(gpus=1).sample())


@dataclass
class Case:
    name: str
    gpus: int
    hz: float
    listen: bool = False
    scrape: bool = False
    goal_ratio: float | None = None
    goal_core_percent: float | None = None


@dataclass
class Proc:
    """A started process, the moment it was ready, and its CPU then."""

    popen: subprocess.Popen[str]
    port: int | None = None
    ready_cpu_seconds: float | None = None
    lines: list[str] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)

    def watch(self, ready_text: str) -> None:
        """Read its stderr in a thread; note its CPU at the ready line."""

        def read() -> None:
            assert self.popen.stderr is not None
            for line in self.popen.stderr:
                self.lines.append(line)
                if not self.ready.is_set() and ready_text in line:
                    self.ready_cpu_seconds = cpu_seconds(self.popen.pid)
                    self.ready.set()
            self.ready.set()  # it ended: whoever waits sees ready_cpu_seconds None

        threading.Thread(target=read, daemon=True).start()

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(20)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()

    def ticks_per_second(self) -> float | None:
        """The sampling rate it reached over its life, from its last line: a loop that falls behind
        skips ticks (and costs less), so a figure is only worth its rate. Call after `stop`."""
        time.sleep(0.2)  # the reader thread takes the last lines
        text = " ".join(" ".join(self.lines).split())
        m = re.search(r"(?:stopped after|floor ticks) (\d+)\D.*?over ([\d.]+) ?s", text)
        return int(m.group(1)) / float(m.group(2)) if m and float(m.group(2)) > 0 else None


def _env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    src = str(HERE.parents[1] / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    # An installed gpulens has its bytecode compiled: so do these processes (in a folder of the run's
    # own, after one warm-up start), or start-up would count compiling every module.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
    env.pop("GPULENS_STORE", None)
    env.pop("GPULENS_BACKEND", None)
    env.pop("GPULENS_NOTIFY", None)
    return env


def _slug(case: Case) -> str:
    return "".join(c if c.isalnum() else "-" for c in case.name)


def start_agent(case: Case, tmp: Path) -> Proc:
    port = free_port() if case.listen else None
    store = tmp / f"agent-{_slug(case)}" / "gpulens.db"
    store.parent.mkdir(parents=True)
    interval = f"{1000 / case.hz:g}ms"
    cmd = [sys.executable, "-m", "gpulens", "agent", "--backend", f"fake:{case.gpus}", "--interval", interval,
           "--listen", f"127.0.0.1:{port}" if port else "off", "--store", str(store)]
    p = Proc(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env(tmp),
                              cwd=tmp), port=port)
    p.watch(READY_LINE)
    return p


def start_floor(case: Case, tmp: Path, rows_per_gpu: int) -> Proc:
    port = free_port() if case.listen else None
    db = tmp / f"floor-{_slug(case)}.db"
    cmd = [sys.executable, str(HERE), "--floor", str(case.gpus), str(case.hz), str(rows_per_gpu), str(db), str(port or 0)]
    p = Proc(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env(tmp)), port=port)
    p.watch(FLOOR_READY)
    return p


def _scraper(procs: list[Proc], stop: threading.Event) -> None:
    """Scrape every process with a port every SCRAPE_SECONDS, as Prometheus would."""
    while not stop.wait(SCRAPE_SECONDS):
        for p in procs:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{p.port}/metrics", timeout=10) as r:
                    r.read()
            except OSError:
                pass


def warm_up(tmp: Path, rows_per_gpu: int) -> None:
    """Start the agent (serving /metrics) and the floor once, so that their bytecode is compiled."""
    agent = [sys.executable, "-m", "gpulens", "agent", "--backend", "fake:1", "--listen", f"127.0.0.1:{free_port()}",
             "--store", str(tmp / "warm" / "gpulens.db"), "--duration", "2s"]
    floor = [sys.executable, str(HERE), "--floor", "1", "1", str(rows_per_gpu), str(tmp / "warm-floor.db"),
             str(free_port()), "2"]
    for cmd in (agent, floor):
        subprocess.run(cmd, env=_env(tmp), cwd=tmp, capture_output=True, check=True, timeout=START_TIMEOUT_SECONDS)


def measure(cases: list[Case], window_seconds: float) -> list[dict]:
    rows_per_gpu = rows_per_gpu_frame()
    with tempfile.TemporaryDirectory(dir=os.environ.get("GPULENS_BENCH_TMP")) as tmp_s:
        tmp = Path(tmp_s)
        warm_up(tmp, rows_per_gpu)
        pairs: list[tuple[Case, Proc, Proc]] = []
        stop = threading.Event()
        try:
            for case in cases:
                pairs.append((case, start_agent(case, tmp), start_floor(case, tmp, rows_per_gpu)))
            for case, agent, floor in pairs:
                for who, p in (("agent", agent), ("floor", floor)):
                    if not p.ready.wait(START_TIMEOUT_SECONDS) or p.ready_cpu_seconds is None:
                        raise RuntimeError(f"the {who} of {case.name} did not start: {''.join(p.lines)[-2000:]}")
            scraped = [p for case, a, f in pairs if case.scrape for p in (a, f)]
            if scraped:
                threading.Thread(target=_scraper, args=(scraped, stop), daemon=True).start()
            time.sleep(WARMUP_SECONDS)
            wall0 = time.monotonic()
            cpu0 = {p.popen.pid: cpu_seconds(p.popen.pid) for _, a, f in pairs for p in (a, f)}
            time.sleep(window_seconds)
            wall = time.monotonic() - wall0
            cpu1 = {p.popen.pid: cpu_seconds(p.popen.pid) for _, a, f in pairs for p in (a, f)}
            for case, agent, floor in pairs:
                for who, p in (("agent", agent), ("floor", floor)):
                    if p.popen.poll() is not None:
                        raise RuntimeError(f"the {who} of {case.name} ended: {''.join(p.lines)[-2000:]}")
        finally:
            stop.set()
            for _, agent, floor in pairs:
                agent.stop()
                floor.stop()
    out: list[dict] = []
    for case, agent, floor in pairs:
        a = 100 * (cpu1[agent.popen.pid] - cpu0[agent.popen.pid]) / wall
        f = 100 * (cpu1[floor.popen.pid] - cpu0[floor.popen.pid]) / wall
        ratio = a / f if f else None
        goals, met = [], True
        if case.goal_ratio is not None:
            goals.append(f"<= {case.goal_ratio:g}x floor")
            met = met and ratio is not None and ratio <= case.goal_ratio
        if case.goal_core_percent is not None:
            goals.append(f"<= {case.goal_core_percent:g} %")
            met = met and a <= case.goal_core_percent
        agent_hz, floor_hz = agent.ticks_per_second(), floor.ticks_per_second()
        kept_up = all(r is not None and r >= 0.9 * case.hz for r in (agent_hz, floor_hz))
        behind = "" if kept_up else f"; fell behind: agent {agent_hz or 0:.3g}/s, floor {floor_hz or 0:.3g}/s of {case.hz:g}/s"
        out.append(dict(name=f"agent CPU, {case.name} ({window_seconds:g} s window{behind})", value=a, unit="% of a core",
                        reference="floor loop (same gauges and rows), same run", reference_value=f, ratio=ratio,
                        goal=", ".join(goals), met=(met and kept_up) if goals else None,
                        agent_ticks_per_second=agent_hz, floor_ticks_per_second=floor_hz))
    case, agent, floor = pairs[0]
    start = agent.ready_cpu_seconds or 0.0
    out.append(dict(name=f"agent start-up until sampling, {case.name}", value=start, unit="CPU-s",
                    reference="floor loop's start-up", reference_value=floor.ready_cpu_seconds,
                    ratio=start / floor.ready_cpu_seconds if floor.ready_cpu_seconds else None,
                    goal="<= 0.5 CPU-s", met=start <= 0.5))
    # What loads on first use (the co-location check's analysis, the alert rules' first evaluation) is
    # paid in the first seconds of sampling: shown apart, so moving it out of start-up hides nothing.
    first = cpu0[agent.popen.pid]
    out.append(dict(name=f"agent CPU-s from its start through its first {WARMUP_SECONDS:g}+ s of sampling, {case.name}", value=first,
                    unit="CPU-s", reference="the floor's, likewise", reference_value=cpu0[floor.popen.pid],
                    ratio=first / cpu0[floor.popen.pid] if cpu0[floor.popen.pid] else None, goal="", met=None))
    return out


CASES = [
    Case("8 GPUs x 1 Hz", 8, 1.0, goal_ratio=1.5, goal_core_percent=0.3),
    Case("8 GPUs x 10 Hz", 8, 10.0, goal_ratio=1.5),
    Case("64 GPUs x 1 Hz", 64, 1.0),
    Case("64 GPUs x 10 Hz", 64, 10.0),
    Case("8 GPUs x 1 Hz, /metrics on, unscraped", 8, 1.0, listen=True),
    Case("8 GPUs x 1 Hz, /metrics scraped every 15 s", 8, 1.0, listen=True, scrape=True),
]


def run() -> list[dict]:
    """GPULENS_BENCH_AGENT_CASES (e.g. "8 GPUs x 1 Hz") keeps the cases whose names start with one of
    its comma-separated parts; the first kept case also gives the start-up figure."""
    only = [c.strip() for c in os.environ.get("GPULENS_BENCH_AGENT_CASES", "").split(",") if c.strip()]
    cases = [c for c in CASES if not only or any(c.name.startswith(o) for o in only)]
    return measure(cases, float(os.environ.get("GPULENS_BENCH_AGENT_SECONDS", "180")))


# ------------------------------------------------------------------ the floor loop (its own process)
def floor_loop(gpus: int, hz: float, rows_per_gpu: int, db: str, port: int, duration_s: float | None = None) -> None:
    """The agent's visible work and nothing else: gauges set, rows inserted and committed."""
    import signal

    from prometheus_client import CollectorRegistry, Gauge, start_http_server

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    registry = CollectorRegistry()
    labels = ("gpu", "uuid", "model", "host")
    gauges = [Gauge(f"floor_metric_{k}", "a floor gauge", labels, registry=registry) for k in range(GAUGES_PER_GPU)]
    children = [[g.labels(str(i), f"GPU-{i:04d}", "NVIDIA H200", "bench") for g in gauges] for i in range(gpus)]
    if port:
        start_http_server(port, addr="127.0.0.1", registry=registry)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("CREATE TABLE samples (series_id INTEGER NOT NULL, t REAL NOT NULL, value REAL NOT NULL)")
    conn.execute("CREATE INDEX samples_by_series_time ON samples (series_id, t)")
    print(FLOOR_READY, file=sys.stderr, flush=True)
    interval = 1.0 / hz
    wall0 = time.monotonic()
    pending: list[tuple[int, float, float]] = []
    next_tick = last_commit = time.monotonic()
    n = 0
    end = None if duration_s is None else time.monotonic() + duration_s
    while not stop.is_set() and (end is None or time.monotonic() < end):
        t = time.time()
        n += 1
        for i, row in enumerate(children):
            base = i * rows_per_gpu
            for k, child in enumerate(row):
                child.set(float((n + k) % 100))
            pending.extend((base + k, t, float((n + k) % 100)) for k in range(rows_per_gpu))
        if time.monotonic() - last_commit >= COMMIT_SECONDS:
            conn.execute("BEGIN")
            conn.executemany("INSERT INTO samples VALUES (?, ?, ?)", pending)
            conn.execute("COMMIT")
            pending = []
            last_commit = time.monotonic()
        next_tick += interval
        delay = next_tick - time.monotonic()
        if delay < 0:  # fell behind: skip, do not burst (as the agent does)
            next_tick, delay = time.monotonic(), 0.0
        stop.wait(delay)
    conn.close()
    print(f"floor ticks {n} over {time.monotonic() - wall0:.3f} s", file=sys.stderr, flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--floor"]:
        g, hz_s, rows_s, db_s, port_s = sys.argv[2:7]
        floor_loop(int(g), float(hz_s), int(rows_s), db_s, int(port_s), float(sys.argv[7]) if len(sys.argv) > 7 else None)
    else:
        for r in run():
            print(r)
