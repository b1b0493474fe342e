"""The CLI as a user meets it: help everywhere, bad input -> one sentence and exit 2, no traceback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from gpulens import __version__
from gpulens.cli.main import app, main

GPULENS = [sys.executable, "-m", "gpulens.cli.main"]


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([*GPULENS, *args], capture_output=True, text=True, timeout=timeout, env=env)


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"gpulens {__version__}"


def _all_commands() -> list[list[str]]:
    import typer.main

    root = typer.main.get_command(app)
    out = []

    def walk(cmd, path):
        out.append(path)
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, [*path, name])

    walk(root, [])
    return out


@pytest.mark.parametrize("path", _all_commands(), ids=lambda p: " ".join(p) or "gpulens")
def test_every_command_has_help(path, capsys):
    assert main([*path, "--help"]) == 0
    out = capsys.readouterr().out
    assert "Usage" in out and len(out) > 100


def _assert_clean_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    text = (result.stderr + result.stdout).lower()
    for n in needles:
        assert n.lower() in text, text


def test_missing_trace(tmp_path):
    _assert_clean_error(run_cli("replay", str(tmp_path / "nope"), "--store", str(tmp_path / "s.db")), "does not exist")


def test_malformed_lines_are_skipped_and_reported(tmp_path, h200_trace):
    lines = (h200_trace / "telemetry.jsonl").read_text().splitlines()
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "telemetry.jsonl").write_text("\n".join(lines[:50] + ["garbage{"] + lines[50:100]) + "\n")
    r = run_cli("replay", str(tmp_path / "t"), "--store", str(tmp_path / "s.db"))
    assert r.returncode == 0, r.stderr
    assert "skipped 1 malformed line" in r.stderr
    assert "imported 100 GPU samples" in r.stdout


def test_unwritable_store(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    _assert_clean_error(run_cli("replay", "--store", str(blocker / "db.sqlite")), "store")


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--interval", "0"], "above zero"),
        (["--interval", "-1s"], "cannot read"),
        (["--duration", "-5"], "cannot read"),
        (["--interval", "soon"], "cannot read"),
        (["--listen", "localhost:http"], "listen address"),
        (["--metric-names", "nvidia"], "metric-names"),
        (["--fault", "xid:79@1s"], "fake backend"),
    ],
)
def test_bad_agent_arguments(tmp_path, args, needle):
    _assert_clean_error(run_cli("agent", "--backend", "replay", "--store", str(tmp_path / "s.db"), *args), needle)


def test_port_in_use(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run_cli("agent", "--backend", "fake", "--store", str(tmp_path / "s.db"), "--listen", f"127.0.0.1:{port}", "--duration", "1s")
    _assert_clean_error(r, "cannot listen", "--listen")


def test_nvml_without_driver_says_what_to_do(tmp_path):
    from gpulens.gpu import nvidia_driver_present

    if nvidia_driver_present():
        pytest.skip("a driver is present")
    r = run_cli("agent", "--store", str(tmp_path / "s.db"), "--duration", "1s")
    assert r.returncode == 3 and "Traceback" not in r.stderr
    assert "--backend fake" in r.stderr


def test_agent_with_fake_backend_writes_the_store(tmp_path):
    db = tmp_path / "s.db"
    r = run_cli("agent", "--backend", "fake:2", "--store", str(db), "--interval", "100ms", "--duration", "1.5s", "--listen", "off", "--fault", "xid:79@0.5s:gpu=1")
    assert r.returncode == 0, r.stderr
    q = run_cli("query", "gpu_power_watts", "--store", str(db), "--format", "json")
    series = json.loads(q.stdout)
    assert {s["labels"]["gpu"] for s in series} == {"0", "1"}
    assert all(len(s["points"]) >= 8 for s in series)
    from gpulens import Store

    with Store(db, readonly=True) as st:
        (xid,) = st.events("xid")
        assert xid.data == {"xid": 79} and xid.labels["gpu"] == "1"


def test_query_errors_and_suggestions(replayed_store):
    r = run_cli("query", "gpu_power_wats", "--store", str(replayed_store))
    _assert_clean_error(r, "gpu_power_watts")
    r = run_cli("query", "gpu_power_watts", "--store", str(replayed_store), "--label", "gpu")
    _assert_clean_error(r, "name=value")
    r = run_cli("query", "gpu_power_watts", "--store", str(replayed_store) + ".missing")
    _assert_clean_error(r, "no store")


def test_query_since_counts_back_from_the_newest_sample(replayed_store):
    r = run_cli("query", "gpu_temperature_celsius", "--store", str(replayed_store), "--since", "10s", "--format", "json")
    (series,) = json.loads(r.stdout)
    ts = [p[0] for p in series["points"]]
    assert 95 <= len(ts) <= 105 and ts[-1] - ts[0] <= 10


def test_top_shows_a_live_view_of_fake_gpus():
    r = run_cli("top", "--backend", "fake:2", "--interval", "200ms", "--duration", "1s")
    assert r.returncode == 0, r.stderr
    assert "gpulens top" in r.stdout and "NVIDIA H200" in r.stdout and "°C" in r.stdout


def test_record_then_replay(tmp_path):
    out = tmp_path / "rec.jsonl"
    r = run_cli("record", "--backend", "fake:2", "--out", str(out), "--interval", "100ms", "--duration", "0.6s")
    assert r.returncode == 0, r.stderr
    r = run_cli("replay", str(out), "--store", str(tmp_path / "s.db"))
    assert r.returncode == 0, r.stderr
    assert "GPU samples" in r.stdout


def test_record_to_standard_output(tmp_path):
    """`--out -` is standard output, as in `export grafana -o -` (it wrote a file named '-')."""
    r = subprocess.run([sys.executable, "-m", "gpulens", "record", "--backend", "fake:1", "--out", "-", "--interval", "100ms",
                        "--duration", "0.3s"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert lines[0]["format"] == "gpulens-recording" and len(lines) >= 2 and not (tmp_path / "-").exists()
