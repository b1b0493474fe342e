"""A tune's report for people: the path taken, each trial's throughput with its interval and
verdict, the findings that drove it, the final setting, the speed-up, and the commands to
reproduce the best and the baseline (the rollback point). Terminal (rich) and one HTML file."""

from __future__ import annotations

import html
from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from gpulens.tune.result import Trial, TuneResult

_VERDICT_STYLE = {"baseline": "bold", "kept": "green", "rolled_back": "yellow", "failed": "red"}


def _num(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:,.4g}" if abs(x) < 1000 else f"{x:,.0f}"


def _ci(t: Trial) -> str:
    e = t.estimate
    if e.ci95_low is None:
        return "–"
    return f"{_num(e.ci95_low)} … {_num(e.ci95_high) if e.ci95_high is not None else 'none'}"


def _speed(x: float | None, ci: tuple[float, float] | None, sep: str = " ", at_least: bool = False) -> str:
    """A speed-up with its interval; a lower bound (no failing rate found) reads "at least"."""
    if x is None:
        return "at least ×1 (no failing rate found: raise --max-rate)" if at_least else "–"
    if at_least:
        return f"at least ×{x:.2f}"
    return f"×{x:.2f}" + (f"{sep}({ci[0]:.2f}…{ci[1]:.2f})" if ci else "")


def _setting(knobs: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in knobs.items()) or "(none)"


def terminal(result: TuneResult) -> Group:
    unit = result.metric.replace("requests_per_second", "req/s").replace("_per_second", "/s").replace("_", " ")
    t = Table(title=f"gpulens tune {result.mode}: {result.name}", title_justify="left", expand=False, box=box.SIMPLE_HEAD,
              padding=(0, 1), show_edge=False, pad_edge=False, collapse_padding=True)
    serve = result.mode == "serve"
    rows = []
    for tr in [result.baseline, *result.trials]:
        cells = [str(tr.index), _setting(tr.changed) if tr.changed else "baseline", _num(tr.estimate.median), _ci(tr),
                 _speed(tr.speedup, tr.speedup_ci, sep="\n", at_least=tr.speedup_at_least)]
        if serve:
            cold = tr.extra.get("cold_start_seconds")
            cells.append(f"{cold:.1f} s" if cold is not None else "–")
        rows.append((cells, Text(tr.verdict.replace("_", " "), style=_VERDICT_STYLE[tr.verdict])))
    headers = ["#", "change", unit, "bracket" if serve else "95 % CI", "vs best", *(["cold\nstart"] if serve else []), "verdict"]
    for i, header in enumerate(headers):
        col = [r[0][i] for r in rows] if i < len(headers) - 1 else []
        if header in ("change", "verdict"):
            # Text folds at ", " and spaces but never below its longest word.
            words = [w for c in col for w in c.replace(",", " ").split()] + ["rolled"]
            t.add_column(header, min_width=max(map(len, words)), overflow="fold")
        else:
            # A figure is kept whole: its column is as wide as its widest line.
            t.add_column(header, justify="right", no_wrap=True,
                         min_width=max([len(line) for c in col for line in c.splitlines()] + [1]))
    for cells, verdict in rows:
        t.add_row(*cells, verdict)
    lines = [t, Text(f"Baseline: {_setting(result.baseline.knobs)}"
                     + ("  (bracket: the highest rate that met every SLO … the lowest that failed)" if serve else ""), style="dim")]
    for tr in result.trials:
        if tr.verdict != "kept":
            lines.append(Text(f"  #{tr.index}: {tr.reason}", style="dim"))
    if result.findings:
        lines.append(Text("Findings that drove it:", style="bold"))
        for f in result.findings:
            when = f" (after trial #{f['after_trial']})" if f.get("after_trial") is not None else ""
            lines.append(Text(f"  {f['kind']}{when}: {f['summary']}"))
    elif result.mode == "train":
        lines.append(Text("The diagnosis found no bottleneck in the baseline.", style="dim"))
    lines.append(Text(f"Best: {_setting(result.best.knobs)}  speed-up {_speed(result.speedup, result.speedup_ci, at_least=result.speedup_at_least)} "
                      f"against the baseline", style="bold green" if result.best is not result.baseline else "bold"))
    lines.append(Text(f"Stopped because {result.stop_reason}."))
    for s in result.skipped:
        lines.append(Text(f"  skipped {s['change']}: {s['why']}", style="dim"))
    for n in result.notes:
        lines.append(Text(f"  note: {n}", style="dim"))
    lines.append(Text("Reproduce the best:      " + result.reproduce_best))
    lines.append(Text("Roll back (the baseline): " + result.reproduce_baseline))
    if result.run_id is not None:
        lines.append(Text(f"Recorded as run #{result.run_id} (trials are runs #{result.baseline.run_id}…); "
                          "see `gpulens runs list`.", style="dim"))
    return Group(*lines)


