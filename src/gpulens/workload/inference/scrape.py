"""Scrape a serving engine's `/metrics` (vLLM, SGLang, TensorRT-LLM, TGI, Triton) at an interval into
the inference series.

Gauges and token counters are copied; request counters become `infer_requests_total{status}` with
each engine's finish reasons mapped to ok / error / rejected / aborted / timeout; histograms become
quantile series (`quantile` label 0.5 / 0.9 / 0.95 / 0.99 / mean) computed from the bucket counts
observed *between* two scrapes, so a percentile describes that interval, never the process's whole
life. The first scrape covers everything since the engine started. Series carry service, model,
host and `source` (the engine).

A scrape is bounded (issue 27): its answer within `timeout_seconds` (the whole answer, however slowly
it trickles) and `MAX_SCRAPE_BYTES`, its text at `MAX_SCRAPE_SAMPLES` sample lines (counted before
the costly parse), and what it writes at `MAX_SCRAPE_SERIES` series; a scrape past a bound is
refused whole (nothing written), counted in `refused` by cause and logged once per cause. `stop()`
cuts a scrape under way (the agent's stop, SIGTERM, --duration).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from gpulens import http_client
from gpulens.errors import BadInputError, GpulensError, UnavailableError
from gpulens.k8s.node import node_host
from gpulens.store import Store
from gpulens.vocab import names as N
from gpulens.workload.inference.engines import ENGINES, EngineMap
from gpulens.workload.inference.histogram import Buckets

log = logging.getLogger(__name__)

QUANTILES = (0.5, 0.9, 0.95, 0.99)
Samples = dict[str, list[tuple[dict[str, str], float]]]
# The bounds of one scrape (an engine serving a few models answers ~100 KiB, ~500 samples per model):
MAX_SCRAPE_BYTES = 4 * 2**20  # the answer's body; beyond, the scrape is refused unread
MAX_SCRAPE_SAMPLES = 10_000  # sample lines in it (parsing costs ~10-40 us a line, in the sampling loop)
MAX_SCRAPE_SERIES = 2_000  # series one scrape writes (one model is ~50)


class ScrapeUnavailableError(UnavailableError):
    """An engine's metrics endpoint cannot be reached or answers something other than 2xx."""


class ScrapeRefusedError(ScrapeUnavailableError):
    """An engine's answer is past one of a scrape's bounds; `cause` names which."""

    def __init__(self, message: str, *, cause: str, hint: str):
        super().__init__(message, hint=hint)
        self.cause = cause


def parse_exposition(text: str) -> Samples:
    """Prometheus text exposition -> {sample name: [(labels, value)]}."""
    from prometheus_client.parser import text_string_to_metric_families

    out: Samples = {}
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    except ValueError as e:
        raise BadInputError(f"The /metrics text cannot be parsed: {e}.", hint="Point --scrape at a serving engine's Prometheus /metrics endpoint.") from None
    return out


def detect_engine(samples: Samples) -> EngineMap:
    for engine in ENGINES.values():
        if any(name.startswith(engine.prefix) for name in samples):
            return engine
    raise BadInputError("No vLLM, SGLang, TensorRT-LLM, TGI or Triton metrics found in the scraped text.",
                        hint="Point the scraper at the engine's metrics endpoint (vLLM :8000/metrics, SGLang :30000/metrics, "
                             "TGI :80/metrics, Triton :8002/metrics).")


@dataclass
class ScrapeResult:
    t: float
    engine: str
    values_written: int
    models: list[str]


