"""`gpulens diagnose`'s summary names each workload's energy: `gpulens energy`'s figures for the
bundled session, the same numbers to the printed precision, over the same window and selection."""

from __future__ import annotations

import json
import re
from pathlib import Path

from gpulens.cli.main import main


def _energy_json(store: Path, capsys, *args: str) -> list[dict]:
    assert main(["energy", "--store", str(store), "--format", "json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def _diagnose_energy(store: Path, capsys, *args: str) -> dict[str, str]:
    """The summary's energy lines, by workload ("training" / "serving"), with rich's wrapping undone."""
    main(["diagnose", "--store", str(store), *args])
    text = " ".join(capsys.readouterr().out.split())
    assert "Energy (gpulens energy)" in text
    return {m.group(1): m.group(2) for m in re.finditer(r"(training|serving) h200-demo[^:]*: ([^(]+)\(", text)}


def _printed(row: dict) -> str:
    per = [f"{row[k]:.3g} {unit}" for k, unit in (("joules_per_token", "J/token"), ("joules_per_sample", "J/sample"),
                                                ("joules_per_request", "J/request")) if row[k] is not None]
    return ", ".join(per) + " "


def test_diagnose_summary_prints_the_energy_commands_figures(replayed_store: Path, capsys) -> None:
    rows = _energy_json(replayed_store, capsys)
    assert {r["workload"] for r in rows} == {"training", "serving"} and all(r["joules_per_token"] > 0 for r in rows)
    shown = _diagnose_energy(replayed_store, capsys)
    assert shown == {r["workload"]: _printed(r) for r in rows}
    assert "J/sample" in shown["training"] and "J/request" in shown["serving"]


def test_diagnose_energy_follows_its_window_and_selection(replayed_store: Path, capsys) -> None:
    (whole,) = _energy_json(replayed_store, capsys, "--job", "h200-demo")
    mid = (whole["start"] + whole["end"]) / 2
    from gpulens.energy import workload_energy
    from gpulens.reader import StoreReader

    reader = StoreReader(replayed_store)
    try:
        (half,) = workload_energy(reader, job="h200-demo", start=whole["start"] - 1, end=mid)
    finally:
        reader.close()
    assert half.joules_per_token is not None and f"{half.joules_per_token:.3g}" != f"{whole['joules_per_token']:.3g}"
    shown = _diagnose_energy(replayed_store, capsys, "--job", "h200-demo", "--start", str(whole["start"] - 1), "--end", str(mid))
    assert set(shown) == {"training"}  # --job leaves the service out
    assert shown["training"].startswith(f"{half.joules_per_token:.3g} J/token")


def test_diagnose_json_keeps_its_shape(replayed_store: Path, capsys) -> None:
    main(["diagnose", "--store", str(replayed_store), "--format", "json"])
    findings = json.loads(capsys.readouterr().out)
    assert isinstance(findings, list) and findings and all("kind" in f for f in findings)

