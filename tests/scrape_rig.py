"""The fleet path as a fleet runs it: a real Prometheus that scrapes a real `gpulens agent`, fed by a
real TrainingMonitor job in another process and by requests that `gpulens bench serve` sends through
the ASGI middleware of a real server, with the exported rules evaluated every second and one XID
injected. A second agent with dcgm names (one agent per store: it serves a copy of the node's store,
taken once the workload is done) shows the same workload series under that naming, with its GPU in
MIG mode and one XID of its own. Every process gets the node's name as `GPULENS_HOST`, as the Helm
chart and a workload pod's downward API give it; one request of 150 s (service `long-gen`) is recorded
beside the served ones.

The rig takes about 70 s of wall time, almost all of it waiting (an XID alert must be seen firing for
60 s). `tests/conftest.py` starts it when a selected test needs it, at collection time, so the wait
overlaps the rest of the suite; `ScrapeRig.wait()` joins it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

from testlib import free_port, wait_http

from gpulens.fleet.procs import stop_processes

HERE = Path(__file__).parent / "contract"
XID_FIRING_SECONDS = 60.0
TRAIN_STEPS = 160
NODE = "gpu-node-7"  # GPULENS_HOST of every process of the rig's node
LONG_SERVICE, LONG_SECONDS = "long-gen", 150.0


def _gpulens(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpulens.cli.main", *args]


class ScrapeRig:
    def __init__(self, work: Path):
        self.work = work
        self.store = work / "node.db"
        self.procs: dict[str, subprocess.Popen] = {}
        self.ports = {k: free_port() for k in ("prom", "agent", "dcgm", "serve")}
        self.prom_url = f"http://127.0.0.1:{self.ports['prom']}"
        self.error: BaseException | None = None
        self.xid_firing: list[float] = []  # wall times at which ALERTS{alertname="GpuXid"} was seen firing
        self.xid_polls: list[tuple[float, bool]] = []
        self.bench: subprocess.CompletedProcess | None = None
        self._thread = threading.Thread(target=self._run, name="scrape-rig", daemon=True)
        self._done = threading.Event()

    # ------------------------------------------------------------ lifecycle
    def start(self) -> ScrapeRig:
        self._thread.start()
        return self

    def wait(self, timeout: float = 240.0) -> None:
        self._done.wait(timeout)
        if self.error is not None:
            raise self.error
        if not self._done.is_set():
            raise AssertionError("the scrape rig did not finish in time")

    def stop(self) -> None:
        stop_processes(self.procs.values(), grace_seconds=10.0)

    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen:
        log = open(self.work / f"{name}.log", "w")  # noqa: SIM115 (closed with the process)
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=self.work, env={**os.environ, "PYTHONUNBUFFERED": "1", "GPULENS_HOST": NODE})
        self.procs[name] = p
        return p

    def log(self, name: str) -> str:
        path = self.work / f"{name}.log"
        return path.read_text()[-3000:] if path.exists() else ""

    # ------------------------------------------------------------ Prometheus API
    def query(self, expr: str, t: float | None = None) -> list[dict]:
        params = {"query": expr, **({"time": f"{t:.3f}"} if t else {})}
        return self.api("/api/v1/query", params)["result"]

    def api(self, path: str, params: dict | list | None = None) -> dict:
        url = self.prom_url + path + ("?" + urllib.parse.urlencode(params, doseq=True) if params else "")
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def _wait_http(self, url: str, proc: subprocess.Popen, what: str, timeout: float = 30.0) -> None:
        wait_http(url, proc, timeout, log=lambda: self.log(what), what=what)

    def _xid_poll(self) -> None:
        firing = bool(self.query('ALERTS{alertname="GpuXid", alertstate="firing", xid="79"}'))
        now = time.time()
        self.xid_polls.append((now, firing))
        if firing:
            self.xid_firing.append(now)

    # ------------------------------------------------------------ the scenario
    def _run(self) -> None:
        try:
            self._scenario()
        except BaseException as e:  # reported by wait(), in the test
            self.error = e
        finally:
            self._done.set()

    def _scenario(self) -> None:
        from gpulens.store import Store

        Store(self.store).close()  # the node's store: the agent and every workload write it
        rules = self.work / "rules.yml"
        subprocess.run(_gpulens("alerts", "export", "--format", "prometheus", "--store", str(self.store), "--out", str(rules)),
                       check=True, capture_output=True, cwd=self.work, timeout=60)
        common = ["--interval", "1s", "--store", str(self.store), "--learn", "1d"]
        agent = self._spawn("agent", _gpulens("agent", "--backend", "fake:2", "--fault", "xid:79@3s:gpu=1",
                                              "--listen", f"127.0.0.1:{self.ports['agent']}", *common))
        # Prometheus's default scrape settings (honor_labels false): only the intervals are shortened.
        (self.work / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            f"rule_files: ['{rules}']\n"
            "scrape_configs:\n"
            f"  - job_name: gpulens\n    static_configs:\n      - targets: ['127.0.0.1:{self.ports['agent']}']\n"
            f"  - job_name: gpulens-dcgm\n    static_configs:\n      - targets: ['127.0.0.1:{self.ports['dcgm']}']\n"
        )
        prom = self._spawn("prometheus", ["prometheus", f"--config.file={self.work / 'prometheus.yml'}",
                                          f"--storage.tsdb.path={self.work / 'tsdb'}", f"--web.listen-address=127.0.0.1:{self.ports['prom']}"])
        server = self._spawn("server", [sys.executable, str(HERE / "contract_server.py"), str(self.store), str(self.ports["serve"])])
        self._wait_http(f"http://127.0.0.1:{self.ports['agent']}/metrics", agent, "agent")
        self._wait_http(f"{self.prom_url}/-/ready", prom, "prometheus")
        self._wait_http(f"http://127.0.0.1:{self.ports['serve']}/v1/infer", server, "server")
        trainer = self._spawn("trainer", [sys.executable, str(HERE / "contract_trainer.py"), str(self.store), str(TRAIN_STEPS)])
        self.bench = subprocess.run(
            _gpulens("bench", "serve", "--url", f"http://127.0.0.1:{self.ports['serve']}/v1/infer", "--rate", "40",
                     "--duration", "5s", "--no-fail", "--no-store", "--format", "json"),
            capture_output=True, text=True, cwd=self.work, timeout=120,
        )
        self._long_request()
        deadline = time.monotonic() + 90
        while trainer.poll() is None and time.monotonic() < deadline:
            self._xid_poll()
            time.sleep(1.0)
        assert trainer.returncode == 0, self.log("trainer")
        # Until Prometheus has scraped every step and request the store holds ...
        steps, requests = self.store_counts()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            self._xid_poll()
            got_steps = self.query('sum(train_step_seconds_count{job="gpulens", train_job="llama-ft"})')
            got_reqs = self.query('sum(infer_request_latency_seconds_count{job="gpulens", service="chat"})')
            got_long = self.query(f'sum(infer_request_latency_seconds_count{{job="gpulens", service="{LONG_SERVICE}"}})')
            if (got_steps and got_reqs and got_long and float(got_steps[0]["value"][1]) == steps
                    and float(got_reqs[0]["value"][1]) == requests):
                break
            time.sleep(1.0)
        # The dcgm-named agent, on a copy of the store as the workload left it.
        from gpulens.store import Store

        with Store(self.store, readonly=True) as st:
            st.backup_to(self.work / "dcgm.db")
        dcgm = self._spawn("dcgm", _gpulens("agent", "--backend", "fake:1", "--metric-names", "dcgm", "--interval", "1s",
                                            "--fault", "mig:3g.71gb+1g.18gb@0s:gpu=0", "--fault", "xid:48@2s:gpu=0",
                                            "--store", str(self.work / "dcgm.db"), "--learn", "1d",
                                            "--listen", f"127.0.0.1:{self.ports['dcgm']}"))
        self._wait_http(f"http://127.0.0.1:{self.ports['dcgm']}/metrics", dcgm, "dcgm")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not self.query('train_step_seconds_count{job="gpulens-dcgm"}'):
            self._xid_poll()
            time.sleep(1.0)
        # ... and the XID alert has been seen firing for a minute (or has stopped: the test says which).
        deadline = time.monotonic() + XID_FIRING_SECONDS + 30
        while time.monotonic() < deadline:
            self._xid_poll()
            if self.xid_firing and self.xid_firing[-1] - self.xid_firing[0] >= XID_FIRING_SECONDS + 2:
                break
            if self.xid_polls and not self.xid_polls[-1][1] and self.xid_firing:
                break  # it went inactive: no point waiting
            time.sleep(2.0)
        self.end_time = time.time()

    def _long_request(self) -> None:
        """One request of LONG_SECONDS (a long generation), through the real InferenceMonitor."""
        from gpulens import InferenceMonitor

        mon = InferenceMonitor(str(self.store), service=LONG_SERVICE, model="tiny-llm", host=NODE, flush_interval_seconds=None)
        mon.start_request(arrival=time.time() - LONG_SECONDS).finish("ok")
        mon.close()

    def store_counts(self) -> tuple[int, int]:
        from gpulens.store import Store

        with Store(self.store, readonly=True) as st:
            steps = sum(len(d) for d in st.query("train_step_seconds", {"train_job": "llama-ft"}, max_points=None))
            reqs = sum(len(d) for d in st.query("infer_request_latency_seconds", {"service": "chat"}, max_points=None))
        return steps, reqs
