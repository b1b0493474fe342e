"""`gpulens agent` starts without loading every command's module (issue 28), and is the same command
it is in the whole app."""

from __future__ import annotations

import subprocess
import sys

import typer.main

from gpulens.cli.main import SELF_CONTAINED_COMMANDS, build_app


def _command_names(app: typer.Typer) -> set[str]:
    return set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def test_each_self_contained_module_registers_exactly_the_commands_the_table_gives_it():
    for module in set(SELF_CONTAINED_COMMANDS.values()):
        expected = {c for c, m in SELF_CONTAINED_COMMANDS.items() if m == module}
        assert _command_names(build_app([module])) == expected


def test_a_self_contained_command_is_the_same_alone_as_in_the_whole_app():
    whole = typer.main.get_command(build_app())
    for command, module in SELF_CONTAINED_COMMANDS.items():
        alone = typer.main.get_command(build_app([module])).commands[command]  # type: ignore[attr-defined]
        full = whole.commands[command]  # type: ignore[attr-defined]
        assert [(p.name, p.opts, p.default, p.envvar) for p in alone.params] == \
               [(p.name, p.opts, p.default, p.envvar) for p in full.params]
        assert alone.help == full.help


def test_the_agent_command_does_not_import_the_other_commands():
    code = ("import sys; from gpulens.cli.main import main; rc = main(['agent', '--help']); "
            "print(sorted(m for m in sys.modules if m.startswith('gpulens.cli.')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    loaded = r.stdout.strip().splitlines()[-1]
    assert "gpulens.cli.agent" in loaded
    assert "gpulens.cli.plan" not in loaded and "gpulens.cli.dashboard" not in loaded
