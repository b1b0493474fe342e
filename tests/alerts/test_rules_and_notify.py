"""Rule files that cannot work fail on load naming the file, the line and the field; notifiers: the
webhook speaks Alertmanager's webhook format, a dead receiver never holds up evaluation, silences
keep an alert recorded but unnotified."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from testlib import free_port

from gpulens.alerts.engine import add_silence, load_alerts, parse_matcher
from gpulens.alerts.rules import RuleFileError, load_rules
from gpulens.cli.main import main

GOOD = """\
rules:
  - name: HotGpu
    expr: gpu_temperature_celsius > 80
    for: 30s
    severity: warning
    summary: "GPU {{ $labels.gpu }} at {{ $value }} °C"
"""

# (id, text, line, field, words the message must contain)
BAD = [
    ("unknown-field", GOOD.replace("    for: 30s", "    fro: 30s"), 4, "fro", "unknown field"),
    ("metric-typo", GOOD.replace("gpu_temperature_celsius", "gpu_temprature_celsius"), 3, "expr", "did you mean 'gpu_temperature_celsius'"),
    ("bad-expr", GOOD.replace("> 80", "> "), 3, "expr", "cannot read"),
    ("bad-function", GOOD.replace("gpu_temperature_celsius > 80", "avg(gpu_temperature_celsius[5m]) > 80"), 3, "expr", "cannot read"),
    ("bad-for", GOOD.replace("for: 30s", "for: 30 seconds"), 4, "for", "write 30s"),
    ("bad-severity", GOOD.replace("severity: warning", "severity: page"), 5, "severity", "critical, warning, info"),
    ("bad-template", GOOD.replace("{{ $labels.gpu }}", "{{ .Labels.gpu }}"), 6, "summary", "template"),
    ("band-on-absolute", GOOD + "    band: {min_width: 1}\n", 7, "band", "learned rules"),
    ("negative-band", GOOD.replace("gpu_temperature_celsius > 80", "gpu_temperature_celsius > upper_band(gpu_temperature_celsius)")
     + "    band:\n      min_width: -1\n", 8, "band.min_width", "zero or more"),
    ("nan-band", GOOD.replace("gpu_temperature_celsius > 80", "gpu_temperature_celsius > upper_band(gpu_temperature_celsius)")
     + "    band:\n      k_initial: .nan\n", 8, "band.k_initial", "zero or more"),  # once accepted: a band of nan width
    ("inf-baseline", "baseline:\n  k_initial: .inf\n" + GOOD, 2, "band.k_initial", "zero or more"),
    ("duplicate", GOOD + GOOD.split("rules:\n", 1)[1], 7, "name", "defined twice"),
    ("bad-name", GOOD.replace("name: HotGpu", "name: hot gpu"), 2, "name", "letters, digits"),
    ("xid-severity-elsewhere", GOOD.replace("severity: warning", "severity: xid"), 5, "severity", "gpu_xid_errors_total"),
    ("top-level-typo", "rule:\n  - name: X\n", 1, "rule", "unknown key"),
    ("invalid-yaml", GOOD.replace("    for: 30s", "    for: [30s"), None, None, "not valid YAML"),
    # a name too long was blamed on 'summary' (the name is a rule's summary when it has none)
    ("long-name", GOOD.replace("name: HotGpu", "name: " + "A" * 5000).replace('    summary: "GPU {{ $labels.gpu }} at {{ $value }} °C"\n', ""),
     2, "name", "5,000 characters long"),
    # once exported as they came: promtool refused the label 'a b', a null became the label value 'None'
    ("label-name", GOOD + "    labels: {'a b': c}\n", 7, "labels", "not a label name"),
    ("label-null", GOOD + "    labels:\n      team: null\n", 8, "labels.team", "must be text"),
    ("label-mapping", GOOD + "    labels:\n      team: {a: b}\n", 8, "labels.team", "must be text"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_rule_file_names_file_line_and_field(tmp_path, case):
    _, text, line, field, words = case
    path = tmp_path / "my-rules.yml"
    path.write_text(text)
    with pytest.raises(RuleFileError) as err:
        load_rules(path)
    e = err.value
    assert e.path == str(path) and words in e.message
    if line is not None:
        assert e.line == line and f"line {line}" in e.message
    else:
        assert e.line is not None
    if field is not None:
        assert e.field == field and f"field '{field}'" in e.message


def test_good_rule_file_adds_to_and_overrides_the_packs(tmp_path):
    path = tmp_path / "rules.yml"
    path.write_text(GOOD + "  - name: GpuLost\n    expr: gpu_up == 0\n    enabled: false\n")
    rs = load_rules(path)
    hot = rs.by_name("HotGpu")
    assert hot is not None and hot.for_seconds == 30 and hot.source == f"{path}:2"
    assert rs.by_name("GpuLost") is None and rs.by_name("GpuXid") is not None


def test_bad_rule_file_on_the_command_line_is_one_sentence(tmp_path, capsys):
    path = tmp_path / "r.yml"
    path.write_text(BAD[1][1])
    assert main(["alerts", "export", "--rules", str(path)]) == 2
    err = " ".join(capsys.readouterr().err.split())  # rich wraps at the terminal width
    assert "Traceback" not in err and "line 3" in err and "field 'expr'" in err and "r.yml" in err


# ---------------------------------------------------------------- notifiers
class _Collector(BaseHTTPRequestHandler):
    bodies: list[dict]

    def do_POST(self):  # noqa: N802
        n = int(self.headers["Content-Length"])
        self.server.bodies.append(json.loads(self.rfile.read(n)))  # type: ignore[attr-defined]
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):  # quiet
        pass


@pytest.fixture
def receiver():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    srv.bodies = []  # type: ignore[attr-defined]
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _webhook(rig):
    return rig.rt.notifier.notifiers[0]


def test_webhook_posts_alertmanager_bodies(store, receiver):
    from alerts_rig import Rig

    rig = Rig(store, notify=[f"webhook:http://127.0.0.1:{receiver.server_port}/hook"])
    try:
        rig.tick()
        rig.fake.inject_xid(0, 79)
        rig.tick()
        assert _webhook(rig).flush(10)
        body = receiver.bodies[0]
        assert body["version"] == "4" and body["status"] == "firing" and body["receiver"] == "gpulens"
        (a,) = body["alerts"]
        assert a["labels"]["alertname"] == "GpuXid" and a["labels"]["xid"] == "79" and a["labels"]["severity"] == "critical"
        assert a["startsAt"].endswith("Z") and a["endsAt"] == "0001-01-01T00:00:00Z" and a["fingerprint"]
        assert body["commonLabels"]["alertname"] == "GpuXid" and "action" in a["annotations"]
        rig.run_until(lambda: not rig.firing("GpuXid"), 700)
        assert _webhook(rig).flush(10)
        last = receiver.bodies[-1]
        assert last["status"] == "resolved" and last["alerts"][0]["endsAt"] != "0001-01-01T00:00:00Z"
        assert len(receiver.bodies) == 2  # fired once, resolved once: no repeats in between
    finally:
        rig.close()


def test_dead_webhook_never_holds_up_evaluation(store):
    """A receiver that accepts connections and never answers: every POST waits out its timeout, with
    retries. Evaluation goes on at its own pace and other notifiers still get the alerts."""
    from alerts_rig import Rig

    blackhole = socket.socket()
    blackhole.bind(("127.0.0.1", 0))
    blackhole.listen(64)  # never accept(): connect succeeds, the response never comes
    port = blackhole.getsockname()[1]
    rig = Rig(store, notify=[f"webhook:http://127.0.0.1:{port}/hook", "log"])
    hook = _webhook(rig)
    try:
        rig.tick()
        worst = 0.0
        for code in (79, 48, 13, 31, 43):
            rig.fake.inject_xid(0, code)
            started = time.perf_counter()
            rig.tick()
            worst = max(worst, time.perf_counter() - started)
        assert len(rig.firing("GpuXid")) == 5
        # One blocked POST alone takes timeout_seconds; evaluation never waited for one.
        assert worst < hook.timeout_seconds / 2, f"an evaluation took {worst:.2f} s"
        assert not hook.flush(0.2) and hook.delivered == 0  # still retrying in the background
        assert hook.retries >= 2 and hook.retries * hook.timeout_seconds < 60  # bounded
    finally:
        started = time.perf_counter()
        rig.close()
        closed_in = time.perf_counter() - started
        blackhole.close()
    # Shutdown is bounded too: close gives up on undeliverable bodies instead of hanging.
    assert closed_in <= 2 * hook.close_timeout_seconds + hook.timeout_seconds
    assert hook.delivered == 0


def test_refused_webhook_gives_up_after_bounded_retries(store):
    from alerts_rig import Rig

    rig = Rig(store, notify=[f"webhook:http://127.0.0.1:{free_port()}/hook"])
    hook = _webhook(rig)
    hook.backoff_seconds = 0.01
    try:
        rig.tick()
        rig.fake.inject_xid(0, 79)
        rig.tick()
        assert hook.flush(10) and hook.failed == 1 and hook.delivered == 0
    finally:
        rig.close()


def test_silenced_alert_is_recorded_but_not_notified(store, tmp_path):
    from alerts_rig import Rig

    out = tmp_path / "n.jsonl"
    rig = Rig(store, notify=[f"file:{out}"])
    try:
        add_silence(store, [parse_matcher("alertname=GpuXid"), parse_matcher('xid=~"79|48"')],
                    starts_at=rig.t, ends_at=rig.t + 3600, comment="RMA open")
        rig.tick()
        rig.fake.inject_xid(0, 79)
        rig.fake.inject_xid(0, 13)
        rig.tick()
        firing = {a.labels["xid"]: a for a in rig.firing("GpuXid")}
        assert firing["79"].silenced and not firing["13"].silenced
        sent = [json.loads(line) for line in out.read_text().splitlines()]
        assert [s["labels"]["xid"] for s in sent] == ["13"]
        stored = {a.labels["xid"]: a for a in load_alerts(store) if a.rule == "GpuXid"}
        assert stored["79"].silenced and stored["79"].state == "firing"
    finally:
        rig.close()
