"""SQLite schema of the store, as statements that the versioned migrations in `migrations.py` run.

Every table the store holds is created here, the feature tables (alerts, baselines, runs) included:
the store owns its SQL, and a feature reaches its table through a repository in `gpulens.store`.
"""

CORE_TABLES = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS series (
  id INTEGER PRIMARY KEY,
  name TEXT NOT NULL,
  labels TEXT NOT NULL,
  UNIQUE (name, labels)
)""",
    "CREATE TABLE IF NOT EXISTS samples (series_id INTEGER NOT NULL, t REAL NOT NULL, value REAL NOT NULL)",
    "CREATE INDEX IF NOT EXISTS samples_by_series_time ON samples (series_id, t)",
    """CREATE TABLE IF NOT EXISTS rollup_1m (
  series_id INTEGER NOT NULL, bucket REAL NOT NULL,
  vmin REAL NOT NULL, vmax REAL NOT NULL, vsum REAL NOT NULL, n INTEGER NOT NULL,
  PRIMARY KEY (series_id, bucket)
) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS rollup_1h (
  series_id INTEGER NOT NULL, bucket REAL NOT NULL,
  vmin REAL NOT NULL, vmax REAL NOT NULL, vsum REAL NOT NULL, n INTEGER NOT NULL,
  PRIMARY KEY (series_id, bucket)
) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS events (
  id INTEGER PRIMARY KEY,
  t REAL NOT NULL,
  kind TEXT NOT NULL,
  labels TEXT NOT NULL,
  data TEXT NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS events_by_kind_time ON events (kind, t)",
    "CREATE INDEX IF NOT EXISTS events_by_time ON events (t)",
)

ALERT_TABLES = (
    """CREATE TABLE IF NOT EXISTS alert_history (
  id INTEGER PRIMARY KEY,
  fingerprint TEXT NOT NULL,
  rule TEXT NOT NULL,
  severity TEXT NOT NULL,
  labels TEXT NOT NULL,
  state TEXT NOT NULL,              -- pending | firing | resolved
  active_since REAL NOT NULL,       -- the condition first held
  fired_at REAL,
  resolved_at REAL,
  value REAL,
  summary TEXT NOT NULL,
  advice TEXT NOT NULL,
  annotations TEXT NOT NULL,
  silenced INTEGER NOT NULL DEFAULT 0
)""",
    "CREATE INDEX IF NOT EXISTS alert_history_by_state ON alert_history (state, active_since)",
    """CREATE TABLE IF NOT EXISTS alert_silences (
  id INTEGER PRIMARY KEY,
  matchers TEXT NOT NULL,           -- [[label, op, value], ...], op one of = != =~ !~
  starts_at REAL NOT NULL,
  ends_at REAL NOT NULL,
  comment TEXT NOT NULL,
  created_at REAL NOT NULL
)""",
)

BASELINE_TABLES = (
    """CREATE TABLE IF NOT EXISTS alert_baselines (
  series_id INTEGER PRIMARY KEY,
  name TEXT NOT NULL,
  labels TEXT NOT NULL,
  state TEXT NOT NULL,                -- learning | ready | frozen
  learn_start REAL NOT NULL,          -- first sample, or the moment of the last reset
  learn_seconds REAL NOT NULL,
  computed_at REAL,
  window_start REAL,
  window_end REAL,
  samples INTEGER NOT NULL DEFAULT 0,
  median REAL,
  mad REAL,
  quantiles TEXT NOT NULL DEFAULT '{}',
  profile TEXT NOT NULL DEFAULT '{}'
)""",
)

RUN_TABLES = (
    """CREATE TABLE IF NOT EXISTS runs (
  id INTEGER PRIMARY KEY,
  kind TEXT NOT NULL,
  name TEXT NOT NULL,
  created REAL NOT NULL,
  started REAL,
  ended REAL,
  config TEXT NOT NULL,
  summary TEXT NOT NULL,
  fingerprint TEXT NOT NULL,
  verdict TEXT,
  baseline INTEGER NOT NULL DEFAULT 0
)""",
    "CREATE INDEX IF NOT EXISTS runs_by_kind_name ON runs (kind, name, id)",
    """CREATE TABLE IF NOT EXISTS run_samples (
  run_id INTEGER NOT NULL,
  metric TEXT NOT NULL,
  vals TEXT NOT NULL,
  PRIMARY KEY (run_id, metric)
) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS run_changes (
  run_id INTEGER NOT NULL,
  previous_run_id INTEGER NOT NULL,
  section TEXT NOT NULL,
  key TEXT NOT NULL,
  old TEXT,
  new TEXT
)""",
    "CREATE INDEX IF NOT EXISTS run_changes_by_run ON run_changes (run_id)",
)

