"""`gpulens agent` and `gpulens record`."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import typer
from rich.markup import escape

from gpulens.cli.common import STORE_HELP, console_err
from gpulens.gpu.fake import FAULT_HELP
from gpulens.signals import on_signals
from gpulens.store import DEFAULT_STORE_PATH

WEB_CONFIG_HELP = ("TLS and basic auth from a Prometheus exporter-toolkit web-config file (the YAML node-exporter reads "
                   "with --web.config.file): tls_server_config, basic_auth_users (bcrypt; needs gpulens[auth]).")
MAX_GAP_HELP = ("For replay backends: the longest recorded gap played (e.g. 60s, the default); a longer one is "
                "shortened to it, and a line that far from both its neighbours is skipped and counted.")
INGEST_HELP = ("Where workloads' monitors send their records (TrainingMonitor/InferenceMonitor agent=, or $GPULENS_AGENT): "
               "unix:PATH, 127.0.0.1:PORT or off. Default: unix:<store name>.ingest.sock beside the store (gpulens.ingest.sock for gpulens.db).")
OTLP_HELP = ("Also push the node's metrics (GPU gauges, workload counters and histograms, as on /metrics) to an "
             "OpenTelemetry Collector over OTLP/HTTP, e.g. http://127.0.0.1:4318/v1/metrics. Needs gpulens[otel].")
OTLP_HEADER_HELP = "A header sent with each OTLP export, NAME=VALUE (e.g. Authorization=Bearer ...); its value is never shown. Repeatable."
BACKEND_HELP = "nvml (real GPUs), fake or fake:N (simulated), replay or replay:PATH (a recorded trace; the bundled H200 session by default). Default: nvml when a driver is present."


def install_stop_handlers(stop: threading.Event) -> None:
    """SIGINT/SIGTERM set `stop` so the loop ends and everything is flushed (from a thread of their
    own: a handler that set it itself could wait forever on the event's lock, see gpulens.signals)."""
    on_signals((signal.SIGINT, signal.SIGTERM), lambda signum: stop.set())


def agent_command(
    backend: str = typer.Option(None, "--backend", "-b", help=BACKEND_HELP),
    store: Path = typer.Option(DEFAULT_STORE_PATH, "--store", help=STORE_HELP),
    interval: str = typer.Option("1s", "--interval", help="Sampling interval, e.g. 1s, 100ms."),
    listen: str = typer.Option("127.0.0.1:9464", "--listen", help="Where /metrics, /health and /ready are served (HOST:PORT; IPv6 as '[::1]:9464'). 'off' serves nothing."),
    web_config: Path = typer.Option(None, "--web-config", help=WEB_CONFIG_HELP),
    duration: str = typer.Option(None, "--duration", help="Stop after this long (e.g. 30s, 2h). Default: until Ctrl-C."),
    metric_names: str = typer.Option("gpulens", "--metric-names", help="gpulens (Prometheus conventions) or dcgm (dcgm-exporter's names)."),
    speed: str = typer.Option("1", "--speed", help="For replay backends: 1 = recorded pace, N = N times faster, max = as fast as possible."),
    loop: bool = typer.Option(False, "--loop", help="For replay backends: start over at the end."),
    max_gap: str = typer.Option("60s", "--max-gap", help=MAX_GAP_HELP),
    fault: list[str] = typer.Option([], "--fault", help=f"For the fake backend: inject a fault, {FAULT_HELP}. Repeatable."),
    learn: str = typer.Option("7d", "--learn", help="How long each series is learned before its learned alert rules may fire."),
    rules: Path = typer.Option(None, "--rules", help="Alert rules file (YAML). Default: the built-in packs."),
    notify: list[str] = typer.Option([], "--notify", help="Where alerts go: log, file:PATH, webhook:URL. Repeatable."),
    keep_raw: str = typer.Option("8d", "--keep-raw", help="How long raw samples are kept (1-minute and 1-hour roll-ups are kept 90 days and 2 years)."),
    scrape: list[str] = typer.Option([], "--scrape", help="A serving engine's /metrics (vLLM, TGI, Triton) to read every 5 s into the inference series. Repeatable."),
    service: str = typer.Option("default", "--service", help="Service label for what --scrape reads."),
    host: str = typer.Option(None, "--host", help="The host label of every series. Default: this machine's name (in a Kubernetes pod, pass the node name)."),
    pod_resources: str = typer.Option(None, "--pod-resources", help="The kubelet's pod-resources socket (e.g. /var/lib/kubelet/pod-resources/kubelet.sock): adds pod, namespace and container labels to GPU series. Needs gpulens[k8s]."),
    ingest: str = typer.Option(None, "--ingest", help=INGEST_HELP),
    otlp: str = typer.Option(None, "--otlp", help=OTLP_HELP),
    otlp_interval: str = typer.Option(None, "--otlp-interval", help="How often --otlp exports (default 15s)."),
    otlp_header: list[str] = typer.Option([], "--otlp-header", help=OTLP_HEADER_HELP),
) -> None:
    """Sample GPUs every interval into the store and serve Prometheus metrics.

    Examples:

        gpulens agent                                  # real GPUs, 1 s, /metrics on 127.0.0.1:9464
        gpulens agent --backend fake:8 --interval 100ms
        gpulens agent --backend replay --speed 10      # the bundled H200 session, 10x
        gpulens agent --metric-names dcgm              # dcgm-exporter's metric names
        gpulens agent --scrape http://127.0.0.1:8000/metrics --service chat   # plus a vLLM server's metrics
        gpulens agent --listen '[::]:9464' --web-config web.yml   # IPv6 and IPv4, TLS and basic auth
        gpulens agent --ingest unix:/run/gpulens/ingest.sock      # workloads send records there (GPULENS_AGENT)
        gpulens agent --otlp http://127.0.0.1:4318/v1/metrics    # also push to an OpenTelemetry Collector
    """
    from gpulens.errors import BadInputError, shown
    from gpulens.exporter.otlp_config import otlp_config
    from gpulens.pipeline import AlertsConfig, NodeConfig, StopEvent, build_node
    from gpulens.pipeline.ingest_sink import default_ingest_address
    from gpulens.units import parse_duration, parse_listen, parse_speed
    from gpulens.webconfig import load_web_config
    from gpulens.workload.wire import parse_address

    interval_s = parse_duration(interval, what="--interval")
    otlp_cfg = otlp_config(otlp, parse_duration(otlp_interval, what="--otlp-interval") if otlp_interval is not None else None,
                           list(otlp_header))
    duration_s = parse_duration(duration, what="--duration") if duration is not None else None
    if metric_names not in ("gpulens", "dcgm"):
        raise BadInputError(f"--metric-names must be gpulens or dcgm, not {shown(metric_names)}.")
    config = NodeConfig(
        backend=backend,
        speed=parse_speed(speed, allow_max=True),
        loop=loop,
        max_gap_seconds=parse_duration(max_gap, what="--max-gap"),
        faults=list(fault),
        store_path=store,
        interval_seconds=interval_s,
        keep_seconds={"raw": parse_duration(keep_raw, what="--keep-raw")},
        listen=None if listen == "off" else parse_listen(listen),
        web_config=load_web_config(web_config) if web_config is not None else None,
        metric_names=metric_names,  # type: ignore[arg-type]
        alerts=AlertsConfig(parse_duration(learn, what="--learn", allow_zero=True), rules, list(notify)),
        scrape_urls=list(scrape),
        scrape_service=service,
        pod_resources_socket=pod_resources,
        host=host,
        single_writer=True,
        stop_event=(stop := StopEvent()),
        ingest=parse_address(ingest, what="--ingest") if ingest is not None else default_ingest_address(store),
        otlp=otlp_cfg,
    )
    install_stop_handlers(stop)  # before the node is built: a signal while it starts ends it too
    node = build_node(config)
    gpus = ", ".join(f"{g.index}: {g.name}" for g in node.backend.gpus())
    from gpulens.store.store import estimate_store_bytes
    from gpulens.units import format_bytes

    keep_s = config.keep_seconds["raw"] if config.keep_seconds else 8 * 86400
    size = estimate_store_bytes(len(node.backend.gpus()), interval_s, keep_s)
    console_err.print(
        f"[bold]gpulens agent[/] {escape(f'{node.backend.name} backend ({gpus}) every {interval_s:g} s → {store}')}"
        + (f"; metrics on {node.metrics_url}" if node.metrics_url else "")
        + (escape(f"; workload records on {node.ingest_address}") if node.ingest_address else "")
        + (escape(f"; {otlp_cfg.describe()}") if otlp_cfg is not None else "")
        + f". Raw samples are kept {keep_raw}: the store reaches about {format_bytes(size)} at this rate (lower it with --keep-raw)."
        + " Ctrl-C stops."
    )
    try:
        stats = node.run(duration_s)
    finally:
        node.close()
    console_err.print(
        f"stopped after {stats.ticks} samples, {stats.values_written} values, {stats.xid_events} XID events; "
        f"CPU {stats.cpu_seconds:.2f} s over {stats.wall_seconds:.1f} s"
    )


def record_command(
    out: Path = typer.Option(..., "--out", "-o", help="The recording to write (JSON lines); - for standard output."),
    backend: str = typer.Option(None, "--backend", "-b", help=BACKEND_HELP),
    interval: str = typer.Option("1s", "--interval", help="Sampling interval."),
    duration: str = typer.Option("60s", "--duration", help="How long to record."),
) -> None:
    """Record any backend to gpulens's trace format, for `gpulens replay` or `--backend replay:FILE`."""
    import errno

    from gpulens.errors import BadInputError, StorageFullError
    from gpulens.gpu.record import open_recording
    from gpulens.pipeline import NodeConfig, build_node
    from gpulens.pipeline.sinks import RecorderSink
    from gpulens.units import parse_duration

    interval_s = parse_duration(interval, what="--interval")
    duration_s = parse_duration(duration, what="--duration")
    if str(out) == "-":  # as `export grafana -o -`: a stream, written straight to (it wrote a file named '-')
        out = Path("/dev/stdout")
    rec = open_recording(out)
    sink = None
    error: OSError | None = None
    try:
        node = build_node(NodeConfig(backend=backend, interval_seconds=interval_s, record_to=rec.file, alerts=None, colocation=False))
        sink = next(s for s in node.sinks if isinstance(s, RecorderSink))
        sink.on_error = node.loop.stop  # a full disk ends the recording there
        install_stop_handlers(node.loop.stop_event)
        try:
            node.run(duration_s)
        finally:
            node.close()
        if sink.error is None:
            rec.commit()  # flushed, fsynced, renamed onto --out: every line counted is on disk
    except OSError as e:  # the last buffered lines could not be written
        error = e
    except BaseException:
        rec.discard()
        raise
    err = error or (sink.error if sink is not None else None)
    lines = sink.recorder.lines if sink is not None else 0
    if err is not None:
        kept = rec.salvage()  # only the complete lines that reached the disk
        cls = StorageFullError if err.errno == errno.ENOSPC else BadInputError
        said = (f"{out} keeps its first {kept} of the {lines} lines recorded (its header and {kept - 1} samples), "
                "a recording that replays" if kept > 1
                else f"{out} keeps only its header, no sample" if kept == 1
                else f"nothing of it was kept: none of its {lines} lines reached the disk whole")
        raise cls(f"The recording {out} could not be written: {err.strerror or err}; {said}.",
                  hint="Free some space or choose another --out.")
    console_err.print(escape(f"wrote {lines} lines to {out}"))


def register(app: typer.Typer) -> None:
    app.command("agent")(agent_command)
    app.command("record")(record_command)
