"""A fleet on one machine: N `gpulens agent`s as N nodes (fake GPUs, `--host node-I`), a training job
whose ranks write to their node's store, one straggler rank (its GPU thermally throttled from the
agent's start, so its compute takes 1.6x and every other rank waits for it in the all-reduce), one
XID on another node's GPU during the job, and one real Prometheus scraping every agent each second.

The job is one process (`python tests/fleet_rig.py job ...`) that writes every rank's records the way
a TrainingMonitor's writer does (`train_start`, then `write_step` per step, a commit per round): cheap
enough for 32 ranks on a 2-core machine. Waits are on conditions (Prometheus holding every step the
job wrote, the XID), never on fixed sleeps.

As a script, for a demo or a benchmark by hand:

    PYTHONPATH=src python tests/fleet_rig.py --nodes 8 --ranks 32   # prints the Prometheus URL, Ctrl-C stops
    gpulens diagnose --prometheus http://127.0.0.1:PORT --window 10m
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from testlib import free_port, wait_http, wait_until  # noqa: E402

JOB = "pretrain"
STEP_DATA_S, STEP_COMPUTE_S, SLOW_FACTOR, ALLREDUCE_S = 0.01, 0.30, 1.6, 0.02
XID = 79


def _gpulens(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpulens.cli.main", *args]


@dataclass
class FleetRig:
    work: Path
    nodes: int = 8
    ranks: int = 32
    straggler_node: int = 5
    xid_node: int = 2
    job_seconds: float = 24.0
    xid_after_seconds: float = 12.0  # after the agents start; the job starts about as they do
    scrape_seconds: float = 1.0
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)

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

    # ------------------------------------------------------------ lifecycle
    def start(self) -> FleetRig:
        """Agents and Prometheus up, then the job; returns once the job runs."""
        self.ports = {"prom": free_port(), **{f"agent{i}": free_port() for i in range(self.nodes)}}
        targets = ", ".join(f"'127.0.0.1:{self.ports[f'agent{i}']}'" for i in range(self.nodes))
        (self.work / "prometheus.yml").write_text(
            f"global:\n  scrape_interval: {self.scrape_seconds:g}s\nscrape_configs:\n  - job_name: gpulens\n"
            f"    static_configs:\n      - targets: [{targets}]\n        labels: {{cluster: rig}}\n")
        self._spawn("prometheus", ["prometheus", f"--config.file={self.work / 'prometheus.yml'}", f"--storage.tsdb.path={self.work / 'tsdb'}",
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
            wait_http(f"http://127.0.0.1:{self.ports[f'agent{i}']}/metrics", self.procs[f"agent{i}"], 60, log=self.work / f"agent{i}.log", what=f"agent {i}")
        wait_http(f"{self.prom_url}/-/ready", self.procs["prometheus"], 60, log=self.work / "prometheus.log", what="prometheus")
        self._spawn("job", [sys.executable, __file__, "job", json.dumps(self.job_spec())])
        return self

    def job_spec(self) -> dict:
        return {"stores": [str(self.store(i)) for i in range(self.nodes)], "hosts": [self.host(i) for i in range(self.nodes)],
                "ranks": self.ranks, "straggler": self.straggler_rank, "seconds": self.job_seconds}

    def finish(self, timeout: float = 120.0, *, stop_agents: bool = True) -> float:
        """Wait for the job to end and for Prometheus to hold every step it wrote and the XID; stop
        the agents (their stores are then final) unless told not to. Returns the wall time then."""
        job = self.procs["job"]
        job.wait(timeout)
        assert job.returncode == 0, self.log("job")
        steps = int((self.work / "job.log").read_text().split()[-1])
        wait_until(lambda: self.value(f'sum(train_step_seconds_count{{train_job="{JOB}"}})') == steps, 60,
                   f"Prometheus to hold all {steps} steps", interval=0.5)
        wait_until(lambda: self.value(f'sum(gpu_xid_errors_total{{xid="{XID}"}})') == 1, 60, "the XID in Prometheus", interval=0.5)
        end = time.time()
        if not stop_agents:
            return end
        for i in range(self.nodes):
            self.procs[f"agent{i}"].terminate()
        for i in range(self.nodes):
            assert self.procs[f"agent{i}"].wait(30) == 0, self.log(f"agent{i}")
        return end

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()

    # ------------------------------------------------------------ helpers
    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.work / f"{name}.log", "w")  # noqa: SIM115 (closed with the process)
        src = str(Path(__file__).resolve().parents[1] / "src")  # this checkout's gpulens, whatever the cwd
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
        self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=self.work, env=env)

    def log(self, name: str) -> str:
        path = self.work / f"{name}.log"
        return path.read_text()[-3000:] if path.exists() else ""

    def query(self, expr: str) -> list[dict]:
        url = f"{self.prom_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read())["data"]["result"]

    def value(self, expr: str) -> float | None:
        got = self.query(expr)
        return float(got[0]["value"][1]) if got else None


# ------------------------------------------------------------------ the job (a process of its own)
def run_job(spec: dict) -> int:
    """Every rank's records, in real time: rank r on node r // per_node, CUDA device r % per_node.
    Returns the steps written."""
    from gpulens.store import Store
    from gpulens.vocab import names as N
    from gpulens.workload.training.records import StepRecord, write_step

    stores = [Store(p) for p in spec["stores"]]
    ranks, per_node = spec["ranks"], max(1, spec["ranks"] // len(stores))
    slowest = STEP_COMPUTE_S * SLOW_FACTOR
    period = STEP_DATA_S + slowest + ALLREDUCE_S
    t0 = time.time()
    labels, ids = [], []
    for r in range(ranks):
        node = min(r // per_node, len(stores) - 1)
        lab = {N.TRAIN_JOB_LABEL: JOB, "rank": str(r), "host": spec["hosts"][node]}
        labels.append((node, lab))
        ids.append({})
        stores[node].event(N.EV_TRAIN_START, t0, lab, {"pid": 20000 + r, "rank": r, "world_size": ranks, "gpu": r % per_node})
    written, step = 0, 0
    while (t_end := t0 + (step + 1) * period) <= t0 + spec["seconds"]:
        time.sleep(max(0.0, t_end - time.time()))
        for r, (node, lab) in enumerate(labels):
            compute = slowest if r == spec["straggler"] else STEP_COMPUTE_S
            rec = StepRecord(t_start=t_end - period, t_end=t_end, step=step, step_s=period, data_wait_s=STEP_DATA_S, compute_s=compute,
                             comm_wait_s=period - STEP_DATA_S - compute, checkpoint_s=0.0, samples=8, tokens=16384,
                             loss=2.5 - 0.001 * step, pid=20000 + r, rank=r)
            write_step(stores[node], lab, rec, ids[r])
            written += 1
        for st in stores:
            st.flush()
        step += 1
    for st in stores:
        st.close()
    return written


def main(argv: list[str]) -> None:
    if argv and argv[0] == "job":
        print(run_job(json.loads(argv[1])), flush=True)
        return
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(description="A fleet of fake-GPU agents scraped by a real Prometheus.")
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--ranks", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=60.0)
    a = ap.parse_args(argv)
    rig = FleetRig(Path(tempfile.mkdtemp(prefix="gpulens-fleet-")), nodes=a.nodes, ranks=a.ranks, job_seconds=a.seconds)
    try:
        rig.start()
        print(f"Prometheus: {rig.prom_url}  (work: {rig.work}; straggler rank {rig.straggler_rank} on {rig.host(rig.straggler_node)}, "
              f"XID {XID} on {rig.host(rig.xid_node)} GPU {rig.xid_gpu}); Ctrl-C stops", flush=True)
        rig.procs["job"].wait()
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        rig.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
