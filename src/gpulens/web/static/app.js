// gpulens dashboard. Every piece of data reaches the page through textContent or uPlot (which also
// uses textContent): never innerHTML, so a job named <script> is shown as text.
"use strict";

const PALETTE = ["#2f6fdf", "#e07a1f", "#2e9e5b", "#c23b6e", "#7a52c7", "#8a8f2c", "#1aa3b5", "#b0503a"];
const state = { meta: null, plots: [], timer: null, loading: false };

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else e.setAttribute(k, String(v));
  }
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }

// Mirrors gpulens/views/format.py for axes and hover values.
function si(v, unit) {
  const a = Math.abs(v);
  for (const [f, p] of [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]]) {
    if (a >= f) return `${+(v / f).toPrecision(3)} ${p}${unit}`;
  }
  return `${+v.toPrecision(3)} ${unit}`.trim();
}
function fmt(v, unit) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  switch (unit) {
    case "seconds":
      if (v === 0) return "0 s";
      if (Math.abs(v) < 1e-3) return `${(v * 1e6).toFixed(0)} µs`;
      if (Math.abs(v) < 1) return `${(v * 1e3).toFixed(1)} ms`;
      if (Math.abs(v) < 120) return `${v.toFixed(2)} s`;
      return Math.abs(v) < 7200 ? `${(v / 60).toFixed(1)} min` : `${(v / 3600).toFixed(1)} h`;
    case "bytes": {
      let n = v;
      for (const u of ["B", "KiB", "MiB", "GiB", "TiB"]) {
        if (Math.abs(n) < 1024 || u === "TiB") return u === "B" ? `${n.toFixed(0)} B` : `${n.toFixed(1)} ${u}`;
        n /= 1024;
      }
      return `${n.toFixed(1)} TiB`;
    }
    case "ratio": return `${(v * 100).toFixed(1)} %`;
    case "celsius": return `${v.toFixed(0)} °C`;
    case "watts": return `${v.toFixed(0)} W`;
    case "hertz": return si(v, "Hz");
    case "per_second": return si(v, "/s");
    case "count": return Number.isInteger(v) ? String(v) : v.toFixed(2);
    case "flag": return v >= 0.5 ? "on" : "off";
    default: return String(+v.toPrecision(4));
  }
}

function query(extra) {
  const p = new URLSearchParams();
  const range = document.getElementById("range").value;
  if (range) p.set("range", range);
  for (const s of document.querySelectorAll("select[data-key]")) if (s.value) p.set(s.dataset.key, s.value);
  for (const [k, v] of Object.entries(extra || {})) p.set(k, v);
  return p.toString();
}

async function getJSON(path) {
  const r = await fetch(path, { headers: { Accept: "application/json" } });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.error ? `${body.error} ${body.hint || ""}` : `${path}: HTTP ${r.status}`);
  return body;
}

function fillSelect(select, values) {
  const keep = select.value;
  while (select.options.length > 1) select.remove(1);
  const all = keep && !values.includes(keep) ? values.concat([keep]) : values;  // keep a picked value with no data
  for (const v of all) select.add(new Option(v, v));  // Option(text, value) sets text, not HTML
  select.value = keep;
}

function timeText(t) { return new Date(t * 1000).toLocaleString(); }
function timeTick(t, win) {
  const d = new Date(t * 1000);
  if (win.end - win.start <= 86400) return d.toLocaleTimeString();
  return `${d.toLocaleDateString()} ${d.getHours()}:${String(d.getMinutes()).padStart(2, "0")}`;
}

function bandPlugin(band) {
  // Draw the learned baseline's normal range behind the series.
  return {
    hooks: {
      drawClear: [(u) => {
        const ctx = u.ctx, yHi = u.valToPos(band.high, "y", true), yLo = u.valToPos(band.low, "y", true);
        ctx.save();
        ctx.fillStyle = "rgba(46, 158, 91, 0.12)";
        ctx.fillRect(u.bbox.left, Math.min(yHi, yLo), u.bbox.width, Math.abs(yLo - yHi));
        ctx.restore();
      }],
    },
  };
}

