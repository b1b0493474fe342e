"""Shared bits of the CLI: consoles and the options many commands take."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from gpulens.store import DEFAULT_STORE_PATH

console = Console()
console_err = Console(stderr=True)

STORE_HELP = "The gpulens store (an SQLite file). Default: .gpulens/gpulens.db"


def open_existing_store(store: Path, what: str,
                        hint: str = "Run `gpulens agent` (or `gpulens replay`) first, or point --store at your store."):  # noqa: ANN201
    """Open a store that must already exist (commands that read or annotate what was recorded):
    a missing file is a one-sentence error, never a new empty store."""
    from gpulens.errors import StoreError
    from gpulens.store import Store

    if not store.exists():
        raise StoreError(f"There is no store at {store}, so there are no {what}.", hint=hint)
    return Store(store)


def store_option(default: Path = DEFAULT_STORE_PATH) -> Path:
    return typer.Option(default, "--store", help=STORE_HELP)  # type: ignore[no-any-return]
