"""`gpulens demo --fleet N` (gpulens.fleet.rig as a demo): it prints the Prometheus URL, and
`diagnose --prometheus` against it finds the straggler and the XID across nodes; Ctrl-C (SIGINT)
stops every process it started and removes its temp folder. Without `prometheus` on PATH it says so
in one sentence (exit 3); a fleet size out of range is one sentence (exit 2). About 40 s."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from testlib import wait_until, which_or_skip

pytestmark = pytest.mark.slow
NODES = 2


def _children(pid: int) -> set[int]:
    """The processes whose parent is `pid` (from /proc)."""
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.add(int(d.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _gpulens(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpulens.cli.main", *args], capture_output=True, text=True, timeout=timeout, env=env)


def _found(url: str) -> dict | None:
    """diagnose --prometheus's straggler and XID findings, once it names both."""
    p = _gpulens("diagnose", "--prometheus", url, "--window", "10m", "--format", "json")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    got = {d["kind"]: d for d in json.loads(p.stdout)}
    return got if {"straggler", "gpu_xid"} <= set(got) else None


def test_demo_fleet_runs_until_ctrl_c_and_leaves_nothing(tmp_path):
    which_or_skip("prometheus")
    proc = subprocess.Popen([sys.executable, "-m", "gpulens.cli.main", "demo", "--fleet", str(NODES)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(iter(proc.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        wait_until(lambda: any(line.startswith("work folder:") for line in list(seen)) or proc.poll() is not None, 90,
                   "the demo to print its URLs")
        text = "".join(seen)
        assert proc.poll() is None, text
        url = re.search(r"^Prometheus: (http://\S+)$", text, re.M).group(1)  # type: ignore[union-attr]
        work = Path(re.search(r"^work folder: (\S+)$", text, re.M).group(1))  # type: ignore[union-attr]
        assert f"gpulens diagnose --prometheus {url}" in text and work.is_dir()
        children = _children(proc.pid)
        assert len(children) >= NODES + 3, children  # the agents, Prometheus, the job, the service

        got = wait_until(lambda: _found(url), 120, "diagnose --prometheus to name the straggler and the XID", interval=1.0)
        last = NODES * 4 - 1  # the last node's last GPU's rank
        assert got["straggler"]["labels"]["rank"] == str(last) and got["straggler"]["labels"]["host"] == f"node-{NODES - 1}"
        assert (got["gpu_xid"]["labels"]["host"], got["gpu_xid"]["labels"]["gpu"]) == ("node-0", "1")

        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, "".join(seen)
        reader.join(10)
        assert not [pid for pid in children if _alive(pid)], "left running after Ctrl-C"
        assert not work.exists(), f"{work} left behind"
        assert "Traceback" not in "".join(seen), "".join(seen)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_demo_fleet_without_prometheus_says_so(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    p = _gpulens("demo", "--fleet", "2", env={**os.environ, "PATH": str(empty)}, timeout=60)
    assert p.returncode == 3 and "no `prometheus` on PATH" in p.stderr and "Install it" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
    bad = _gpulens("demo", "--fleet", "1", timeout=60)
    assert bad.returncode == 2 and "--fleet takes 2 to 16 nodes, not 1" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
