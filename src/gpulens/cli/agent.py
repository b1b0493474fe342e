"""`gpulens agent` and `gpulens record`."""

from __future__ import annotations

import importlib.util
import signal
import threading
import time
from pathlib import Path

import typer

from gpulens.cli.common import STORE_HELP, console_err
from gpulens.gpu.fake import FAULT_HELP
from gpulens.store import DEFAULT_STORE_PATH

BACKEND_HELP = "nvml (real GPUs), fake or fake:N (simulated), replay or replay:PATH (a recorded trace; the bundled H200 session by default). Default: nvml when a driver is present."


def install_stop_handlers(stop: threading.Event) -> None:
    """SIGINT/SIGTERM set `stop` so the loop ends and everything is flushed."""

    def handler(signum: int, frame: object) -> None:
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            signal.signal(sig, handler)
        except ValueError:  # not the main thread
            pass


def attach_alerts(agent, store, learn: str, rules: Path | None, notify: list[str]):  # type: ignore[no-untyped-def]
    """Hook the alert runtime into the agent when the alerts feature is installed."""
    from gpulens.units import parse_duration

    learn_seconds = parse_duration(learn, what="--learn", allow_zero=True)
    try:
        from gpulens.alerts.runtime import AlertRuntime
    except ImportError:
        return None
    rt = AlertRuntime(store, learn_seconds=learn_seconds, rules_file=rules, notify=list(notify or []))
    agent.evaluators.append(rt)
    return rt


