//! Versioned schema of both backends. A migration is applied once, in a transaction
//! together with its row in `schema_migrations`; open applies whatever is missing.
//! Never edit a released migration: append a new version.
//!
//! Columns that hold provider JSON (`payload`, `usage`) are TEXT on both backends, not
//! JSONB: the archive must give back the exact bytes it was given, and JSONB re-formats
//! numbers and key order.
//!
//! Version 2 puts the tenant into every key (docs/architecture.md §3: a run id is unique only
//! within its tenant): `events (tenant, run_id, seq)`, `runs (tenant, run_id)`, `raw_chunks
//! (tenant, run_id, chunk)`. Rows of version 1 are kept: the columns are the same, only the keys
//! and the indexes that order by run id change. SQLite cannot alter a primary key, so
//! there each table is rebuilt (create, copy, drop, rename) inside the migration's
//! transaction; PostgreSQL swaps the constraint in place.
//!
//! `runs.terminal_seq` and `runs.usage_seq` are bookkeeping, not part of `RunRecord`:
//! they let the upsert keep the highest-seq terminal status and usage when batches of one
//! run commit out of order.

/// `(version, sql)` for SQLite, ascending.
pub(crate) const SQLITE: &[(i64, &str)] = &[
    (
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
    ),
    (2, SQLITE_V2),
    (3, SQLITE_V3),
    (4, SQLITE_V4),
    (5, "ALTER TABLE runs ADD COLUMN stripped_at_ms INTEGER;"),
    (6, SQLITE_V6),
    (7, SQLITE_V7),
    (8, "ALTER TABLE runs ADD COLUMN exported_at_ms INTEGER;"),
    (9, SQLITE_V9),
];

/// Version 2 on SQLite: the tenant joins every primary key; tables rebuilt, rows copied.
const SQLITE_V2: &str = "
CREATE TABLE events_v2 (
    run_id      TEXT    NOT NULL,
    seq         INTEGER NOT NULL,
    journal_seq INTEGER NOT NULL,
    tenant      TEXT    NOT NULL,
    session_key TEXT,
    stream      TEXT    NOT NULL,
    phase       TEXT,
    ts_ms       INTEGER NOT NULL,
    payload     TEXT    NOT NULL,
    PRIMARY KEY (tenant, run_id, seq)
) WITHOUT ROWID;
INSERT INTO events_v2 (run_id, seq, journal_seq, tenant, session_key, stream, phase, ts_ms,
    payload)
    SELECT run_id, seq, journal_seq, tenant, session_key, stream, phase, ts_ms, payload
    FROM events;
DROP TABLE events;
ALTER TABLE events_v2 RENAME TO events;
CREATE INDEX events_journal ON events (journal_seq);
CREATE TABLE runs_v2 (
    run_id       TEXT    NOT NULL,
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
    event_count  INTEGER NOT NULL,
    PRIMARY KEY (tenant, run_id)
);
INSERT INTO runs_v2 (run_id, tenant, session_key, provider, model, status, stop_reason,
    terminal_seq, usage, usage_seq, first_seq, last_seq, first_ts_ms, last_ts_ms, event_count)
    SELECT run_id, tenant, session_key, provider, model, status, stop_reason, terminal_seq,
    usage, usage_seq, first_seq, last_seq, first_ts_ms, last_ts_ms, event_count FROM runs;
DROP TABLE runs;
ALTER TABLE runs_v2 RENAME TO runs;
CREATE INDEX runs_by_time ON runs (first_ts_ms DESC, tenant, run_id);
CREATE INDEX runs_by_tenant_time ON runs (tenant, first_ts_ms DESC, run_id);
CREATE INDEX runs_by_session ON runs (session_key);
CREATE TABLE raw_chunks_v2 (
    run_id       TEXT    NOT NULL,
    chunk        INTEGER NOT NULL,
    tenant       TEXT    NOT NULL,
    family       TEXT    NOT NULL,
    ingest_ts_ms INTEGER NOT NULL,
    close        TEXT,
    body         BLOB    NOT NULL,
    PRIMARY KEY (tenant, run_id, chunk)
);
INSERT INTO raw_chunks_v2 (run_id, chunk, tenant, family, ingest_ts_ms, close, body)
    SELECT run_id, chunk, tenant, family, ingest_ts_ms, close, body FROM raw_chunks;