def html_report(result: TuneResult) -> str:
    """One self-contained HTML page (no scripts, no outside assets)."""
    e = html.escape
    d: dict[str, Any] = result.to_dict()
    serve = result.mode == "serve"
    rows = []
    for tr in [result.baseline, *result.trials]:
        change = _setting(tr.changed) if tr.changed else "baseline: " + _setting(tr.knobs)
        cold = tr.extra.get("cold_start_seconds")
        cold_cell = f"<td>{f'{cold:.1f} s' if cold is not None else '–'}</td>" if serve else ""
        rows.append(f"<tr class='{e(tr.verdict)}'><td>{tr.index}</td><td>{e(change)}</td><td>{e(_num(tr.estimate.median))}</td>"
                    f"<td>{e(_ci(tr))}</td><td>{e(_speed(tr.speedup, tr.speedup_ci, at_least=tr.speedup_at_least))}</td>{cold_cell}"
                    f"<td>{e(tr.verdict.replace('_', ' '))}</td><td>{e(tr.reason)}</td></tr>")

    def when(f: dict) -> str:
        return f" (after trial #{f['after_trial']})" if f.get("after_trial") is not None else ""

    findings = "".join(f"<li><b>{e(f['kind'])}</b>{e(when(f))}: {e(f['summary'])}<ul>{''.join(f'<li>{e(a)}</li>' for a in f['advice'])}</ul></li>"
                       for f in d["findings"]) or ("<li>None.</li>" if serve else "<li>The diagnosis found no bottleneck in the baseline.</li>")
    items = [f"<li>skipped {e(x['change'])}: {e(x['why'])}</li>" for x in result.skipped] + [f"<li>{e(n)}</li>" for n in result.notes]
    extra = f"<h2>Skipped and notes</h2><ul>{''.join(items)}</ul>" if items else ""
    unit = e(result.metric.replace("_", " "))
    interval = "passed … failed" if result.mode == "serve" else "95 % CI"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gpulens tune {e(result.mode)}: {e(result.name)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:70em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:.3em .6em;text-align:left}}tr.kept{{background:#e6f6e6}}
tr.failed{{background:#fbe3e3}}tr.rolled_back{{background:#fff6dc}}code{{background:#f3f3f3;padding:.1em .3em}}</style></head>
<body><h1>gpulens tune {e(result.mode)}: {e(result.name)}</h1>
<p>Best setting <b>{e(_setting(result.best.knobs))}</b>, speed-up <b>{e(_speed(result.speedup, result.speedup_ci, at_least=result.speedup_at_least))}</b>
against the baseline ({unit}, 95 % interval). Stopped because {e(result.stop_reason)}.</p>
<h2>Trials</h2><table><tr><th>#</th><th>change</th><th>{unit}</th><th>{interval}</th><th>vs best</th>{"<th>cold start</th>" if serve else ""}<th>verdict</th><th>why</th></tr>
{''.join(rows)}</table>
<h2>Findings</h2><ul>{findings}</ul>
{extra}<h2>Reproduce</h2><p>Best: <code>{e(result.reproduce_best)}</code></p>
<p>Baseline (the rollback point): <code>{e(result.reproduce_baseline)}</code></p>
</body></html>
"""
