"""`gpulens report`: a run's report as one self-contained HTML file, or Markdown."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from gpulens.cli.common import console, store_option


def report(
    out: Path = typer.Option(..., "--out", "-o", help="Where to write the report, e.g. report.html or report.md."),
    store: Path = store_option(),
    job: str = typer.Option(None, "--job", help="Only this training job."),
    service: str = typer.Option(None, "--service", help="Only this inference service."),
    start: str = typer.Option(None, "--start", help="Window start (unix seconds or ISO time). Default: the store's first sample."),
    end: str = typer.Option(None, "--end", help="Window end. Default: the store's last sample."),
    baseline: str = typer.Option(None, "--baseline", help="A window to compare with, START,END (unix seconds or ISO times): a run you trust."),
    fmt: str = typer.Option(None, "--format", help="html (default; one file, charts embedded) or md (charts in a folder beside it)."),
) -> None:
    """Write a run report: summary numbers, the dashboard's charts, findings with advice, alerts,
    and the comparison with a baseline window.

    The HTML report is a single file with its charts embedded: attach it to a ticket or a mail.

    Examples:

    * `gpulens report --out report.html`
    * `gpulens report --job llama-ft --out run.md`
    * `gpulens report --baseline 1796002127,1796002132 --out vs-baseline.html`
    """
    from gpulens.errors import BadInputError
    from gpulens.report import write_report
    from gpulens.vocab.time import parse_time

    start_t = parse_time(start, "start") if start else None
    end_t = parse_time(end, "end") if end else None
    if start_t is not None and end_t is not None and end_t <= start_t:
        raise BadInputError(f"--end {end} is not after --start {start}.", hint="Give the window's start first, then a later end.")
    res = write_report(
        store,
        out,
        fmt=fmt,  # type: ignore[arg-type]
        job=job,
        service=service,
        start=start_t,
        end=end_t,
        baseline=baseline,
    )
    panels = ", ".join(res.panels_with_data) or "none"
    console.print(escape(f"wrote {res.path} ({res.format}): {res.charts} charts, {res.findings} findings; panels with data: {panels}"))


def register(app: typer.Typer) -> None:
    app.command("report")(report)