DROP TABLE raw_chunks;
ALTER TABLE raw_chunks_v2 RENAME TO raw_chunks;
";

/// `(version, sql)` for PostgreSQL, ascending.
pub(crate) const POSTGRES: &[(i64, &str)] = &[
    (
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
    ),
    (2, POSTGRES_V2),
    (3, POSTGRES_V3),
    (4, POSTGRES_V4),
    (5, "ALTER TABLE runs ADD COLUMN stripped_at_ms BIGINT;"),
    (6, POSTGRES_V6),
    (7, POSTGRES_V7),
    (8, "ALTER TABLE runs ADD COLUMN exported_at_ms BIGINT;"),
    (9, POSTGRES_V9),
];

/// Version 2 on PostgreSQL: the tenant joins every primary key, in place (rows kept).
const POSTGRES_V2: &str = "
ALTER TABLE events DROP CONSTRAINT events_pkey;
ALTER TABLE events ADD CONSTRAINT events_pkey PRIMARY KEY (tenant, run_id, seq);
ALTER TABLE runs DROP CONSTRAINT runs_pkey;
ALTER TABLE runs ADD CONSTRAINT runs_pkey PRIMARY KEY (tenant, run_id);
DROP INDEX runs_by_time;
CREATE INDEX runs_by_time ON runs (first_ts_ms DESC, tenant, run_id);
ALTER TABLE raw_chunks DROP CONSTRAINT raw_chunks_pkey;
ALTER TABLE raw_chunks ADD CONSTRAINT raw_chunks_pkey PRIMARY KEY (tenant, run_id, chunk);
";

/// Version 3 on SQLite: provenance and generations (governable history). `runs` gains what
/// made its events and its current generation (1 for every existing run);
/// `event_generations` keeps the events a backfill replaced, `run_generations` what had
/// made them and when they were replaced.
const SQLITE_V3: &str = "
ALTER TABLE runs ADD COLUMN adapter TEXT;
ALTER TABLE runs ADD COLUMN adapter_version INTEGER;
ALTER TABLE runs ADD COLUMN grammar_version INTEGER;
ALTER TABLE runs ADD COLUMN generation INTEGER NOT NULL DEFAULT 1;
CREATE TABLE event_generations (
    tenant      TEXT    NOT NULL,
    run_id      TEXT    NOT NULL,
    generation  INTEGER NOT NULL,
    seq         INTEGER NOT NULL,
    journal_seq INTEGER NOT NULL,
    session_key TEXT,
    stream      TEXT    NOT NULL,
    phase       TEXT,
    ts_ms       INTEGER NOT NULL,
    payload     TEXT    NOT NULL,
    PRIMARY KEY (tenant, run_id, generation, seq)
) WITHOUT ROWID;
CREATE TABLE run_generations (
    tenant          TEXT    NOT NULL,
    run_id          TEXT    NOT NULL,
    generation      INTEGER NOT NULL,
    adapter         TEXT,
    adapter_version INTEGER,
    grammar_version INTEGER,
    event_count     INTEGER NOT NULL,
    replaced_at_ms  INTEGER NOT NULL,
    PRIMARY KEY (tenant, run_id, generation)
);
";

/// Version 3 on PostgreSQL: see [`SQLITE_V3`].
const POSTGRES_V3: &str = "
ALTER TABLE runs ADD COLUMN adapter TEXT, ADD COLUMN adapter_version BIGINT,
    ADD COLUMN grammar_version BIGINT, ADD COLUMN generation BIGINT NOT NULL DEFAULT 1;
