"""Alert rules: a readable YAML file, the built-in packs as defaults, and the checks that make a bad
file fail on load with the file, the line and the field named.

    baseline:                 # optional: band defaults for learned rules in this file
      k_initial: 6
    metrics: [vllm:num_requests_waiting]   # optional: extra metric names the rules may use
    rules:
      - name: GpuTemperatureNearSlowdown
        expr: gpu_temperature_celsius >= gpu_temperature_slowdown_celsius - 5
        for: 30s
        severity: warning                  # critical | warning | info | xid (from the XID catalog)
        summary: "GPU {{ $labels.gpu }} is at {{ $value }} °C, within 5 °C of its slowdown point"
        advice: Check airflow and fans.
        band: {min_width: 0.1}             # learned rules only (expr uses upper_band/lower_band)
        enabled: true

A file given with `--rules` adds to the packs; a rule with a pack rule's name replaces it, and
`enabled: false` switches it off.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from gpulens.alerts.baseline import BandSpec
from gpulens.alerts.expr import ExprError, ParsedExpr, parse_expr
from gpulens.errors import BadInputError, shown
from gpulens.safe_parse import UnsafeYaml, read_text, yaml_value
from gpulens.units import parse_duration
from gpulens.vocab.gpu import GPU_UP, GPU_XID_TOTAL

PACKS = ("gpu_health", "training", "inference")
SEVERITIES = ("critical", "warning", "info", "xid")
_RULE_KEYS = {"name", "expr", "for", "severity", "summary", "advice", "labels", "band", "enabled"}
_TOP_KEYS = {"pack", "rules", "baseline", "metrics", "description"}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TEMPLATE = re.compile(r"\{\{(.*?)\}\}")
_TEMPLATE_FORMS = re.compile(r'^\s*(\$value|\$labels\.[A-Za-z_][A-Za-z0-9_]*|printf\s+"%\.\d+f"\s+\$value)\s*$')
_PRINTF = re.compile(r'printf\s+"%\.(\d+)f"\s+\$value')
MAX_PRINTF_DIGITS = 12  # digits after the point: %.3000000000f passed a check of the form and then failed (or
#                         wrote 50 MB) at every evaluation, so the precision is checked when the file loads
MAX_TEMPLATE_CHARS = 2000  # a summary or advice as written in the file
MAX_RENDERED_CHARS = 4000  # what one filled template may grow to (label values are the alert's own)


class RuleFileError(BadInputError):
    """A rule file that cannot be used; names the file, the line and the field."""

    def __init__(self, path: str, line: int | None, field_name: str | None, problem: str):
        where = f"{path}" + (f" line {line}" if line else "") + (f", field '{field_name}'" if field_name else "")
        super().__init__(f"{where}: {problem}.", hint="Fix the rule file (see docs/alerts.md for the format).")
        self.path, self.line, self.field = path, line, field_name


@dataclass(frozen=True)
class Rule:
    name: str
    expr: ParsedExpr
    for_seconds: float
    severity: str
    summary: str
    advice: str
    labels: dict[str, str] = field(default_factory=dict)
    band: BandSpec = field(default_factory=BandSpec)
    pack: str = "custom"
    source: str = ""  # file:line

    @property
    def learned(self) -> bool:
        return self.expr.learned


@dataclass
class RuleSet:
    rules: list[Rule]
    band: BandSpec = field(default_factory=BandSpec)
    extra_metrics: set[str] = field(default_factory=set)

    def by_name(self, name: str) -> Rule | None:
        return next((r for r in self.rules if r.name == name), None)


# ---------------------------------------------------------------- YAML with line numbers
class _Map(dict):
    line: int = 0

    def __init__(self, *args: Any, **kw: Any):
        super().__init__(*args, **kw)
        self.key_lines: dict[str, int] = {}


class _LineLoader(yaml.SafeLoader):
    pass


def _construct_map(loader: yaml.SafeLoader, node: yaml.MappingNode) -> _Map:
    m = _Map()
    m.line = node.start_mark.line + 1
    m.key_lines = {}
    for k_node, v_node in node.value:
        key = loader.construct_object(k_node, deep=True)
        m[key] = loader.construct_object(v_node, deep=True)
        m.key_lines[str(key)] = k_node.start_mark.line + 1
    return m


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_map)


def known_metric_names() -> set[str]:
    """Metric and event names the agent and the importers write (vocab/gpu.py, vocab/names.py)."""
    from gpulens.vocab import gpu as gm
    from gpulens.vocab import names

    out = {m.name for m in gm.GPU_METRICS}
    out |= {gm.GPU_UP, gm.GPU_CLOCK_EVENT_ACTIVE, gm.GPU_PROCESS_MEMORY, gm.GPU_PROCESS_COUNT, gm.GPU_XID_TOTAL, gm.GPU_XID_LAST}
    out |= {v for k, v in vars(names).items() if k.isupper() and isinstance(v, str)}
    out.add("xid")
    return out


def _band(raw: Any, path: str, line: int, base: BandSpec) -> BandSpec:
    if raw is None:
        return base
    if not isinstance(raw, dict):
        raise RuleFileError(path, line, "band", "must be a mapping such as {min_width: 0.1}")
    allowed = {f.name for f in fields(BandSpec)}
    values = {}
    for k, v in raw.items():
        kl = getattr(raw, "key_lines", {}).get(k, line)
        if k not in allowed:
            raise RuleFileError(path, kl, f"band.{k}", f"unknown setting (known: {', '.join(sorted(allowed))})")
        if not isinstance(v, int | float) or isinstance(v, bool) or not 0 <= v < math.inf:
            raise RuleFileError(path, kl, f"band.{k}", f"must be a number of zero or more, not {v!r}")
        values[k] = float(v)
    return replace(base, **values)


def _check_template(text: str, path: str, line: int, fname: str) -> None:
    if len(text) > MAX_TEMPLATE_CHARS:
        raise RuleFileError(path, line, fname, f"is {len(text):,} characters long (at most {MAX_TEMPLATE_CHARS:,})")
    for m in _TEMPLATE.finditer(text):
        if not _TEMPLATE_FORMS.match(m.group(1)):
            raise RuleFileError(
                path, line, fname,
                f"cannot use the template {m.group(0)[:60]!r} (use {{{{ $value }}}}, {{{{ $labels.NAME }}}} or {{{{ printf \"%.2f\" $value }}}})",
            )
        p = _PRINTF.search(m.group(1))
        if p and int(p.group(1)) > MAX_PRINTF_DIGITS:
            raise RuleFileError(path, line, fname, f"asks for {p.group(1)[:24]} digits after the point in {m.group(0)[:60]!r} "
                                                   f"(at most {MAX_PRINTF_DIGITS})")
    if "{{" in _TEMPLATE.sub("", text):  # Prometheus would refuse the whole exported rules file ("unclosed action")
        raise RuleFileError(path, line, fname, "has a '{{' with no closing }} (a template is {{ $value }} or {{ $labels.NAME }})")


def _template_text(raw: Any, default: str, path: str, line: int, fname: str) -> str:
    """A summary or advice as written: text (a number is taken as its text), never a list or mapping
    (str() of an alias-built list would be walked in full)."""
    if raw is None or raw == "":
        return default
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise RuleFileError(path, line, fname, "must be text")
    return str(raw)


def parse_rules(text: str, path: str = "<rules>", *, pack: str = "custom", base: RuleSet | None = None) -> RuleSet:
    """Rules from YAML text, checked. With `base`, the file adds to (and overrides) those rules."""
    try:
        doc = yaml_value(text, loader=_LineLoader)  # a SafeLoader subclass; depth and alias expansion bounded
    except UnsafeYaml as e:
        raise RuleFileError(path, e.line, None, f"cannot be read: {e}") from None
    if doc is None:
        doc = _Map()
    if not isinstance(doc, dict):
        raise RuleFileError(path, 1, None, "must be a mapping with a 'rules' list")
    for k in doc:
        if k not in _TOP_KEYS:
            raise RuleFileError(path, doc.key_lines.get(k), str(k), f"unknown key (known: {', '.join(sorted(_TOP_KEYS))})")
    band = _band(doc.get("baseline"), path, doc.key_lines.get("baseline", 1), base.band if base else BandSpec())
    extra = set(base.extra_metrics) if base else set()
    metrics = doc.get("metrics") or []
    if not isinstance(metrics, list) or not all(isinstance(m, str) for m in metrics):
        raise RuleFileError(path, doc.key_lines.get("metrics"), "metrics", "must be a list of metric names")
    extra |= set(metrics)
    known = known_metric_names() | extra
    pack = str(doc.get("pack", pack))
    raw_rules = doc.get("rules") or []
    if not isinstance(raw_rules, list):
        raise RuleFileError(path, doc.key_lines.get("rules"), "rules", "must be a list of rules")
    rules: list[Rule] = list(base.rules) if base else []
    seen: set[str] = set()
    for raw in raw_rules:
        rule, enabled = _parse_rule(raw, path, pack, known, band)
        if rule.name in seen:
            raise RuleFileError(path, raw.line, "name", f"the rule {rule.name!r} is defined twice in this file")
        seen.add(rule.name)
        rules = [r for r in rules if r.name != rule.name]
        if enabled:
            rules.append(rule)
    return RuleSet(rules, band, extra)


def _labels(raw: Any, path: str, line: int) -> dict[str, str]:
    """A rule's extra labels: Prometheus label names with text values (str() of a null, a list or a
    mapping was exported as the label 'None' or "{'b': 'c'}", and a name such as 'a b' made promtool
    refuse the whole exported file)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise RuleFileError(path, line, "labels", "must be a mapping of label names to values")
    kl = getattr(raw, "key_lines", {})
    out = {}
    for k, v in raw.items():
        if not isinstance(k, str) or not _NAME.match(k):
            raise RuleFileError(path, kl.get(str(k), line), "labels", f"{shown(k)} is not a label name (letters, digits and _, not first a digit)")
        if isinstance(v, bool) or not isinstance(v, str | int | float):
            raise RuleFileError(path, kl.get(k, line), f"labels.{k}", "must be text")
        out[k] = str(v)
    return out


