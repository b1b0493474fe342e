"""Prometheus alerting rules from gpulens rules, over the metric names the agent's /metrics exports.

What translates and how:
- absolute rules: as written (`increase` keeps gpulens's meaning, see expr.to_promql);
- `severity: xid`: one rule per catalog code with its severity, meaning and action, and one for
  codes outside the catalog (Prometheus cannot look the code up at evaluation time);
- learned rules: one rule per learned series, with the band the store holds now as a constant
  (Prometheus has no baselines); without a store or a ready baseline they are left out;
- rules on store events (`count_events_over_time`): left out, Prometheus never sees events;
- staleness rules (`last_over_time(m[long]) unless last_over_time(m[short])`, e.g. GpuSilent): joined
  with `up == 1` on the target's labels, so a series that vanished pages while its target still
  answers, and a target that is down as a whole is its own alert, not one per series.
Every rule left out is listed, with why, in the file's header. The file ends with the recording
rule groups the caller passes: `gpulens alerts export` passes the scaling signal's
(`gpulens:desired_replicas`, scaling/promql.py; docs/scale.md). They come from the caller because
scaling sits above alerts. Every expression is written by gpulens.promql.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import yaml

from gpulens.alerts.baseline import Baseline, load_baselines
from gpulens.alerts.expr import (
    BAND_FUNCTIONS,
    Call,
    Matcher,
    Node,
    Number,
    Selector,
    band_selectors,
    is_staleness,
    map_nodes,
    to_promql,
)
from gpulens.alerts.rules import Rule, RuleSet
from gpulens.promql import duration, regex_any, target_up
from gpulens.store import Store
from gpulens.vocab.gpu import GPU_XID_TOTAL
from gpulens.vocab.xid import UNKNOWN_XID_SEVERITY, XID_CATALOG

XID_METRIC = GPU_XID_TOTAL


@dataclass(frozen=True)
class RuleGroup:
    """A group of ready Prometheus rules (dicts with `record` or `alert`, `expr`, ...) to append."""

    name: str
    rules: list[dict] = field(default_factory=list)


@dataclass
class PromExport:
    text: str  # the rules file (YAML)
    exported: int  # Prometheus rules written
    skipped: list[tuple[str, str]]  # (gpulens rule, why it was left out)


def _restrict(node: Node, metric: str, extra: tuple[Matcher, ...]) -> Node:
    """Every selector of `metric` gets `extra` matchers."""
    return map_nodes(node, lambda n: n.with_matchers(extra) if isinstance(n, Selector) and n.name == metric else None)


def _prom_rule(
    name: str, expr: str, rule: Rule, severity: str, extra_annotations: dict[str, str] | None = None, series_labels: dict[str, str] | None = None
) -> dict:
    out: dict = {"alert": name, "expr": expr}
    if rule.for_seconds > 0:
        out["for"] = duration(rule.for_seconds)
    # The series' own labels (same values as the alert gets anyway) keep the rules distinct for promtool's lint.
    out["labels"] = {**(series_labels or {}), **rule.labels, "severity": severity, "source": "gpulens"}
    ann = {"summary": rule.summary}
    if rule.advice:
        ann["advice"] = rule.advice
    ann.update(extra_annotations or {})
    out["annotations"] = ann
    return out


def _xid_rules(rule: Rule) -> list[dict]:
    codes = sorted(XID_CATALOG)
    out = []
    for code in codes:
        info = XID_CATALOG[code]
        node = _restrict(rule.expr.root, XID_METRIC, (Matcher("xid", "=", str(code)),))
        out.append(_prom_rule(rule.name, to_promql(node), rule, info.severity, {"meaning": info.meaning, "action": info.action},
                              {"xid": str(code)}))
    other = _restrict(rule.expr.root, XID_METRIC, (Matcher("xid", "!~", regex_any(str(c) for c in codes)),))
    out.append(_prom_rule(rule.name, to_promql(other), rule, UNKNOWN_XID_SEVERITY,
                          {"meaning": "XID not in gpulens's catalog", "action": "Look the code up in NVIDIA's XID catalog."}))
    return out


def _learned_rules(rule: Rule, baselines: list[Baseline], now: float) -> tuple[list[dict], str | None]:
    """One Prometheus rule per learned label set. A band still learning becomes NaN, which no
    comparison passes - the same as the local evaluator's empty band."""
    sels = band_selectors(rule.expr.root)
    metrics = {s.name for s in sels}
    ready: dict[tuple, dict[str, Baseline]] = {}
    for b in baselines:
        if b.name in metrics and b.ready and all(m.matches(b.labels) for s in sels if s.name == b.name for m in s.matchers):
            ready.setdefault(tuple(sorted(b.labels.items())), {})[b.name] = b
    out = []
    for key, by_metric in sorted(ready.items()):

        def band_const(n: Node, by_metric: dict[str, Baseline] = by_metric) -> Node | None:
            if not (isinstance(n, Call) and n.func in BAND_FUNCTIONS):
                return None
            sel = n.args[0]
            assert isinstance(sel, Selector)
            b = by_metric.get(sel.name)
            q = n.args[1].value if len(n.args) > 1 else None  # type: ignore[union-attr]
            # One constant band: the whole-day statistics, not the hour's.
            v = replace(b, profile={}).band(now, n.func == "upper_band", q, rule.band) if b else None
            return Number(round(v, 9) if v is not None and math.isfinite(v) else math.nan)

        node = map_nodes(rule.expr.root, band_const)
        matchers = tuple(Matcher(k, "=", v) for k, v in key)
        node = map_nodes(node, lambda n, m=matchers: n.with_matchers(m) if isinstance(n, Selector) else None)
        learned = ", ".join(sorted(by_metric))
        out.append(_prom_rule(rule.name, to_promql(node), rule, rule.severity, {"baseline": f"bands of {learned} as of export"}, dict(key)))
    if not out:
        return [], "no learned baseline for it in the store yet (export again once it has learned, with --store)"
    return out, None