CREATE TABLE event_generations (
    tenant      TEXT   NOT NULL,
    run_id      TEXT   NOT NULL,
    generation  BIGINT NOT NULL,
    seq         BIGINT NOT NULL,
    journal_seq BIGINT NOT NULL,
    session_key TEXT,
    stream      TEXT   NOT NULL,
    phase       TEXT,
    ts_ms       BIGINT NOT NULL,
    payload     TEXT   NOT NULL,
    PRIMARY KEY (tenant, run_id, generation, seq)
);
CREATE TABLE run_generations (
    tenant          TEXT   NOT NULL,
    run_id          TEXT   NOT NULL,
    generation      BIGINT NOT NULL,
    adapter         TEXT,
    adapter_version BIGINT,
    grammar_version BIGINT,
    event_count     BIGINT NOT NULL,
    replaced_at_ms  BIGINT NOT NULL,
    PRIMARY KEY (tenant, run_id, generation)
);
";

/// Version 4 on SQLite: the erasure audit (who, when, what — ids as hashes, no content).
const SQLITE_V4: &str = "
CREATE TABLE erasures (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms      INTEGER NOT NULL,
    actor      TEXT    NOT NULL,
    tenant     TEXT    NOT NULL,
    scope      TEXT    NOT NULL,
    scope_hash TEXT    NOT NULL,
    run_hashes TEXT    NOT NULL,
    events     INTEGER NOT NULL,
    raw_chunks INTEGER NOT NULL
);
";

/// Version 4 on PostgreSQL: see [`SQLITE_V4`].
const POSTGRES_V4: &str = "
CREATE TABLE erasures (
    id         BIGSERIAL PRIMARY KEY,
    at_ms      BIGINT NOT NULL,
    actor      TEXT   NOT NULL,
    tenant     TEXT   NOT NULL,
    scope      TEXT   NOT NULL,
    scope_hash TEXT   NOT NULL,
    run_hashes TEXT   NOT NULL,
    events     BIGINT NOT NULL,
    raw_chunks BIGINT NOT NULL
);
";

// Version 5 (both backends): `runs.stripped_at_ms`, when retention stubbed the run.

/// Version 6 on SQLite: full-text search over final answers (FTS5, `unicode61` words,
/// `secure-delete` so an erased answer leaves no trace in the index), filled with the
/// answers already archived.
const SQLITE_V6: &str = "
CREATE VIRTUAL TABLE run_search USING fts5(
    tenant UNINDEXED, run_id UNINDEXED, seq UNINDEXED, answer, tokenize = 'unicode61'
);
INSERT INTO run_search (run_search, rank) VALUES ('secure-delete', 1);
INSERT INTO run_search (tenant, run_id, seq, answer)
    SELECT tenant, run_id, seq, COALESCE(json_extract(payload, '$.data.text'),
                                         json_extract(payload, '$.data.delta'))
    FROM events WHERE stream = 'assistant' AND phase = 'final_answer'
      AND COALESCE(json_extract(payload, '$.data.text'), json_extract(payload, '$.data.delta'))
          IS NOT NULL;
";

/// Version 6 on PostgreSQL: the same over a `tsvector` (`simple` configuration: no
/// language's stemming or stop words, as answers come in every language) with a GIN index.
const POSTGRES_V6: &str = "
CREATE TABLE run_search (
    tenant TEXT   NOT NULL,
    run_id TEXT   NOT NULL,
    seq    BIGINT NOT NULL,
    answer TEXT   NOT NULL,
    doc    tsvector GENERATED ALWAYS AS (to_tsvector('simple', answer)) STORED,
    PRIMARY KEY (tenant, run_id, seq)
);
CREATE INDEX run_search_doc ON run_search USING GIN (doc);
INSERT INTO run_search (tenant, run_id, seq, answer)
    SELECT tenant, run_id, seq, COALESCE(payload::json->'data'->>'text',
                                         payload::json->'data'->>'delta')
    FROM events WHERE stream = 'assistant' AND phase = 'final_answer'
      AND COALESCE(payload::json->'data'->>'text', payload::json->'data'->>'delta') IS NOT NULL;
