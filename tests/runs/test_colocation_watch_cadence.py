"""The live co-location watch analyses the store only when a pair is possible: some GPU held two
processes within the window, or a mark of 1 is left to resolve (issue 28: the analysis was most of
an idle agent's CPU). The alert still pends, fires and resolves as when it analysed every time."""

from __future__ import annotations

from gpulens.alerts.runtime import AlertRuntime
from gpulens.diagnose.colocation import ALERT_RULE_YAML
from gpulens.gpu.fake import FakeBackend
from gpulens.pipeline import sinks
from gpulens.pipeline.loop import Frame
from gpulens.pipeline.sinks import ColocationWatch, StoreSink
from gpulens.vocab import names as N

GiB = 1 << 30
T0 = 1_800_000_000.0


def test_the_watch_analyses_only_while_a_gpu_is_shared_and_the_alert_still_fires_and_resolves(store, tmp_path, monkeypatch):
    analyses: list[float] = []
    real = sinks.write_colocation_series

    def counted(store_, now, *args, **kw):  # the real analysis, counted
        analyses.append(now)
        return real(store_, now, *args, **kw)

    monkeypatch.setattr(sinks, "write_colocation_series", counted)
    rules = tmp_path / "coloc.yaml"
    rules.write_text(ALERT_RULE_YAML)
    t = [T0]
    fake = FakeBackend(1, clock=lambda: t[0])
    fake.add_process(0, 4242, "python", GiB)
    store.event(N.EV_TRAIN_START, T0, {"train_job": "j"}, {"pid": 4242})
    store.event(N.EV_INFER_START, T0, {"service": "s"}, {"pid": 5151})
    store.flush()
    rt = AlertRuntime(store, learn_seconds=60, rules_file=rules, packs=(), recent_seconds=12.0)
    store_sink, watch = StoreSink(store, host="n"), ColocationWatch(store, every_seconds=5.0, window_seconds=10.0)
    states: list[str | None] = []
    for i in range(200):
        if i == 40:  # the service joins the GPU
            fake.add_process(0, 5151, "python", GiB)
        if i == 120:  # and leaves it
            fake = FakeBackend(1, clock=lambda: t[0])
            fake.add_process(0, 4242, "python", GiB)
        frame = Frame(fake.sample())
        store_sink.on_frame(frame)
        watch.on_frame(frame)
        if i % 5 == 0:
            store.flush()  # the loop's flush interval; the rules read the rest from their feed
        watch.on_tick(t[0])
        found = [a.state for a in rt.evaluate(t[0]) if a.rule == "GpuTrainingServingColocated"]
        states.append(found[0] if found else None)
        t[0] += 1
    rt.close()
    assert analyses[0] == T0 and all(a >= T0 + 40 for a in analyses[1:])  # alone on its GPU: the first look only
    assert all(a <= T0 + 120 + 10 + 5 + 5 + 5 for a in analyses)  # stops once the service left and its mark resolved
    assert "firing" in states and states.index("firing") > 40 + 55  # held for the rule's minute
    assert states[-1] is None and "resolved" in states[states.index("firing"):]
