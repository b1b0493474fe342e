"""docs/metrics.md is the metrics contract: every family the agent exports, in both naming modes, is on it."""

from __future__ import annotations

import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gpulens import FakeBackend, Store
from gpulens.exporter.exposition import render_text
from gpulens.exporter.prometheus import LatestReadings, make_registry
from gpulens.vocab import names as wn

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def _families(tmp_path, metric_names: str) -> set[str]:
    fake = FakeBackend(gpus=1, clock=lambda: 1000.0)
    fake.add_process(0, 42, "python train.py", 2**30)
    fake.inject_xid(0, 79)
    readings = LatestReadings(host="h")
    readings.update(fake.sample())
    for ev in fake.drain_xid_events():
        readings.add_xid(ev.gpu, ev.xid)
    readings.source_time = 1000.0
    with Store(tmp_path / f"{metric_names}.db") as st:
        now = time.time()
        for name in (v for k, v in vars(wn).items() if k.startswith(("TRAIN_", "INFER_")) and isinstance(v, str) and k != "TRAIN_JOB_LABEL"):
            labels = {"train_job": "j", "rank": "0"} if name.startswith("train_") else {"service": "s", "status": "ok"}
            st.write(name, labels, now, 1.0)
        st.flush()
        text = render_text(make_registry(readings, metric_names=metric_names, store=st)).decode()  # type: ignore[arg-type]
    return {f.name for f in text_string_to_metric_families(text)}


def test_every_exported_family_is_documented(tmp_path):
    doc = DOC.read_text()
    missing = set()
    for mode in ("gpulens", "dcgm"):
        for fam in _families(tmp_path, mode):
            # prometheus_client's parser names a counter family without `_total`
            if f"`{fam}`" not in doc and f"`{fam}_total`" not in doc:
                missing.add(fam)
    assert not missing, f"exported but not in docs/metrics.md: {sorted(missing)}"