// The y-range from the values uPlot finds in view (it skips the gaps that uPlot.join leaves as
// undefined; a Math.min over the joined arrays gave NaN and a blank chart), the learned band
// included. A constant series gets a range around it, not uPlot's [0, 100] ("10000 %" for a ratio).
function yRange(dmin, dmax, band) {
  let lo = Number.isFinite(dmin) ? dmin : null, hi = Number.isFinite(dmax) ? dmax : null;
  if (band) {
    lo = lo === null ? band.low : Math.min(lo, band.low);
    hi = hi === null ? band.high : Math.max(hi, band.high);
  }
  if (lo === null || hi === null) return [0, 1];
  if (hi === lo) {
    const pad = lo === 0 ? 1 : Math.abs(lo) * 0.5;
    return lo >= 0 && lo - pad < 0 ? [0, hi + pad] : [lo - pad, hi + pad];
  }
  return uPlot.rangeNum(lo, hi, 0.1, true);
}

// Units shown without decimals get whole-number tick steps: a step of 0.5 W printed "1 W, 1 W, 0 W".
const WHOLE_UNITS = new Set(["count", "watts", "celsius"]);
const WHOLE_INCRS = [];
for (let m = 1; m <= 1e15; m *= 10) WHOLE_INCRS.push(m, 2 * m, ...(m >= 10 ? [2.5 * m] : []), 5 * m);
// Bytes step in round binary units (50 GiB, not 5e10 B = "46.6 GiB").
const BYTE_INCRS = [];
for (let k = 0; k <= 4; k++) for (const m of [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500]) BYTE_INCRS.push(m * 1024 ** k);

// The y-axis as wide as its widest tick label (uPlot's fixed size clipped "139.7 GiB").
function yAxisSize(u, values, axisIdx, cycleNum) {
  const axis = u.axes[axisIdx];
  if (cycleNum > 1) return axis._size;
  let widest = 0;
  u.ctx.save();
  u.ctx.font = axis.font[0];
  for (const v of values || []) widest = Math.max(widest, u.ctx.measureText(String(v)).width / uPlot.pxRatio);
  u.ctx.restore();
  return Math.ceil(widest + axis.ticks.size + axis.gap + 4);
}

function drawChart(container, chart, win) {
  const tables = chart.series.map((s) => [s.t, s.v]);
  const data = tables.length === 1 ? [tables[0][0], tables[0][1]] : uPlot.join(tables);
  const npoints = chart.series.reduce((n, s) => n + s.v.filter((v) => v !== null).length, 0);
  const few = data[0].length < 60;
  const series = [{}].concat(chart.series.map((s, i) => {
    const one = {
      label: s.label,
      stroke: PALETTE[i % PALETTE.length],
      width: 1.5,
      spanGaps: true,
      points: { show: few, size: 4 },
      value: (u, v) => fmt(v, chart.unit),
    };
    // Separate events (checkpoints, model loads): a mark each, never a line from one to the next.
    if (s.draw === "points") Object.assign(one, { paths: () => null, spanGaps: false, points: { show: true, size: 7 } });
    return one;
  }));
  const flag = chart.unit === "flag";  // 0 / 1: an off / on axis, not 0 % … 100 %
  const scales = {
    x: { time: true, min: win.start, max: win.end },
    y: { range: flag ? () => [0, 1] : (u, dmin, dmax) => yRange(dmin, dmax, chart.band) },
  };
  const tick = chart.unit === "bytes" ? (v) => fmt(v, "bytes").replace(".0 ", " ") : (v) => fmt(v, chart.unit);
  const yAxis = { values: (u, ticks) => ticks.map(tick), size: yAxisSize };
  if (WHOLE_UNITS.has(chart.unit)) yAxis.incrs = WHOLE_INCRS;
  if (chart.unit === "bytes") yAxis.incrs = BYTE_INCRS;
  if (flag) yAxis.splits = () => [0, 1];
  const opts = {
    width: Math.max(200, container.clientWidth),
    height: 180,
    scales,
    series,
    axes: [{ space: 70, values: (u, ticks) => ticks.map((t) => timeTick(t, win)) }, yAxis],
    plugins: chart.band ? [bandPlugin(chart.band)] : [],
    cursor: { drag: { x: true, y: false } },
  };
  const plot = new uPlot(opts, data, container);
  state.plots.push(plot);
  return npoints;
}