def _parse_rule(raw: Any, path: str, pack: str, known: set[str], band: BandSpec) -> tuple[Rule, bool]:
    if not isinstance(raw, dict):
        raise RuleFileError(path, None, "rules", "each rule must be a mapping with name and expr")
    line = raw.line
    kl = raw.key_lines

    def at(k: str) -> int:
        return kl.get(k, line)

    for k in raw:
        if k not in _RULE_KEYS:
            raise RuleFileError(path, at(k), str(k), f"unknown field (known: {', '.join(sorted(_RULE_KEYS))})")
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise RuleFileError(path, at("name"), "name", f"must be a name of letters, digits and _ , not {shown(name)}")
    if len(name) > MAX_TEMPLATE_CHARS:  # checked here: it is the summary a rule without one shows
        raise RuleFileError(path, at("name"), "name", f"is {len(name):,} characters long (at most {MAX_TEMPLATE_CHARS:,})")
    enabled = raw.get("enabled", True)
    if not isinstance(enabled, bool):
        raise RuleFileError(path, at("enabled"), "enabled", "must be true or false")
    expr_text = raw.get("expr")
    if not isinstance(expr_text, str):
        raise RuleFileError(path, at("expr"), "expr", f"is missing (an expression such as {GPU_UP} == 0)")
    try:
        expr = parse_expr(expr_text)
    except ExprError as e:
        cut = expr_text if len(expr_text) <= 80 else f"{expr_text[:80]}…"
        raise RuleFileError(path, at("expr"), "expr", f"cannot read {cut!r}: {e.message}") from None
    for m in sorted(expr.metrics | expr.event_kinds):
        if m not in known:
            close = difflib.get_close_matches(m, sorted(known), n=1)
            tip = f" (did you mean {close[0]!r}?)" if close else " (declare it under 'metrics:' if an exporter writes it)"
            raise RuleFileError(path, at("expr"), "expr", f"unknown metric {m!r}{tip}")
    try:
        for_seconds = parse_duration(raw.get("for", 0), what="'for' duration", allow_zero=True)
    except BadInputError as e:
        raise RuleFileError(path, at("for"), "for", e.message.rstrip(".") + " (write 30s, 5m, 1h)") from None
    severity = raw.get("severity", "warning")
    if severity not in SEVERITIES:
        raise RuleFileError(path, at("severity"), "severity", f"must be one of {', '.join(SEVERITIES)}, not {severity!r}")
    if severity == "xid" and GPU_XID_TOTAL not in expr.metrics:
        raise RuleFileError(path, at("severity"), "severity", f"'xid' takes severity from the XID catalog and needs {GPU_XID_TOTAL} in expr")
    summary = _template_text(raw.get("summary"), name, path, at("summary"), "summary")
    advice = _template_text(raw.get("advice"), "", path, at("advice"), "advice")
    _check_template(summary, path, at("summary"), "summary")
    _check_template(advice, path, at("advice"), "advice")
    labels = _labels(raw.get("labels"), path, at("labels"))
    rule_band = _band(raw.get("band"), path, at("band"), band)
    if raw.get("band") is not None and not expr.learned:
        raise RuleFileError(path, at("band"), "band", "applies only to learned rules (expr with upper_band or lower_band)")
    rule = Rule(
        name=name, expr=expr, for_seconds=for_seconds, severity=severity, summary=summary, advice=advice,
        labels=labels, band=rule_band, pack=pack, source=f"{path}:{line}",
    )
    return rule, enabled


