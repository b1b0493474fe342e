"""SQLite schema of the store. Each later feature adds its own tables with `Store.ensure_schema`."""

SCHEMA_VERSION = 1

CORE_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS series (
  id INTEGER PRIMARY KEY,
  name TEXT NOT NULL,
  labels TEXT NOT NULL,
  UNIQUE (name, labels)
);
CREATE TABLE IF NOT EXISTS samples (series_id INTEGER NOT NULL, t REAL NOT NULL, value REAL NOT NULL);
CREATE INDEX IF NOT EXISTS samples_by_series_time ON samples (series_id, t);
CREATE TABLE IF NOT EXISTS rollup_1m (
  series_id INTEGER NOT NULL, bucket REAL NOT NULL,
  vmin REAL NOT NULL, vmax REAL NOT NULL, vsum REAL NOT NULL, n INTEGER NOT NULL,
  PRIMARY KEY (series_id, bucket)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS rollup_1h (
  series_id INTEGER NOT NULL, bucket REAL NOT NULL,
  vmin REAL NOT NULL, vmax REAL NOT NULL, vsum REAL NOT NULL, n INTEGER NOT NULL,
  PRIMARY KEY (series_id, bucket)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
  id INTEGER PRIMARY KEY,
  t REAL NOT NULL,
  kind TEXT NOT NULL,
  labels TEXT NOT NULL,
  data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_kind_time ON events (kind, t);
CREATE INDEX IF NOT EXISTS events_by_time ON events (t);
"""

# Roll-up widths in seconds, by table.
ROLLUPS: dict[str, int] = {"rollup_1m": 60, "rollup_1h": 3600}

# Folds the pending batch (temp.batch) into a roll-up table: incremental, so a bucket written in
# several flushes ends with the same min/max/sum/count as a recomputation from raw samples.
ROLLUP_UPSERT = """
INSERT INTO {table} (series_id, bucket, vmin, vmax, vsum, n)
SELECT series_id, CAST(t / {width} AS INTEGER) * {width}, min(value), max(value), sum(value), count(*)
FROM temp.batch WHERE true GROUP BY 1, 2
ON CONFLICT (series_id, bucket) DO UPDATE SET
  vmin = min(vmin, excluded.vmin), vmax = max(vmax, excluded.vmax),
  vsum = vsum + excluded.vsum, n = n + excluded.n
"""
