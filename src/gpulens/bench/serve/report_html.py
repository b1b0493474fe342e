"""`bench serve --report PATH.html`: one self-contained page per run or sweep, its charts drawn
by matplotlib and embedded as PNG (no script, no outside reference), so it can be mailed or
attached to a ticket: TTFT / ITL / end-to-end distributions, send lag over the run, the
latency-vs-rate curve of a sweep, and the SLO verdicts."""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

from gpulens.bench.serve.api import SweepResult
from gpulens.bench.serve.runner import LoadSpec
from gpulens.bench.serve.stats import SloResult
from gpulens.bench.serve.summary import LoadResult
from gpulens.errors import BadInputError
from gpulens.files import write_atomically
from gpulens.http_client import redact_url
from gpulens.vocab.slo import Slo

_CSS = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
        "th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}.met{color:#2e7d32}.missed{color:#c62828}"
        "figure{margin:1em 0}figcaption{font-size:.9em;color:#555}")


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise BadInputError("--report draws its charts with matplotlib, which is not installed.",
                            hint="Install the plot extra: pip install 'gpulens[plot]'.") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    return base64.b64encode(buf.getvalue()).decode()


def _figure(name: str, caption: str, data: str) -> str:
    return (f"<figure data-chart='{name}'><img alt='{html.escape(caption)}' src='data:image/png;base64,{data}'>"
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def _axes(ax, title: str, xlabel: str, ylabel: str) -> None:
    """Every chart's axes look alike: labelled, titled at the left, on a light grid."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10, loc="left")
    ax.grid(alpha=0.3)


def _distributions(plt, load: LoadResult) -> list[str]:
    recs = [r for r in load.records if r.status == "ok"]
    series = [("ttft", "TTFT", [r.ttft for r in recs if r.ttft is not None]),
              ("itl", "inter-token latency", [g for r in recs for g in (r.itls or ())]),
              ("latency", "end-to-end latency", [r.latency for r in recs if r.latency is not None])]
    out = []
    for name, title, values in series:
        if not values:
            continue
        fig, ax = plt.subplots(figsize=(7, 2.6))
        try:
            ax.hist([v * 1e3 for v in values], bins=min(60, max(10, len(values) // 5)), color="#2f6fdf")
            _axes(ax, f"{title} ({len(values)} values)", "ms", "requests" if name != "itl" else "gaps")
            out.append(_figure(f"{name}_distribution", f"{title}: distribution", _png(fig)))
        finally:
            plt.close(fig)
    return out


def _scatter(plt, pts: list[tuple[float, float]], *, marker: str, ms: int, color: str,
             axes: tuple[str, str, str], name: str, caption: str) -> list[str]:
    """One point per request on a wide, short figure; `axes` is (title, x label, y label)."""
    fig, ax = plt.subplots(figsize=(7, 2.6))
    try:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker, ms=ms, color=color)
        _axes(ax, *axes)
        return [_figure(name, caption, _png(fig))]
    finally:
        plt.close(fig)


def _ttft_by_prompt(plt, load: LoadResult) -> list[str]:
    """Shaped traffic: TTFT against the prompt's tokens, where the prefill cost shows."""
    pts = [(r.input_tokens, r.ttft * 1e3) for r in load.records
           if r.status == "ok" and r.input_tokens is not None and r.ttft is not None]
    if len({x for x, _ in pts}) < 2:
        return []
    return _scatter(plt, pts, marker="o", ms=3, color="#7a52c7",
                    axes=("TTFT against prompt length", "prompt tokens", "TTFT ms"),
                    name="ttft_by_prompt_tokens", caption="TTFT against the prompt's length in tokens")


def _send_lag(plt, load: LoadResult) -> list[str]:
    pts = [(r.intended, (r.sent - r.intended) * 1e3) for r in load.records if r.sent is not None]
    if not pts:
        return []
    return _scatter(plt, pts, marker=".", ms=2, color="#e07a1f",
                    axes=("send lag: actual send − intended send", "s from the start", "ms late"),
                    name="send_lag", caption="send lag over the run")


def _sweep_curve(plt, sweep: SweepResult) -> list[str]:
    probes = sorted(sweep.probes, key=lambda p: p.value)
    xs = [p.value for p in probes]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 3))
    try:
        for stat, color in (("p50", "#2e9e5b"), ("p99", "#c23b6e")):
            ys = [getattr(p.result.summary.latency, stat) * 1e3 if p.result.summary.latency else None for p in probes]
            ax.plot(xs, ys, "o-", color=color, label=f"latency {stat}")
            ts = [getattr(p.result.summary.ttft, stat) * 1e3 if p.result.summary.ttft else None for p in probes]
            if any(t is not None for t in ts):
                ax.plot(xs, ts, "s--", color=color, alpha=0.6, label=f"TTFT {stat}")
        _axes(ax, "latency against load", "offered req/s" if sweep.mode == "open" else "users", "ms")
        ax.legend(fontsize=7)
        ax2.plot(xs, [p.result.summary.achieved_rate for p in probes], "o-", label="achieved req/s")
        ax2.plot(xs, [p.result.summary.goodput or 0 for p in probes], "s-", label="goodput req/s")
        ax2.set_xlabel(ax.get_xlabel())
        ax2.set_title("throughput and goodput", fontsize=10, loc="left")
        ax2.legend(fontsize=7)
        ax2.grid(alpha=0.3)
        return [_figure("latency_vs_rate", "latency, throughput and goodput against the load offered", _png(fig))]
    finally:
        plt.close(fig)


