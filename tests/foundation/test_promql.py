"""gpulens.promql, the one builder of PromQL text: string literals that decode back to their value,
one duration spelling, and every expression gpulens emits (alert rules of every pack, Grafana panels,
the Prometheus reader's queries, the scaling recording rules) parsed by Prometheus's own promtool."""

from __future__ import annotations

import math
import re
import subprocess

import pytest
import yaml
from testlib import which_or_skip

from gpulens import promql as P
from gpulens.alerts.baseline import Baseline, robust_stats
from gpulens.alerts.export import RuleGroup, export_prometheus
from gpulens.alerts.expr import band_selectors, parse_expr, to_promql
from gpulens.alerts.rules import load_rules
from gpulens.errors import BadInputError
from gpulens.export.grafana import grafana_dashboard
from gpulens.scaling.promql import recording_rules
from gpulens.views.data import Selection, Window, build_panel
from gpulens.views.panels import PANELS
from gpulens.views.prometheus import PrometheusReader

HOSTILE = [
    'a"b', "back\\slash", "trail\\", "new\nline", '"}', '"} or vector(1) or up{a="', "\\\"} or vector(1) #",
    "tab\tcr\r", "ctl\x00\x01\x1b\x7f", "uni é ✓ \u2028 \U0001f600", "single'quote", "`back`", "{{ $labels.a }}",
    "$host", "a.b*c|d", "\\n not a newline",
]


# ------------------------------------------------------------------ literals
@pytest.mark.parametrize("value", HOSTILE + ["", "plain"])
def test_a_quoted_value_decodes_back_to_itself_and_stays_on_one_line(value):
    lit = P.quote(value)
    assert P.unquote(lit) == value
    assert "\n" not in lit and "\r" not in lit
    # The literal ends at its last character: no unescaped quote inside.
    assert re.fullmatch(r'"(?:[^"\\]|\\.)*"', lit, re.S)


def test_quote_spells_the_usual_escapes():
    assert P.quote('a"b\\c\nd\te') == r'"a\"b\\c\nd\te"'
    assert P.quote("\x00\x7f\u2028\U0001f600") == '"\\x00\\x7f\\u2028\U0001f600"'
    with pytest.raises(BadInputError, match="lone surrogate"):
        P.quote("\ud800")


@pytest.mark.parametrize(("literal", "value"), [
    (r'"a\nb"', "a\nb"), (r"'it\'s'", "it's"), (r'"\x41\101\u00e9\U0001F600"', "AAé\U0001f600"), ("`raw\\n`", "raw\\n"),
])
def test_unquote_follows_promqls_escape_rules(literal, value):
    assert P.unquote(literal) == value


@pytest.mark.parametrize("literal", [r'"\q"', r'"\'"', '"a\nb"', '"a"b"', r'"\x4"', r'"\ud800"', r'"\377"', "x"])
def test_unquote_refuses_what_promql_refuses(literal):
    with pytest.raises(BadInputError):
        P.unquote(literal)


def test_regex_any_matches_exactly_its_values():
    rx = P.regex_any(["a.b", "c|d", "(x)", "79"])
    assert re.fullmatch(rx, "a.b") and re.fullmatch(rx, "c|d") and re.fullmatch(rx, "(x)") and re.fullmatch(rx, "79")
    assert not re.fullmatch(rx, "axb") and not re.fullmatch(rx, "c")


def test_names_are_checked_not_pasted():
    with pytest.raises(BadInputError):
        P.selector("up} or vector(1)")
    with pytest.raises(BadInputError):
        P.selector("up", {'a="x"': "1"})
    with pytest.raises(BadInputError):
        P.aggregate("sum", "up", by=("a) (vector(1)",))
    with pytest.raises(BadInputError):
        P.rate("up", "5m] or vector(1) #")  # a window is seconds or a Grafana variable


# ------------------------------------------------------------------ durations
@pytest.mark.parametrize(("seconds", "text"), [
    (60, "1m"), (90, "1m30s"), (300, "5m"), (0.25, "250ms"), (3600, "1h"), (86400 * 2 + 1, "2d1s"), (1e-6, "1ms"),
    (0.1 * 3, "300ms"), (604800, "7d"),
])
def test_one_duration_spelling(seconds, text):
    assert P.duration(seconds) == text
    assert P.duration_seconds(text) == pytest.approx(max(seconds, 0.001))


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf])
def test_a_duration_is_positive_and_finite(bad):
    with pytest.raises(BadInputError):
        P.duration(bad)