def export_prometheus(rules: RuleSet, store: Store | None = None, *, now: float | None = None,
                      extra_groups: Sequence[RuleGroup] = ()) -> PromExport:
    """The rules as a Prometheus rules file (one group per pack), then `extra_groups` (recording rules)."""
    now = time.time() if now is None else now
    baselines = load_baselines(store) if store is not None else []
    groups: dict[str, list[dict]] = {}
    skipped: list[tuple[str, str]] = []
    for rule in rules.rules:
        if rule.expr.local_only:
            skipped.append((rule.name, "it counts store events, which Prometheus does not see"))
            continue
        if rule.learned:
            prom, why = _learned_rules(rule, baselines, now)
            if why:
                skipped.append((rule.name, why))
                continue
        elif rule.severity == "xid":
            prom = _xid_rules(rule)
        elif is_staleness(rule.expr.root):
            prom = [_prom_rule(rule.name, target_up(to_promql(rule.expr.root)), rule, rule.severity)]
        else:
            prom = [_prom_rule(rule.name, to_promql(rule.expr.root), rule, rule.severity)]
        groups.setdefault(rule.pack, []).extend(prom)
    doc = {"groups": [{"name": f"gpulens-{pack}", "rules": rs} for pack, rs in groups.items()]}
    for g in extra_groups:
        doc["groups"].append({"name": g.name, "rules": list(g.rules)})
    header = ["# Prometheus alerting rules generated by `gpulens alerts export --format prometheus`.",
              "# Check with: promtool check rules FILE"]
    for name, why in skipped:
        header.append(f"# left out: {name}: {why}")
    body = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=1000)
    return PromExport("\n".join(header) + "\n" + body, sum(len(v) for v in groups.values()) + sum(len(g.rules) for g in extra_groups), skipped)
