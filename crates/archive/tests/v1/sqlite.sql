
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