def test_the_helpers_spelling():
    sel = P.selector("m", {"b": "2", "a": "1"}, {"host": "$host"})
    assert sel == 'm{a="1", b="2", host=~"$host"}'
    assert P.histogram_quantile(0.99, "lat", "$__rate_interval", {"a": "1"}, by=("service",)) == \
        'histogram_quantile(0.99, sum by (le, service) (rate(lat_bucket{a="1"}[$__rate_interval])))'
    assert P.histogram_mean("lat", 120) == "rate(lat_sum[2m]) / rate(lat_count[2m])"
    assert P.aggregate("sum", "x") == "sum(x)" and P.aggregate("max", "x", by=("a", "b")) == "max by (a, b) (x)"
    assert P.over_time("quantile", "m", 90, 0.5) == "quantile_over_time(0.5, m[1m30s])"


def test_an_alert_matcher_round_trips_through_the_rule_language():
    for value in HOSTILE:
        node = parse_expr(f"gpu_up{{host={P.quote(value)}}} == 0").root
        assert parse_expr(to_promql(node)).root == node
        assert node.left.matchers[0].value == value  # type: ignore[union-attr]


# ------------------------------------------------------------------ everything gpulens emits, through promtool
def _ready_baselines(rules) -> list[Baseline]:
    """A ready baseline for every series a learned rule reads, on a hostile label value too."""
    out, sid = [], 0
    for rule in rules.rules:
        for sel in band_selectors(rule.expr.root):
            for labels in ({"host": "node-a"}, {"host": '"} or vector(1) or up{a="'}):
                sid += 1
                out.append(Baseline(sid, sel.name, {**labels, **{m.label: m.value for m in sel.matchers if m.op == "="}},
                                    "ready", 0.0, 60.0, stats=robust_stats([float(i) for i in range(1, 30)])))
    return out


def _alert_exprs(monkeypatch) -> list[str]:
    rules = load_rules()
    baselines = _ready_baselines(rules)
    monkeypatch.setattr("gpulens.alerts.export.load_baselines", lambda store: baselines)
    res = export_prometheus(rules, store=object(), now=1e9)  # type: ignore[arg-type]
    learned = {r.name for r in rules.rules if r.learned}
    assert not {name for name, _ in res.skipped} & learned, res.skipped  # every learned rule was emitted
    return [r["expr"] for g in yaml.safe_load(res.text)["groups"] for r in g["rules"]]


def _reader_queries() -> list[str]:
    """Every query the Prometheus reader sends for every panel, over a few windows and selections."""
    sent: list[str] = []

    class Recording(PrometheusReader):
        def _range(self, expr, start, end, points):
            sent.append(expr)
            return []

        def _instant(self, expr, t):
            sent.append(expr)
            return [{"metric": {}, "value": [t, "1"], "values": [[t, "1"]]}]

    reader = Recording("http://prometheus.invalid:9090")
    selections = [Selection(), Selection(gpu="0", job="train-1", service="chat", host="node-a"),
                  Selection(gpu='0"} or vector(1) or up{a="', job="a\\b\nc", service='"}', host="x\\")]
    for panel_id in PANELS:
        for w in (Window(1e9 - 900, 1e9), Window(1e9 - 0.5, 1e9), Window(1e9 - 7 * 86400, 1e9)):
            for sel in selections:
                build_panel(reader, panel_id, w, sel, points=600)
    assert sent
    return sent


def _grafana_exprs() -> list[str]:
    exprs = [t["expr"] for names in ("gpulens", "dcgm") for p in grafana_dashboard(metric_names=names)["panels"]
             for t in p.get("targets", [])]
    concrete = [e.replace("$__rate_interval", "1m").replace("$__range", "1h") for e in exprs]
    return [re.sub(r"\$(host|gpu|job|service)\b", ".*", e) for e in concrete]


