"""Scrape a serving engine's `/metrics` (vLLM, TGI, Triton) at an interval into the inference series.

Gauges are copied; request counters become `infer_requests_total{status}`; histograms become
quantile series (`quantile` label 0.5 / 0.9 / 0.95 / 0.99 / mean) computed from the bucket counts
observed *between* two scrapes, so a percentile describes that interval, never the process's whole
life. The first scrape covers everything since the engine started. Series carry service, model,
host and `source` (the engine).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from gpulens.errors import BadInputError, GpulensError
from gpulens.store import Store
from gpulens.workload import names as N
from gpulens.workload.inference.engines import ENGINES, EngineMap
from gpulens.workload.inference.histogram import Buckets

log = logging.getLogger(__name__)

QUANTILES = (0.5, 0.9, 0.95, 0.99)
Samples = dict[str, list[tuple[dict[str, str], float]]]


class ScrapeUnavailableError(GpulensError):
    exit_code = 3


def parse_exposition(text: str) -> Samples:
    """Prometheus text exposition -> {sample name: [(labels, value)]}."""
    from prometheus_client.parser import text_string_to_metric_families

    out: Samples = {}
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    except ValueError as e:
        raise BadInputError(f"The /metrics text cannot be parsed: {e}.", hint="Point --url at a Prometheus /metrics endpoint.") from None
    return out


def detect_engine(samples: Samples) -> EngineMap:
    for engine in ENGINES.values():
        if any(name.startswith(engine.prefix) for name in samples):
            return engine
    raise BadInputError("No vLLM, TGI or Triton metrics found in the scraped text.",
                        hint="Point the scraper at the engine's metrics endpoint (vLLM :8000/metrics, TGI :80/metrics, Triton :8002/metrics).")


@dataclass
class ScrapeResult:
    t: float
    engine: str
    values_written: int
    models: list[str]


class EngineScraper:
    """Reads one engine's metrics endpoint into a store. `scrape_once` for one reading, `run` for a loop."""

    def __init__(self, url: str, store: Store, *, service: str, model: str = "", host: str | None = None,
                 engine: str = "auto", timeout_seconds: float = 5.0, clock: Callable[[], float] = time.time):
        if engine != "auto" and engine not in ENGINES:
            raise BadInputError(f"Unknown engine {engine!r}.", hint=f"Use auto or one of {', '.join(ENGINES)}.")
        self.url, self.store, self.clock, self.timeout = url, store, clock, timeout_seconds
        self.engine = None if engine == "auto" else ENGINES[engine]
        self.base = {"service": service, "host": host or socket.gethostname()}
        self.default_model = model
        self._hist_prev: dict[tuple[str, str], Buckets] = {}  # the engine's cumulative histograms, last scrape
        self._ctr_prev: dict[tuple[str, str], float] = {}
        self.errors = 0

    def fetch(self) -> str:
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout) as r:  # noqa: S310 (the user's URL)
                return r.read().decode("utf-8", errors="replace")
        except urllib.error.HTTPError as e:
            raise ScrapeUnavailableError(f"{self.url} answered HTTP {e.code}.", hint="Check the metrics path (usually /metrics).") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise ScrapeUnavailableError(f"Cannot scrape {self.url}: {reason}.", hint="Check that the engine runs and exposes its metrics port.") from None

    def scrape_once(self, text: str | None = None) -> ScrapeResult:
        t = self.clock()
        samples = parse_exposition(self.fetch() if text is None else text)
        engine = self.engine or detect_engine(samples)
        self.engine = engine
        written = 0
        models: set[str] = set()

        def w(name: str, model: str, value: float | None, **extra: str) -> None:
            nonlocal written
            if value is None or value != value:
                return
            models.add(model)
            self.store.write(name, {**self.base, "model": model, "source": engine.name, **extra}, t, value)
            written += 1

        for sources, dest, scale in engine.gauges:
            for model, value in self._sum_by_model(samples, _first(samples, sources), engine).items():
                w(dest, model, value * scale)
        for src, status in engine.status_counters:
            for model, value in self._sum_by_model(samples, src, engine).items():
                w(N.INFER_REQUESTS_TOTAL, model, value, status=status)
        for sources, dest in engine.histograms:
            base = _first(samples, tuple(s + "_bucket" for s in sources))
            if base is None:
                continue
            for model, cur in self._histograms(samples, base.removesuffix("_bucket"), engine).items():
                key = (dest, model)
                delta = cur.minus(self._hist_prev.get(key))
                self._hist_prev[key] = cur
                if delta.total <= 0:
                    continue
                for q in QUANTILES:
                    w(dest, model, delta.quantile(q), quantile=f"{q:g}")
                w(dest, model, delta.mean, quantile="mean")
        for src, count_srcs, scale, dest in engine.mean_of_counters:
            sums = self._sum_by_model(samples, src, engine)
            counts: dict[str, float] = {}
            for c in count_srcs:
                for model, v in self._sum_by_model(samples, c, engine).items():
                    counts[model] = counts.get(model, 0.0) + v
            for model, total in sums.items():
                prev_s = self._ctr_prev.get((src, model))
                prev_c = self._ctr_prev.get((src + "#count", model))
                self._ctr_prev[(src, model)], self._ctr_prev[(src + "#count", model)] = total, counts.get(model, 0.0)
                ds, dc = total - (prev_s or 0.0), counts.get(model, 0.0) - (prev_c or 0.0)
                if ds < 0 or dc < 0:  # restarted: everything counted is new
                    ds, dc = total, counts.get(model, 0.0)
                if dc > 0:
                    w(dest, model, ds / dc * scale, quantile="mean")
        self.store.flush()
        return ScrapeResult(t, engine.name, written, sorted(models))

    def histograms(self) -> list[tuple[str, dict[str, str], Buckets]]:
        """The engine's own cumulative histograms at the last scrape, under gpulens's names, for the
        exporter to pass through (so `histogram_quantile` works on the engine's buckets)."""
        engine = self.engine.name if self.engine else ""
        return [(dest, {**self.base, "model": model, "source": engine}, b) for (dest, model), b in sorted(self._hist_prev.items())]

    def scrape_safely(self) -> None:
        """One scrape in the agent's loop: a failure is counted and logged (first and every 100th)."""
        try:
            self.scrape_once()
        except GpulensError as e:
            self.errors += 1
            if self.errors == 1 or self.errors % 100 == 0:
                log.warning("scrape of %s failed (%d so far): %s", self.url, self.errors, e)

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

    def _sum_by_model(self, samples: Samples, name: str | None, engine: EngineMap) -> dict[str, float]:
        out: dict[str, float] = {}
        # prometheus_client's parser names a counter's sample `<name>_total` even where the engine
        # wrote it without the suffix (TGI, Triton), so look for both spellings
        rows = (samples.get(name) or samples.get(name + "_total") or []) if name else []
        for labels, value in rows:
            m = self._model(labels, engine)
            out[m] = out.get(m, 0.0) + value
        return out

    def _histograms(self, samples: Samples, base: str, engine: EngineMap) -> dict[str, Buckets]:
        """One merged histogram per model (label sets such as engine="0"/"1" summed)."""
        per_set: dict[tuple[tuple[str, str], ...], dict] = {}
        for labels, value in samples.get(base + "_bucket", []):
            le = labels.pop("le", None)
            if le is None:
                continue
            key = tuple(sorted(labels.items()))
            per_set.setdefault(key, {"pairs": [], "sum": 0.0, "count": None})["pairs"].append((float(le), value))
        for suffix in ("_sum", "_count"):
            for labels, value in samples.get(base + suffix, []):
                key = tuple(sorted(labels.items()))
                if key in per_set:
                    per_set[key]["sum" if suffix == "_sum" else "count"] = value
        out: dict[str, Buckets] = {}
        for key, d in per_set.items():
            b = Buckets.from_pairs(d["pairs"], d["sum"], d["count"])
            m = self._model(dict(key), engine)
            try:
                out[m] = out[m].plus(b) if m in out else b
            except ValueError:
                continue  # differing buckets across label sets: keep the first
        return out


def _first(samples: Samples, names: tuple[str, ...]) -> str | None:
    return next((n for n in names if n in samples), None)
