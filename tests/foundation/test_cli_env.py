"""Defaults a user sets once (GPULENS_STORE, ...) come from the environment in every command and
show in --help; shell completion completes commands and options in a real bash."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys

import pytest
import typer.main

from gpulens.cli.common import ENV_DEFAULTS, ENV_EXEMPT_COMMANDS
from gpulens.cli.main import app, main
from gpulens.store import Store


def _commands():
    def walk(cmd, path):
        if not hasattr(cmd, "commands"):
            yield path, cmd
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from walk(sub, [*path, name])

    yield from walk(typer.main.get_command(app), [])


def test_every_command_reads_its_once_set_options_from_the_environment():
    seen = {flag: 0 for flag in ENV_DEFAULTS}
    for path, cmd in _commands():
        for p in cmd.params:
            for flag in set(p.opts) & set(ENV_DEFAULTS):
                if path[0] in ENV_EXEMPT_COMMANDS:
                    assert p.envvar is None, (path, flag)  # the demo keeps to its own store
                    continue
                assert p.envvar == ENV_DEFAULTS[flag] and p.show_envvar, (path, flag)
                seen[flag] += 1
    assert seen["--store"] >= 15 and all(seen.values()), seen


def test_help_shows_the_variable():
    r = subprocess.run([sys.executable, "-m", "gpulens.cli.main", "query", "--help"], capture_output=True, text=True,
                       env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}, timeout=60)
    assert r.returncode == 0 and "env var: GPULENS_STORE" in r.stdout


def _store_with(path, metric: str, value: float) -> None:
    with Store(path) as st:
        st.write(metric, {"gpu": "0"}, 1000.0, value)
        st.flush()


def test_gpulens_store_is_the_default_store_and_a_flag_wins(tmp_path, monkeypatch, capsys):
    env_store, flag_store = tmp_path / "env.db", tmp_path / "flag.db"
    _store_with(env_store, "gpu_power_watts", 111.0)
    _store_with(flag_store, "gpu_power_watts", 222.0)
    monkeypatch.chdir(tmp_path)  # no .gpulens/gpulens.db here: the default would find nothing
    monkeypatch.setenv("GPULENS_STORE", str(env_store))
    assert main(["query", "gpu_power_watts", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["points"] == [[1000.0, 111.0]]
    assert main(["query", "gpu_power_watts", "--format", "json", "--store", str(flag_store)]) == 0
    assert json.loads(capsys.readouterr().out)[0]["points"] == [[1000.0, 222.0]]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_completion_completes_commands_and_options(tmp_path):
    exe = tmp_path / "gpulens"  # the script bash completes for, as an installed `gpulens` is
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m gpulens.cli.main "$@"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    script = ('source <(gpulens --show-completion bash)\n'
              'COMP_WORDS=(gpulens ag); COMP_CWORD=1; _gpulens_completion gpulens; echo "1:${COMPREPLY[*]}"\n'
              'COMP_WORDS=(gpulens diagnose --sto); COMP_CWORD=2; _gpulens_completion gpulens; echo "2:${COMPREPLY[*]}"\n')
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}", "SHELL": "/bin/bash"}
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=60)
    lines = dict(line.split(":", 1) for line in r.stdout.splitlines() if line[:2] in ("1:", "2:"))
    assert lines.get("1") == "agent" and lines.get("2") == "--store", r.stdout + r.stderr
