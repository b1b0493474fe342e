"""Standard output that cannot be written: a full disk is one sentence and exit 4; a reader that went
away (`| head`) ends the command quietly with 1. Neither prints a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

COMMANDS = [["top", "--help"], ["plan", "--model", "llama-3-8b", "--gpu", "h200"],
            ["plan", "--model", "llama-3-8b", "--gpu", "h200", "--format", "json"]]


def _gpulens(*args: str, stdout) -> subprocess.CompletedProcess:  # noqa: ANN001
    return subprocess.run([sys.executable, "-m", "gpulens", *args], stdout=stdout, stderr=subprocess.PIPE, text=True,
                          timeout=120, env={**os.environ, "NO_COLOR": "1"})


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("args", COMMANDS, ids=[" ".join(a) for a in COMMANDS])
def test_a_full_disk_under_stdout_is_one_sentence_and_exit_4(args):
    with open("/dev/full", "w") as full:
        p = _gpulens(*args, stdout=full)
    assert p.returncode == 4, p.stderr
    assert "Traceback" not in p.stderr and "Exception ignored" not in p.stderr
    assert " ".join(p.stderr.split()).startswith("error: Could not write the output: the disk it goes to is full.")


@pytest.mark.parametrize("args", COMMANDS, ids=[" ".join(a) for a in COMMANDS])
def test_a_reader_that_went_away_ends_the_command_quietly(args):
    r, w = os.pipe()
    os.close(r)  # no reader at all: the first write finds the pipe closed
    with os.fdopen(w, "w") as closed:
        p = _gpulens(*args, stdout=closed)
    assert p.returncode == 1, p.stderr
    assert p.stderr == ""
