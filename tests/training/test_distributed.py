"""Two ranks on the gloo backend (CPU): per-rank step records, communication wait, the straggler."""

from __future__ import annotations

import pytest
from ddp_worker import run_rank

from gpulens.diagnose import diagnose
from gpulens.store import Store
from gpulens.vocab import names as N

pytestmark = pytest.mark.slow


def test_two_gloo_ranks_name_the_straggler(store_path, port) -> None:
    mp = pytest.importorskip("torch.multiprocessing")
    slow_s = 0.2  # long beside a loaded machine's scheduling delays, which shift either rank's wait
    mp.spawn(run_rank, args=(2, str(store_path), port, 1, slow_s), nprocs=2, join=True)
    with Store(store_path) as st:
        steps = st.events(N.EV_TRAIN_STEP)
        by_rank = {r: [e.data for e in steps if e.labels["rank"] == r] for r in ("0", "1")}
        assert len(by_rank["0"]) == 24 and len(by_rank["1"]) == 24
        assert {e.data["rank"] for e in steps} == {0, 1}
        assert len({d["pid"] for d in by_rank["0"]} | {d["pid"] for d in by_rank["1"]}) == 2
        starts = st.events(N.EV_TRAIN_START)
        assert sorted(e.data["rank"] for e in starts) == [0, 1] and all(e.data["world_size"] == 2 for e in starts)
        # The fast rank waits in communication for about the slow rank's extra work, in both halves.
        for half in (slice(2, 12), slice(14, 24)):
            wait0 = sorted(d["comm_wait_s"] for d in by_rank["0"][half])[5]
            wait1 = sorted(d["comm_wait_s"] for d in by_rank["1"][half])[5]
            assert wait0 > 0.6 * slow_s and wait1 < 0.5 * slow_s, (half, wait0, wait1)
        (f,) = [f for f in diagnose(st) if f.kind == "straggler"]
        assert f.evidence["slow_rank"] == "1" and f.labels == {"train_job": "ddp", "rank": "1", "host": "node"}
        assert "rank 1" in f.summary
