"""Run reports: one self-contained HTML file (charts as embedded PNGs) or Markdown, with the run's
summary, the dashboard panels' charts, findings and advice, alerts, and the comparison with a
baseline window. Charts need the plot extra: pip install 'gpulens[plot]'."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gpulens.errors import BadInputError, shown
from gpulens.files import missing_folder, write_atomically
from gpulens.report.build import ReportData, build_report_data
from gpulens.views.data import Window
from gpulens.vocab.time import parse_window

WRITE_HINT = "Free some space or choose an --out path you can write to."

ReportFormat = Literal["html", "md"]


@dataclass
class ReportResult:
    path: Path
    format: ReportFormat
    charts: int
    findings: int
    panels_with_data: list[str]
    extra_files: list[Path] = field(default_factory=list)


_SUFFIX_FORMATS: dict[str, ReportFormat] = {".html": "html", ".htm": "html", ".md": "md", ".markdown": "md"}


def _format_from_suffix(out: Path) -> ReportFormat:
    """html or md from the file name; no suffix means html. Any other suffix (.pdf) is refused, never
    written as HTML under a name that promises something else."""
    suffix = out.suffix.lower()
    if not suffix:
        return "html"
    if suffix not in _SUFFIX_FORMATS:
        raise BadInputError(
            f"gpulens cannot write a {suffix} report ({out.name}): it writes HTML (.html) or Markdown (.md).",
            hint="Name the file report.html or report.md, or give --format html|md.",
        )
    return _SUFFIX_FORMATS[suffix]


def write_report(
    store_path: str | Path,
    out: str | Path,
    *,
    fmt: ReportFormat | None = None,
    job: str | None = None,
    service: str | None = None,
    start: float | None = None,
    end: float | None = None,
    baseline: str | None = None,
    readers: tuple[Any, Any] | None = None,
) -> ReportResult:
    """Build the report of a store's run and write it to `out` (format from `fmt` or the suffix)."""
    from gpulens.report.render import render_html, write_markdown

    to_stdout = str(out) == "-"  # as `export grafana --out -` and `record --out -`
    out = Path(out)
    fmt = fmt or ("html" if to_stdout else _format_from_suffix(out))
    if fmt not in ("html", "md"):
        raise BadInputError(f"Unknown report format {shown(fmt)}.", hint="Use --format html or --format md.")
    if to_stdout and fmt == "md":
        raise BadInputError("A Markdown report cannot go to standard output: its charts are files in a folder beside it.",
                            hint="Give --out a file name (run.md), or leave out --format md: HTML is one self-contained stream.")
    if job and service:
        raise BadInputError("Give --job or --service, not both.", hint="A report covers one training job or one service.")
    if readers is None and not Path(store_path).exists():
        raise BadInputError(f"There is no store at {store_path}.", hint="Point --store at a file that `gpulens agent` or `gpulens replay` wrote.")
    if not to_stdout and not out.parent.is_dir():
        raise missing_folder(out, "the report")
    data = build_report_data(
        store_path, job=job, service=service, start=start, end=end,
        baseline=Window(*parse_window(baseline)) if baseline else None, readers=readers,
    )
    charts = sum(1 for p in data.panels for c in p.charts if c.has_data)
    extra: list[Path] = []
    if to_stdout:
        sys.stdout.write(render_html(data))
        sys.stdout.flush()
    elif fmt == "html":
        write_atomically(out, render_html(data), what="the report", hint=WRITE_HINT)
    else:
        extra = write_markdown(data, out)
    return ReportResult(out, fmt, charts, len(data.findings), [p.id for p in data.panels if p.has_data], extra)


__all__ = ["ReportData", "ReportResult", "build_report_data", "write_report"]
