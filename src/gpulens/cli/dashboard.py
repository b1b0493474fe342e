"""`gpulens dashboard`: the web dashboard over a store or a Prometheus server."""

from __future__ import annotations

from pathlib import Path

import typer

from gpulens.errors import BadInputError
from gpulens.store import DEFAULT_STORE_PATH
from gpulens.units import parse_listen


def dashboard(
    store: Path = typer.Option(None, "--store", help="A gpulens store (SQLite file) to read. Default: .gpulens/gpulens.db"),
    prometheus: str = typer.Option(None, "--prometheus", help="Read a Prometheus server's HTTP API instead, e.g. http://prom:9090 (a fleet)."),
    listen: str = typer.Option("127.0.0.1:8642", "--listen", help="HOST:PORT to serve on. Any address but loopback needs a token. Port 0 picks a free one."),
    token: str = typer.Option(None, "--token", help="A secret every request must carry. Generated and printed when --listen is not loopback and none is given."),
    open_browser: bool = typer.Option(False, "--open", help="Open the dashboard in the default browser."),
    web_config: Path = typer.Option(None, "--web-config", help="TLS and basic auth from a Prometheus exporter-toolkit web-config file (as `gpulens agent --web-config`). With basic_auth_users, no token is needed beyond loopback."),
) -> None:
    """Serve the dashboard: Training | Inference | GPU health panels, findings with advice, alerts.

    Read-only. It listens on 127.0.0.1 unless told otherwise; on any other address it requires a
    token (pass --token, or copy the generated one it prints). The page needs no internet: its
    chart library is served from the package.

    Examples:

    * `gpulens dashboard` the local store on http://127.0.0.1:8642/
    * `gpulens dashboard --store run.db --listen :9000`
    * `gpulens dashboard --prometheus http://127.0.0.1:9090` a fleet scraped by Prometheus
    * `gpulens dashboard --listen 0.0.0.0:8642` reachable from other machines: prints a token
    * `gpulens dashboard --listen '[::]:8642' --web-config web.yml` IPv6, TLS and basic auth
    """
    from gpulens.web.server import serve
    from gpulens.webconfig import load_web_config

    if store is not None and prometheus is not None:
        raise BadInputError("Give --store or --prometheus, not both.", hint="The dashboard reads one source at a time.")
    if prometheus is None:
        store = store or DEFAULT_STORE_PATH
        if not Path(store).exists():
            raise BadInputError(
                f"There is no store at {store}.",
                hint="Run `gpulens agent` or `gpulens replay` first, or point --store at a gpulens store file.",
            )
    host, port = parse_listen(listen)
    wc = load_web_config(web_config) if web_config is not None else None
    serve(store if prometheus is None else None, host, port, token, open_browser, prometheus_url=prometheus, web_config=wc)


def register(app: typer.Typer) -> None:
    app.command("dashboard")(dashboard)