";

/// Version 7 on SQLite: accounting — token counts and first-token times per run (runs
/// archived before stay NULL).
const SQLITE_V7: &str = "
ALTER TABLE runs ADD COLUMN input_tokens INTEGER;
ALTER TABLE runs ADD COLUMN output_tokens INTEGER;
ALTER TABLE runs ADD COLUMN reasoning_tokens INTEGER;
ALTER TABLE runs ADD COLUMN cache_read_tokens INTEGER;
ALTER TABLE runs ADD COLUMN cache_write_tokens INTEGER;
ALTER TABLE runs ADD COLUMN first_token_ts_ms INTEGER;
ALTER TABLE runs ADD COLUMN first_answer_ts_ms INTEGER;
";

/// Version 7 on PostgreSQL: see [`SQLITE_V7`].
const POSTGRES_V7: &str = "
ALTER TABLE runs ADD COLUMN input_tokens BIGINT, ADD COLUMN output_tokens BIGINT, ADD COLUMN reasoning_tokens BIGINT, ADD COLUMN cache_read_tokens BIGINT, ADD COLUMN cache_write_tokens BIGINT, ADD COLUMN first_token_ts_ms BIGINT, ADD COLUMN first_answer_ts_ms BIGINT;
";

// Version 8 (both backends): `runs.exported_at_ms`, when the continuous trace export sent
// the run.

/// Version 9 on SQLite: the opt-in search over thinking — one row per reasoning segment,
/// filled by the archiver's thinking indexer (`--search-thinking`) once a run ended, and
/// `runs.thinking_indexed_at_ms`, when it was.
const SQLITE_V9: &str = "
CREATE VIRTUAL TABLE thinking_search USING fts5(
    tenant UNINDEXED, run_id UNINDEXED, seq UNINDEXED, thinking, tokenize = 'unicode61'
);
INSERT INTO thinking_search (thinking_search, rank) VALUES ('secure-delete', 1);
ALTER TABLE runs ADD COLUMN thinking_indexed_at_ms INTEGER;
";

/// Version 9 on PostgreSQL: see [`SQLITE_V9`].
const POSTGRES_V9: &str = "
CREATE TABLE thinking_search (
    tenant   TEXT   NOT NULL,
    run_id   TEXT   NOT NULL,
    seq      BIGINT NOT NULL,
    thinking TEXT   NOT NULL,
    doc      tsvector GENERATED ALWAYS AS (to_tsvector('simple', thinking)) STORED,
    PRIMARY KEY (tenant, run_id, seq)
);
CREATE INDEX thinking_search_doc ON thinking_search USING GIN (doc);
ALTER TABLE runs ADD COLUMN thinking_indexed_at_ms BIGINT;
";

/// Creates the bookkeeping table; both backends accept this statement.
pub(crate) const CREATE_SCHEMA_MIGRATIONS: &str = "CREATE TABLE IF NOT EXISTS schema_migrations (
    version       BIGINT NOT NULL PRIMARY KEY,
    applied_at_ms BIGINT NOT NULL
)";

/// Milliseconds since the Unix epoch, for `applied_at_ms`.
pub(crate) use streamgate_grammar::clock::now_ms;

#[cfg(test)]
mod tests {
    /// The upgrade tests (`tests/suite.rs`) build a version-1 archive from copies of the
    /// released version-1 SQL; this keeps the copies and the migrations identical (and so
    /// guards against editing version 1).
    #[test]
    fn version_1_is_frozen() {
        assert_eq!(
            super::SQLITE[0],
            (1, include_str!("../tests/v1/sqlite.sql"))
        );
        assert_eq!(
            super::POSTGRES[0],
            (1, include_str!("../tests/v1/postgres.sql"))
        );
        assert_eq!(super::SQLITE.len(), super::POSTGRES.len());
    }
}