def _verdicts(results: list[SloResult]) -> str:
    if not results:
        return "<p>No SLO was given.</p>"
    rows = []
    for r in results:
        cls = "met" if r.met else "missed"
        note = "" if r.gating else " (reported, not gating)"
        rows.append(f"<tr data-slo='{html.escape(r.slo)}'><td>{html.escape(r.slo)}</td><td>{r.shown()}</td>"
                    f"<td class='{cls}'>{cls}{note}</td></tr>")
    return "<table class='verdicts'><tr><th>SLO</th><th>value</th><th>verdict</th></tr>" + "".join(rows) + "</table>"


def _summary_table(load: LoadResult) -> str:
    s = load.summary
    rows = [("requests", f"{s.requests.total} ({s.requests.ok} ok)"),
            ("achieved", f"{s.achieved_rate:.2f} req/s"),
            ("input tokens/s", "–" if s.input_tokens_per_second is None else f"{s.input_tokens_per_second:.1f}"),
            ("output tokens/s", "–" if s.output_tokens_per_second is None else f"{s.output_tokens_per_second:.1f}"),
            ("token counts", s.token_basis or "–")]
    if s.concurrency:
        c = s.concurrency
        rows.append(("concurrency", f"mean {c.mean:.1f}, p50 {c.p50:g}, p99 {c.p99:g}, max {c.max:g}"))
    if s.goodput is not None:
        rows.append(("goodput", f"{s.goodput:.2f} req/s" + ("" if s.goodput_ratio is None else f" ({s.goodput_ratio:.1%})")))
    stats = []
    for name, d in (("latency", s.latency), ("TTFT", s.ttft), ("ITL", s.itl), ("TPOT", s.tpot), ("send lag", s.send_lag)):
        if d is not None:
            stats.append(f"<tr><td>{name}</td>" + "".join(f"<td>{getattr(d, k) * 1e3:.2f}</td>"
                                                          for k in ("p50", "p90", "p99", "mean", "max")) + f"<td>{d.count}</td></tr>")
    return ("<table class='summary'>" + "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in rows)
            + "</table><table class='latency'><tr><th>ms</th><th>p50</th><th>p90</th><th>p99</th><th>mean</th><th>max</th>"
            "<th>n</th></tr>" + "".join(stats) + "</table>")


def write_report(path: str | Path, spec: LoadSpec, slos: list[Slo], *, load: LoadResult | None = None,
                 sweep: SweepResult | None = None) -> Path:
    """Write the page; returns its path. Give `load` for one run, `sweep` for a sweep."""
    plt = _pyplot()
    path = Path(path)
    title = f"bench serve: {redact_url(spec.target.url)}"
    parts = [f"<h1>{html.escape(title)}</h1>"]
    if sweep is not None:
        best = "none met every SLO" if sweep.best is None else (
            f"{sweep.best:g}" + ("" if sweep.limit_found else " (at least: every probe passed)"))
        parts.append(f"<p class='best'>Highest load meeting every SLO: <b>{html.escape(best)}</b></p>")
        parts += _sweep_curve(plt, sweep)
        load = load or (sweep.probes[-1].result if sweep.probes else None)
        if sweep.best is not None:
            load = next((p.result for p in sweep.probes if p.value == sweep.best), load)
    if load is not None:
        parts.append("<h2>SLO verdicts</h2>" + _verdicts(load.summary.slo_results))
        parts.append("<h2>Run</h2>" + _summary_table(load))
        parts += _distributions(plt, load) + _ttft_by_prompt(plt, load) + _send_lag(plt, load)
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_CSS}</style></head><body>" + "".join(parts) + "</body></html>")
    hint = "Free some space or choose a --report path in a folder you can write to."
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadInputError(f"Cannot create the folder of the report {path}: {e.strerror}.", hint=hint) from None
    return write_atomically(path, page, what="the report", hint=hint)