function renderPanel(section, panel, win) {
  clear(section);
  section.appendChild(el("h2", {}, panel.title));
  section.dataset.hasData = String(panel.has_data);
  if (!panel.has_data) {
    section.appendChild(el("p", { class: "empty" }, panel.empty_hint));
    return;
  }
  const stats = el("div", { class: "stats" });
  for (const s of panel.stats) {
    const box = el("div", { class: "stat", "data-stat": s.id, "data-value": s.value === null ? "" : s.value });
    box.appendChild(el("span", { class: "v" }, s.display));
    box.appendChild(el("span", { class: "k" }, s.label));
    stats.appendChild(box);
  }
  section.appendChild(stats);
  const grid = el("div", { class: "charts" });
  section.appendChild(grid);
  for (const c of panel.charts) {
    const box = el("div", { class: "chart", "data-chart": c.id });
    box.appendChild(el("h3", {}, c.title));
    if (c.help) box.appendChild(el("p", { class: "help" }, c.help));
    grid.appendChild(box);
    const has = c.series.some((s) => s.t.length > 0);
    if (!has) {
      box.dataset.points = "0";
      box.appendChild(el("p", { class: "nodata" }, c.empty || "No data for this chart in this range."));
      continue;
    }
    const plotBox = el("div", { class: "plot" });
    box.appendChild(plotBox);
    box.dataset.points = String(drawChart(plotBox, c, win));
    if (c.band) {
      // The shaded band's legend: whose normal range it is, and the range.
      const legend = el("p", { class: "band-legend" });
      legend.appendChild(el("span", { class: "swatch" }));
      legend.appendChild(document.createTextNode(
        `learned normal range of ${c.band.series || "the first series"}: ${fmt(c.band.low, c.unit)} – ${fmt(c.band.high, c.unit)}`));
      box.appendChild(legend);
    }
  }
}

function renderFindings(res) {
  const list = document.getElementById("findings-list");
  clear(list);
  const note = document.getElementById("findings-note");
  note.textContent = res.note || (res.findings.length ? "" : "No findings in this range.");
  for (const f of res.findings) {
    const li = el("li", { class: "finding", "data-kind": f.kind });
    li.appendChild(el("span", { class: `sev ${f.severity}` }, f.severity));
    li.appendChild(el("strong", {}, `${f.kind} (${f.workload})`));
    li.appendChild(el("div", {}, f.summary));
    const where = Object.entries(f.labels || {}).map(([k, v]) => `${k}=${v}`).join(", ");
    li.appendChild(el("div", { class: "evidence" }, `${timeText(f.start)} – ${timeText(f.end)}${where ? " · " + where : ""}`));
    // evidence_text: each value formatted from its unit by the library, as the terminal shows it
    const labels = f.evidence_labels || {};
    const ev = Object.entries(f.evidence_text || f.evidence || {}).map(([k, v]) => `${labels[k] || k.replaceAll("_", " ")}: ${typeof v === "string" ? v : JSON.stringify(v)}`);
    if (ev.length) li.appendChild(el("div", { class: "evidence" }, ev.join(" · ")));
    if ((f.advice || []).length) {
      const ol = el("ol", { class: "advice" });
      for (const a of f.advice) ol.appendChild(el("li", {}, a));
      li.appendChild(ol);
    }
    list.appendChild(li);
  }
}

function renderAlerts(res) {
  const body = document.querySelector("#alerts-table tbody");
  clear(body);
  document.getElementById("alerts-note").textContent = res.alerts.length ? "" : "No alerts in this range.";
  for (const a of res.alerts) {
    const tr = el("tr");
    for (const v of [timeText(a.t), a.name, a.state, a.severity, a.summary]) tr.appendChild(el("td", {}, v));
    body.appendChild(tr);
  }
}

