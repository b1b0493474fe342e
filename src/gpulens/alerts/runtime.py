"""AlertRuntime: what the agent and `gpulens replay` call every evaluation interval.

    rt = AlertRuntime(store, learn_seconds=7 * 86400, rules_file=None, notify=["log"])
    rt.evaluate(now)   # after the store was flushed; reads the store, returns the alerts
    rt.close()

Learned rules use windows and `for` durations no longer than the learning period (a band learned
from 30 seconds of data cannot support a 2-minute window); with the default 7-day learning the
rules run as written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpulens.alerts.baseline import BandSpec, BaselineConfig, Baselines
from gpulens.alerts.engine import AlertEngine, AlertState, RuleResult
from gpulens.alerts.evaluate import DEFAULT_LOOKBACK_SECONDS, BandFn, Evaluator
from gpulens.alerts.expr import Node, Selector, band_selectors, cap_ranges, walk
from gpulens.alerts.notify import build_notifier
from gpulens.alerts.rules import PACKS, Rule, RuleSet, load_rules
from gpulens.alerts.source import SeriesRef, StoreSource
from gpulens.alerts.timeline import AlertTimeline
from gpulens.clock import Clock, as_clock
from gpulens.errors import BadInputError, StoreError
from gpulens.store import Store

# The alert the agent raises from memory while its store cannot be written (docs/alerts.md).
STORE_WRITE_FAILING = "GpulensStoreWriteFailing"


@dataclass(frozen=True)
class CompiledRule:
    rule: Rule
    root: Node
    for_seconds: float
    learned: bool = False  # computed once: the property walks the expression
    band_selectors: tuple = ()
    selectors: tuple = ()  # every series selector; empty when the rule reads store events
    reads_events: bool = False


def compile_rule(rule: Rule, learn_seconds: float) -> CompiledRule:
    reads_events = rule.expr.local_only
    if not rule.learned:
        root = rule.expr.root
        return CompiledRule(rule, root, rule.for_seconds, selectors=tuple(walk(root, Selector)), reads_events=reads_events)
    root = cap_ranges(rule.expr.root, learn_seconds)
    return CompiledRule(rule, root, min(rule.for_seconds, learn_seconds / 2), True, tuple(band_selectors(root)),
                        tuple(walk(root, Selector)), reads_events)


class AlertRuntime:
    def __init__(
        self,
        store: Store,
        *,
        learn_seconds: float,
        rules_file: Path | None = None,
        notify: Sequence[str] = (),
        clock: Clock | Callable[[], float] | None = None,
        packs: tuple[str, ...] = PACKS,
        rules: RuleSet | None = None,
        lookback_seconds: float = DEFAULT_LOOKBACK_SECONDS,
        recent_seconds: float | None = None,
    ):
        """`recent_seconds`: read the samples this process wrote in the last that many seconds from
        memory (`store.recent`), so `evaluate` needs no flush first (a live agent, which commits every
        flush interval: give at least twice that). None: every read goes to the store (flush first)."""
        if not learn_seconds > 0:
            raise BadInputError(f"--learn must be above zero, not {learn_seconds!r} seconds.", hint="Give e.g. --learn 7d, or 30s for a demo.")
        self.store = store
        self.clock = as_clock(clock)  # the real clock by default
        self.learn_seconds = float(learn_seconds)
        self.rules = rules if rules is not None else load_rules(rules_file, packs=packs)
        self.compiled = [compile_rule(r, self.learn_seconds) for r in self.rules.rules]
        self.feed = store.keep_recent(recent_seconds) if recent_seconds is not None and not store.readonly else None
        self.source = StoreSource(store, self.feed)
        self.evaluator = Evaluator(self.source, lookback_seconds)
        self.baselines = Baselines(store, self.source, BaselineConfig(learn_seconds=self.learn_seconds, band=self.rules.band))
        self.notifier = build_notifier(list(notify), store=None if store.readonly else store)
        self.engine = AlertEngine(store, self.notifier.send)
        self.timeline = AlertTimeline(self.clock)  # alert times and durations, monotonic under clock steps
        self._behind: Evaluator | None = None  # reads the rules at the alert time while the clock is set back
        # Rules that answered nothing while none of their selectors matched a series: with no data to
        # read they answer nothing again (a GPU node has no training or serving series), so they wait
        # until one of their series appears.
        self._empty_without_series: set[int] = set()
        self._unread_at: dict[int, tuple[int, bool]] = {}  # rule index -> (source generation, unread)
        self.evaluations = 0

    @property
    def reads_unflushed(self) -> bool:
        """Whether `evaluate` sees what the store buffered, so the loop need not flush before it."""
        return self.feed is not None

    def _band_fn(self, spec: BandSpec) -> BandFn:
        def band(ref: SeriesRef, t: float, upper: bool, q: float | None) -> float | None:
            return self.baselines.band(ref, t, upper, q, spec)

        return band

    def evaluate(self, now: float | None = None) -> list[AlertState]:
        """Evaluate every rule at `now` (unix seconds; the clock's time by default). Returns the pending
        and firing alerts, and those that resolved at this evaluation."""
        now = self.clock() if now is None else now
        at = self.timeline.at(now)
        self.source.refresh()
        for c in self.compiled:
            for sel in c.band_selectors:
                self.baselines.track(self.source.series(sel))
        self.baselines.update(at.t, self._held_series())
        if at.behind:
            if self._behind is None:  # windows of its own, so that both readings' windows stay incremental
                self._behind = Evaluator(StoreSource(self.store, self.feed), self.evaluator.lookback_seconds)
            self._behind.source.refresh()
        results = [RuleResult(c.rule, c.for_seconds, self._vector_unless_unread(i, c, now, at.t if at.behind else None))
                   for i, c in enumerate(self.compiled)]
        pending_events = self.store.pending_count
        out = self.engine.step(at.t, results, duration_clock=at.duration_clock)
        if self.store.pending_count > pending_events and self.store.write_error is None:
            try:
                self.store.flush()  # alert events: visible to other readers right away
            except StoreError:
                pass  # buffered; the sampling loop retries and raises GpulensStoreWriteFailing
        self.evaluations += 1
        return out

    def _vector_unless_unread(self, i: int, c: CompiledRule, now: float, also_at: float | None) -> dict:
        unread = self._unread(i, c)
        if unread and i in self._empty_without_series:
            return {}
        vector = self._vector(c, now, also_at)
        if unread and not vector:
            self._empty_without_series.add(i)
        elif not unread:
            self._empty_without_series.discard(i)
        return vector

    def _unread(self, i: int, c: CompiledRule) -> bool:
        """Whether none of the rule's selectors matches a series (it reads no events): known until the
        source finds new series."""
        gen = self.source.generation
        known = self._unread_at.get(i)
        if known is None or known[0] != gen:
            unread = not c.reads_events and bool(c.selectors) and not any(self.source.series(sel) for sel in c.selectors)
            known = self._unread_at[i] = (gen, unread)
        return known[1]

    def _vector(self, c: CompiledRule, now: float, also_at: float | None) -> dict:
        """The rule's answer at `now`; with `also_at` (the wall clock was set back behind the alert
        time) the union with its answer there, so that what was true before the step still holds
        while the clock is behind, and what the samples stamped since say counts too."""
        band = self._band_fn(c.rule.band)
        vector = self.evaluator.vector(c.root, now, band)
        if also_at is None:
            return vector
        assert self._behind is not None
        return {**self._behind.vector(c.root, also_at, band), **vector}

    def _held_series(self) -> set[int]:
        """Series with an active learned alert: their baselines are not refreshed mid-incident."""
        learned = {c.rule.name for c in self.compiled if c.learned}
        keys = {
            tuple(sorted((k, v) for k, v in a.labels.items() if k not in ("alertname", "severity")))
            for a in self.engine.active.values() if a.rule in learned
        }
        if not keys:
            return set()
        out = set()
        for refs in (self.source.series(sel) for c in self.compiled for sel in c.band_selectors):
            out |= {r.id for r in refs if r.key in keys}
        return out

    def store_health(self, writable: bool, message: str, now: float) -> None:
        """The store's writes started failing (or work again): page about it from memory, since the
        rules and the alert history cannot be written while it lasts."""
        a = AlertState(
            rule=STORE_WRITE_FAILING, severity="critical", labels={"alertname": STORE_WRITE_FAILING, "severity": "critical"},
            state="resolved" if writable else "firing", active_since=now, value=0.0 if writable else 1.0,
            summary="The store can be written again; buffered samples were written." if writable else message,
            advice="Free space on the store's disk (or lower retention), or move --store; samples are buffered in memory meanwhile.",
            fired_at=None if writable else now, resolved_at=now if writable else None,
        )
        a.fingerprint = f"gpulens-internal:{STORE_WRITE_FAILING}"
        self.notifier.send([a])

    def close(self) -> None:
        self.notifier.close()
