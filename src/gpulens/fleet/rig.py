"""A fleet on one machine: N `gpulens agent`s as N nodes (fake GPUs, `--host node-I`), a training job
whose ranks write to their node's store, one straggler rank (its GPU thermally throttled from the
agent's start, so its compute takes 1.6x and every other rank waits for it in the all-reduce), one
XID on another node's GPU during the job, optionally an inference service on the first nodes, and one
real Prometheus scraping every agent each second (gpulens.fleet.workload runs the workloads).

Used by tests/diagnose/test_fleet_rig.py, benchmarks/bench_fleet.py and `gpulens demo --fleet N`.
Waits are on conditions (Prometheus holding every record the workloads wrote, the XID), never on
fixed sleeps. `stop()` ends every process the rig started, and removes its work folder when the rig
made it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from gpulens import promql as P
from gpulens.errors import BadInputError, UnavailableError
from gpulens.fleet.procs import FleetStartError, free_ports, log_tail, stop_processes, wait_for, wait_http
from gpulens.fleet.workload import JOB, SERVICE
from gpulens.vocab import names as N
from gpulens.vocab.gpu import GPU_XID_TOTAL

__all__ = ["JOB", "SERVICE", "XID", "FleetRig", "FleetStartError", "demo_rig", "prometheus_binary"]

XID = 79
DEMO_NODES = (2, 16)  # the fewest nodes a multi-node job has; the most one machine runs at ease
DEMO_GPUS_PER_NODE = 4
DEMO_SECONDS = 7 * 86400.0  # the demo's job and service run until Ctrl-C
START_TIMEOUT_SECONDS = 60.0
PROMETHEUS = "prometheus"


def prometheus_binary() -> str:
    """The `prometheus` program on PATH; UnavailableError (exit 3) in one sentence when there is none."""
    path = shutil.which(PROMETHEUS)
    if path is None:
        raise UnavailableError("The fleet needs a Prometheus server to scrape its agents, and there is no `prometheus` on PATH.",
                               hint="Install it (apt-get install prometheus, or a release from prometheus.io/download) and run again.")
    return path


def _gpulens(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpulens.cli.main", *args]


@dataclass
class FleetRig:
    work: Path | None = None  # None: a temp folder of the rig's own, removed by stop()
    nodes: int = 8
    ranks: int = 32
    straggler_node: int = 5
    xid_node: int = 2
    job_seconds: float = 24.0
    xid_after_seconds: float = 12.0  # after the agents start; the job starts about as they do
    scrape_seconds: float = 1.0
    serve_nodes: int = 0  # the first this many nodes also serve SERVICE
    serve_seconds: float = 20.0
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    _own_work: bool = False
    _logs: list = field(default_factory=list)  # the processes' open log files, closed by stop()

    def __post_init__(self) -> None:
        if not 1 <= self.nodes:
            raise BadInputError(f"A fleet needs at least one node, not {self.nodes}.")
        if not (0 <= self.straggler_node < self.nodes and 0 <= self.xid_node < self.nodes and 0 <= self.serve_nodes <= self.nodes):
            raise BadInputError(f"The straggler node ({self.straggler_node}), the XID's node ({self.xid_node}) and the serving "
                                f"nodes ({self.serve_nodes}) must lie among the {self.nodes} nodes.")
        if self.work is None:
            self.work, self._own_work = Path(tempfile.mkdtemp(prefix="gpulens-fleet-")), True

    # ------------------------------------------------------------ layout
    @property
    def gpus_per_node(self) -> int:
        return max(1, self.ranks // self.nodes)

    def host(self, node: int) -> str:
        return f"node-{node}"

    def store(self, node: int) -> Path:
        return self.work / f"{self.host(node)}.db"

    @property
    def straggler_rank(self) -> int:
        return self.straggler_node * self.gpus_per_node + self.gpus_per_node - 1  # the node's last GPU

    @property
    def xid_gpu(self) -> int:
        return 1 % self.gpus_per_node

    @property
    def xid_rank(self) -> int:
        return self.xid_node * self.gpus_per_node + self.xid_gpu

    @property
    def prom_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['prom']}"

    def agent_url(self, node: int) -> str:
        return f"http://127.0.0.1:{self.ports[f'agent{node}']}"

    # ------------------------------------------------------------ lifecycle
    def start(self) -> FleetRig:
        """Agents and Prometheus up, then the workloads; returns once they run. On any failure every
        process started so far is stopped before the error goes up."""
        prometheus = prometheus_binary()
        try:
            self._start(prometheus)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, prometheus: str) -> None:
        work = self.work
        assert work is not None
        names = ["prom", *(f"agent{i}" for i in range(self.nodes))]
        self.ports = dict(zip(names, free_ports(len(names)), strict=True))
        targets = ", ".join(f"'127.0.0.1:{self.ports[f'agent{i}']}'" for i in range(self.nodes))
        (work / "prometheus.yml").write_text(
            f"global:\n  scrape_interval: {self.scrape_seconds:g}s\nscrape_configs:\n  - job_name: gpulens\n"
            f"    static_configs:\n      - targets: [{targets}]\n        labels: {{cluster: rig}}\n")
        self._spawn("prometheus", [prometheus, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'tsdb'}",
                                   f"--web.listen-address=127.0.0.1:{self.ports['prom']}"])
        for i in range(self.nodes):
            faults = []
            if i == self.straggler_node:
                faults += ["--fault", f"throttle:hw_thermal@0s:gpu={self.gpus_per_node - 1}"]
            if i == self.xid_node:
                faults += ["--fault", f"xid:{XID}@{self.xid_after_seconds:g}s:gpu={self.xid_gpu}"]
            self._spawn(f"agent{i}", _gpulens("agent", "--backend", f"fake:{self.gpus_per_node}", "--host", self.host(i), "--interval",
                                               f"{self.scrape_seconds:g}s", "--store", str(self.store(i)), "--learn", "1d",
                                               "--listen", f"127.0.0.1:{self.ports[f'agent{i}']}", *faults))
        for i in range(self.nodes):
            wait_http(f"{self.agent_url(i)}/metrics", self.procs[f"agent{i}"], START_TIMEOUT_SECONDS, work / f"agent{i}.log", f"agent {i}")
        wait_http(f"{self.prom_url}/-/ready", self.procs["prometheus"], START_TIMEOUT_SECONDS, work / "prometheus.log", "prometheus")
        # Ready is not yet scraped: a reader right after start would find no series at all.
        wait_for(lambda: self.value(P.aggregate("count", f"{P.selector(P.TARGET_UP)} == 1")) == self.nodes, START_TIMEOUT_SECONDS,
                 "Prometheus to scrape every agent", interval=0.25)
        if self.ranks:
            self._spawn("job", [sys.executable, "-m", "gpulens.fleet.workload", "job", json.dumps(self.job_spec())])
        if self.serve_nodes:
            spec = {"stores": [str(self.store(i)) for i in range(self.serve_nodes)],
                    "hosts": [self.host(i) for i in range(self.serve_nodes)], "seconds": self.serve_seconds}
            self._spawn("serve", [sys.executable, "-m", "gpulens.fleet.workload", "serve", json.dumps(spec)])

    def job_spec(self) -> dict:
        return {"stores": [str(self.store(i)) for i in range(self.nodes)], "hosts": [self.host(i) for i in range(self.nodes)],
                "ranks": self.ranks, "straggler": self.straggler_rank, "seconds": self.job_seconds}

    def _written(self, name: str, timeout: float) -> int:
        """Wait for workload `name` to end; the records it wrote (the last word of its log)."""
        proc = self.procs[name]
        proc.wait(timeout)
        if proc.returncode != 0:
            raise FleetStartError(f"The rig's {name} exited with {proc.returncode}.", hint=log_tail(self.work / f"{name}.log"))
        return int((self.work / f"{name}.log").read_text().split()[-1])

    def finish(self, timeout: float = 120.0, *, stop_agents: bool = True) -> float:
        """Wait for the workloads to end and for Prometheus to hold every step and request they wrote
        and the XID; stop the agents (their stores are then final) unless told not to. Returns the
        wall time then."""
        if self.ranks:
            steps = self._written("job", timeout)
            wait_for(lambda: self.value(f'sum({P.selector(N.TRAIN_STEP_SECONDS + "_count", {N.TRAIN_JOB_LABEL: JOB})})') == steps, 60,
                     f"Prometheus to hold all {steps} steps", interval=0.5)
            wait_for(lambda: self.value(f'sum({P.selector(GPU_XID_TOTAL, {"xid": str(XID)})})') == 1, 60, "the XID in Prometheus", interval=0.5)
        if self.serve_nodes:
            requests = self._written("serve", timeout)
            wait_for(lambda: self.value(f'sum({P.selector(N.INFER_LATENCY_SECONDS + "_count", {"service": SERVICE})})') == requests, 60,
                     f"Prometheus to hold all {requests} requests", interval=0.5)
        end = time.time()
        if not stop_agents:
            return end
        for i in range(self.nodes):
            self.procs[f"agent{i}"].terminate()
        for i in range(self.nodes):
            if self.procs[f"agent{i}"].wait(30) != 0:
                raise FleetStartError(f"agent {i} exited with {self.procs[f'agent{i}'].returncode}.",
                                      hint=log_tail(self.work / f"agent{i}.log"))
        return end

    def stop(self) -> None:
        """End every process the rig started (SIGTERM, then SIGKILL after 20 s) and remove its own work folder."""
        stop_processes(self.procs.values(), grace_seconds=20.0)
        for log in self._logs:
            log.close()
        self._logs.clear()
        if self._own_work and self.work is not None:
            shutil.rmtree(self.work, ignore_errors=True)

    # ------------------------------------------------------------ helpers
    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.work / f"{name}.log", "w")  # noqa: SIM115 (closed by stop())
        self._logs.append(log)
        src = str(Path(__file__).resolve().parents[2])  # this gpulens, whatever the cwd
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
        self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=self.work, env=env)

    def log(self, name: str) -> str:
        return log_tail(self.work / f"{name}.log", 3000)

    def query(self, expr: str) -> list[dict]:
        url = f"{self.prom_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read())["data"]["result"]

    def value(self, expr: str) -> float | None:
        got = self.query(expr)
        return float(got[0]["value"][1]) if got else None


def demo_rig(nodes: int) -> FleetRig:
    """`gpulens demo --fleet N`: N nodes of 4 fake GPUs, a job of 4N ranks across them all with its
    straggler on the last node, an XID on the first node's GPU 1 after 12 s, and the inference service
    on the first node; the workloads run until stopped, in a temp folder of the rig's own."""
    lo, hi = DEMO_NODES
    if not lo <= nodes <= hi:
        raise BadInputError(f"--fleet takes {lo} to {hi} nodes, not {nodes}.",
                            hint="A multi-node job needs 2 nodes; more than 16 agents crowd one machine.")
    return FleetRig(None, nodes=nodes, ranks=DEMO_GPUS_PER_NODE * nodes, straggler_node=nodes - 1, xid_node=0,
                    job_seconds=DEMO_SECONDS, serve_nodes=1, serve_seconds=DEMO_SECONDS)


def describe(rig: FleetRig) -> list[str]:
    """What the rig runs, and where, in a few lines for a person."""
    return [
        f"A fleet of {rig.nodes} nodes ({', '.join(rig.host(i) for i in range(rig.nodes))}), {rig.gpus_per_node} fake GPUs each; "
        f"job {JOB!r} with {rig.ranks} ranks across them: rank {rig.straggler_rank} on {rig.host(rig.straggler_node)} straggles "
        f"(its GPU thermally throttled); XID {XID} on {rig.host(rig.xid_node)} GPU {rig.xid_gpu} after {rig.xid_after_seconds:g} s"
        + (f"; service {SERVICE!r} on {', '.join(rig.host(i) for i in range(rig.serve_nodes))}." if rig.serve_nodes else "."),
        f"Prometheus: {rig.prom_url}",
        "agents: " + " ".join(f"{rig.agent_url(i)}/metrics" for i in range(rig.nodes)),
        f"work folder: {rig.work}",
    ]


def dead_process(rig: FleetRig) -> str | None:
    """The name of a server of the rig (Prometheus, an agent) that has exited, if one has."""
    return next((name for name, p in rig.procs.items() if name not in ("job", "serve") and p.poll() is not None), None)
