"""Energy per token where people look: the dashboard's training and inference panels and the report
show `gpulens energy`'s figure for the bundled session, the same number to the printed precision."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpulens.cli.main import main

pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

from gpulens.web import create_app  # noqa: E402

PANEL_OF = {"training": "training", "serving": "inference"}


def _energy_cli(store: Path, capsys) -> tuple[dict[str, float], dict[str, str]]:
    """`gpulens energy`'s joules per token by workload: the JSON value and the table's printed cell."""
    assert main(["energy", "--store", str(store), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert main(["energy", "--store", str(store)]) == 0
    table = capsys.readouterr().out
    printed = {}
    for r in rows:
        line = next(ln for ln in table.splitlines() if f"{r['workload']} {r['name']}" in ln)
        printed[r["workload"]] = [c.strip() for c in line.split("│") if c.strip()][5]  # the J/token column
    return {r["workload"]: r["joules_per_token"] for r in rows}, printed


def _stat(panel: dict, stat_id: str) -> dict:
    return next(s for s in panel["stats"] if s["id"] == stat_id)


def test_dashboard_and_report_show_the_energy_commands_joules_per_token(replayed_store: Path, tmp_path: Path, capsys) -> None:
    value, printed = _energy_cli(replayed_store, capsys)
    assert set(value) == {"training", "serving"} and all(v and v > 0 for v in value.values())

    with TestClient(create_app(store_path=replayed_store)) as c:
        for workload, panel_id in PANEL_OF.items():
            stat = _stat(c.get(f"/api/panel/{panel_id}?range=1h").json(), "energy_per_token")
            assert stat["value"] == value[workload]  # the same function over the same records
            assert stat["display"] == f"{printed[workload]} J/token"

    from gpulens.report import write_report

    out = tmp_path / "r.md"
    write_report(replayed_store, out)
    cells = re.findall(r"\| ([^|]*J/token) \|", out.read_text(encoding="utf-8"))
    assert cells == [f"{printed['training']} J/token", f"{printed['serving']} J/token"]


def test_the_dashboard_figure_covers_the_window_and_the_picked_service(replayed_store: Path) -> None:
    from gpulens.energy import workload_energy
    from gpulens.reader import StoreReader

    reader = StoreReader(replayed_store)
    try:
        (whole,) = workload_energy(reader, job="h200-demo")
        mid = (whole.start + whole.end) / 2
        (half,) = workload_energy(reader, job="h200-demo", start=whole.start - 1, end=mid)
    finally:
        reader.close()
    assert half.steps is not None and whole.steps is not None and 0 < half.steps < whole.steps
    assert half.joules is not None and whole.joules is not None and half.joules < whole.joules
    with TestClient(create_app(store_path=replayed_store)) as c:
        first_half = c.get(f"/api/panel/training?start={whole.start - 1}&end={mid}").json()
        assert _stat(first_half, "energy_per_token")["value"] == half.joules_per_token
        other = c.get("/api/panel/inference?range=1h&service=not-this-one").json()
        assert not other["has_data"] or _stat(other, "energy_per_token")["value"] is None