def _promtool_check(tmp_path, exprs: list[str]) -> subprocess.CompletedProcess:
    promtool = which_or_skip("promtool")
    rules = [{"record": f"gpulens_check_{i}", "expr": e} for i, e in enumerate(dict.fromkeys(exprs))]
    path = tmp_path / "every-expression.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "every-expression", "rules": rules}]}, allow_unicode=True, width=10_000))
    return subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=120)


def test_every_expression_gpulens_emits_parses_in_promtool(tmp_path, monkeypatch):
    exprs = _alert_exprs(monkeypatch) + _grafana_exprs() + _reader_queries()
    for window in (0.25, 60.0, 90.0, 3600.0):
        exprs += [r["expr"] for r in recording_rules(window_seconds=window)]
    done = _promtool_check(tmp_path, exprs)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_cli_export_is_this_export_path(tmp_path, monkeypatch):
    from gpulens.cli.main import main

    monkeypatch.chdir(tmp_path)  # no store here: the packs alone
    out = tmp_path / "rules.yml"
    assert main(["alerts", "export", "--format", "prometheus", "--out", str(out)]) == 0
    same = export_prometheus(load_rules(), extra_groups=(RuleGroup("gpulens-scaling", recording_rules()),))
    assert out.read_text() == same.text


def test_a_hostile_label_value_selects_exactly_its_series_on_prometheus(tmp_path):
    """Prometheus itself (promtool test rules) reads each selector: the equality and the regex
    selector of each hostile value fire for exactly the one series with that value (the alert's
    labels compared with the value as YAML holds it), never for the others or for an injected vector(1)."""
    promtool = which_or_skip("promtool")
    values = HOSTILE + ["plain"]
    rules, tests = [], []
    for i, v in enumerate(values):
        for op, matched in (("=", v), ("=~", P.regex_any([v]))):
            name = f"Hostile{i}{'Eq' if op == '=' else 'Re'}"
            expr = P.selector("hostile_metric", extra=(P.Matcher("a", op, matched),))
            assert len(parse_expr(expr).root.matchers) == 1  # type: ignore[union-attr]
            rules.append({"alert": name, "expr": expr})
            tests.append({"eval_time": "1m", "alertname": name, "exp_alerts": [{"exp_labels": {"a": v}}]})
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "hostile", "rules": rules}]}))
    series = [{"series": P.selector("hostile_metric", {"a": v}), "values": "1x10"} for v in values]
    spec = {"rule_files": ["rules.yml"], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": tests}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(spec))
    done = subprocess.run([promtool, "test", "rules", "test.yml"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_builder_and_alerts_stay_below_their_callers():
    """promql is a leaf (errors, units, vocab only); alerts does not reach up to scaling, lazy imports included."""
    grimp = pytest.importorskip("grimp", reason="the import-graph checks need grimp (the dev extra)")
    graph = grimp.build_graph("gpulens", cache_dir=None)
    allowed = ("gpulens.errors", "gpulens.units", "gpulens.vocab")
    up = [m for m in graph.find_modules_directly_imported_by("gpulens.promql") if not m.startswith(allowed)]
    assert up == []
    alerts = {"gpulens.alerts"} | graph.find_descendants("gpulens.alerts")
    scaling = {"gpulens.scaling"} | graph.find_descendants("gpulens.scaling")
    assert not [(a, s) for a in alerts for s in graph.find_modules_directly_imported_by(a) if s in scaling]


def test_a_user_selector_parses_into_matchers():
    from gpulens.promql import Matcher, parse_matchers

    assert parse_matchers('{cluster="a", region=~"eu-.*",}') == (Matcher("cluster", "=", "a"), Matcher("region", "=~", "eu-.*"))
    assert parse_matchers("zone!='b'") == (Matcher("zone", "!=", "b"),) and parse_matchers("{}") == ()
    assert parse_matchers(r'{a="x\"} or up{"}')[0].value == 'x"} or up{'  # a value stays a value
    assert P.selector("gpu_up", {"gpu": "0"}, extra=parse_matchers('{cluster="a"}')) == 'gpu_up{gpu="0", cluster="a"}'
    for bad in ('{a="b" c="d"}', "{a=b}", '{"a"="b"}', '{a="b"'):
        with pytest.raises(BadInputError):
            parse_matchers(bad)
    assert P.subquery("timestamp(up)", 600, 1) == "(timestamp(up))[10m:1s]"