def pack_text(name: str) -> str:
    return resources.files("gpulens.alerts").joinpath("packs").joinpath(f"{name}.yaml").read_text(encoding="utf-8")


def load_rules(rules_file: str | Path | None = None, *, packs: tuple[str, ...] = PACKS) -> RuleSet:
    """The built-in packs, then `rules_file` on top."""
    rs = RuleSet([])
    for p in packs:
        if p not in PACKS:
            raise BadInputError(f"There is no rule pack {p!r}.", hint=f"Use one of {', '.join(PACKS)}.")
        rs = parse_rules(pack_text(p), f"packs/{p}.yaml", pack=p, base=rs)
    if rules_file is not None:
        path = Path(rules_file)
        text = read_text(path, "the rule file", hint="Check the --rules path; give a YAML rules file (see docs/alerts.md).")
        rs = parse_rules(text, str(path), pack="custom", base=rs)
    return rs


def render_template(text: str, labels: dict[str, str], value: float) -> str:
    """Fills {{ $value }}, {{ $labels.x }} and {{ printf "%.Nf" $value }} (Prometheus's syntax)."""

    def sub(m: re.Match[str]) -> str:
        inner = m.group(1).strip()
        if inner == "$value":
            return f"{value:.6g}"
        if inner.startswith("$labels."):
            return labels.get(inner[len("$labels."):], "")
        fm = _PRINTF.match(inner)
        if not fm:
            return m.group(0)
        if not math.isfinite(value):
            return f"{value}"
        return f"{value:.{min(int(fm.group(1)), MAX_PRINTF_DIGITS)}f}"  # a rule built in code is held to the bound too

    filled = _TEMPLATE.sub(sub, text)
    return filled if len(filled) <= MAX_RENDERED_CHARS else filled[: MAX_RENDERED_CHARS - 1] + "…"
