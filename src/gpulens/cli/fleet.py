"""The options `diagnose`, `report`, `energy` and `scale` share for reading a fleet's Prometheus instead of a
store (--prometheus, --match, --start / --end / --window, --job, --service): parsed and checked once,
so the commands say the same sentence for the same mistake (exit 2; an unreachable server exit 3)."""

from __future__ import annotations

from typing import Any

import typer

from gpulens.errors import BadInputError, shown
from gpulens.vocab.gpu import GPU_UP
from gpulens.vocab.names import INFER_LATENCY_SECONDS, TRAIN_JOB_LABEL, TRAIN_STEP_SECONDS

DEFAULT_PROMETHEUS_WINDOW = "1h"
PROMETHEUS_HELP = ("Read a fleet's Prometheus (or Thanos, Mimir, VictoriaMetrics) at this URL instead of a store: "
                   "every node --match selects, as one.")
MATCH_HELP = 'With --prometheus: a label selector every series must match, e.g. \'{cluster="a"}\'. Default: every series.'
WINDOW_HELP = f"With --prometheus and no --start: how far back from the end, e.g. 30m, 6h. Default: {DEFAULT_PROMETHEUS_WINDOW}."


def prometheus_option() -> Any:
    return typer.Option(None, "--prometheus", help=PROMETHEUS_HELP)


def match_option() -> Any:
    return typer.Option("", "--match", help=MATCH_HELP)


def window_option() -> Any:
    return typer.Option(None, "--window", help=WINDOW_HELP)


def time_window(start: str | None, end: str | None, window: str | None, prometheus: str | None,
                flag: str = "--window") -> tuple[float | None, float | None]:
    """--start / --end as unix seconds; over Prometheus, a missing start is --window (`flag`: the
    option's name where a command's --window means something else) before the end."""
    from gpulens.units import parse_duration
    from gpulens.vocab.time import parse_time

    if window and not prometheus:
        raise BadInputError(f"{flag} is the span read from a Prometheus server: it needs --prometheus URL.", hint="Use --start and --end with a store.")
    if window and start:
        raise BadInputError(f"Give --start or {flag}, not both.", hint=f"{flag} counts back from --end (default now).")
    start_t = parse_time(start, "start") if start else None
    end_t = parse_time(end, "end") if end else None
    if start_t is not None and end_t is not None and end_t <= start_t:
        raise BadInputError(f"--end {end} is not after --start {start}.", hint="Give the window's start first, then a later end.")
    if prometheus and start_t is None:
        import time

        end_t = end_t if end_t is not None else time.time()
        start_t = end_t - parse_duration(window or DEFAULT_PROMETHEUS_WINDOW, what=flag)
    return start_t, end_t


def refuse_match_without_prometheus(match: str, prometheus: str | None) -> None:
    if match and not prometheus:
        raise BadInputError("--match selects series in a Prometheus server: it needs --prometheus URL.", hint="Add --prometheus, or leave out --match.")


def refuse_store_with_prometheus(prometheus: str | None, ctx: Any) -> None:
    """--store typed beside --prometheus: one source at a time, as the dashboard says, rather than
    the store silently ignored. A store set once in GPULENS_STORE (or left at its default) is fine.
    `ctx` is the command's click context (the command runs off click's thread, so it is passed)."""
    source = ctx.get_parameter_source("store") if ctx is not None else None
    if prometheus and source is not None and source.name == "COMMANDLINE":  # by name: typer's click may be its own copy
        raise BadInputError("Give --store or --prometheus, not both.",
                            hint="--prometheus reads the fleet's Prometheus; --store reads one node's store.")


def open_prometheus(url: str, match: str, start: float | None, end: float | None, job: str | None, service: str | None) -> Any:
    """The analysis reader of the fleet, checked: the server answers, the selection holds data, and
    --job / --service name a job and a service that are there."""
    from gpulens.reader.prometheus import PrometheusAnalysisReader

    reader = PrometheusAnalysisReader(url, match=match, start=start, end=end)
    reader.check()  # one sentence, exit 3, when the server is not there
    if not reader.series_labels(GPU_UP) and not reader.series_labels(TRAIN_STEP_SECONDS) and not reader.series_labels(INFER_LATENCY_SECONDS):
        raise BadInputError(f"{reader.description} holds no GPU series, training steps or requests in the window.",
                            hint="Check --match and the window (--start, --end, --window), and that Prometheus scrapes the agents.")
    for option, value, metric, label in (("--job", job, TRAIN_STEP_SECONDS, TRAIN_JOB_LABEL), ("--service", service, INFER_LATENCY_SECONDS, "service")):
        if value and not reader.series_labels(metric, {label: value}):
            have = ", ".join(sorted({s.get(label, "") for s in reader.series_labels(metric)} - {""})) or "none"
            raise BadInputError(f"{reader.description} has no series of {option} {shown(value)} in the window (there: {have}).",
                                hint=f"Check the spelling and the window, or leave out {option}.")
    return reader
