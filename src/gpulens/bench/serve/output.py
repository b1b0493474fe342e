"""Where a load run's results go besides the screen: a CSV of every request and a run in the store
(`gpulens.runs`), so `gpulens compare` can test the next run against this one."""

from __future__ import annotations

import csv
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gpulens.bench.serve.api import SweepResult
from gpulens.bench.serve.runner import LoadSpec
from gpulens.bench.serve.summary import LoadResult
from gpulens.errors import BadInputError
from gpulens.files import atomic_writer
from gpulens.http_client import redact_url
from gpulens.store import Store

RUN_KIND = "bench-serve"
CSV_COLUMNS = (
    "index", "worker", "intended_s", "sent_s", "first_token_s", "end_s", "latency_s", "send_lag_s", "ttft_s",
    "tpot_s", "itl_mean_s", "output_tokens", "status", "http_status", "error", "input_tokens",
    "planned_output_tokens",
)


def _r(v: float | None) -> str:
    return "" if v is None else f"{v:.6f}"


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(v: object) -> object:
    """A cell a spreadsheet shows as text: a string that would start a formula (an error message or
    a server's text, say) gets a leading apostrophe (OWASP's CSV-injection advice); numbers stay."""
    if isinstance(v, str) and v.startswith(_FORMULA_START):
        try:
            float(v)
            return v  # a negative number written as text is a number, not a formula
        except ValueError:
            return "'" + v
    return v


def _write_rows(path: str | Path, header: tuple[str, ...], rows) -> int:  # noqa: ANN001
    path = Path(path)
    n = 0
    hint = "Free some space or choose a --csv path in a folder you can write to."
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadInputError(f"Cannot create the folder of the CSV {path}: {e.strerror}.", hint=hint) from None
    with atomic_writer(path, what="the CSV", hint=hint, newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        for row in rows:
            w.writerow([csv_cell(c) for c in row])
            n += 1
    return n


def write_csv(result: LoadResult, path: str | Path) -> int:
    """One row per request, times in seconds from the run's start. Returns the rows written."""
    def rows():
        for rec in result.records:
            lag = None if rec.sent is None else rec.sent - rec.intended
            yield [
                rec.index, rec.worker, _r(rec.intended), _r(rec.sent), _r(rec.first_token), _r(rec.end),
                _r(rec.latency), _r(lag), _r(rec.ttft), _r(rec.tpot), _r(rec.itl_mean),
                "" if rec.output_tokens is None else rec.output_tokens, rec.status,
                "" if rec.http_status is None else rec.http_status, rec.error or "",
                "" if rec.input_tokens is None else rec.input_tokens,
                "" if rec.planned_output_tokens is None else rec.planned_output_tokens,
            ]

    return _write_rows(path, CSV_COLUMNS, rows())


SWEEP_CSV_COLUMNS = (
    "probe", "value", "passed", "failed_slos", "achieved_rate_per_second", "goodput_per_second", "ok", "error",
    "timeout", "rejected", "error_ratio", "latency_p50_s", "latency_p99_s", "ttft_p99_s", "client_bound",
    "best", "limit_found",
)


def write_sweep_csv(result: SweepResult, path: str | Path) -> int:
    """One row per probe, in the order they ran. `best` and `limit_found` repeat on every row, so
    a reader of any row knows whether `best` is the capacity or only a lower bound of it."""
    best = "" if result.best is None else f"{result.best:g}"

    def rows():
        for i, p in enumerate(result.probes):
            s, q = p.result.summary, p.result.summary.requests
            yield [
                i, f"{p.value:g}", str(p.passed).lower(), ";".join(p.failed_slos), _r(s.achieved_rate),
                _r(s.goodput), q.ok, q.error, q.timeout, q.rejected, _r(s.error_ratio),
                _r(s.latency.p50 if s.latency else None), _r(s.latency.p99 if s.latency else None),
                _r(s.ttft.p99 if s.ttft else None), str(s.client_bound).lower(), best, str(result.limit_found).lower(),
            ]

    return _write_rows(path, SWEEP_CSV_COLUMNS, rows())


def run_name(url: str) -> str:
    """Runs of the same endpoint share a name, so each is compared with the one before."""
    p = urlsplit(url)
    return f"{p.hostname}:{p.port or (443 if p.scheme == 'https' else 80)}{p.path or '/'}"


def spec_config(spec: LoadSpec, slos: list[str] | None = None) -> dict[str, Any]:
    # The workload's bodies and the replayed times can be large: the store keeps their shape.
    d = {f.name: getattr(spec, f.name) for f in fields(spec) if f.name not in ("target", "workload", "arrivals")}
    d["workload"] = spec.workload.describe() if spec.workload is not None else None
    d["arrivals"] = None if spec.arrivals is None else {"requests": len(spec.arrivals),
                                                        "span_seconds": spec.arrivals[-1] - spec.arrivals[0]}
    target = asdict(spec.target)
    target.pop("body", None)  # prompts can be large; the shape of the load is what matters
    target["headers"] = sorted(target.get("headers", {}))  # names only: values may be secrets
    target["url"] = redact_url(target["url"])  # userinfo and a ?token= are secrets too
    return {**d, "target": target, "slos": list(slos or [])}


def save_result(store: Store, spec: LoadSpec, result: LoadResult, slos: list[str] | None = None,
                extra_summary: dict[str, Any] | None = None) -> int:
    """Store the run (config, summary, per-request samples) and return its id."""
    from gpulens.runs import save_run

    s = result.summary
    samples: dict[str, list[float]] = {"latency_seconds": [], "ttft_seconds": [], "tpot_seconds": []}
    for rec in result.records:
        if rec.status in ("ok", "timeout") and rec.latency is not None:
            samples["latency_seconds"].append(rec.latency)
        if rec.status == "ok" and rec.ttft is not None:
            samples["ttft_seconds"].append(rec.ttft)
        if rec.status == "ok" and rec.tpot is not None:
            samples["tpot_seconds"].append(rec.tpot)
    samples = {k: v for k, v in samples.items() if v}
    summary = {**s.to_dict(), **(extra_summary or {})}
    return save_run(
        store, RUN_KIND, run_name(spec.target.url), spec_config(spec, slos), summary, samples,
        started=result.wall_start_unix, ended=result.wall_start_unix + s.duration_seconds,
    )
