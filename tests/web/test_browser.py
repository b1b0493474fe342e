"""The dashboard in a real browser (Debian's chromium through Playwright) over a real server."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from gpulens.store import Store
from gpulens.views.format import format_value
from gpulens.vocab import names as wn

pytestmark = pytest.mark.slow

PANELS = ("training", "inference", "gpu")


def open_dashboard(page, base: str, query: str = "") -> None:
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{base}/{query}")
    page.wait_for_selector("body[data-state=ready], body[data-state=error]", timeout=30_000)
    assert page.evaluate("document.body.dataset.state") == "ready", page.text_content("#error")
    assert not errors, errors


def store_values(db: Path, metric: str) -> np.ndarray:
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT s.value FROM samples s JOIN series x ON x.id = s.series_id WHERE x.name = ?", (metric,)
        ).fetchall()
    return np.array([r[0] for r in rows])


def shown(page, panel: str, stat: str) -> tuple[str, float]:
    box = page.locator(f"section[data-panel={panel}] .stat[data-stat={stat}]")
    return box.locator(".v").text_content(), float(box.get_attribute("data-value"))


def test_three_panels_draw_charts_with_the_stores_numbers(page, replayed_dashboard, replayed_store, artifacts):
    open_dashboard(page, replayed_dashboard.base)
    for panel in PANELS:
        section = page.locator(f"section[data-panel={panel}]")
        assert section.get_attribute("data-has-data") == "true", section.text_content()
        # Every panel draws canvases, and its main charts hold many points.
        assert section.locator("canvas").count() >= 3, panel
        points = [int(p) for p in section.locator(".chart").evaluate_all("els => els.map(e => e.dataset.points)")]
        assert sum(p > 0 for p in points) >= 3 and max(points) >= 50, (panel, points)

    # The numbers on the page are the store's, read here with plain SQL.
    checks = [
        ("gpu", "temperature_max", store_values(replayed_store, "gpu_temperature_celsius").max(), "celsius"),
        ("gpu", "power_max", store_values(replayed_store, "gpu_power_watts").max(), "watts"),
        ("training", "steps", float(len(store_values(replayed_store, wn.TRAIN_STEP_SECONDS))), "count"),
        ("training", "step_p50", np.percentile(store_values(replayed_store, wn.TRAIN_STEP_SECONDS), 50), "seconds"),
        ("inference", "requests", float(len(store_values(replayed_store, wn.INFER_LATENCY_SECONDS))), "count"),
        ("inference", "latency_p99", np.percentile(store_values(replayed_store, wn.INFER_LATENCY_SECONDS), 99), "seconds"),
    ]
    for panel, stat, expected, unit in checks:
        text, value = shown(page, panel, stat)
        assert value == pytest.approx(expected, rel=1e-9), (panel, stat)
        assert text == format_value(float(expected), unit), (panel, stat)

    # The findings list names the input-bound phase, with advice.
    finding = page.locator("#findings-list li.finding[data-kind=input_bound]")
    assert finding.count() >= 1
    assert finding.first.locator("ol.advice li").count() >= 1
    page.screenshot(path=str(artifacts / "dashboard-h200.png"), full_page=True)


def test_range_picker_and_selection_reload_the_panels(page, replayed_dashboard):
    open_dashboard(page, replayed_dashboard.base)
    page.select_option("#range", "7d")
    page.wait_for_selector("body[data-state=ready]")
    assert page.locator("section[data-panel=gpu] canvas").count() >= 3
    # The GPU selector lists the recorded GPU; picking another shows the empty-panel hint.
    assert page.locator("#sel-gpu option[value='0']").count() == 1
    open_dashboard(page, replayed_dashboard.base, "?gpu=9")
    assert "gpulens agent" in page.locator("section[data-panel=gpu] .empty").text_content()


XSS = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'


def test_xss_in_a_job_name_is_shown_as_text(page, tmp_path, dashboard_server, artifacts):
    from gpulens.web import create_app

    db = tmp_path / "xss.db"
    with Store(db) as s:
        for i in range(40):
            for job in (XSS, "safe-job"):
                labels = {"train_job": job, "rank": "0", "host": XSS}
                s.write(wn.TRAIN_STEP_SECONDS, labels, 1000.0 + i, 0.1 + 0.001 * i)
            s.write("gpu_utilization_ratio", {"gpu": "0", "host": XSS, "model": XSS}, 1000.0 + i, 0.5)
            for pid, proc in (("1", XSS), ("2", "python")):
                s.write("gpu_process_memory_bytes", {"gpu": "0", "host": XSS, "pid": pid, "process": proc}, 1000.0 + i, 2e9)
        s.event("xid", 1010.0, {"gpu": "0", "host": XSS}, {"xid": XSS})
    with dashboard_server(create_app(store_path=db)) as d:
        open_dashboard(page, d.base, "?range=7d")
        assert page.evaluate("window.__xss") is None  # nothing ran
        assert page.locator("img[src=x]").count() == 0
        # The name is there, as text: in the job selector, the chart legend and the events table.
        assert XSS in [o.text_content() for o in page.locator("#sel-job option").all()]
        assert XSS in page.locator("section[data-panel=training] .u-legend").text_content()
        assert XSS in page.locator(".chart[data-chart=gpu_process_memory] .u-legend").text_content()
        assert XSS in page.locator("#events-table").text_content()
        page.select_option("#sel-job", XSS)
        page.wait_for_selector("body[data-state=ready]")
        assert page.evaluate("window.__xss") is None
        # Picking a job leaves GPU events alone: the XID is still listed, as text.
        assert XSS in page.locator("#events-table tbody").text_content()
        page.screenshot(path=str(artifacts / "dashboard-xss.png"), full_page=True)


def test_token_address_opens_the_dashboard_in_the_browser(page, replayed_store, dashboard_server):
    from gpulens.web import create_app

    token = "browser-test-token-123"
    with dashboard_server(create_app(store_path=replayed_store, token=token)) as d:
        page.goto(f"{d.base}/")
        assert "needs its token" in page.text_content("body")
        open_dashboard(page, d.base, f"?token={token}")
        assert "token" not in page.url  # traded for a cookie, gone from the address bar
        assert page.locator("section[data-panel=gpu] canvas").count() >= 3
