"""Writing a user's output files (reports, dashboards, rule files, CSVs, recordings) so that a
failed write never leaves a half or 0-byte file behind, and says what was kept.

Every file is written to a temporary file in the same folder, flushed and fsynced, then renamed
over the destination: readers see the old file or the whole new one, never a part. On failure the
temporary file goes, and the error says whether the destination is as it was or absent. A
recording (`AtomicFile.salvage`) keeps its complete lines instead: they replay.

A symbolic link is written through (its target is replaced, the link stays a link), and a path that
is a stream, not a file (/dev/stdout, a FIFO, a device), is written straight to: a rename would put
a regular file in place of /dev/stdout, or of /dev/full, whose "no space" then goes unseen.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from gpulens.errors import EXIT_STORAGE_FULL, BadInputError


class FileWriteError(BadInputError):
    """An output file could not be written; nothing half-written was left at its path."""


class OutputDiskFullError(FileWriteError):
    """An output file's disk is full: exit 4 like a full store's, since nothing typed was wrong."""

    exit_code = EXIT_STORAGE_FULL


SQLITE_MAGIC = b"SQLite format 3\x00"


def refuse_database(path: Path) -> None:
    """An output path that holds an SQLite database (most likely a gpulens store, perhaps the one
    being read) is never written over: a report renamed onto a store loses the store."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError:
        return  # absent or unreadable: the write itself says what is wrong
    if head == SQLITE_MAGIC:
        raise BadInputError(f"{path} is an SQLite database (a gpulens store, perhaps); gpulens writes no output over one.",
                            hint="Choose another output path (or delete the database first, if nothing in it is needed).")


def kept_note(path: Path) -> str:
    """What a failed write left at `path`: the file as it was, or none (a stream keeps what it took)."""
    if is_stream(path):
        return f"{path} is a device or pipe, written to directly"
    return f"{path} is as it was before" if path.exists() else f"no file was left at {path}"


def is_stream(path: Path) -> bool:
    """An existing path that is not a regular file nor a folder: a character or block device, a FIFO
    or a socket (after symbolic links)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


class AtomicFile:
    """A file written at a temporary path beside `path`, renamed onto it by `commit`; a stream is
    written straight to (module docstring)."""

    def __init__(self, path: str | os.PathLike[str], *, binary: bool = False, newline: str | None = None):
        self.path = Path(path)
        if is_stream(self.path):
            self.tmp: Path | None = None
            self.file: IO[Any] = open(self.path, "wb") if binary else open(self.path, "w", encoding="utf-8", newline=newline)
            return
        target = Path(os.path.realpath(self.path)) if self.path.is_symlink() else self.path
        if target.is_file():
            refuse_database(target)
        if target.is_dir():  # said before anything is written: a rename onto '.' (--out "") said "Device or resource busy"
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(self.path))
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        self.tmp = Path(tmp)
        self._target = target
        try:
            os.fchmod(fd, _mode_for(self.path))  # mkstemp's 0600 would hide a report from its readers
            self.file = os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8", newline=newline)
        except BaseException:
            os.close(fd)
            self.tmp.unlink(missing_ok=True)
            raise

    def commit(self) -> None:
        """Flush, fsync, close and rename onto the destination (then fsync the folder: the rename
        lasts); a stream is flushed and closed, so a write it refuses still raises here."""
        self.file.flush()
        if self.tmp is None:
            self.file.close()
            return
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.tmp, self._target)
        _fsync_folder(self._target.parent)

    def discard(self) -> None:
        try:
            self.file.close()
        except OSError:
            pass  # the buffered rest could not be written: it is being thrown away anyway
        if self.tmp is not None:
            self.tmp.unlink(missing_ok=True)

    def salvage(self) -> int:
        """After a failed write: keep the complete lines that reached the disk (cut after the last
        newline), renamed onto the destination. Returns how many lines were kept; 0 leaves no file."""
        try:
            self.file.close()
        except OSError:
            pass  # the part still buffered is lost; what is on disk is judged below
        if self.tmp is None:
            return 0  # a stream: what it took is gone downstream, nothing here to keep
        try:
            lines, end = _complete_lines(self.tmp)
            if lines == 0:
                self.tmp.unlink(missing_ok=True)
                return 0
            with open(self.tmp, "r+b") as f:
                f.truncate(end)
                f.flush()
                os.fsync(f.fileno())
            os.replace(self.tmp, self._target)
            _fsync_folder(self._target.parent)
            return lines
        except OSError:
            self.tmp.unlink(missing_ok=True)
            return 0


def _mode_for(path: Path) -> int:
    """The destination's mode when it exists, else what a plain open() would give (0666 less the umask)."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _complete_lines(path: Path) -> tuple[int, int]:
    """(complete lines, the byte offset just after the last newline) of a file."""
    lines = end = offset = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            n = chunk.count(b"\n")
            if n:
                lines += n
                end = offset + chunk.rindex(b"\n") + 1
            offset += len(chunk)
    return lines, end


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse a folder fsync; the rename itself is already atomic
    finally:
        os.close(fd)


def missing_folder(path: Path, what: str) -> FileWriteError:
    """The output's folder is not there: said before any work is done where a caller checks first."""
    return FileWriteError(f"Cannot write {what} {path}: the folder {path.parent} does not exist; nothing was written.",
                          hint="Create the folder first, or choose another output path.")


def write_failed(path: Path, what: str, e: OSError, hint: str) -> FileWriteError:
    """The one sentence for an output file that could not be written, saying what was kept. `hint`
    is the caller's, for a full disk; a path that cannot be written for another reason gets its own."""
    said = f"Cannot write {what} {path}: {e.strerror or e}; {kept_note(path)}."
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return OutputDiskFullError(said, hint=hint)
    if e.errno == errno.ENOENT and not path.parent.is_dir():
        return missing_folder(path, what)
    if e.errno == errno.EISDIR or path.is_dir():
        return FileWriteError(f"Cannot write {what} to {path}: it is a folder; nothing was written.",
                              hint="Give the path of a file, inside that folder or elsewhere.")
    return FileWriteError(said, hint="Choose an output path in a folder you can write to.")


@contextmanager
def atomic_writer(path: str | os.PathLike[str], *, what: str, hint: str, binary: bool = False,
                  newline: str | None = None) -> Iterator[IO[Any]]:
    """Write `path` through the yielded file, all or nothing; an OSError becomes FileWriteError."""
    path = Path(path)
    try:
        f = AtomicFile(path, binary=binary, newline=newline)
    except OSError as e:
        raise write_failed(path, what, e, hint) from None
    try:
        yield f.file
        f.commit()
    except OSError as e:
        f.discard()
        raise write_failed(path, what, e, hint) from None
    except BaseException:
        f.discard()
        raise


def write_atomically(path: str | os.PathLike[str], data: str | bytes, *, what: str, hint: str) -> Path:
    """Write all of `data` to `path` or, on failure, nothing (FileWriteError says what was kept)."""
    with atomic_writer(path, what=what, hint=hint, binary=isinstance(data, bytes)) as f:
        f.write(data)
    return Path(path)
