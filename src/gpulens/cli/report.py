"""`gpulens report`: a run's report as one self-contained HTML file, or Markdown."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from gpulens.cli.common import console, console_err, store_option
from gpulens.cli.fleet import match_option, prometheus_option, window_option


def report(
    ctx: typer.Context,
    out: Path = typer.Option(..., "--out", "-o", help="Where to write the report, e.g. report.html or report.md; - writes the HTML to standard output."),
    store: Path = store_option(),
    job: str = typer.Option(None, "--job", help="Only this training job."),
    service: str = typer.Option(None, "--service", help="Only this inference service."),
    start: str = typer.Option(None, "--start", help="Window start (unix seconds or ISO time). Default: the store's first sample."),
    end: str = typer.Option(None, "--end", help="Window end. Default: the store's last sample."),
    baseline: str = typer.Option(None, "--baseline", help="A window to compare with, START,END (unix seconds or ISO times): a run you trust."),
    fmt: str = typer.Option(None, "--format", help="html (default; one file, charts embedded) or md (charts in a folder beside it)."),
    prometheus: str = prometheus_option(),
    match: str = match_option(),
    window: str = window_option(),
) -> None:
    """Write a run report: summary numbers, the dashboard's charts, findings with advice, alerts,
    and the comparison with a baseline window.

    The HTML report is a single file with its charts embedded: attach it to a ticket or a mail.

    Examples:

    * `gpulens report --out report.html`
    * `gpulens report --job llama-ft --out run.md`
    * `gpulens report --out - > report.html`
    * `gpulens report --baseline 1796002127,1796002132 --out vs-baseline.html`
    * `gpulens report --prometheus http://prometheus:9090 --job pretrain --window 6h --out fleet.html`
    * `gpulens report --prometheus http://prometheus:9090 --match '{cluster="a"}' --out cluster-a.html`

    Over --prometheus the report covers every node --match selects: charts from PromQL (percentiles
    are `histogram_quantile` bucket estimates), findings from `diagnose --prometheus` (docs/fleet.md).
    """
    from gpulens.cli.fleet import (
        open_prometheus,
        refuse_match_without_prometheus,
        refuse_store_with_prometheus,
        time_window,
    )
    from gpulens.report import write_report

    refuse_match_without_prometheus(match, prometheus)
    refuse_store_with_prometheus(prometheus, ctx)
    start_t, end_t = time_window(start, end, window, prometheus)
    readers = None
    if prometheus:
        from gpulens.views.prometheus import PrometheusReader

        analysis = open_prometheus(prometheus, match, start_t, end_t, job, service)
        # The charts and the findings over the same series: the panel reader takes the same matchers.
        readers = (PrometheusReader(prometheus, matchers=analysis.matchers), analysis)
        start_t, end_t = analysis.start, analysis.end
    res = write_report(
        store,
        out,
        fmt=fmt,  # type: ignore[arg-type]
        job=job,
        service=service,
        start=start_t,
        end=end_t,
        baseline=baseline,
        readers=readers,
    )
    panels = ", ".join(res.panels_with_data) or "none"
    said = f"wrote {'standard output' if str(out) == '-' else res.path} ({res.format}): {res.charts} charts, {res.findings} findings; panels with data: {panels}"
    (console_err if str(out) == "-" else console).print(escape(said))  # the report itself is on stdout


def register(app: typer.Typer) -> None:
    app.command("report")(report)
