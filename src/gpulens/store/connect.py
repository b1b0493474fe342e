"""Opening a store file: WAL mode, retries while other processes create it, the schema
migrations, and the one mapping of SQLite's errors to gpulens errors (a full disk is its own)."""

from __future__ import annotations

import errno
import os
import sqlite3
import time
from pathlib import Path
from urllib.parse import quote

from gpulens.errors import StorageFullError, StoreError, refuse_special_file
from gpulens.store import migrations
from gpulens.store.migrations import SCHEMA_VERSION
from gpulens.store.schema import ROLLUP_DELTA_TABLE

# A burst (the rows a full disk held back, a large import) grows the WAL far past the ~4 MiB at which
# SQLite checkpoints, and without a limit the file stays that large for as long as the agent runs,
# holding the space a user just freed. With it, the WAL is cut back to this size when it next
# starts over. 16 MiB is above what steady sampling reaches (7 MiB at 8 GPUs x 10 Hz), so a
# normal WAL is never cut and grown again.
WAL_SIZE_LIMIT_BYTES = 16 * 2**20

OPEN_HINT = "Check that the path is writable and is a gpulens store (an SQLite file), or choose another --store."
ACCESS_HINT = "Check that --store points at a gpulens store you can read and write."


def storage_error(e: BaseException, path: Path, action: str, hint: str) -> StoreError:
    """The gpulens error for an SQLite or OS error: a full disk is its own class and exit code."""
    full = isinstance(e, sqlite3.OperationalError) and "full" in str(e).lower()
    full = full or (isinstance(e, OSError) and e.errno == errno.ENOSPC)
    # SQLite reports a WAL or shm file it cannot grow on a full disk as a plain I/O error
    full = full or (isinstance(e, sqlite3.OperationalError) and "i/o error" in str(e).lower() and _no_space_left(path))
    if full:
        return StorageFullError(
            f"The disk that holds the store {path} is full.",
            hint="Free some space (or lower retention), or point --store at another disk; the data written before is kept.",
        )
    return StoreError(f"Cannot {action} the store {path}: {e}.", hint=hint)


def _no_space_left(path: Path) -> bool:
    try:
        st = os.statvfs(path.parent)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 64 * 1024 or st.f_favail == 0


def _newer_schema(path: Path, version: int) -> StoreError:
    return StoreError(
        f"This store was written by a newer gpulens (schema {version}, this one knows {SCHEMA_VERSION}); "
        "upgrade gpulens or use another --store.",
        hint=f"The store is {path}.",
    )


def connect(path: Path, *, readonly: bool, busy_timeout_seconds: float) -> sqlite3.Connection:
    """Open the store file in WAL mode and migrate it to this gpulens' schema (see `migrations`)."""
    # SQLite would block forever opening a FIFO, and read a device without end
    refuse_special_file(path, "the store", hint="Point --store at a gpulens store (an SQLite file) or a new path.", error=StoreError)
    if path.is_dir():  # SQLite would answer "disk I/O error"
        inside = sorted(path.glob("*.db"))
        raise StoreError(
            f"The store {path} is a folder, not a store file.",
            hint=f"Point --store at the .db file: {inside[0]}." if len(inside) == 1
            else f"Point --store at one of its .db files: {', '.join(str(p) for p in inside[:4])}." if inside
            else f"Point --store at a .db file, e.g. {path / 'gpulens.db'}.",
        )
    if readonly and not path.exists():
        raise StoreError(
            f"There is no store at {path}.",
            hint="Point --store at a file that `gpulens agent` or `gpulens replay` wrote.",
        )
    if not readonly:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise storage_error(e, path, "create", OPEN_HINT) from None
            raise StoreError(
                f"Cannot create the folder for the store {path}: {e.strerror}.",
                hint="Choose a --store path in a folder you can write to.",
            ) from None
    # Several processes may create the same new store at once (the ranks of one job): switching
    # to WAL and migrating can then answer "locked" without waiting, so retry it all.
    if readonly:
        return _connect_readonly(path, busy_timeout_seconds)
    deadline = time.monotonic() + busy_timeout_seconds
    while True:
        conn = None
        try:
            conn = sqlite3.connect(path, timeout=busy_timeout_seconds, check_same_thread=False, isolation_level=None)
            conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_seconds * 1000)}")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT_BYTES}")
            _migrate(conn, path, readonly)
            conn.execute("CREATE TEMP TABLE IF NOT EXISTS batch (series_id INTEGER, t REAL, value REAL)")
            conn.execute(ROLLUP_DELTA_TABLE)
            return conn
        except sqlite3.OperationalError as e:
            if conn is not None:
                conn.close()
            if ("locked" in str(e) or "busy" in str(e)) and time.monotonic() < deadline:
                time.sleep(0.02)
                continue
            raise storage_error(e, path, "open", OPEN_HINT) from None
        except (sqlite3.DatabaseError, StoreError, migrations.NotAStore) as e:
            raise _open_failed(conn, path, e) from None

