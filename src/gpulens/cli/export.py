"""`gpulens export ...`: files for the tools a fleet already runs. Other features add their own
subcommands to `export_app` (e.g. `@export_app.command("rules")`)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from gpulens.cli.common import console

export_app = typer.Typer(
    name="export",
    help="Write files for the tools a fleet already runs: a Grafana dashboard, ...",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)


@export_app.command("grafana")
def grafana(
    out: Path = typer.Option(Path("gpulens-grafana.json"), "--out", "-o", help="Where to write the dashboard JSON; '-' prints it."),
    title: str = typer.Option("gpulens: training | inference | GPU health", "--title", help="The dashboard's title in Grafana."),
    uid: str = typer.Option("gpulens-overview", "--uid", help="The dashboard's uid (keep it to overwrite on re-import)."),
    metric_names: str = typer.Option("gpulens", "--metric-names", help="The agents' naming: gpulens, or dcgm (agents run with --metric-names dcgm)."),
) -> None:
    """Write a Grafana dashboard with the Training, Inference and GPU health panels.

    It queries the metric names `gpulens agent` exports (scraped by Prometheus), with data-source,
    GPU, host, job and service pickers. Provision it from a file (Grafana's dashboard provider) as it
    is, or import it (Dashboards → New → Import): the `datasource` picker starts on the default
    Prometheus.

    * `gpulens export grafana --out gpulens.json`
    * `gpulens export grafana --out - | curl -XPOST -H 'Content-Type: application/json' ...`
    """
    from gpulens.export.grafana import write_grafana_dashboard

    text = write_grafana_dashboard(None if str(out) == "-" else out, title=title, uid=uid, metric_names=metric_names)
    if str(out) == "-":
        typer.echo(text)
    else:
        console.print(escape(f"wrote {out}: provision it from a file or import it in Grafana (Dashboards → New → Import)."))


def register(app: typer.Typer) -> None:
    app.add_typer(export_app, name="export")