def agent_command(
    backend: str = typer.Option(None, "--backend", "-b", help=BACKEND_HELP),
    store: Path = typer.Option(DEFAULT_STORE_PATH, "--store", help=STORE_HELP),
    interval: str = typer.Option("1s", "--interval", help="Sampling interval, e.g. 1s, 100ms."),
    listen: str = typer.Option("127.0.0.1:9464", "--listen", help="Where /metrics is served (HOST:PORT). 'off' serves nothing."),
    duration: str = typer.Option(None, "--duration", help="Stop after this long (e.g. 30s, 2h). Default: until Ctrl-C."),
    metric_names: str = typer.Option("gpulens", "--metric-names", help="gpulens (Prometheus conventions) or dcgm (dcgm-exporter's names)."),
    speed: str = typer.Option("1", "--speed", help="For replay backends: 1 = recorded pace, N = N times faster, max = as fast as possible."),
    loop: bool = typer.Option(False, "--loop", help="For replay backends: start over at the end."),
    fault: list[str] = typer.Option([], "--fault", help=f"For the fake backend: inject a fault, {FAULT_HELP}. Repeatable."),
    learn: str = typer.Option("7d", "--learn", help="How long each series is learned before its learned alert rules may fire."),
    rules: Path = typer.Option(None, "--rules", help="Alert rules file (YAML). Default: the built-in packs."),
    notify: list[str] = typer.Option([], "--notify", help="Where alerts go: log, file:PATH, webhook:URL. Repeatable."),
    keep_raw: str = typer.Option("8d", "--keep-raw", help="How long raw samples are kept (1-minute and 1-hour roll-ups are kept 90 days and 2 years)."),
    scrape: list[str] = typer.Option([], "--scrape", help="A serving engine's /metrics (vLLM, TGI, Triton) to read every 5 s into the inference series. Repeatable."),
    service: str = typer.Option("default", "--service", help="Service label for what --scrape reads."),
) -> None:
    """Sample GPUs every interval into the store and serve Prometheus metrics.

    Examples:

        gpulens agent                                  # real GPUs, 1 s, /metrics on 127.0.0.1:9464
        gpulens agent --backend fake:8 --interval 100ms
        gpulens agent --backend replay --speed 10      # the bundled H200 session, 10x
        gpulens agent --metric-names dcgm              # dcgm-exporter's metric names
        gpulens agent --scrape http://127.0.0.1:8000/metrics --service chat   # plus a vLLM server's metrics
    """
    from gpulens.agent import Agent
    from gpulens.errors import BadInputError
    from gpulens.export.prometheus import LatestReadings, make_registry, serve_metrics
    from gpulens.gpu import FakeBackend, open_backend
    from gpulens.gpu.fake import schedule_fault
    from gpulens.store import Store
    from gpulens.units import parse_duration, parse_listen

    interval_s = parse_duration(interval, what="--interval")
    duration_s = parse_duration(duration, what="--duration") if duration is not None else None
    if metric_names not in ("gpulens", "dcgm"):
        raise BadInputError(f"--metric-names must be gpulens or dcgm, not {metric_names!r}.")
    speed_f = None if speed == "max" else parse_duration(speed, what="--speed")
    addr = None if listen == "off" else parse_listen(listen)
    be = open_backend(backend, speed=speed_f, rebase=True, loop=loop)
    if fault:
        if not isinstance(be, FakeBackend):
            raise BadInputError("--fault works only with the fake backend.", hint="Add --backend fake or fake:N.")
        for spec in fault:
            schedule_fault(be, spec)
    st = Store(store)
    readings = LatestReadings(host=__import__("socket").gethostname())
    keep = {"raw": parse_duration(keep_raw, what="--keep-raw")}
    agent = Agent(be, st, interval_seconds=interval_s, readings=readings, keep_seconds=keep)
    if importlib.util.find_spec("gpulens.diagnose.colocation") is not None:
        from gpulens.agent import ColocationWatch

        agent.evaluators.append(ColocationWatch(st))  # before the alert rules, which read its series
    attach_alerts(agent, st, learn, rules, notify)
    scrapers = []
    for url in scrape:
        from gpulens.workload.inference.scrape import EngineScraper

        scrapers.append(EngineScraper(url, st, service=service).start(5.0))  # a wrong URL fails here, at once
    server = None
    if addr:
        server = serve_metrics(make_registry(readings, metric_names=metric_names, store=st), *addr)  # type: ignore[arg-type]
    install_stop_handlers(agent.stop_event)
    gpus = ", ".join(f"{g.index}: {g.name}" for g in be.gpus())
    console_err.print(
        f"[bold]gpulens agent[/] {be.name} backend ({gpus}) every {interval_s:g} s → {st.path}"
        + (f"; metrics on http://{addr[0]}:{addr[1]}/metrics" if addr else "")
        + ". Ctrl-C stops."
    )
    try:
        stats = agent.run(duration_s)
    finally:
        for _thread, stop_scrape in scrapers:
            stop_scrape.set()
        agent.close()
        st.close()
        if server is not None:
            server.shutdown()
    console_err.print(
        f"stopped after {stats.ticks} samples, {stats.values_written} values, {stats.xid_events} XID events; "
        f"CPU {stats.cpu_seconds:.2f} s over {stats.wall_seconds:.1f} s"
    )


def record_command(
    out: Path = typer.Option(..., "--out", "-o", help="The recording to write (JSON lines)."),
    backend: str = typer.Option(None, "--backend", "-b", help=BACKEND_HELP),
    interval: str = typer.Option("1s", "--interval", help="Sampling interval."),
    duration: str = typer.Option("60s", "--duration", help="How long to record."),
) -> None:
    """Record any backend to gpulens's trace format, for `gpulens replay` or `--backend replay:FILE`."""
    from gpulens.gpu import open_backend
    from gpulens.gpu.record import Recorder, open_recording
    from gpulens.units import parse_duration

    interval_s = parse_duration(interval, what="--interval")
    duration_s = parse_duration(duration, what="--duration")
    be = open_backend(backend, speed=1.0, rebase=True)
    stop = threading.Event()
    install_stop_handlers(stop)
    with open_recording(out) as f:
        rec = Recorder(f, be)
        t_end = time.monotonic() + duration_s
        while not stop.is_set() and time.monotonic() < t_end and not be.exhausted:
            rec.write_samples(be.sample())
            for ev in be.drain_xid_events():
                rec.write_xid(ev)
            if not getattr(be, "paced", False):
                stop.wait(interval_s)
    be.close()
    console_err.print(f"wrote {rec.lines} lines to {out}")


def register(app: typer.Typer) -> None:
    app.command("agent")(agent_command)
    app.command("record")(record_command)
