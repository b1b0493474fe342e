"""Commands that only read a store open it read-only, so a store in a folder they may not write
(an immutable or read-only mount, a copy handed over from a node) still answers. Made unwritable
for real with `chattr +i` (root on a filesystem that supports it); skipped elsewhere."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from tracelib import h200_lines, write_trace

from gpulens.cli.main import main
from gpulens.pipeline.ingest import import_trace
from gpulens.store import Store

READERS = {
    "runs list": ["runs", "list"],
    "alerts list": ["alerts", "list"],
    "alerts export": ["alerts", "export", "--format", "prometheus"],
    "baseline show": ["baseline", "show"],
    "energy": ["energy"],
    "scale": ["scale"],
    "query": ["query", "gpu_up"],
    "diagnose": ["diagnose"],
}


@pytest.fixture(scope="module")
def immutable_store(tmp_path_factory, h200_trace):
    folder = tmp_path_factory.mktemp("ro")
    with Store(folder / "s.db") as st:
        import_trace(write_trace(folder / "t", h200_lines(h200_trace, 120), h200_trace), st)
    shutil.rmtree(folder / "t")
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(folder)], capture_output=True).returncode:
        pytest.skip("needs chattr +i (root, on a filesystem that supports it) to make a folder unwritable")
    try:
        yield folder / "s.db"
    finally:
        subprocess.run([chattr, "-i", str(folder)], capture_output=True)


@pytest.mark.parametrize("command", list(READERS))
def test_a_reading_command_answers_from_a_store_it_cannot_write(immutable_store, tmp_path, capsys, command):
    args = [*READERS[command], "--store", str(immutable_store)]
    if command == "alerts export":
        args += ["--out", str(tmp_path / "rules.yml")]
    assert main(args) == 0, capsys.readouterr().err
