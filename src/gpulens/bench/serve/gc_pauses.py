"""Keep the cyclic garbage collector's pauses short while a load runs.

A run keeps every request's record until its end, so the collector's oldest generation grows with
the run and each full collection walks all of it: measured at 1,000 req/s, 45 ms pauses after a
minute (45 sends late at once), 2–3 ms middle-generation ones within seconds. Here the objects
alive at the start, and then every `FREEZE_SECONDS` those alive since, are moved to the
collector's permanent generation (`gc.freeze()`, a list splice), so a collection only ever walks
what the last fraction of a second allocated. Reference counting still frees everything at once;
only garbage *cycles* made during the run (a failed task's traceback, say) wait for the run's end,
when everything is handed back to the collector (`gc.unfreeze()`).
"""

from __future__ import annotations

import asyncio
import gc

FREEZE_SECONDS = 0.1


class ShortGcPauses:
    """Start with `start()` on the run's loop, end with `stop()`. Does nothing where something else
    in the process already uses `gc.freeze()` (a forking server), whose freeze this would undo."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._handle: asyncio.TimerHandle | None = None
        self.active = False

    def start(self) -> None:
        if self.active or not gc.isenabled() or gc.get_freeze_count():
            return
        self.active = True
        gc.collect()  # before the run's clock starts: what the set-up left is collected once
        self._freeze()

    def _freeze(self) -> None:
        gc.freeze()
        self._handle = self.loop.call_later(FREEZE_SECONDS, self._freeze)

    def stop(self) -> None:
        if not self.active:
            return
        self.active = False
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        gc.unfreeze()
