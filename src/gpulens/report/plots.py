"""The panels' charts as PNG images (matplotlib, headless), for self-contained reports."""

from __future__ import annotations

import io
import warnings
from datetime import UTC, datetime

from gpulens.errors import BadInputError
from gpulens.views.data import ChartOut, Window
from gpulens.views.format import format_value
from gpulens.vocab.time import ZONE

PALETTE = ["#2f6fdf", "#e07a1f", "#2e9e5b", "#c23b6e", "#7a52c7", "#8a8f2c", "#1aa3b5", "#b0503a"]


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise BadInputError(
            "Reports draw their charts with matplotlib, which is not installed.",
            hint="Install the plot extra: pip install 'gpulens[plot]'.",
        ) from None
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    return plt


def plain_text(text: str) -> str:
    """A name as matplotlib shows it literally: `$` would start mathtext (a `$\\undefinedmacro$`
    label crashed the report) and a leading `_` hides a legend entry."""
    text = str(text).replace("$", r"\$")
    return " " + text if text.startswith("_") else text


def _moment(t: float) -> datetime | None:
    try:
        return datetime.fromtimestamp(t, UTC)
    except (OverflowError, OSError, ValueError):
        return None  # a time no date holds (an older store): not drawn


def chart_png(chart: ChartOut, window: Window, *, width_in: float = 7.0, height_in: float = 2.6, dpi: int = 100) -> bytes:
    """One chart as a PNG: every series against time, the baseline band behind them, values in the chart's unit."""
    plt = _pyplot()
    from matplotlib.ticker import FuncFormatter

    fig, ax = plt.subplots(figsize=(width_in, height_in), dpi=dpi)
    try:
        ax.xaxis_date(UTC)  # ticks in UTC, as every time in the report's text, whatever the machine's TZ
        if chart.band:
            whose = chart.band.get("series")
            ax.axhspan(chart.band["low"], chart.band["high"], color="#2e9e5b", alpha=0.12, lw=0,
                       label=plain_text(f"normal range of {whose}" if whose else "normal range"))
        for i, s in enumerate(chart.series):
            pts = [(m, v) for t, v in zip(s.t, s.v, strict=True) if v is not None and (m := _moment(t)) is not None]
            if not pts:
                continue
            xs, ys = zip(*pts, strict=True)
            # separate events (checkpoints, model loads) are marks, never joined by a line
            style = "o" if s.draw == "points" else ("o-" if len(xs) < 40 else "-")
            ax.plot(xs, ys, style, color=PALETTE[i % len(PALETTE)], lw=1.2, ms=3, label=plain_text(s.label))
        ax.set_title(plain_text(chart.title), fontsize=10, loc="left")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: format_value(v, chart.unit)))
        if chart.unit == "flag":  # an off / on axis, not 0 % … 100 %
            ax.set_yticks([0.0, 1.0])
            ax.set_ylim(-0.05, 1.05)
        ax.set_xlim(datetime.fromtimestamp(window.start, UTC), datetime.fromtimestamp(window.end, UTC))
        ax.set_xlabel(ZONE, fontsize=7, loc="right")
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        if chart.series:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
        fig.autofmt_xdate()
        with warnings.catch_warnings():  # a legend of many long labels leaves no room: the chart keeps its layout,
            warnings.simplefilter("ignore", UserWarning)  # which is not worth a warning on the user's terminal
            fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return buf.getvalue()
    finally:
        plt.close(fig)
