"""Reports over the replayed H200 session: self-contained HTML with embedded charts (opened in a
real browser), Markdown with its PNGs, the baseline comparison, escaping, and bad input."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from gpulens.cli.main import main  # noqa: E402
from gpulens.report import write_report  # noqa: E402
from gpulens.store import Store  # noqa: E402
from gpulens.vocab import names as wn  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def phase_window(trace: Path, phase: str) -> tuple[float, float]:
    """Ground truth from the recording's phase markers (used only by tests)."""
    marks = [r for r in map(json.loads, (trace / "events.jsonl").read_text().splitlines()) if r.get("kind") == "phase"]
    i = next(i for i, r in enumerate(marks) if r["name"] == phase)
    return marks[i]["t"], marks[i + 1]["t"]


@pytest.fixture(scope="module")
def html_report(replayed_store, h200_trace, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report") / "report.html"
    lo, hi = phase_window(h200_trace, "train_normal")
    res = write_report(replayed_store, out, baseline=f"{lo},{hi}")
    assert res.format == "html" and res.charts >= 10
    return out


def test_html_report_is_self_contained_with_charts(html_report):
    text = html_report.read_text()
    # No outside references: every image is embedded, no script, no stylesheet link.
    assert "<script" not in text and "<link" not in text
    assert not re.search(r"""src=['"](?!data:)""", text)
    pngs = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", text)
    assert len(pngs) >= 10
    assert all(base64.b64decode(p)[:8] == PNG for p in pngs)
    for chart in ("train_step", "infer_latency", "gpu_power"):
        assert f"data-chart='{chart}'" in text, chart


def test_html_report_has_findings_and_the_baseline_comparison(html_report):
    text = html_report.read_text()
    assert "data-kind='input_bound'" in text
    assert "Comparison with the baseline" in text and "step time p95" in text
    # The baseline is the healthy phase: the whole run's p95 step time is far above it.
    row = re.search(r"<td>step time p95</td><td>[^<]+</td><td>[^<]+</td><td>\+(\d+\.\d) %</td>", text)
    assert row and float(row.group(1)) > 100


def test_report_opens_in_the_browser_with_its_charts(page, html_report, artifacts):
    page.goto(html_report.as_uri())
    imgs = page.locator("figure img")
    assert imgs.count() >= 10
    page.wait_for_function("Array.from(document.images).every(i => i.complete)")
    widths = imgs.evaluate_all("els => els.map(e => e.naturalWidth)")
    assert min(widths) >= 300
    assert page.locator(".finding[data-kind=input_bound] ol li").count() >= 1
    page.screenshot(path=str(artifacts / "report-h200.png"), full_page=True)


def test_markdown_report_writes_its_charts_beside_it(replayed_store, tmp_path):
    out = tmp_path / "run.md"
    assert main(["report", "--store", str(replayed_store), "--out", str(out)]) == 0
    text = out.read_text()
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(links) >= 10
    for link in links:
        assert (tmp_path / link).read_bytes()[:8] == PNG
    assert "input_bound" in text and "| steps |" in text


def test_names_are_escaped_in_reports(tmp_path):
    evil = "<script>alert(1)</script>|x"
    db = tmp_path / "evil.db"
    with Store(db) as s:
        for i in range(20):
            s.write(wn.TRAIN_STEP_SECONDS, {"train_job": evil, "rank": "0", "host": "h"}, 1000.0 + i, 0.1)
    html_out, md_out = tmp_path / "r.html", tmp_path / "r.md"
    write_report(db, html_out, job=evil)
    write_report(db, md_out, job=evil)
    assert "<script>alert" not in html_out.read_text()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html_out.read_text()
    assert "<script>" not in md_out.read_text()


@pytest.mark.parametrize(
    "args",
    [
        ["--store", "{missing}", "--out", "{out}"],
        ["--store", "{db}", "--out", "{out}", "--job", "no-such-job"],
        ["--store", "{db}", "--out", "{out}", "--baseline", "yesterday"],
        ["--store", "{db}", "--out", "{out}", "--baseline", "1,2"],  # a window with no samples: an empty comparison before
        ["--store", "{db}", "--out", "{out}", "--format", "pdf"],
        ["--store", "{db}", "--out", "{tmp}/no/such/folder/r.html"],
        ["--store", "{db}", "--out", "{out}", "--job", "a", "--service", "b"],
        ["--store", "{db}", "--out", "-", "--format", "md"],  # its charts are files beside it
    ],
)
def test_bad_input_exits_2(replayed_store, tmp_path, args, capsys):
    fill = {"missing": str(tmp_path / "missing.db"), "out": str(tmp_path / "r.html"), "db": str(replayed_store), "tmp": str(tmp_path)}
    assert main([a.format(**fill) for a in ["report", *args]]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_out_dash_writes_the_html_to_standard_output(replayed_store, tmp_path, capsys, monkeypatch):
    """As `export grafana --out -` and `record --out -` (it wrote a file named '-'); the line that
    says what was written goes to standard error, so the stream is the report alone."""
    monkeypatch.chdir(tmp_path)
    assert main(["report", "--store", str(replayed_store), "--out", "-"]) == 0
    got = capsys.readouterr()
    assert got.out.startswith("<!doctype html>") and got.out.rstrip().endswith("</html>")
    assert "wrote standard output (html)" in " ".join(got.err.split())
    assert not (tmp_path / "-").exists()