# Alert notifications a notifier could not deliver, kept for the next try (after a restart too).
OUTBOX_TABLES = (
    """CREATE TABLE IF NOT EXISTS notification_outbox (
  id INTEGER PRIMARY KEY,
  target TEXT NOT NULL,               -- the notifier's address (a webhook URL)
  body BLOB NOT NULL,
  created REAL NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS notification_outbox_by_target ON notification_outbox (target, id)",
)

# Roll-up widths in seconds, by table.
ROLLUPS: dict[str, int] = {"rollup_1m": 60, "rollup_1h": 3600}

# A flush groups its rows once into per-minute partial aggregates (temp.rollup_delta), then folds
# every roll-up table from those (min, max, sum and count compose; each width is a multiple of the
# delta's): incremental, so a bucket written in several flushes ends with the same min/max/sum/count
# as a recomputation from raw samples, and the raw rows are sorted by bucket once, not per table.
ROLLUP_DELTA_SECONDS = 60
assert all(width % ROLLUP_DELTA_SECONDS == 0 for width in ROLLUPS.values())
ROLLUP_DELTA_TABLE = ("CREATE TEMP TABLE IF NOT EXISTS rollup_delta "
                      "(series_id INTEGER, bucket INTEGER, vmin REAL, vmax REAL, vsum REAL, n INTEGER)")
_ROLLUP_DELTA_FROM = f"""
INSERT INTO temp.rollup_delta (series_id, bucket, vmin, vmax, vsum, n)
SELECT series_id, CAST(t / {ROLLUP_DELTA_SECONDS} AS INTEGER) * {ROLLUP_DELTA_SECONDS}, min(value), max(value), sum(value), count(*)
FROM {{source}} GROUP BY 1, 2
"""
ROLLUP_DELTA = _ROLLUP_DELTA_FROM.format(source="temp.batch")
# The same grouping read straight from the rows this flush just inserted (rowid above the table's
# largest before it, one parameter): no copy of the batch into temp.batch.
ROLLUP_DELTA_INSERTED = _ROLLUP_DELTA_FROM.format(source="samples NOT INDEXED WHERE rowid > ?")
ROLLUP_UPSERT_DELTA = """
INSERT INTO {table} (series_id, bucket, vmin, vmax, vsum, n)
SELECT series_id, CAST(bucket / {width} AS INTEGER) * {width}, min(vmin), max(vmax), sum(vsum), sum(n)
FROM temp.rollup_delta WHERE true GROUP BY 1, 2
ON CONFLICT (series_id, bucket) DO UPDATE SET
  vmin = min(vmin, excluded.vmin), vmax = max(vmax, excluded.vmax),
  vsum = vsum + excluded.vsum, n = n + excluded.n
"""
# Rowids are handed out above the largest while it stays below SQLite's limit; near it they are
# random, and the fold goes through temp.batch.
ROWID_SEQUENTIAL_BELOW = 1 << 62

# How far each recorded trace has been imported (`gpulens replay`): one row per trace, advanced in the
# same transaction as the samples it covers, so concurrent, repeated or resumed imports store each
# sample once (store/trace_claims.py).
TRACE_CLAIM_TABLES = (
    """CREATE TABLE IF NOT EXISTS trace_claims (
  trace_id TEXT PRIMARY KEY,          -- sha256 of the telemetry file's first line(s): pipeline.ingest.trace_identity
  path TEXT NOT NULL,                 -- where it was last imported from (for messages only)
  position_t REAL,                    -- every sample and event recorded at or before this is stored
  samples INTEGER NOT NULL DEFAULT 0, -- GPU samples imported from it, all imports together
  prefix_bytes INTEGER NOT NULL DEFAULT 0,  -- the file's size when an import of it began ...
  prefix_sha TEXT NOT NULL DEFAULT '',      -- ... and the sha256 of those bytes: a grown file keeps them
  owner TEXT,                         -- "pid:start" of the import running now, NULL when none
  updated REAL NOT NULL
)""",
)
