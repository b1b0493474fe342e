"""Shared bits of the CLI: consoles and the options many commands take."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from gpulens.store import DEFAULT_STORE_PATH

console = Console()
console_err = Console(stderr=True)

STORE_HELP = "The gpulens store (an SQLite file). Default: .gpulens/gpulens.db"


def store_option(default: Path = DEFAULT_STORE_PATH) -> Path:
    return typer.Option(default, "--store", help=STORE_HELP)  # type: ignore[no-any-return]
