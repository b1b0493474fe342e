"""One agent per store: an exclusive `flock` on `STORE.lock` that holds the owner's pid.

Two agents on one store would both sample and page every alert twice; the second is refused with
the first one's pid. The kernel drops the lock when its process ends, kill -9 included, so a stale
file never blocks. (Training monitors and `replay` write the same store legitimately: only the
sampling agents take this lock.)
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from gpulens.errors import StorageFullError, StoreError


class WriterLock:
    def __init__(self, store_path: str | os.PathLike[str]):
        self.store_path = Path(store_path)
        self.path = self.store_path.with_name(self.store_path.name + ".lock")
        self._fd: int | None = None

    def acquire(self) -> WriterLock:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise StorageFullError(f"The disk that holds the store {self.store_path} is full.",
                                       hint="Free some space, or point --store at another disk.") from None
            raise StoreError(f"Cannot create the lock file {self.path}: {e.strerror}.",
                             hint="Choose a --store in a folder you can write to.") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StoreError(
                f"Another gpulens agent (pid {holder}) is already writing to the store {self.store_path}.",
                hint="Stop that agent first, or give this one another --store.",
            ) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass  # a full disk: the lock holds all the same, only the pid in its message is missing
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> WriterLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
