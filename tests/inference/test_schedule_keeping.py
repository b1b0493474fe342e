"""What keeps an open loop's sends on schedule besides the timers themselves: the garbage
collector walks only what the last tenth of a second allocated while a run is on (and everything is
handed back after it), and the loop's thread sleeps with 1 ns timer slack, restored afterwards."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import select

import pytest

from gpulens.bench.serve import LoadSpec, Target, precise_loop
from gpulens.bench.serve.gc_pauses import ShortGcPauses
from gpulens.bench.serve.runner import Progress, _Run


def test_a_run_freezes_what_it_keeps_and_hands_it_back_at_the_end(test_server):
    """During a real open-loop run the records kept so far sit in the permanent generation (so no
    collection walks them); after it nothing is left frozen."""
    spec = LoadSpec(Target(f"{test_server}/v1/models"), rate=200, duration_seconds=0.6)
    seen: list[int] = []

    async def main():
        run = _Run(spec, 0, 1, Progress())
        loop = asyncio.get_running_loop()

        def look() -> None:
            seen.append(gc.get_freeze_count())
            if len(seen) < 20:
                loop.call_later(0.02, look)

        loop.call_soon(look)
        return await run.run(None)

    assert gc.get_freeze_count() == 0
    result = precise_loop.run(main())
    assert len(result.records) == 120
    assert max(seen) > 1000  # at least the interpreter's own objects and the records so far
    assert gc.get_freeze_count() == 0


def test_an_existing_freeze_is_left_alone():
    """A process that froze its own objects (a forking server) keeps them frozen: the run neither
    adds to nor undoes that freeze."""
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()

        async def main():
            pauses = ShortGcPauses(asyncio.get_running_loop())
            pauses.start()
            assert not pauses.active
            pauses.stop()

        asyncio.run(main())
        # not undone (unfreeze would empty it) and not added to; frozen objects that die leave it, so <=
        assert 0 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()


@pytest.mark.skipif(not hasattr(select, "epoll"), reason="timer slack is a Linux prctl")
def test_timer_slack_is_fine_while_the_loop_runs_and_restored_after():
    prctl = ctypes.CDLL(None).prctl
    get_slack = 30  # PR_GET_TIMERSLACK
    before = prctl(get_slack, 0, 0, 0, 0)

    async def main():
        return prctl(get_slack, 0, 0, 0, 0)

    during = precise_loop.run(main())
    assert during == 1 and before > 1  # the kernel's default is 50,000 ns
    assert prctl(get_slack, 0, 0, 0, 0) == before