class EngineScraper:
    """Reads one engine's metrics endpoint into a store. `scrape_once` for one reading, `run` for a loop."""

    def __init__(self, url: str, store: Store, *, service: str, model: str = "", host: str | None = None,
                 engine: str = "auto", timeout_seconds: float = 5.0, clock: Callable[[], float] = time.time,
                 max_bytes: int = MAX_SCRAPE_BYTES, max_samples: int = MAX_SCRAPE_SAMPLES, max_series: int = MAX_SCRAPE_SERIES):
        if engine != "auto" and engine not in ENGINES:
            raise BadInputError(f"Unknown engine {engine!r}.", hint=f"Use auto or one of {', '.join(ENGINES)}.")
        self.url, self.store, self.clock, self.timeout = url, store, clock, timeout_seconds
        self.engine = None if engine == "auto" else ENGINES[engine]
        self.base = {"service": service, "host": node_host(host)}
        self.default_model = model
        self._hist_prev: dict[tuple[str, str], Buckets] = {}  # the engine's cumulative histograms, last scrape
        self._ctr_prev: dict[tuple[str, str], tuple[float, float]] = {}  # a ratio's (numerator, denominator), last scrape
        self.errors = 0
        self.max_bytes, self.max_samples, self.max_series = max_bytes, max_samples, max_series
        self.refused: Counter[str] = Counter()  # scrapes refused past a bound, by cause
        self._cancel = http_client.Cancel()

    def stop(self) -> None:
        """Cut a scrape under way, and fail any later one at once (the agent is stopping)."""
        self._cancel.set()

    def fetch(self) -> str:
        try:
            r = http_client.get(self.url, timeout_seconds=self.timeout, max_bytes=self.max_bytes, cancel=self._cancel)
        except http_client.HttpUnavailableError as e:
            if not e.retryable:  # the body is past max_bytes
                raise ScrapeRefusedError(f"The scrape of {http_client.redact_url(self.url)} was refused: its answer is larger than {self.max_bytes} bytes.",
                                         cause="body too large", hint="Point --scrape at one engine's /metrics.") from None
            raise ScrapeUnavailableError(f"Cannot scrape {http_client.redact_url(self.url)}: {e.reason}.", hint="Check that the engine runs and exposes its metrics port.") from None
        if not r.ok:
            raise ScrapeUnavailableError(f"{http_client.redact_url(self.url)} answered HTTP {r.status}.", hint="Check the metrics path (usually /metrics).")
        return r.text()

    def scrape_once(self, text: str | None = None) -> ScrapeResult:
        t = self.clock()
        text = self.fetch() if text is None else text
        lines = _sample_lines(text)
        if lines > self.max_samples:
            raise ScrapeRefusedError(f"The scrape of {http_client.redact_url(self.url)} was refused: its answer has {lines} samples, more than {self.max_samples}.",
                                     cause="too many samples", hint="Point --scrape at one engine's /metrics.")
        samples = parse_exposition(text)
        engine = self.engine or detect_engine(samples)
        self.engine = engine
        return self.write_samples(samples, t, engine)

    def write_samples(self, samples: Samples, t: float, engine: EngineMap, *, source: str | None = None,
                      flush: bool = True) -> ScrapeResult:
        """Write one reading's samples through `engine`'s mapping, as of `t`. The one write path
        for engine series: a live scrape and a recording's `engine_stats` records both come here.
        `source` labels the series (the engine's name by default)."""
        models: set[str] = set()
        label_source = source or engine.name
        pending: list[tuple[str, dict[str, str], float]] = []  # written once the whole reading is within bounds
        remembered = dict(self._hist_prev), dict(self._ctr_prev)

        def w(name: str, model: str, value: float | None, **extra: str) -> None:
            if value is None or value != value:
                return
            models.add(model)
            pending.append((name, {**self.base, "model": model, "source": label_source, **extra}, value))

        for g in engine.gauges:
            rows = [(lb, v) for lb, v in self._rows(samples, _first(samples, g.sources))
                    if all(lb.get(k) == want for k, want in g.where)]
            for model, value in self._merge(rows, engine, g.merge).items():
                w(g.dest, model, value * g.scale)
        for c in engine.counters:
            for model, value in self._sum_by_model(samples, _first(samples, c.sources), engine).items():
                w(c.dest, model, value)
        for model, by_status in self._outcomes(samples, engine).items():
            for status, value in sorted(by_status.items()):
                w(N.INFER_REQUESTS_TOTAL, model, value, status=status)
        for h in engine.histograms:
            base = _first(samples, tuple(s + "_bucket" for s in h.sources))
            if base is None:
                continue
            for model, cur in self._histograms(samples, base.removesuffix("_bucket"), engine, h.scale).items():
                key = (h.dest, model)
                delta = cur.minus(self._hist_prev.get(key))
                self._hist_prev[key] = cur
                if delta.total <= 0:
                    continue
                for q in QUANTILES:
                    w(h.dest, model, delta.quantile(q), quantile=f"{q:g}")
                w(h.dest, model, delta.mean, quantile="mean")
        for r in engine.ratios:
            num = _first(samples, r.numerator)
            if num is None:
                continue
            nums = self._sum_by_model(samples, num, engine)
            dens: dict[str, float] = {}
            for d in r.denominators:
                for model, v in self._sum_by_model(samples, d, engine).items():
                    dens[model] = dens.get(model, 0.0) + v
            for model, total in nums.items():
                count = dens.get(model, 0.0)
                prev = self._ctr_prev.get((r.dest, model))
                self._ctr_prev[(r.dest, model)] = (total, count)
                dn, dd = (total - prev[0], count - prev[1]) if prev else (total, count)
                if dn < 0 or dd < 0:  # restarted: everything counted is new
                    dn, dd = total, count
                if dd > 0:
                    if r.as_mean:
                        w(r.dest, model, dn / dd * r.scale, quantile="mean")
                    else:
                        w(r.dest, model, dn / dd * r.scale)
        if len(pending) > self.max_series:
            self._hist_prev, self._ctr_prev = remembered  # a refused reading leaves no trace
            raise ScrapeRefusedError(
                f"The scrape of {http_client.redact_url(self.url) if self.url else label_source} was refused: it would write {len(pending)} series "
                f"({len(models)} models), more than {self.max_series}.",
                cause="too many series", hint="Scrape an engine that serves fewer models, or one engine per --scrape.")
        for name, labels, value in pending:
            self.store.write(name, labels, t, value)
        if flush:
            self.store.flush()
        return ScrapeResult(t, label_source, len(pending), sorted(models))

    def _outcomes(self, samples: Samples, engine: EngineMap) -> dict[str, dict[str, float]]:
        """{model: {status: cumulative requests}} from the engine's request counters."""
        out: dict[str, dict[str, float]] = {}
        for o in engine.outcomes:
            for labels, value in self._rows(samples, o.source):
                by = out.setdefault(self._model(labels, engine), {})
                status = o.status_of(labels)
                by[status] = by.get(status, 0.0) + value
        return out

    def histograms(self) -> list[tuple[str, dict[str, str], Buckets]]:
        """The engine's own cumulative histograms at the last scrape, under gpulens's names, for the
        exporter to pass through (so `histogram_quantile` works on the engine's buckets)."""
        engine = self.engine.name if self.engine else ""
        return [(dest, {**self.base, "model": model, "source": engine}, b) for (dest, model), b in sorted(self._hist_prev.items())]

    def scrape_safely(self) -> None:
        """One scrape in the agent's loop: a failure is counted and logged (first and every 100th); a
        refusal is counted by cause and logged once per cause."""
        try:
            self.scrape_once()
        except ScrapeRefusedError as e:
            self.refused[e.cause] += 1
            if self.refused[e.cause] == 1:
                log.warning("%s (logged once; counted in gpulens_scrape_refused_total)", e.message)
        except GpulensError as e:
            if self._cancel.is_set():
                return  # stopping: a cut scrape is not news
            self.errors += 1
            if self.errors == 1 or self.errors % 100 == 0:
                log.warning("scrape of %s failed (%d so far): %s", http_client.redact_url(self.url), self.errors, e)

    def run(self, interval_seconds: float = 5.0, stop: threading.Event | None = None, iterations: int | None = None) -> int:
        """Scrape every `interval_seconds` until `stop` is set (or `iterations` scrapes). The first
        failure raises (a wrong URL should fail at once); later ones are logged and retried."""
        stop = stop or threading.Event()
        n = 0
        self.scrape_once()
        n += 1
        while (iterations is None or n < iterations) and not stop.wait(interval_seconds):
            self.scrape_safely()
            n += 1
        return n

    def start(self, interval_seconds: float = 5.0) -> tuple[threading.Thread, threading.Event]:
        """Scrape in a daemon thread (for the agent): the first scrape happens here, so a wrong URL
        raises at once; set the returned event to stop."""
        self.scrape_once()
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(interval_seconds):
                self.scrape_safely()

        thread = threading.Thread(target=loop, daemon=True, name=f"gpulens-scrape-{self.base['service']}")
        thread.start()
        return thread, stop

    # ------------------------------------------------------------------ grouping
    def _model(self, labels: dict[str, str], engine: EngineMap) -> str:
        if engine.model_label and labels.get(engine.model_label):
            return labels[engine.model_label]
        return self.default_model

    @staticmethod
    def _rows(samples: Samples, name: str | None) -> list[tuple[dict[str, str], float]]:
        # prometheus_client's parser names a counter's sample `<name>_total` even where the engine
        # wrote it without the suffix (TGI, Triton), so look for both spellings
        return (samples.get(name) or samples.get(name + "_total") or []) if name else []

    def _sum_by_model(self, samples: Samples, name: str | None, engine: EngineMap) -> dict[str, float]:
        return self._merge(self._rows(samples, name), engine, "sum")

    def _merge(self, rows: list[tuple[dict[str, str], float]], engine: EngineMap, how: str) -> dict[str, float]:
        """One value per model: label sets (ranks, data-parallel engines) summed, or averaged (ratios)."""
        sums: dict[str, float] = {}
        ns: dict[str, int] = {}
        for labels, value in rows:
            m = self._model(labels, engine)
            sums[m] = sums.get(m, 0.0) + value
            ns[m] = ns.get(m, 0) + 1
        return {m: v / ns[m] for m, v in sums.items()} if how == "mean" else sums

    def _histograms(self, samples: Samples, base: str, engine: EngineMap, scale: float = 1.0) -> dict[str, Buckets]:
        """One merged histogram per model (label sets such as engine="0"/"1" summed)."""
        per_set: dict[tuple[tuple[str, str], ...], dict] = {}
        for labels, value in samples.get(base + "_bucket", []):
            le = labels.pop("le", None)
            if le is None:
                continue
            key = tuple(sorted(labels.items()))
            per_set.setdefault(key, {"pairs": [], "sum": 0.0, "count": None})["pairs"].append((float(le) * scale, value))
        for suffix in ("_sum", "_count"):
            for labels, value in samples.get(base + suffix, []):
                key = tuple(sorted(labels.items()))
                if key in per_set:
                    per_set[key]["sum" if suffix == "_sum" else "count"] = value * scale if suffix == "_sum" else value
        out: dict[str, Buckets] = {}
        for key, d in per_set.items():
            b = Buckets.from_pairs(d["pairs"], d["sum"], d["count"])
            m = self._model(dict(key), engine)
            try:
                out[m] = out[m].plus(b) if m in out else b
            except ValueError:
                continue  # differing buckets across label sets: keep the first
        return out


def _sample_lines(text: str) -> int:
    """Sample lines of an exposition (lines that are neither comments nor blank), without parsing it."""
    return text.count("\n") + 1 - text.count("\n#") - text.startswith("#") - text.count("\n\n") - text.endswith("\n")


def _first(samples: Samples, names: tuple[str, ...]) -> str | None:
    """The first of `names` the scrape has (a counter may be spelt with or without `_total`)."""
    return next((n for n in names if n in samples or n + "_total" in samples), None)
