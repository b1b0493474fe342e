"""`gpulens record`: write any backend's samples to gpulens's recording format, which ReplayBackend reads.

Format (JSON lines): a header `{"format": "gpulens-recording", "version": 1, "gpus": [GpuInfo...]}`,
then `{"type": "sample", ...GpuSample fields}` per GPU per tick and `{"type": "xid", t, gpu, uuid, xid}`.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import IO

from gpulens.files import AtomicFile
from gpulens.gpu.backend import GpuBackend
from gpulens.gpu.replay import RECORDING_FORMAT
from gpulens.gpu.types import GpuSample, XidEvent


class Recorder:
    def __init__(self, out: IO[str], backend: GpuBackend):
        self.out = out
        self.lines = 0
        header = {"format": RECORDING_FORMAT, "version": 1, "backend": backend.name, "gpus": [asdict(g) for g in backend.gpus()]}
        self._write(header)

    def _write(self, obj: dict) -> None:
        self.out.write(json.dumps(obj, separators=(",", ":")) + "\n")
        self.lines += 1

    def write_samples(self, samples: list[GpuSample]) -> None:
        for s in samples:
            d = asdict(s)
            d["type"] = "sample"
            self._write(d)

    def write_xid(self, ev: XidEvent) -> None:
        self._write({"type": "xid", **asdict(ev)})


def open_recording(path: Path) -> AtomicFile:
    """The recording's file, written beside `path` and renamed onto it when done (`commit`), or cut
    after its last complete line when a write fails (`salvage`): never a half line, never a file
    that claims lines the disk did not take."""
    from gpulens.errors import BadInputError

    if path.is_dir():  # found now, not when the recording is renamed onto it at the end
        raise BadInputError(f"Cannot write the recording {path}: it is a folder.", hint="Give --out a file path, e.g. rec.jsonl.")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return AtomicFile(path)
    except OSError as e:
        raise BadInputError(f"Cannot write the recording {path}: {e.strerror}.", hint="Choose an --out path in a folder you can write to.") from None
