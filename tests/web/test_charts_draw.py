"""Every dashboard chart really draws, in Debian's chromium: finite values, a finite y-scale that fits
its data, ink of the series' colours on the canvas, and y-axis labels that fit their axis.

The bundled H200 session is replayed the way `gpulens replay --learn 20s` does, so the charts carry
learned baseline bands (the step-time and queue charts were blank with one: a y-range of NaN).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulens.cli.main import main
from gpulens.store import Store
from gpulens.vocab import names as wn

pytestmark = pytest.mark.slow

PANELS = ("training", "inference", "gpu")
MIN_INKED_PIXELS = 20  # a drawn line of a few points covers far more
MIN_INKED_PIXELS_ONE_POINT = 3  # a lone point is a dot of 4 px
# A y-scale may reach this many times past the data's largest magnitude (uPlot pads to round ticks).
MAX_SCALE_OVER_DATA = 10.0

# What uPlot drew, read from the plots the page keeps (state.plots): data, y-scale, tick labels
# measured with the axis font, and the pixels of the series' colours inside the plotting area.
PROBE = """() => state.plots.map((u) => {
  const finite = (v) => typeof v === "number" && Number.isFinite(v);
  const box = u.root.closest(".chart");
  const series = u.series.slice(1).map((s, i) => {
    const vals = u.data[i + 1].filter(finite);
    return { label: s.label, finite: vals.length, absmax: vals.length ? Math.max(...vals.map(Math.abs)) : null };
  });
  const y = u.axes[1], ctx = u.ctx;
  ctx.save();
  ctx.font = y.font[0];
  const labels = (y._values || []).map((t) => [String(t), ctx.measureText(String(t)).width / uPlot.pxRatio]);
  ctx.restore();
  const room = y._size - (y.ticks.show ? y.ticks.size : 0) - y.gap;
  const colours = u.series.slice(1).map((s) => s._stroke).filter((c) => typeof c === "string" && c[0] === "#")
    .map((c) => [1, 3, 5].map((k) => parseInt(c.slice(k, k + 2), 16)));
  const r = uPlot.pxRatio, b = u.bbox;
  // A few pixels past the plotting area: a line along its bottom edge (an all-zero series) counts.
  const m = 3 * r, img = ctx.getImageData(Math.round(b.left - m), Math.round(b.top - m), Math.round(b.width + 2 * m), Math.round(b.height + 2 * m)).data;
  let inked = 0;
  for (let p = 0; p < img.length; p += 4) {
    if (img[p + 3] < 128) continue;
    if (colours.some((c) => Math.abs(c[0] - img[p]) + Math.abs(c[1] - img[p + 1]) + Math.abs(c[2] - img[p + 2]) < 60)) inked++;
  }
  return { chart: box.dataset.chart, panel: box.closest("section").dataset.panel, ymin: u.scales.y.min,
           ymax: u.scales.y.max, series, labels, room, inked, legend: box.querySelector(".u-legend").textContent, r };
})"""

API_CHARTS = """async () => {
  const w = state.meta.window, out = {};
  for (const p of %s) out[p] = (await (await fetch(`/api/panel/${p}?start=${w.start}&end=${w.end}`)).json()).charts;
  return out;
}"""


def _finite(x) -> bool:
    return isinstance(x, int | float) and x == x and abs(x) != float("inf")


def chart_problems(page) -> list[str]:
    """One sentence per thing wrong with a drawn chart; [] when every chart draws well."""
    problems = []
    for c in page.evaluate(PROBE):
        where = f"{c['panel']}/{c['chart']}"
        for s in c["series"]:
            if not s["finite"]:
                problems.append(f"{where}: series {s['label']!r} has no finite value")
        if not (_finite(c["ymin"]) and _finite(c["ymax"]) and c["ymax"] > c["ymin"]):
            problems.append(f"{where}: y-scale is [{c['ymin']}, {c['ymax']}]")
        else:
            data_max = max((s["absmax"] for s in c["series"] if s["absmax"] is not None), default=0.0)
            reach = max(abs(c["ymin"]), abs(c["ymax"]))
            limit = MAX_SCALE_OVER_DATA * data_max if data_max > 0 else 1.0
            if reach > limit:
                labels = [t for t, _ in c["labels"]]
                problems.append(f"{where}: y-scale [{c['ymin']}, {c['ymax']}] for data up to {data_max} (ticks {labels})")
        points = sum(s["finite"] for s in c["series"])
        if c["inked"] < (MIN_INKED_PIXELS if points > 1 else MIN_INKED_PIXELS_ONE_POINT):
            problems.append(f"{where}: {c['inked']} pixels of the series' colours drawn")
        texts = [t for t, _ in c["labels"]]
        if len(set(texts)) < len(texts):
            problems.append(f"{where}: y ticks repeat a label: {texts}")
        for text, width in c["labels"]:
            if width > c["room"]:
                problems.append(f"{where}: y label {text!r} is {width:.0f} px wide, its axis has {c['room']:.0f} px")
    return problems


def open_ready(page, base: str, query: str = "") -> None:
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{base}/{query}")
    page.wait_for_selector("body[data-state=ready], body[data-state=error]", timeout=30_000)
    assert page.evaluate("document.body.dataset.state") == "ready", page.text_content("#error")
    assert not errors, errors


@pytest.fixture(scope="module")
def learned_store(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("learned") / "h200.db"
    assert main(["replay", "--store", str(path), "--learn", "20s"]) == 0
    return path


def test_every_chart_of_the_h200_session_draws(page, learned_store, dashboard_server, artifacts):
    from gpulens.web import create_app

    with dashboard_server(create_app(store_path=learned_store)) as d:
        open_ready(page, d.base)
        page.screenshot(path=str(artifacts / "charts-h200-learned.png"), full_page=True)
        problems = chart_problems(page)
        assert not problems, "\n".join(problems)
        # Every chart the API has values for is drawn (none left as "no data").
        drawn = {(c["panel"], c["chart"]) for c in page.evaluate(PROBE)}
        api = page.evaluate(API_CHARTS % list(PANELS))
        with_values = {(p, c["id"]) for p in PANELS for c in api[p] if any(v is not None for s in c["series"] for v in s["v"])}
        assert with_values - drawn == set()
        assert len(drawn) >= 10  # the session feeds most charts of the three panels
        # A band was learned, so the failing case (a band over series of unequal timestamps) is covered.
        assert any(c.get("band") for p in PANELS for c in api[p] if c["id"] in ("train_step", "infer_queue"))
        # The legend says whose line it is.
        legends = {c["chart"]: c["legend"] for c in page.evaluate(PROBE)}
        assert "hw_thermal (GPU 0)" in legends["gpu_throttle"]
        assert "step (job h200-demo)" in legends["train_step"]
        assert "queued (service h200-demo)" in legends["infer_queue"]


def test_all_zero_and_constant_series_get_sane_scales(page, tmp_path, dashboard_server, artifacts):
    """Two GPUs that never throttle, sit idle at a constant temperature and a queue that stays empty."""
    from gpulens.web import create_app

    db = tmp_path / "flat.db"
    with Store(db) as s:
        for i in range(120):
            t = 1000.0 + i
            for gpu in ("0", "1"):
                labels = {"gpu": gpu, "host": "h"}
                s.write("gpu_utilization_ratio", labels, t, 0.0)
                s.write("gpu_temperature_celsius", labels, t, 41.0)
                s.write("gpu_power_watts", labels, t, 0.0)
                s.write("gpu_memory_used_bytes", labels, t, 0.0)
                s.write("gpu_memory_total_bytes", labels, t, 150754820096.0)
                for reason in ("hw_thermal", "sw_power_cap", "idle"):
                    s.write("gpu_clock_event_active", {**labels, "reason": reason}, t, 0.0)
            s.write(wn.INFER_QUEUE_DEPTH, {"service": "chat", "host": "h"}, t, 0.0)
    with dashboard_server(create_app(store_path=db)) as d:
        open_ready(page, d.base, "?range=7d")
        page.screenshot(path=str(artifacts / "charts-flat.png"), full_page=True)
        problems = chart_problems(page)
        assert not problems, "\n".join(problems)
        legends = {c["chart"]: c["legend"] for c in page.evaluate(PROBE)}
        assert "hw_thermal (GPU 1)" in legends["gpu_throttle"]
        assert "hw_thermal (GPU 0)" in legends["gpu_throttle"]
