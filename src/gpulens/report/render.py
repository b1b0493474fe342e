"""ReportData -> one self-contained HTML file (charts embedded as PNG), or Markdown with its PNGs
in a folder beside it. Every name from the data is escaped: a report is safe to open and share."""

from __future__ import annotations

import base64
import errno
import html
import re
from collections.abc import Callable
from pathlib import Path

from gpulens.diagnose import Finding
from gpulens.diagnose.evidence import evidence_label, format_value
from gpulens.report.build import ReportData
from gpulens.report.plots import chart_png
from gpulens.views.data import ChartOut
from gpulens.vocab.time import format_when

CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;color:#1d2330;max-width:1100px;margin:24px auto;padding:0 16px}
h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #dde1ea;padding-bottom:4px;margin-top:28px}
h3{font-size:14px;margin:14px 0 2px}.muted{color:#6b7385}table{border-collapse:collapse;margin:6px 0}
th,td{text-align:left;padding:3px 10px;border-bottom:1px solid #dde1ea;vertical-align:top}
img{max-width:100%}.sev{font-weight:700;text-transform:uppercase;font-size:11px}.critical{color:#b3261e}.warning{color:#b36b00}
.empty{background:#fffbe6;border:1px dashed #e2c96b;padding:8px}
"""


def _t(ts: float) -> str:
    return format_when(ts)


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


def _selection_text(data: ReportData) -> str:
    parts = [f"{k}={v}" for k, v in vars(data.selection).items() if v]
    return ", ".join(parts) or "everything in the store"


def _evidence_text(finding: Finding) -> str:
    """The evidence as the terminal shows it (formatted from the values' units)."""
    return " · ".join(f"{evidence_label(k, v)}: {format_value(v)}" for k, v in finding.evidence.items())


def render_html(data: ReportData) -> str:
    """The report as one HTML document with no outside references."""
    h: list[str] = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{_e(data.title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{_e(data.title)}</h1>",
        f"<p class='muted'>From {_e(data.source)} · {_e(_t(data.window.start))} – {_e(_t(data.window.end))} "
        f"({data.window.seconds:.0f} s) · {_e(_selection_text(data))} · generated {_e(_t(data.generated_at))}</p>",
        "<h2>Summary</h2>",
    ]
    for p in data.panels:
        h.append(f"<h3>{_e(p.title)}</h3>")
        if not p.has_data:
            h.append(f"<p class='empty'>{_e(p.empty_hint)}</p>")
            continue
        h.append("<table><tr>" + "".join(f"<th>{_e(s.label)}</th>" for s in p.stats) + "</tr><tr>")
        h.append("".join(f"<td data-stat='{_e(s.id)}'>{_e(s.display)}</td>" for s in p.stats) + "</tr></table>")
    h.append("<h2>Findings and advice</h2>")
    if not data.findings:
        h.append(f"<p class='muted'>{_e(data.findings_note or 'No findings in this window.')}</p>")
    for f in data.findings:
        h.append(f"<div class='finding' data-kind='{_e(f.kind)}'><p><span class='sev {_e(f.severity)}'>{_e(f.severity)}</span> "
                 f"<b>{_e(f.kind)}</b> ({_e(f.workload)}, {_e(_t(f.start))} – {_e(_t(f.end))}): {_e(f.summary)}</p>")
        if f.evidence:
            h.append(f"<p class='muted'>{_e(_evidence_text(f))}</p>")
        if f.advice:
            h.append("<ol>" + "".join(f"<li>{_e(a)}</li>" for a in f.advice) + "</ol>")
        h.append("</div>")
    h.append("<h2>Comparison with the baseline</h2>")
    if data.baseline_window is None:
        h.append(f"<p class='muted'>{_e(data.baseline_note)}</p>")
    else:
        bw = data.baseline_window
        h.append(f"<p class='muted'>Baseline window {_e(_t(bw.start))} – {_e(_t(bw.end))}.</p>")
        if not data.baseline:
            h.append("<p class='muted'>The baseline window holds no data of the panels shown.</p>")
        else:
            h.append("<table><tr><th>panel</th><th>number</th><th>this run</th><th>baseline</th><th>change</th><th></th></tr>")
            for r in data.baseline:
                h.append(f"<tr><td>{_e(r.panel)}</td><td>{_e(r.stat)}</td><td>{_e(r.value_text)}</td>"
                         f"<td>{_e(r.baseline_text)}</td><td>{_e(r.change_text)}</td><td>{_e(r.verdict_text)}</td></tr>")
            h.append("</table>")
    h.append("<h2>Alerts</h2>")
    if not data.alerts:
        h.append("<p class='muted'>No alerts fired in this window.</p>")
    else:
        h.append("<table><tr><th>time</th><th>alert</th><th>state</th><th>severity</th><th>summary</th></tr>")
        for a in data.alerts:
            h.append(f"<tr><td>{_e(_t(a.t))}</td><td>{_e(a.name)}</td><td>{_e(a.state)}</td><td>{_e(a.severity)}</td><td>{_e(a.summary)}</td></tr>")
        h.append("</table>")
    for p in data.panels:
        if not p.has_data:
            continue
        h.append(f"<h2>{_e(p.title)} charts</h2>")
        for c in p.charts:
            if not c.has_data:
                continue
            png = base64.b64encode(chart_png(c, data.window)).decode()
            h.append(f"<figure data-chart='{_e(c.id)}'><img alt='{_e(c.title)}' src='data:image/png;base64,{png}'>"
                     f"{f'<figcaption class=muted>{_e(c.help)}</figcaption>' if c.help else ''}</figure>")
    h.append("</body></html>")
    return "\n".join(h)


# Markdown's own syntax characters, escaped with a backslash: no link, image, emphasis or code span from data.
# An underscore inside a word (input_bound) cannot start emphasis, so it stays as written.
_MD_SPECIAL = re.compile(r"[\\`*\[\]|]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
# a "<" that could open raw HTML or an autolink (a letter, /, ! or ? follows); "<=" and "< 5" stay as they are
_TAG_START = re.compile(r"<(?=[A-Za-z/!?])")


def _md(x: object) -> str:
    """Markdown-safe text: no raw HTML, no links or table breaks from data; plain comparisons like
    "p99_latency<=2s" stay readable (not "&lt;=")."""
    text = _MD_SPECIAL.sub(lambda m: "\\" + m.group(0), str(x).replace("\n", " "))
    return _TAG_START.sub("&lt;", text)


def _md_code(x: object) -> str:
    """Text for inside a `code span`, where backslashes are literal: only the backtick must go."""
    return str(x).replace("`", "'").replace("\n", " ")


def render_markdown(data: ReportData, write_png: Callable[[ChartOut, bytes], str]) -> str:
    """The report as Markdown; `write_png(chart, png)` stores one chart and returns its relative path."""
    m = [f"# {_md(data.title)}", "",
         f"From `{_md_code(data.source)}` · {_t(data.window.start)} – {_t(data.window.end)} ({data.window.seconds:.0f} s) · "
         f"{_md(_selection_text(data))}", "", "## Summary", ""]
    for p in data.panels:
        m.append(f"### {_md(p.title)}")
        m.append("")
        if not p.has_data:
            m += [f"_{_md(p.empty_hint)}_", ""]
            continue
        m.append("| " + " | ".join(_md(s.label) for s in p.stats) + " |")
        m.append("|" + "---|" * len(p.stats))
        m.append("| " + " | ".join(_md(s.display) for s in p.stats) + " |")
        m.append("")
    m += ["## Findings and advice", ""]
    if not data.findings:
        m += [f"_{_md(data.findings_note or 'No findings in this window.')}_", ""]
    for f in data.findings:
        m.append(f"- **{_md(f.severity)} · {_md(f.kind)}** ({_md(f.workload)}, {_t(f.start)} – {_t(f.end)}): {_md(f.summary)}")
        if f.evidence:
            m.append(f"  - evidence: {_md(_evidence_text(f))}")
        for i, a in enumerate(f.advice, 1):
            m.append(f"  {i}. {_md(a)}")
    m += ["", "## Comparison with the baseline", ""]
    if data.baseline_window is None:
        m += [f"_{_md(data.baseline_note)}_", ""]
    else:
        m += [f"Baseline window {_t(data.baseline_window.start)} – {_t(data.baseline_window.end)}.", "",
              "| panel | number | this run | baseline | change | |", "|---|---|---|---|---|---|"]
        m += [f"| {_md(r.panel)} | {_md(r.stat)} | {_md(r.value_text)} | {_md(r.baseline_text)} | {_md(r.change_text)} "
              f"| {r.verdict_text} |" for r in data.baseline]
        m.append("")
    m += ["## Alerts", ""]
    if not data.alerts:
        m += ["_No alerts fired in this window._", ""]
    else:
        m += ["| time | alert | state | severity | summary |", "|---|---|---|---|---|"]
        m += [f"| {_t(a.t)} | {_md(a.name)} | {_md(a.state)} | {_md(a.severity)} | {_md(a.summary)} |" for a in data.alerts]
        m.append("")
    for p in data.panels:
        if not p.has_data:
            continue
        m += [f"## {_md(p.title)} charts", ""]
        for c in p.charts:
            if c.has_data:
                m += [f"![{_md(c.title)}]({write_png(c, chart_png(c, data.window))})", ""]
    return "\n".join(m)


def write_markdown(data: ReportData, out: Path) -> list[Path]:
    """Write out.md and its charts under out's stem + '_files/' (each file whole or not at all; the
    charts first, so a report never points at a chart that is not there). Returns the PNG paths."""
    from gpulens.files import (
        FileWriteError,
        OutputDiskFullError,
        kept_note,
        refuse_database,
        write_atomically,
    )

    refuse_database(out)  # before the charts folder is made beside it

    hint = "Free some space or choose an --out path you can write to."
    folder = out.with_name(out.stem + "_files")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        cls = OutputDiskFullError if e.errno in (errno.ENOSPC, errno.EDQUOT) else FileWriteError
        raise cls(f"Cannot create the charts folder {folder}: {e.strerror}; the report {out} was not written.",
                  hint=hint) from None
    written: list[Path] = []

    def write_png(chart: ChartOut, png: bytes) -> str:
        path = folder / f"{chart.id}.png"
        try:
            write_atomically(path, png, what="the chart", hint=hint)
        except FileWriteError as e:
            charts = f" ({len(written)} chart(s) before it are in {folder})" if written else ""
            raise type(e)(f"{e.message} The report was not written{charts}: {kept_note(out)}.", hint=hint) from None
        written.append(path)
        return f"{folder.name}/{path.name}"

    write_atomically(out, render_markdown(data, write_png), what="the report", hint=hint)
    return written
