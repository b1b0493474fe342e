"""The keys of `vllm bench serve`'s result file, computed with its definitions from a run's
per-request records, so scripts and dashboards kept for vLLM's benchmark read gpulens's JSON.

vLLM's definitions (vllm/benchmarks/serve.py, `calculate_metrics`), kept here:
- times count from the request's *actual* send (vLLM starts its clock in the request function),
  not from the intended send that gpulens's own `latency`/`ttft` use; the two differ by the send
  lag, which `send_lag` reports;
- only successful requests count; `completed` = their number, `failed` = the rest;
- TTFT = first streamed content − send; E2EL = end − send;
- TPOT per request = (E2EL − TTFT) / (output tokens − 1), for requests of more than one token:
  the first token is excluded;
- ITL: every gap between streamed chunks, of every request, pooled;
- mean / median / std (population, numpy's default) / percentiles (numpy's linear interpolation), in ms;
- throughputs divide by `duration`: here the run window (first intended send to last end);
- `request_goodput`: successful requests meeting every ttft / tpot / e2el objective, per second
  (None when no --slo is given); a request of one token has TPOT 0 for that check, as in vLLM;
- `max_output_tokens_per_s` / `max_concurrent_requests`: the busiest whole second of output
  tokens, and the most requests active in any one second, over one-second buckets from the first send.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gpulens.bench.serve.client import RequestRecord
from gpulens.vocab.slo import Slo

PERCENTILES = (50.0, 90.0, 95.0, 99.0)
METRICS = ("ttft", "tpot", "itl", "e2el")
_SLO_METRIC = {"ttft": "ttft", "tpot": "tpot", "latency": "e2el"}


def _stats(values: list[float], name: str) -> dict[str, float]:
    v = np.asarray(values or [0.0], dtype=float) * 1000.0
    out = {f"mean_{name}_ms": float(np.mean(v)), f"median_{name}_ms": float(np.median(v)),
           f"std_{name}_ms": float(np.std(v))}
    for p in PERCENTILES:
        word = str(int(p)) if int(p) == p else str(p)
        out[f"p{word}_{name}_ms"] = float(np.percentile(v, p))
    return out


def vllm_load_keys(spec: Any) -> dict[str, Any]:
    """The load asked for, in vLLM's terms: `request_rate` ("inf" for a closed loop, as vLLM writes
    an unbounded rate; a replay's mean rate), `burstiness` (1 Poisson, the gamma shape, "inf" for
    constant spacing; None for a replay) and `max_concurrency` (a closed loop's users)."""
    if spec.arrivals is not None:
        span = spec.arrivals[-1] - spec.arrivals[0]
        return {"request_rate": len(spec.arrivals) / span if span > 0 else "inf", "burstiness": None,
                "max_concurrency": None}
    burst: float | str = {"poisson": 1.0, "gamma": spec.burstiness}.get(spec.arrival, "inf")
    return {"request_rate": spec.rate, "burstiness": burst if spec.rate is not None else 1.0,
            "max_concurrency": spec.concurrency}


def vllm_result(records: list[RequestRecord], duration_seconds: float, *, slos: list[Slo] | None = None,
                request_rate: float | str | None = None, burstiness: float | str | None = None,
                max_concurrency: int | None = None) -> dict[str, Any]:
    ok = [r for r in records if r.status == "ok" and r.sent is not None and r.end is not None]
    ttfts, tpots, all_tpots, itls, e2els = [], [], [], [], []
    for r in ok:
        e2el = r.end - r.sent
        e2els.append(e2el)
        ttft = None if r.first_token is None else r.first_token - r.sent
        if ttft is not None:
            ttfts.append(ttft)
        n = r.output_tokens or 0
        tpot = 0.0
        if n > 1 and ttft is not None:
            tpot = (e2el - ttft) / (n - 1)
            tpots.append(tpot)
        all_tpots.append(tpot)
        itls.extend(r.itls or ())
    total_in = sum(r.input_tokens or 0 for r in ok)
    total_out = sum(r.output_tokens or 0 for r in ok)
    dur = duration_seconds if duration_seconds > 0 else math.inf
    goodput = None
    bounds = {_SLO_METRIC[s.metric]: s.bound for s in (slos or []) if s.metric in _SLO_METRIC}
    if bounds:
        good = 0
        for r, e2el, tpot in zip(ok, e2els, all_tpots, strict=True):
            ttft = None if r.first_token is None else r.first_token - r.sent
            vals = {"ttft": ttft, "tpot": tpot, "e2el": e2el}
            if all(vals[m] is not None and vals[m] <= b for m, b in bounds.items()):
                good += 1
        goodput = good / dur
    peak_tokens, peak_conc = _peaks(ok)
    out: dict[str, Any] = {
        "duration": duration_seconds, "completed": len(ok), "failed": len(records) - len(ok),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(ok) / dur, "request_goodput": goodput,
        "output_throughput": total_out / dur, "total_token_throughput": (total_in + total_out) / dur,
        "max_output_tokens_per_s": peak_tokens, "max_concurrent_requests": peak_conc,
        "request_rate": "inf" if request_rate is None else request_rate,
        "burstiness": burstiness, "max_concurrency": max_concurrency,
        "input_lens": [r.input_tokens or 0 for r in records],
        "output_lens": [(r.output_tokens or 0) if r.status == "ok" else 0 for r in records],
        "ttfts": [(r.first_token - r.sent) if r.first_token is not None and r.sent is not None else 0.0 for r in records],
        "itls": [list(r.itls or ()) for r in records],
        "errors": [r.error or "" for r in records],
    }
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        out.update(_stats(values, name))
    return out


def _peaks(ok: list[RequestRecord]) -> tuple[float, int]:
    if not ok:
        return 0.0, 0
    start = min(r.sent for r in ok)
    end = max(r.end for r in ok)
    n = int(math.ceil(end - start)) + 1
    tokens = np.zeros(n)
    conc = np.zeros(n)
    for r in ok:
        if r.first_token is not None:
            t = r.first_token
            times = [t]
            for gap in r.itls or ():
                t += gap
                times.append(t)
            for x in times:
                b = int(x - start)
                if 0 <= b < n:
                    tokens[b] += 1
        conc[int(r.sent - start): int(r.end - start) + 1] += 1
    return float(tokens.max()), int(conc.max())


PER_REQUEST_KEYS = ("input_lens", "output_lens", "ttfts", "itls", "errors")


def vllm_scalars(records: list[RequestRecord], duration_seconds: float, **kw: Any) -> dict[str, Any]:
    """`vllm_result` without its per-request lists: one sweep probe's figures."""
    return {k: v for k, v in vllm_result(records, duration_seconds, **kw).items() if k not in PER_REQUEST_KEYS}
