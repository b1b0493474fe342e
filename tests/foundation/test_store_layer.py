"""The store owns its SQL: nothing outside gpulens/store/ names sqlite3 or reaches for a raw
connection. Ruff's banned-api enforces the import where no per-file ignore lifts it (web/ and cli/
lift every TID251 ban for the layer rules); this test covers every file."""

from __future__ import annotations

from pathlib import Path

import gpulens
from gpulens.store import Store

SRC = Path(gpulens.__file__).parent


def test_only_the_store_names_sqlite3():
    offenders = [
        str(p.relative_to(SRC))
        for p in SRC.rglob("*.py")
        if p.relative_to(SRC).parts[0] != "store" and "sqlite3" in p.read_text(encoding="utf-8")
    ]
    assert offenders == []


def test_the_raw_connection_is_not_public():
    assert not hasattr(Store, "connection") and not hasattr(Store, "ensure_schema")
    offenders = [
        str(p.relative_to(SRC))
        for p in SRC.rglob("*.py")
        if p.relative_to(SRC).parts[0] != "store" and "store._" in p.read_text(encoding="utf-8")
    ]
    assert offenders == []
