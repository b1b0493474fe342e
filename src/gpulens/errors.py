"""One exception tree for gpulens. Each error says what went wrong and what to do.

Exit codes (documented in the README) follow from where a class sits in the tree; only the classes
marked below set one, every other class inherits its parent's:
  0  success
  1  a finding the caller asked to gate on (e.g. `gpulens compare` found a regression)
  2  bad input: a wrong argument, an unreadable file, a port in use, a path that cannot be written
  3  an outside system is unavailable (no NVIDIA driver, a server that cannot be reached)
  4  a disk is full: the store's, or an output file's (nothing the user typed is wrong: free space,
     or point --store / --out elsewhere)

The tree (classes defined elsewhere name their module):

  GpulensError                                 exit 2 unless a subclass says otherwise
  ├── BadInputError                            2
  │   ├── TraceError
  │   │   └── ClaimLostError                   (store.trace_claims: another import took this trace over)
  │   ├── StoreError
  │   │   └── StorageFullError                 4
  │   ├── PortInUseError
  │   ├── FileWriteError                       (files: an output file could not be written; says what was kept)
  │   │   └── OutputDiskFullError              4 (files: the output file's disk is full)
  │   ├── UnknownGpuError, UnsupportedPrecisionError   (plan.catalog)
  │   │   └── UnsupportedKernelError           (plan.kernels: an attention kernel not measured on this GPU)
  │   ├── UnknownModelTypeError                (plan.models)
  │   ├── CalibrationRefusedError              (plan.calibration)
  │   ├── RuleFileError                        (alerts.rules)
  │   └── ExprError                            (alerts.expr)
  ├── GateFailedError                          1
  ├── UnavailableError                         3
  │   ├── BackendUnavailableError
  │   │   └── WireError                        (k8s.wire)
  │   ├── CannotAnswerError                    (reader.protocols: a reader that cannot answer that question)
  │   ├── FleetStartError                      (fleet.procs: a process of `demo --fleet` did not come up in time)
  │   ├── HttpUnavailableError                 (http_client: one mapping of every transport failure)
  │   ├── PrometheusUnavailableError           (reader.prometheus_api)
  │   ├── ScrapeUnavailableError               (workload.inference.scrape)
  │   │   └── ScrapeRefusedError               (workload.inference.scrape: a page over the scrape limits)
  │   ├── TargetUnreachableError               (bench.serve.runner)
  │   └── _AllFailed                           (cli.bench: every request of a load run failed)
  └── MonitorUsageError                        2
"""

from __future__ import annotations

import os
import stat

EXIT_OK = 0
EXIT_GATE = 1
EXIT_BAD_INPUT = 2
EXIT_UNAVAILABLE = 3
EXIT_STORAGE_FULL = 4


def shown(value: object, limit: int = 40, *, quote: bool = True) -> str:
    """What the user gave, quoted for a sentence (or bare, `quote=False`), cut after `limit`
    characters: an error answers a 40,000-character query value without echoing it whole."""
    text = str(value)
    cut = text[:limit]
    said = repr(cut) if quote else cut
    return said if len(text) <= limit else f"{said}… ({len(text):,} characters)"


class GpulensError(Exception):
    """Root of every error gpulens raises on purpose. `str(err)` is a complete sentence for a user."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} {self.hint}" if self.hint else self.message


class BadInputError(GpulensError):
    """Something the user typed or pointed at is wrong (an argument, a file, a config field)."""


class TraceError(BadInputError):
    """A trace cannot be read at all (missing, unreadable, wrong format)."""


class StoreError(BadInputError):
    """The store cannot be opened or written (path, permissions, corrupt file, newer schema)."""


class StorageFullError(StoreError):
    """The store's disk (or its size limit) is full: not bad input, so its own exit code.
    Data committed before stays readable; the write that failed is kept for a retry."""

    exit_code = EXIT_STORAGE_FULL


class PortInUseError(BadInputError):
    """A listen address is taken."""


class GateFailedError(GpulensError):
    """A check the caller gates on failed (a missed SLO, too many failed requests, a regression)."""

    exit_code = EXIT_GATE


class UnavailableError(GpulensError):
    """An outside system gpulens needs cannot be reached or does not answer usably (a driver, a
    server): nothing the user typed is wrong, so retrying later or starting it may help."""

    exit_code = EXIT_UNAVAILABLE


class BackendUnavailableError(UnavailableError):
    """A GPU backend cannot start (no driver, no GPU)."""


class MonitorUsageError(GpulensError):
    """A monitor API is used in the wrong order (e.g. a step inside a step)."""


# What a path may be besides a regular file or a folder, as a person would name it. Reading one
# blocks forever (a FIFO with no writer) or never ends (/dev/zero, /dev/urandom).
_SPECIAL_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                  (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def special_file_kind(path: str | os.PathLike[str]) -> str | None:
    """What `path` is when it is neither a regular file nor a folder ("a FIFO (named pipe)", "a
    character device", ...), else None (a missing path too: the caller's open says so). Symlinks
    are followed, so /dev/stdin and links to devices are seen for what they point at."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return next((name for is_kind, name in _SPECIAL_KINDS if is_kind(mode)), None)


def refuse_special_file(path: str | os.PathLike[str], what: str, *, hint: str,
                        error: type[BadInputError] = BadInputError) -> None:
    """Every reader of a file a user names calls this before opening it: a FIFO, a device or a
    socket is refused by its kind with one sentence (`error`, exit 2), instead of a hang."""
    kind = special_file_kind(path)
    if kind is not None:
        raise error(f"{what[:1].upper()}{what[1:]} {path} is {kind}, not a regular file.", hint=hint)
