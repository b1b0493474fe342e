"""`gpulens demo`: what `make run` runs. Real GPUs when a driver is present; otherwise the bundled
H200 session imported into the store, summarised, then replayed live behind /metrics (and the
dashboard, when the web extra is installed)."""

from __future__ import annotations

import threading
from pathlib import Path

import typer
from rich.markup import escape

from gpulens.cli.agent import install_stop_handlers
from gpulens.cli.common import STORE_HELP, console, console_err

DEMO_DIR = Path(".gpulens")


def _start_dashboard(store_path: Path, host: str, port: int) -> str | None:
    """The dashboard in a background thread, when gpulens.web is installed. Returns the address to open.
    Same safety as `gpulens dashboard`: loopback by default, a generated token for any other address,
    and a taken port is reported now (one sentence), not lost in the thread."""
    from gpulens.errors import PortInUseError

    try:
        import uvicorn

        from gpulens.web import create_app
        from gpulens.web.server import bind, plan_listen
    except ImportError:
        return None
    plan = plan_listen(host, port)
    app = create_app(store_path=store_path, token=plan.token, allowed_hosts=plan.allowed_hosts)
    try:
        sock = bind(plan.host, plan.port)
    except PortInUseError as e:  # bind's hint names `gpulens dashboard`'s --listen; here it is --dashboard
        raise PortInUseError(e.message, hint="Pick another with --dashboard 127.0.0.1:PORT ('off' for none), or stop what holds it.") from None
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="gpulens-dashboard", daemon=True).start()
    return plan.url(sock.getsockname()[1])


def demo_command(
    store: Path = typer.Option(DEMO_DIR / "gpulens.db", "--store", help=STORE_HELP),
    listen: str = typer.Option("127.0.0.1:9464", "--listen", help="Where /metrics is served."),
    dashboard: str = typer.Option("127.0.0.1:8642", "--dashboard", help="Where the dashboard listens ('off' for none)."),
    duration: str = typer.Option(None, "--duration", help="Stop after this long. Default: until Ctrl-C."),
    backend: str = typer.Option(None, "--backend", help="Force a backend (nvml, fake[:N], replay[:PATH]); default: nvml if a driver is present, else the bundled replay."),
    speed: str = typer.Option("1", "--speed", help="For the replay: 1 = the recorded pace, N = N times faster."),
    fleet: int = typer.Option(None, "--fleet", help="Instead: a fleet of N nodes (2 to 16) on this machine, scraped by a real "
                              "Prometheus (needs `prometheus` on PATH: exit 3 without it); the other options do not apply."),
) -> None:
    """Watch the real GPUs, or, without a driver, replay the bundled H200 session: import it into the
    store, print what it shows, then keep replaying it live behind /metrics and the dashboard.

    With --fleet N: N `gpulens agent`s as N nodes (4 fake GPUs each), a training job across them with
    a straggler rank and an XID, a service, and a real Prometheus scraping them all; it prints the
    Prometheus URL and the `diagnose --prometheus` command to try, and runs until Ctrl-C, which stops
    every process it started and removes its temp folder (docs/fleet.md).

    Examples:

    * `gpulens demo --fleet 2`
    """
    if fleet is not None:
        from gpulens.cli.demo_fleet import run_fleet_demo

        run_fleet_demo(fleet)
        return
    from gpulens.data import bundled_trace
    from gpulens.gpu import nvidia_driver_present
    from gpulens.pipeline import AlertsConfig, NodeConfig, build_node
    from gpulens.pipeline.ingest import import_trace
    from gpulens.store import Store
    from gpulens.units import parse_duration, parse_listen, parse_speed
    from gpulens.workload.importers import ImportContext

    duration_s = parse_duration(duration, what="--duration") if duration else None
    speed_f = parse_speed(speed)
    addr = parse_listen(listen)
    if backend is None:
        backend = "nvml" if nvidia_driver_present() else "replay"
    replaying = backend.startswith("replay")
    if replaying:
        trace = backend.partition(":")[2] or str(bundled_trace())
        backend = f"replay:{trace}"
    # The live replay goes to its own store, so the imported session stays as recorded; the
    # session's training steps and requests replay with it, so /metrics carries them too.
    live_store = store.with_name("live.db") if replaying else store
    # Both addresses are taken first: a port in use is said before the import, not after it.
    node = build_node(NodeConfig(
        backend=backend, speed=speed_f, loop=True, store_path=live_store, listen=addr,
        alerts=AlertsConfig(notify=["log"]), import_context=ImportContext(),
    ))
    lines = [f"Prometheus metrics: {node.metrics_url}"]
    try:
        if dashboard != "off":
            dh, dp = parse_listen(dashboard)
            # The live store, which the replay writes: the imported copy never changes, so a dashboard
            # over it never moved while the demo played.
            url = _start_dashboard(live_store, dh, dp)
            lines.append(f"dashboard: {url}" if url else "dashboard: not installed (pip install 'gpulens[web]')")
            if url and live_store != store:
                lines.append(escape(f"the session as recorded: gpulens dashboard --store {store}"))
        if replaying:
            console.print("[bold]No NVIDIA driver here[/]: " + escape(f"replaying the recorded H200 session ({trace})."))
            with Store(store) as st, console_err.status("importing the session into the store …"):
                s = import_trace(trace, st, ctx=ImportContext(), alerts=AlertsConfig(learn_seconds=5.0))
            from gpulens.render.session import import_text, print_session_summary

            if s.already_imported:
                console.print(escape(f"(already imported into {store})"))
            else:
                console.print(escape(import_text(s.gpu_frames, s.events, store)))
            print_session_summary(console, store)
    except BaseException:
        node.close()
        raise
    console.print("\n".join(lines) + "\nCtrl-C stops.")
    install_stop_handlers(node.loop.stop_event)
    try:
        node.run(duration_s)
    finally:
        node.close()


def register(app: typer.Typer) -> None:
    app.command("demo")(demo_command)
