"""The dashboard's charts read right (issue 26, "The dashboard"): separate checkpoints are not joined
by ramps, the baseline band has a legend, memory ticks fall on round GiB, the throttle flags have an
off / on axis, TPOT has an axis of its own rather than lying flat under TTFT. What the charts are
given is checked through the API; what the page draws, in Debian's chromium.

The bundled H200 session is replayed as `gpulens replay --learn 20s` does, so bands are learned.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpulens.cli.main import main
from gpulens.views.format import format_value

pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

from gpulens.web import create_app  # noqa: E402


@pytest.fixture(scope="module")
def learned_store(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("learned") / "h200.db"
    assert main(["replay", "--store", str(path), "--learn", "20s"]) == 0
    return path


@pytest.fixture(scope="module")
def charts(learned_store: Path) -> dict[str, dict]:
    with TestClient(create_app(store_path=learned_store)) as c:
        return {ch["id"]: ch for p in ("training", "inference", "gpu") for ch in c.get(f"/api/panel/{p}?range=1h").json()["charts"]}


def _max(series: dict) -> float:
    return max(v for v in series["v"] if v is not None)


# ------------------------------------------------------------------ what the charts are given


def test_tpot_has_an_axis_of_its_own(charts) -> None:
    """TPOT p95 (~80 ms) on TTFT's axis (~2 s) was a line along the bottom."""
    ttft = next(ch for ch in charts.values() if any(s["metric"] == "infer_ttft_seconds" for s in ch["series"]))
    tpot = next(ch for ch in charts.values() if any(s["metric"] == "infer_tpot_seconds" for s in ch["series"]))
    assert ttft["id"] != tpot["id"]
    for ch in (ttft, tpot):
        top = max(_max(s) for s in ch["series"])
        flat = [s["label"] for s in ch["series"] if _max(s) < top / 10]
        assert not flat, f"{ch['id']}: {flat} lie under a tenth of the axis"


def test_throttle_reasons_are_flags_not_a_percentage(charts) -> None:
    throttle = charts["gpu_throttle"]
    assert throttle["unit"] == "flag"
    assert {v for s in throttle["series"] for v in s["v"] if v is not None} <= {0.0, 1.0}
    assert (format_value(1.0, "flag"), format_value(0.0, "flag")) == ("on", "off")


def test_every_band_names_the_series_it_was_learned_from(charts) -> None:
    banded = [ch for ch in charts.values() if ch.get("band")]
    assert banded, "the learned session has bands"
    for ch in banded:
        assert ch["band"]["series"] in {s["label"] for s in ch["series"]}, ch["band"]


def test_separate_events_are_drawn_as_marks(charts) -> None:
    checkpoint = next(s for s in charts["train_step"]["series"] if s["metric"] == "train_checkpoint_seconds")
    assert checkpoint["draw"] == "points" and sum(v is not None for v in checkpoint["v"]) >= 2
    assert all(s["draw"] == "points" for s in charts["infer_cold_start"]["series"])
    assert all(s["draw"] == "line" for s in charts["train_step"]["series"] if s is not checkpoint)


# ------------------------------------------------------------------ what the page draws

READINGS = """() => {
  const plots = {};
  for (const u of state.plots) plots[u.root.closest(".chart").dataset.chart] = u;
  const ink = (u, idx, x, y, half) => {
    const c = u.series[idx]._stroke, rgb = [1, 3, 5].map((k) => parseInt(c.slice(k, k + 2), 16));
    const img = u.ctx.getImageData(Math.round(x - half), Math.round(y - half), 2 * half + 1, 2 * half + 1).data;
    let n = 0;
    for (let p = 0; p < img.length; p += 4) {
      if (img[p + 3] > 128 && Math.abs(rgb[0] - img[p]) + Math.abs(rgb[1] - img[p + 1]) + Math.abs(rgb[2] - img[p + 2]) < 60) n++;
    }
    return n;
  };
  const step = plots.train_step;
  const idx = step.series.findIndex((s) => (s.label || "").startsWith("checkpoint"));
  const pts = step.data[0].map((t, i) => [t, step.data[idx][i]]).filter(([, v]) => typeof v === "number");
  const at = ([t, v]) => [step.valToPos(t, "x", true), step.valToPos(v, "y", true)];
  const [a, b] = [at(pts[0]), at(pts[1])];
  const band = document.querySelector(".chart[data-chart=train_step] .band-legend");
  return {
    checkpoint_marks: ink(step, idx, a[0], a[1], 3 * uPlot.pxRatio),
    between_checkpoints: ink(step, idx, (a[0] + b[0]) / 2, (a[1] + b[1]) / 2, 3 * uPlot.pxRatio),
    memory_ticks: plots.gpu_memory.axes[1]._values,
    throttle_ticks: plots.gpu_throttle.axes[1]._values,
    throttle_scale: [plots.gpu_throttle.scales.y.min, plots.gpu_throttle.scales.y.max],
    band_legend: band ? band.textContent : null,
  };
}"""


@pytest.fixture(scope="module")
def drawn(browser, learned_store: Path, dashboard_server) -> dict:
    with dashboard_server(create_app(store_path=learned_store)) as d:
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            page.goto(f"{d.base}/?range=1h")
            page.wait_for_selector("body[data-state=ready], body[data-state=error]", timeout=30_000)
            assert page.evaluate("document.body.dataset.state") == "ready", page.text_content("#error")
            assert not errors, errors
            return page.evaluate(READINGS)
        finally:
            context.close()


@pytest.mark.slow
def test_checkpoints_are_marks_with_no_ramp_between_them(drawn) -> None:
    assert drawn["checkpoint_marks"] > 0, "the checkpoint itself is drawn"
    assert drawn["between_checkpoints"] == 0, "a line joins two separate checkpoints"


@pytest.mark.slow
def test_memory_ticks_fall_on_round_binary_units(drawn) -> None:
    ticks = [t for t in drawn["memory_ticks"] if t]
    assert len(ticks) >= 3, ticks
    assert all(re.fullmatch(r"\d+ (B|KiB|MiB|GiB|TiB)", t) for t in ticks), ticks  # not "46.6 GiB"


@pytest.mark.slow
def test_throttle_axis_reads_off_and_on(drawn) -> None:
    assert drawn["throttle_ticks"] == ["off", "on"]
    assert drawn["throttle_scale"] == [0, 1]


@pytest.mark.slow
def test_the_band_has_a_legend_naming_its_series_and_range(drawn, charts) -> None:
    band = charts["train_step"]["band"]
    text = drawn["band_legend"]
    assert text is not None, "the shaded band has no legend"
    assert band["series"] in text and format_value(band["low"], "seconds").split()[0] in text, text