def _open_failed(conn: sqlite3.Connection | None, path: Path, e: Exception) -> StoreError:
    """Close what was opened; a gpulens error stays as it is, an SQLite one becomes one sentence."""
    if conn is not None:
        conn.close()
    if isinstance(e, migrations.NotAStore):
        return StoreError(
            f"{path} is an SQLite database but not a gpulens store: {e.why}.",
            hint="Point --store at a file that `gpulens agent` or `gpulens replay` wrote, or at a new path.",
        )
    return e if isinstance(e, StoreError) else StoreError(f"Cannot open the store {path}: {e}.", hint=OPEN_HINT)



def empty_store(path: str | os.PathLike[str]) -> StoreError:
    """The one sentence for a store file that holds nothing (zero bytes, or no schema yet)."""
    return StoreError(f"The store {path} is empty: nothing was ever recorded in it.",
                      hint="Run `gpulens agent` or `gpulens replay` into it first, or point --store at a store that holds data.")

def _open_ro(path: Path, busy_timeout_seconds: float, *, immutable: bool = False) -> sqlite3.Connection:
    uri = f"file:{quote(str(path.resolve()))}?mode=ro" + ("&immutable=1" if immutable else "")
    conn = sqlite3.connect(uri, uri=True, timeout=busy_timeout_seconds, check_same_thread=False, isolation_level=None)
    conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_seconds * 1000)}")
    return conn


def _connect_readonly(path: Path, busy_timeout_seconds: float) -> sqlite3.Connection:
    """Open for reading only (`mode=ro`): the journal mode is left as it is and a store on
    read-only media opens (as immutable, when SQLite cannot make its WAL index there). An older
    store is migrated once through a writable connection first, where the file allows it."""
    conn = None
    try:
        try:
            conn = _open_ro(path, busy_timeout_seconds)
            version = migrations.stored_version(conn)
        except sqlite3.OperationalError as e:
            if "unable to open" not in str(e) and "readonly" not in str(e):
                raise
            if conn is not None:
                conn.close()
            conn = _open_ro(path, busy_timeout_seconds, immutable=True)  # read-only media
            version = migrations.stored_version(conn)
        if version > SCHEMA_VERSION:
            raise _newer_schema(path, version)
        if version == 0:  # an empty file (or one a writer has not set up yet): no tables to read
            raise empty_store(path)
        if version < SCHEMA_VERSION:
            conn.close()
            conn = None
            _migrate_once(path, busy_timeout_seconds)
            conn = _open_ro(path, busy_timeout_seconds)
        conn.execute("CREATE TEMP TABLE IF NOT EXISTS batch (series_id INTEGER, t REAL, value REAL)")
        conn.execute(ROLLUP_DELTA_TABLE)
        return conn
    except (sqlite3.DatabaseError, StoreError, migrations.NotAStore) as e:
        raise _open_failed(conn, path, e) from None


def _migrate_once(path: Path, busy_timeout_seconds: float) -> None:
    """The one write a reader makes: bring an older store to this schema, when the file is writable."""
    try:
        connect(path, readonly=False, busy_timeout_seconds=busy_timeout_seconds).close()
    except StoreError as e:
        raise StoreError(
            f"The store {path} has an older schema and cannot be upgraded here ({e.message})",
            hint="Open it once with write access (e.g. `gpulens query` where it is writable), or use a copy.",
        ) from None


def _migrate(conn: sqlite3.Connection, path: Path, readonly: bool) -> None:
    """Bring the file to this gpulens' schema (see `migrations`), or refuse a newer one."""
    version = migrations.stored_version(conn)
    if readonly and version == 0:
        return  # nothing to read
    if version > SCHEMA_VERSION:
        raise _newer_schema(path, version)
    if version == SCHEMA_VERSION:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = migrations.stored_version(conn)  # another process may have just migrated
        if version > SCHEMA_VERSION:
            raise _newer_schema(path, version)
        migrations.migrate(conn, version)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise

