
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
