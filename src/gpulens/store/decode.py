"""Decoding what the store reads back: the one place its JSON columns become Python, and the one
statement of which sample values a read trusts.

Only gpulens writes a store, and it writes JSON objects in `labels` and `data` (lists or any JSON
value in a few feature columns) and numbers within ±MAX_ABS_VALUE in `value`. A JSON column that
does not decode to what was written means a damaged or hand-edited file: it is refused with one
sentence naming the store, the table and the row (`StoreError`, exit 2), here, before an analysis
trips over it far away. A sample value that is not a number in range (a text in the REAL column, an
infinity an older gpulens stored before the door refused it) is left out by every read, in SQL
(`SANE_VALUE`, `SANE_ROLLUP`; `SANE_TIME` where the caller gives no window), as `time_range` leaves
out times it cannot trust: one bad sample among millions must not make a week of data unreadable.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from gpulens.errors import StoreError, shown
from gpulens.units import MAX_ABS_VALUE, MAX_TIME_SECONDS, MIN_TIME_SECONDS

RESTORE_HINT = "Restore it from a backup, or re-import its trace into a new store."

# The samples a read keeps: a number within what the door lets in. A TEXT or BLOB value (SQLite is
# dynamically typed: REAL affinity keeps a text that is not a number as text) sorts above every
# number, so the upper bound leaves it out; NaN is never stored (SQLite turns it into NULL).
SANE_VALUE = f"value BETWEEN {-MAX_ABS_VALUE!r} AND {MAX_ABS_VALUE!r}"
# A sample time a read not bounded by the caller's window keeps (the newest sample, the samples
# committed since a cursor): a text sorts after every number, so `ORDER BY t DESC` would pick it.
SANE_TIME = f"t BETWEEN {MIN_TIME_SECONDS!r} AND {MAX_TIME_SECONDS!r}"
# A roll-up bucket, likewise; its sum may pass ±MAX_ABS_VALUE (many large values) but stays finite.
SANE_ROLLUP = (f"vmin BETWEEN {-MAX_ABS_VALUE!r} AND {MAX_ABS_VALUE!r} AND vmax BETWEEN {-MAX_ABS_VALUE!r} "
               f"AND {MAX_ABS_VALUE!r} AND vsum BETWEEN -1e300 AND 1e300")

_TEXT = frozenset((str,))
_WHAT = {dict: "a JSON object", list: "a JSON list", object: "JSON"}


def json_column(
    text: Any, path: str | os.PathLike[str], table: str, row: object, column: str, kind: type = dict
) -> Any:
    """The JSON value stored in `column` of `table`'s `row` (its id, or a description of its key),
    which must be of `kind` (dict, list, or object for any JSON value). Anything else raises the
    damaged-row StoreError. One `json.loads` and a type check: the readers call it per row."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError, RecursionError):
        pass
    else:
        if kind is object or type(value) is kind:
            return value
    raise damaged_row(path, table, row, column, f"is not {_WHAT.get(kind, 'JSON')} ({shown(text)})")


def label_decoder(path: str | os.PathLike[str], table: str) -> Callable[[Any, int], dict[str, str]]:
    """A decoder of the `labels` column for one read: `decode(text, row_id)`. A label set is a JSON
    object of texts; each distinct one is decoded and checked once per read (they repeat: every
    request of a service carries the same), and every row gets its own copy."""
    seen: dict[Any, dict[str, str]] = {}

    def decode(text: Any, row: int) -> dict[str, str]:
        labels = seen.get(text)
        if labels is None:
            labels = json_column(text, path, table, row, "labels")
            if not _TEXT.issuperset(map(type, labels.values())):
                raise damaged_row(path, table, row, "labels", f"holds a value that is not text ({shown(text)})")
            seen[text] = labels
        return labels.copy()

    return decode


def damaged_row(path: str | os.PathLike[str], table: str, row: object, column: str, what: str) -> StoreError:
    """The one sentence for a row that is not what gpulens wrote: "The store PATH has a damaged row:
    the data column of events id 12 is not a JSON object ('{garbage')." and how to recover."""
    where = f"{table} id {row}" if isinstance(row, int) else f"{table} ({row})"
    return StoreError(f"The store {path} has a damaged row: the {column} column of {where} {what}.", hint=RESTORE_HINT)

