//! Versioned schema of both backends. A migration is applied once, in a transaction
//! together with its row in `schema_migrations`; open applies whatever is missing.
//! Never edit a released migration: append a new version.
//!
//! Columns that hold provider JSON (`payload`, `usage`) are TEXT on both backends, not
//! JSONB: the archive must give back the exact bytes it was given, and JSONB re-formats
//! numbers and key order.
//!
//! `runs.terminal_seq` and `runs.usage_seq` are bookkeeping, not part of `RunRecord`:
//! they let the upsert keep the highest-seq terminal status and usage when batches of one
//! run commit out of order.

/// `(version, sql)` for SQLite, ascending.
pub(crate) const SQLITE: &[(i64, &str)] = &[(
    1,
    "
CREATE TABLE events (
    run_id      TEXT    NOT NULL,
    seq         INTEGER NOT NULL,
    journal_seq INTEGER NOT NULL,
    tenant      TEXT    NOT NULL,
    session_key TEXT,
    stream      TEXT    NOT NULL,
    phase       TEXT,
    ts_ms       INTEGER NOT NULL,
    payload     TEXT    NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
CREATE INDEX events_journal ON events (journal_seq);
CREATE TABLE runs (
    run_id       TEXT    NOT NULL PRIMARY KEY,
    tenant       TEXT    NOT NULL,
    session_key  TEXT,
    provider     TEXT,
    model        TEXT,
    status       TEXT    NOT NULL,
    stop_reason  TEXT,
    terminal_seq INTEGER,
    usage        TEXT,
    usage_seq    INTEGER,
    first_seq    INTEGER NOT NULL,
    last_seq     INTEGER NOT NULL,
    first_ts_ms  INTEGER NOT NULL,
    last_ts_ms   INTEGER NOT NULL,
    event_count  INTEGER NOT NULL
);
CREATE INDEX runs_by_time ON runs (first_ts_ms DESC, run_id);
CREATE INDEX runs_by_tenant_time ON runs (tenant, first_ts_ms DESC, run_id);
CREATE INDEX runs_by_session ON runs (session_key);
CREATE TABLE raw_chunks (
    run_id       TEXT    NOT NULL,
    chunk        INTEGER NOT NULL,
    tenant       TEXT    NOT NULL,
    family       TEXT    NOT NULL,
    ingest_ts_ms INTEGER NOT NULL,
    close        TEXT,
    body         BLOB    NOT NULL,
    PRIMARY KEY (run_id, chunk)
);
",
)];

/// `(version, sql)` for PostgreSQL, ascending.
pub(crate) const POSTGRES: &[(i64, &str)] = &[(
    1,
    "
CREATE TABLE events (
    run_id      TEXT   NOT NULL,
    seq         BIGINT NOT NULL,
    journal_seq BIGINT NOT NULL,
    tenant      TEXT   NOT NULL,
    session_key TEXT,
    stream      TEXT   NOT NULL,
    phase       TEXT,
    ts_ms       BIGINT NOT NULL,
    payload     TEXT   NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE INDEX events_journal ON events (journal_seq);
CREATE TABLE runs (
    run_id       TEXT   NOT NULL PRIMARY KEY,
    tenant       TEXT   NOT NULL,
    session_key  TEXT,
    provider     TEXT,
    model        TEXT,
    status       TEXT   NOT NULL,
    stop_reason  TEXT,
    terminal_seq BIGINT,
    usage        TEXT,
    usage_seq    BIGINT,
    first_seq    BIGINT NOT NULL,
    last_seq     BIGINT NOT NULL,
    first_ts_ms  BIGINT NOT NULL,
    last_ts_ms   BIGINT NOT NULL,
    event_count  BIGINT NOT NULL
);
CREATE INDEX runs_by_time ON runs (first_ts_ms DESC, run_id);
CREATE INDEX runs_by_tenant_time ON runs (tenant, first_ts_ms DESC, run_id);
CREATE INDEX runs_by_session ON runs (session_key);
CREATE TABLE raw_chunks (
    run_id       TEXT   NOT NULL,
    chunk        BIGINT NOT NULL,
    tenant       TEXT   NOT NULL,
    family       TEXT   NOT NULL,
    ingest_ts_ms BIGINT NOT NULL,
    close        TEXT,
    body         BYTEA  NOT NULL,
    PRIMARY KEY (run_id, chunk)
);
",
)];

/// Creates the bookkeeping table; both backends accept this statement.
pub(crate) const CREATE_SCHEMA_MIGRATIONS: &str = "CREATE TABLE IF NOT EXISTS schema_migrations (
    version       BIGINT NOT NULL PRIMARY KEY,
    applied_at_ms BIGINT NOT NULL
)";

/// Milliseconds since the Unix epoch, for `applied_at_ms`.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
