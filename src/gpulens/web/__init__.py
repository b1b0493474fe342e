"""The gpulens dashboard: three panels (training | inference | GPU health) with findings and alerts,
over a local store or a Prometheus server. Needs the web extra: pip install 'gpulens[web]'.

    gpulens.web.serve(store_path, host, port, token=None, open_browser=False)   # blocking
    gpulens.web.create_app(store_path=..., prometheus_url=..., token=...)       # an ASGI app
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def create_app(
    store_path: str | Path | None = None,
    prometheus_url: str | None = None,
    token: str | None = None,
    allowed_hosts: list[str] | None = None,
) -> Any:
    from gpulens.web.app import create_app as _create

    return _create(store_path=store_path, prometheus_url=prometheus_url, token=token, allowed_hosts=allowed_hosts)


def serve(
    store_path: str | Path | None,
    host: str = "127.0.0.1",
    port: int = 8642,
    token: str | None = None,
    open_browser: bool = False,
    *,
    prometheus_url: str | None = None,
) -> None:
    from gpulens.web.server import serve as _serve

    _serve(store_path, host, port, token, open_browser, prometheus_url=prometheus_url)


__all__ = ["create_app", "serve"]
