"""The hardware seam: every GPU source (NVML, fake, replay) implements `GpuBackend`."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from gpulens.gpu.types import GpuInfo, GpuSample, XidEvent


@runtime_checkable
class GpuBackend(Protocol):
    """A source of GPU samples.

    `sample()` never raises for a single failing field or a lost GPU: failing fields become None
    and a lost GPU comes back as a sample with `lost=True`.
    """

    name: str

    @property
    def paced(self) -> bool:
        """True when the backend keeps its own time (a replay): `sample()` waits for the next recorded
        moment itself, and the pipeline flushes and evaluates on the samples' timeline, not the wall clock."""
        ...

    @property
    def source_time(self) -> float | None:
        """The recorded time of the frame last returned (a replay, in the trace's own clock, including
        the offset of a looped pass); None for a live source, whose sample times are the wall clock."""
        ...

    def gpus(self) -> list[GpuInfo]:
        """Static facts about each GPU."""
        ...

    def sample(self) -> list[GpuSample]:
        """One reading of every GPU, now (or, for a replay, the next recorded moment)."""
        ...

    def drain_xid_events(self) -> list[XidEvent]:
        """XID errors seen since the last call."""
        ...

    def close(self) -> None: ...

    @property
    def exhausted(self) -> bool:
        """True when a finite source (a replay) has nothing more to give."""
        ...
