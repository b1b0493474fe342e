"""Every option of `gpulens plan` and its subcommands is in docs/plan.md (issue 25: "every new
option is in docs/plan.md with the mechanism it models and its source")."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import typer.main

from gpulens.cli.main import app
from gpulens.plan.request import PlanOptions

DOC = (Path(__file__).resolve().parents[2] / "docs" / "plan.md").read_text(encoding="utf-8")


def _plan_flags(*, negations: bool = False) -> set[str]:
    """The options' names; with `negations`, their `--no-...` forms too (docs name the option once)."""
    group = typer.main.get_command(app).commands["plan"]  # type: ignore[attr-defined]
    cmds = [group, *group.commands.values()]
    flags = {o for c in cmds for p in c.params if p.param_type_name == "option"
             for o in (*p.opts, *(p.secondary_opts if negations else ())) if o.startswith("--")}
    return flags - {"--help"}


def test_every_plan_option_is_in_docs_plan_md():
    flags = _plan_flags()
    assert {"--lora-engine", "--qlora-double-quant", "--tpot-target", "--measurements", "--gpu"} <= flags
    missing = sorted(f for f in flags if not re.search(re.escape(f) + r"(?![\w-])", DOC))
    assert missing == []


def test_every_shared_option_is_a_plan_flag():
    shared = {p for f in fields(PlanOptions) for fl in f.metadata.get("flags", ()) for p in fl.split("/") if p.startswith("--")}
    assert shared <= _plan_flags(negations=True)
