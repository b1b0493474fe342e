"""Hypothesis fuzz of the trace parsers: any bytes as a trace never raise out of `replay` (a
TraceError, exit 2, is the one allowed answer), and a valid trace with bad lines inserted imports
exactly its valid lines. `make reliability` runs many more examples (GPULENS_FUZZ_EXAMPLES)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tracelib import sample_rows

from gpulens.errors import GpulensError
from gpulens.pipeline.ingest import import_trace
from gpulens.store import Store

EXAMPLES = int(os.environ.get("GPULENS_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**500), max_value=10**500),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)
FIELDS = ["t", "gpu_util", "mem_util", "mem_used", "mem_total", "temp_c", "power_mw", "energy_mj", "sm_mhz",
          "mem_mhz", "clk_reasons", "pstate", "pcie_tx_kbs", "nproc", "procs", "errs", "type", "gpu", "xid", "format", "gpus"]
hostile_objects = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6)
hostile_lines = st.one_of(
    hostile_objects.map(json.dumps),
    st.binary(max_size=60).map(lambda b: b.decode("latin-1")),
    st.text(max_size=60),
    st.sampled_from(["[" * 5000, '{"t": 1e999}', '{"t": NaN}', "\x00\x00", "\ufeff{}", '{"format": "gpulens-recording", "gpus": 5}']),
).map(lambda s: s.replace("\n", " ").replace("\r", " "))


def _import(folder: Path, db: Path):
    with Store(db) as store:
        return import_trace(folder, store), store


@FUZZ
@given(content=st.one_of(st.binary(max_size=2000), st.lists(hostile_lines, max_size=12).map(lambda ls: "\n".join(ls).encode("utf-8", "surrogatepass"))))
def test_any_bytes_never_raise_out_of_replay(content):
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        (folder / "telemetry.jsonl").write_bytes(content)
        try:
            with Store(folder / "s.db") as store:
                import_trace(folder, store)
                rng = store.time_range()
                assert rng is None or (0 <= rng[0] <= rng[1] < 7.3e9)
        except GpulensError as e:
            assert e.exit_code == 2


def _valid_line(i: int) -> str:
    return json.dumps({"t": 1_700_000_000.0 + i, "gpu_util": i % 101, "temp_c": 40 + i % 30, "power_mw": 100_000 + i,
                       "clk_reasons": i % 8, "pstate": 0, "nproc": 1})


@FUZZ
@given(n_good=st.integers(min_value=1, max_value=15), bad=st.lists(st.tuples(st.integers(min_value=0, max_value=15), hostile_objects), max_size=8))
def test_valid_lines_import_exactly_with_bad_lines_inserted(n_good, bad):
    from gpulens.gpu.replay import _h200_line_to_sample
    from gpulens.gpu.types import GpuInfo

    info = GpuInfo(index=0, uuid="u", name="n")

    def readable(d: dict) -> bool:  # a generated "bad" line may by chance be a valid sample
        try:
            _h200_line_to_sample(d, info)
            return True
        except Exception:  # noqa: BLE001 - any refusal means the line is skipped
            return False

    lines = [_valid_line(i) for i in range(n_good)]
    really_bad = 0
    for pos, obj in sorted(bad, key=lambda x: -x[0]):
        if readable(obj) or obj.get("format") == "gpulens-recording":
            continue  # only lines that are unreadable count
        lines.insert(max(1, min(pos, len(lines))), json.dumps(obj))  # line 1 stays valid: it decides the format
        really_bad += 1
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        (folder / "telemetry.jsonl").write_text("\n".join(lines) + "\n")
        with Store(folder / "s.db") as store:
            summary = import_trace(folder, store)
            assert summary.gpu_frames == n_good
            assert summary.skipped_lines == really_bad
            assert sample_rows(store, "gpu_up") == n_good