function describeEvent(e) {
  const d = e.data || {};
  if (e.kind === "xid") return `XID ${d.xid}`;
  if (e.kind === "cold_start" && typeof d.seconds === "number") return `ready after ${fmt(d.seconds, "seconds")}`;
  const text = JSON.stringify(d);
  return text.length > 160 ? text.slice(0, 157) + "…" : text;
}

function renderEvents(res) {
  const body = document.querySelector("#events-table tbody");
  clear(body);
  document.getElementById("events-note").textContent = !res.supported
    ? "This source keeps no events (Prometheus keeps counters only)."
    : (res.events.length ? "" : "No XID errors, cold starts or OOMs in this range.");
  for (const e of res.events) {
    const tr = el("tr", { "data-kind": e.kind });
    const where = Object.entries(e.labels || {}).map(([k, v]) => `${k}=${v}`).join(", ");
    for (const v of [timeText(e.t), e.kind, where, describeEvent(e)]) tr.appendChild(el("td", {}, v));
    body.appendChild(tr);
  }
}

async function load() {
  if (state.loading) return;
  state.loading = true;
  document.body.dataset.state = "loading";
  const err = document.getElementById("error");
  try {
    const meta = await getJSON(`/api/meta?${query()}`);
    state.meta = meta;
    document.getElementById("source").textContent = meta.description;
    for (const s of document.querySelectorAll("select[data-key]")) fillSelect(s, meta.selections[s.dataset.key] || []);
    const win = meta.window;
    const q = query({ start: win.start, end: win.end });
    document.getElementById("window").textContent = `Showing ${timeText(win.start)} – ${timeText(win.end)}` +
      (win.snapped_to_data ? " (the data ends before the picked range: showing the recorded data)" : "");
    for (const p of state.plots) p.destroy();
    state.plots = [];
    const sections = Array.from(document.querySelectorAll("section[data-panel]"));
    const width = Math.max(200, Math.floor((sections[0].clientWidth || 800) / 2));
    const panels = await Promise.all(sections.map((s) => getJSON(`/api/panel/${s.dataset.panel}?${q}&points=${width}`)));
    sections.forEach((s, i) => renderPanel(s, panels[i], win));
    const [findings, alerts, events] = await Promise.all([
      getJSON(`/api/findings?${q}`), getJSON(`/api/alerts?${q}`), getJSON(`/api/events?${q}`),
    ]);
    renderFindings(findings);
    renderAlerts(alerts);
    renderEvents(events);
    err.hidden = true;
    document.body.dataset.state = "ready";
  } catch (e) {
    err.textContent = `Could not load the dashboard: ${e.message}`;
    err.hidden = false;
    document.body.dataset.state = "error";
  } finally {
    state.loading = false;
  }
}

function schedule() {
  if (state.timer) clearInterval(state.timer);
  const seconds = Number(document.getElementById("refresh").value);
  state.timer = seconds > 0 ? setInterval(() => { if (!document.hidden) load(); }, seconds * 1000) : null;
}

document.addEventListener("DOMContentLoaded", async () => {
  const range = document.getElementById("range");
  for (const [v, text] of [["15m", "last 15 min"], ["1h", "last hour"], ["6h", "last 6 h"], ["24h", "last 24 h"], ["7d", "last 7 days"]]) {
    range.add(new Option(text, v));
  }
  const params = new URLSearchParams(location.search);
  if (params.get("range")) {
    const r = params.get("range");
    if (![...range.options].some((o) => o.value === r)) range.add(new Option(r, r));
    range.value = r;
  }
  for (const s of document.querySelectorAll("select[data-key]")) {
    const v = params.get(s.dataset.key);
    if (v) { s.add(new Option(v, v)); s.value = v; }
  }
  if (params.get("refresh") !== null) document.getElementById("refresh").value = params.get("refresh");
  document.getElementById("controls").addEventListener("change", (e) => {
    if (e.target.id === "refresh") schedule(); else load();
  });
  schedule();
  await load();
});
