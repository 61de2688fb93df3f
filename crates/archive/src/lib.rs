//! The streamgate event archive (docs/architecture.md §5): the system of record for every canonical
//! event, behind one [`Store`] trait with an embedded SQLite backend (the default for
//! `streamgate up`) and a PostgreSQL backend for deployments.
//!
//! Both backends keep the same schema and the same semantics:
//!
//! - A run is identified by `(tenant, run_id)`: a run id is unique only within its tenant
//!   (docs/architecture.md §3), so every key and every per-run query names both.
//! - `events` is keyed by `(tenant, run_id, seq)`. Inserting is idempotent: an identical duplicate
//!   (a JetStream redelivery, a re-normalization) is counted, never re-written; the same
//!   key with different bytes is a *conflict*: the original row is kept, the newcomer is
//!   counted and logged. The event's canonical JSON line (`Event::to_json`) is stored
//!   verbatim in `payload` so a replay is byte-identical to what the normalizer published.
//! - `runs` holds one row per `(tenant, run_id)` and is updated in the same transaction as the events,
//!   once per run per batch, and in a way that does not depend on batch order (archiver
//!   replicas share one durable consumer, so batches of one run may commit out of order).
//! - `raw_chunks` optionally keeps the provider bytes of `SG_RAW`, keyed by
//!   `(tenant, run_id, chunk)`.
//!
//! - Runs have *generations* (docs/architecture.md §5, governable history): generation 1 is what
//!   the normalizer published live; a backfill ([`Store::write_generation`]) replaces a run's
//!   events with a re-normalization and keeps the old ones in `event_generations`, so
//!   replay reads the latest and an older generation stays readable. Each run records the
//!   adapter and grammar versions that made its current generation ([`Provenance`]).
//!
//! Schema version 2 introduced the tenant into the keys; opening a version-1 archive
//! migrates it in place, keeping its rows. Version 3 added provenance and generations.
//!
//! # Layout
//! - this file: the public data types, the [`Store`] trait and [`open_store`].
//! - [`error`] — [`ArchiveError`].
//! - `rows` (private): turning events into rows and per-run deltas, shared by both
//!   backends, plus the list cursor format.
//! - `migrations` (private): the versioned schema of both backends.
//! - [`sqlite`]: [`SqliteStore`], one writer thread plus pooled reader connections;
//!   `sqlite/wal_sync.rs` syncs its commits to disk on a thread of its own,
//!   `sqlite/checkpoints.rs` copies the WAL into the database file on another.
//! - [`retention`]: the stubs retention leaves of thinking text and tool payloads.
//! - [`postgres`]: [`PostgresStore`], a deadpool pool, `UNNEST` batch inserts.
#![forbid(unsafe_code)]

pub mod error;
mod migrations;
pub mod postgres;
pub mod retention;
mod rows;
pub mod sqlite;

use std::sync::Arc;
use streamgate_grammar::{Json, RunEvent};

pub use error::ArchiveError;
pub use postgres::PostgresStore;
pub use sqlite::{
    ArchivePageSize, SqliteDurability, SqliteOptions, SqliteStore, WriterPriority, RAISED_BY,
};

/// An archived event: the grammar event with its envelope and its `SG_EVENTS` stream
/// sequence (the global journal position).
#[derive(Debug, Clone, PartialEq)]
pub struct ArchivedEvent {
    /// The event and its envelope.
    pub event: RunEvent,
    /// The `SG_EVENTS` stream sequence the event was consumed at.
    pub journal_seq: u64,
}

/// Where a run stands, as the archive has seen it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunStatusKind {
    /// No terminal lifecycle event archived yet.
    Open,
    /// A `lifecycle/end` was archived.
    Ended,
    /// A `lifecycle/error` was archived.
    Failed,
}

impl RunStatusKind {
    /// The stored name: `open`, `ended` or `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatusKind::Open => "open",
            RunStatusKind::Ended => "ended",
            RunStatusKind::Failed => "failed",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<RunStatusKind> {
        Some(match s {
            "open" => RunStatusKind::Open,
            "ended" => RunStatusKind::Ended,
            "failed" => RunStatusKind::Failed,
            _ => return None,
        })
    }
}

/// One row of `runs`, kept current in the same transaction as the events.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    /// Tenant that owns the run.
    pub tenant: String,
    /// The run id.
    pub run_id: String,
    /// Chat session, when the envelope carried one.
    pub session_key: Option<String>,
    /// Provider, from `lifecycle/start`.
    pub provider: Option<String>,
    /// Model, from `lifecycle/start`.
    pub model: Option<String>,
    /// Open until a terminal lifecycle event is archived.
    pub status: RunStatusKind,
    /// Stop reason of the terminal lifecycle event (wire name).
    pub stop_reason: Option<String>,
    /// The usage of the highest-seq lifecycle event that carried one (verbatim).
    pub usage: Option<Json>,
    /// Lowest archived seq.
    pub first_seq: u64,
    /// Highest archived seq.
    pub last_seq: u64,
    /// Lowest archived envelope timestamp (ms).
    pub first_ts_ms: i64,
    /// Highest archived envelope timestamp (ms).
    pub last_ts_ms: i64,
    /// Number of archived events (duplicates and conflicts not counted).
    pub event_count: u64,
    /// What made the events of the current generation, when recorded (runs archived
    /// before schema version 3, or by a normalizer that did not say, have none).
    pub provenance: Option<Provenance>,
    /// The generation the events are (1 = as normalized live; each backfill adds one).
    pub generation: u32,
    /// When retention replaced the run's thinking text and tool payloads with stubs
    /// ([`retention`]) and dropped its raw chunks; `None` while they are whole.
    pub stripped_at_ms: Option<i64>,
    /// Token counts from the run's usage (per field the largest a lifecycle event
    /// reported); `None` when no event carried usage.
    pub tokens: Option<streamgate_grammar::usage::Tokens>,
    /// Ingest time of the first thinking, assistant or tool event (time to first token
    /// = this − `first_ts_ms`).
    pub first_token_ts_ms: Option<i64>,
    /// Ingest time of the first assistant event (time to first answer token).
    pub first_answer_ts_ms: Option<i64>,
}

/// What made a run's events: the adapter (family, `/dialect` when one was named) and its
/// version, and the version of the event grammar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provenance {
    /// `<family>` or `<family>/<dialect>`, e.g. `f1`, `f2/openrouter`.
    pub adapter: String,
    /// The adapter's version (`streamgate_wire::Family::adapter_version`).
    pub adapter_version: u32,
    /// The grammar's version (`streamgate_grammar::GRAMMAR_VERSION`).
    pub grammar_version: u32,
}

/// A run's provenance as the archiver saw it on `SG_EVENTS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunProvenance {
    /// Tenant that owns the run.
    pub tenant: String,
    /// The run id.
    pub run_id: String,
    /// What made the events.
    pub provenance: Provenance,
}

/// A new generation of one run's events, replacing the current one (which is kept).
#[derive(Debug, Clone)]
pub struct NewGeneration<'a> {
    /// Tenant that owns the run.
    pub tenant: &'a str,
    /// The run id.
    pub run_id: &'a str,
    /// The generation this one replaces: written only while it is still the current one
    /// (so two backfills racing, or a backfill repeated after a crash, write once).
    pub replaces: u32,
    /// The whole run's events, ascending seq; their `journal_seq` is ignored (an event
    /// takes the journal position of the event it replaces, or the run's last one).
    pub events: &'a [RunEvent],
    /// What made them.
    pub provenance: Provenance,
    /// When, ms since the Unix epoch (recorded with the generation it replaces).
    pub at_ms: i64,
}

/// What [`Store::write_generation`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GenerationOutcome {
    /// Written: the run's current generation is now this one.
    Written(u32),
    /// Not written: the run's current generation is no longer the one it was to replace.
    Stale {
        /// The current generation.
        current: u32,
    },
    /// Not written: the archive has no such run.
    NoRun,
}

/// Filters for listing runs; results ordered by `(first_ts_ms desc, tenant, run_id)`, paginated
/// with an opaque cursor.
#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    /// Only this tenant.
    pub tenant: Option<String>,
    /// Only this session.
    pub session_key: Option<String>,
    /// Only runs in this status.
    pub status: Option<RunStatusKind>,
    /// Only this provider.
    pub provider: Option<String>,
    /// Only this model.
    pub model: Option<String>,
    /// Only runs with `first_ts_ms >= since_ts_ms`.
    pub since_ts_ms: Option<i64>,
    /// Only runs with `first_ts_ms < until_ts_ms`.
    pub until_ts_ms: Option<i64>,
    /// Only runs retention has not stripped yet.
    pub unstripped: bool,
    /// Only runs the continuous trace export has not sent yet.
    pub unexported: bool,
    /// Only runs the thinking indexer has not indexed yet ([`Store::index_thinking`]).
    pub thinking_unindexed: bool,
    /// Page size: 0 means 100, values above 1000 are clamped to 1000.
    pub limit: u32,
    /// `next_cursor` of the previous page; `None` for the first page.
    pub cursor: Option<String>,
}

impl RunFilter {
    /// The page size after applying the default and the maximum.
    pub fn effective_limit(&self) -> u32 {
        match self.limit {
            0 => 100,
            n => n.min(1000),
        }
    }
}

/// One page of [`Store::list_runs`].
#[derive(Debug, Clone, PartialEq)]
pub struct RunPage {
    /// The runs of this page, in list order.
    pub runs: Vec<RunRecord>,
    /// Cursor for the next page; `None` when this page is the last.
    pub next_cursor: Option<String>,
}

/// What one batch insert did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InsertOutcome {
    /// New rows written.
    pub inserted: u64,
    /// Events whose key was already archived with identical content.
    pub duplicates: u64,
    /// Events whose key was already archived with different content (original kept).
    pub conflicts: u64,
}

/// A raw chunk kept in the optional raw archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawChunkRecord {
    /// Tenant that owns the run.
    pub tenant: String,
    /// The run id.
    pub run_id: String,
    /// 0-based chunk index within the run.
    pub chunk: u64,
    /// Adapter family (`f1`, …, or `auto`).
    pub family: String,
    /// Ingest time, ms since the Unix epoch.
    pub ingest_ts_ms: i64,
    /// Close marker kind (`normal`, `abnormal`, `timeout`) for close markers.
    pub close: Option<String>,
    /// The provider bytes (empty for close markers).
    pub body: Vec<u8>,
}

/// Which of a tenant's runs an erasure removes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EraseScope {
    /// One run.
    Run(String),
    /// Every run of a chat session.
    Session(String),
    /// Every run of the tenant.
    All,
}

impl EraseScope {
    /// `run`, `session` or `all`, as the audit records it.
    pub fn kind(&self) -> &'static str {
        match self {
            EraseScope::Run(_) => "run",
            EraseScope::Session(_) => "session",
            EraseScope::All => "all",
        }
    }
}

/// A request to erase runs, with who asked and when (for the audit record).
#[derive(Debug, Clone)]
pub struct Erasure<'a> {
    /// The tenant whose runs go.
    pub tenant: &'a str,
    /// Which of them.
    pub scope: &'a EraseScope,
    /// Who asked (as the operator API saw them).
    pub actor: &'a str,
    /// When, ms since the Unix epoch.
    pub at_ms: i64,
}

/// What [`Store::erase`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Erased {
    /// The run ids erased (in memory only: the caller erases them from the broker next;
    /// the audit keeps their hashes).
    pub runs: Vec<String>,
    /// How many of them were still open.
    pub open_runs: u64,
    /// Events removed, every generation counted.
    pub events: u64,
    /// Raw chunks removed.
    pub raw_chunks: u64,
    /// The audit record's id.
    pub audit_id: i64,
}

/// One erasure as the audit keeps it: who, when, what — never content, and ids only as
/// SHA-256 of `<tenant>/<id>` (hex), so an auditor can confirm that a given id was erased
/// without the archive keeping it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErasureRecord {
    /// Audit id, ascending.
    pub id: i64,
    /// When, ms since the Unix epoch.
    pub at_ms: i64,
    /// Who asked.
    pub actor: String,
    /// The tenant.
    pub tenant: String,
    /// `run`, `session` or `all`.
    pub scope: String,
    /// The hash of the run or session id named (empty for `all`).
    pub scope_hash: String,
    /// The hashes of the runs erased.
    pub run_hashes: Vec<String>,
    /// Events removed.
    pub events: u64,
    /// Raw chunks removed.
    pub raw_chunks: u64,
}

/// SHA-256 of `<tenant>/<id>`, lowercase hex: how the erasure audit names ids.
pub fn id_hash(tenant: &str, id: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(format!("{tenant}/{id}").as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The archive: batch inserts for the archiver, queries for replay and the operator API.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// Inserts a batch in ONE transaction, idempotent on `(tenant, run_id, seq)`: an identical
    /// duplicate is counted as duplicate; the same key with different content is never
    /// overwritten — counted as conflict and logged (`tracing::warn`). Updates `runs` in
    /// the same transaction (provider/model from lifecycle start, status/stop_reason from
    /// terminal lifecycle, usage from the highest-seq lifecycle event carrying one,
    /// first/last seq and ts, event_count). Returns after commit.
    ///
    /// "Same content" compares the canonical JSON line, tenant, session key and ts; the
    /// journal_seq is not compared (a re-publish after the dedupe window gets a new stream
    /// sequence but is the same event).
    async fn insert_batch(&self, events: &[ArchivedEvent]) -> Result<InsertOutcome, ArchiveError>;

    /// Whether batches one caller hands over concurrently
    /// ([`Store::insert_batch_with_provenance`] calls not awaited one by one) commit in the
    /// order they were handed over: a single writer taking them from one queue. The
    /// archiver keeps two batches in flight only then, so that a run never stands ended
    /// in the archive while an earlier batch of it is still uncommitted (ended runs are
    /// exported and indexed as they appear). The default, for a store that commits
    /// concurrent transactions in any order, is `false`.
    fn commits_in_submission_order(&self) -> bool {
        false
    }

    /// [`Store::insert_batch`] and then [`Store::record_provenance`] for what made those
    /// events, in the same transaction: the archiver's commit. One commit per batch
    /// instead of two — a run's first batch always changes its provenance — and a
    /// run's events never stand archived without it. This default, for a store that
    /// cannot join them, runs the two one after the other.
    async fn insert_batch_with_provenance(
        &self,
        events: &[ArchivedEvent],
        runs: &[RunProvenance],
    ) -> Result<InsertOutcome, ArchiveError> {
        let outcome = self.insert_batch(events).await?;
        self.record_provenance(runs).await?;
        Ok(outcome)
    }

    /// Events of the run `(tenant, run_id)` with `seq > after_seq`, ascending, at most
    /// `limit` (0 = no limit).
    async fn events_after(
        &self,
        tenant: &str,
        run_id: &str,
        after_seq: u64,
        limit: u32,
    ) -> Result<Vec<ArchivedEvent>, ArchiveError>;

    /// The global journal: events with `journal_seq > after_journal_seq`, ascending (ties
    /// by tenant, run id and seq). With `limit` (0 = none) the page ends after the journal entry
    /// holding the `limit`-th event: entries (one SG_EVENTS message, possibly a batch of
    /// events) are never split, so resuming after the last `journal_seq` seen loses
    /// nothing. A page may therefore hold more than `limit` events.
    async fn journal_after(
        &self,
        after_journal_seq: u64,
        limit: u32,
    ) -> Result<Vec<ArchivedEvent>, ArchiveError>;

    /// The `runs` row of the run `(tenant, run_id)`.
    async fn get_run(&self, tenant: &str, run_id: &str) -> Result<Option<RunRecord>, ArchiveError>;

    /// Runs matching `filter`, one page at a time.
    async fn list_runs(&self, filter: &RunFilter) -> Result<RunPage, ArchiveError>;

    /// Inserts raw chunks in one transaction, idempotent on `(tenant, run_id, chunk)` (an existing
    /// chunk is kept). Returns how many were new.
    async fn insert_raw(&self, chunks: &[RawChunkRecord]) -> Result<u64, ArchiveError>;

    /// The raw chunks of the run `(tenant, run_id)`, by ascending chunk index.
    async fn raw_chunks(
        &self,
        tenant: &str,
        run_id: &str,
    ) -> Result<Vec<RawChunkRecord>, ArchiveError>;

    /// Records what made runs' events (from the headers of `SG_EVENTS` messages), for
    /// runs whose current generation is the live one (1). A run already stamped keeps the
    /// lowest adapter and grammar version seen, so a run that a rolling upgrade split
    /// between two normalizer versions reads as made by the older one.
    /// Runs not (yet) archived are skipped.
    async fn record_provenance(&self, runs: &[RunProvenance]) -> Result<(), ArchiveError>;

    /// At most `limit` raw chunks (0 = all) of a run with index `>= from_chunk`, ascending:
    /// the bounded-memory way through a long run's provider bytes.
    async fn raw_chunks_from(
        &self,
        tenant: &str,
        run_id: &str,
        from_chunk: u64,
        limit: u32,
    ) -> Result<Vec<RawChunkRecord>, ArchiveError>;

    /// Replaces a run's events with a new generation in ONE transaction: the current
    /// generation's events move to the generations history (kept, readable with
    /// [`Store::generation_events_after`]), the new events become the run's events, the
    /// `runs` row is rebuilt from them and stamped with the new generation and provenance.
    async fn write_generation(
        &self,
        generation: &NewGeneration<'_>,
    ) -> Result<GenerationOutcome, ArchiveError>;

    /// Like [`Store::events_after`] for one generation of the run: the current one reads
    /// the run's events, an older one the generations history. Empty when the run has no
    /// such generation.
    async fn generation_events_after(
        &self,
        tenant: &str,
        run_id: &str,
        generation: u32,
        after_seq: u64,
        limit: u32,
    ) -> Result<Vec<ArchivedEvent>, ArchiveError>;

    /// Removes runs from every table — events of every generation, raw chunks, the
    /// `runs` rows — in ONE transaction with an audit record, and makes the removal
    /// physical (SQLite overwrites deleted content and truncates its WAL; PostgreSQL
    /// vacuums the tables). Idempotent: erasing what is gone removes nothing and still
    /// records the request.
    async fn erase(&self, erasure: &Erasure<'_>) -> Result<Erased, ArchiveError>;

    /// The erasure audit, newest first (at most `limit`, 0 = 100), of one tenant or all.
    async fn erasures(
        &self,
        tenant: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ErasureRecord>, ArchiveError>;

    /// Retention, first stage: in ONE transaction, every generation's thinking text and
    /// tool payloads of the run become stubs ([`retention::strip`]), its raw chunks (which
    /// hold the same text) go, and the run is marked stripped. Returns the events
    /// rewritten. Idempotent.
    async fn strip_run(&self, tenant: &str, run_id: &str, at_ms: i64) -> Result<u64, ArchiveError>;

    /// Retention, last stage: the run removed from every table (no audit record: a
    /// policy, not a request). Returns the events removed.
    async fn drop_run(&self, tenant: &str, run_id: &str) -> Result<u64, ArchiveError>;

    /// Runs whose final answer contains `phrase` (words in order), best match first, at
    /// most `limit` (0 = 50): the operator's full-text search (SQLite FTS5, PostgreSQL
    /// `tsvector`).
    async fn search_runs(
        &self,
        tenant: Option<&str>,
        phrase: &str,
        limit: u32,
    ) -> Result<Vec<SearchHit>, ArchiveError>;

    /// Runs whose thinking contains `phrase` (words in order), best match first, at most
    /// `limit` (0 = 50): the opt-in search over reasoning, over what the thinking
    /// indexer put in ([`Store::index_thinking`]); the snippet is from the thinking.
    async fn search_thinking(
        &self,
        tenant: Option<&str>,
        phrase: &str,
        limit: u32,
    ) -> Result<Vec<SearchHit>, ArchiveError>;

    /// Puts a run's reasoning segments (`(seq of the segment's end, its text)`) in the
    /// thinking search, replacing what it held of the run, and marks the run indexed (it
    /// leaves [`RunFilter::thinking_unindexed`] lists). A new generation of the run, or
    /// retention stripping it, takes its thinking out of the search again.
    async fn index_thinking(
        &self,
        tenant: &str,
        run_id: &str,
        segments: &[(i64, String)],
        at_ms: i64,
    ) -> Result<(), ArchiveError>;

    /// Marks runs as sent by the continuous trace export (they leave
    /// [`RunFilter::unexported`] lists).
    async fn mark_exported(
        &self,
        runs: &[(String, String)],
        at_ms: i64,
    ) -> Result<(), ArchiveError>;

    /// Accounting by tenant, model and UTC day of the runs `filter` selects, newest day
    /// first.
    async fn run_stats(&self, filter: &StatsFilter) -> Result<Vec<StatsRow>, ArchiveError>;

    /// Conflicts seen since this store was opened, for metrics.
    fn conflicts_total(&self) -> u64;
}

/// Which runs [`Store::run_stats`] adds up.
#[derive(Debug, Clone, Default)]
pub struct StatsFilter {
    /// Only this tenant.
    pub tenant: Option<String>,
    /// Only runs with `first_ts_ms >= since_ts_ms`.
    pub since_ts_ms: Option<i64>,
    /// Only runs with `first_ts_ms < until_ts_ms`.
    pub until_ts_ms: Option<i64>,
}

/// Accounting of one (tenant, model, UTC day).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsRow {
    /// The tenant.
    pub tenant: String,
    /// The model (empty when the runs named none).
    pub model: String,
    /// The UTC day, as days since the Unix epoch.
    pub day: i64,
    /// Runs.
    pub runs: u64,
    /// Summed token counts.
    pub tokens: streamgate_grammar::usage::Tokens,
    /// Summed time to first token, ms, over `ttft_runs` runs.
    pub ttft_ms_sum: i64,
    /// Runs with a first token.
    pub ttft_runs: u64,
    /// Summed run durations (first to last event), ms.
    pub duration_ms_sum: i64,
}

/// One run found by [`Store::search_runs`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchHit {
    /// Tenant that owns the run.
    pub tenant: String,
    /// The run id.
    pub run_id: String,
    /// The answer around the match, the matched words in `[…]`.
    pub snippet: String,
}

/// Opens a store by URL: `sqlite:///abs/path.db`, `sqlite:relative.db` or a plain path →
/// SQLite; `postgres://…` or `postgresql://…` → PostgreSQL. Migrations run at open.
/// A SQLite URL may end in parameters, `&`-separated: `synchronous=normal` (or `full`,
/// the default; see [`SqliteDurability`]), `page_size=4096` (a new archive's page
/// size, 8192 by default; see [`ArchivePageSize`]) and `writer_priority=normal` (or
/// `raised`, the default; see [`WriterPriority`]).
pub async fn open_store(url: &str) -> Result<Arc<dyn Store>, ArchiveError> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok(Arc::new(PostgresStore::connect(url).await?));
    }
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .unwrap_or(url);
    let (path, query) = match url.starts_with("sqlite:") {
        true => rest.split_once('?').unwrap_or((rest, "")),
        // A plain path is taken literally ('?' is a valid file name character).
        false => (rest, ""),
    };
    if path.is_empty() {
        return Err(ArchiveError::Config(format!("no database path in {url:?}")));
    }
    let mut options = SqliteOptions::default();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("synchronous", v)) => {
                options.durability = SqliteDurability::parse(v).ok_or_else(|| {
                    ArchiveError::Config(format!("synchronous must be full or normal, not {v:?}"))
                })?;
            }
            Some(("page_size", v)) => {
                options.page_size = Some(ArchivePageSize::parse(v).ok_or_else(|| {
                    ArchiveError::Config(format!(
                        "page_size must be a power of two from 512 to 65536, not {v:?}"
                    ))
                })?);
            }
            Some(("writer_priority", v)) => {
                options.writer_priority = WriterPriority::parse(v).ok_or_else(|| {
                    ArchiveError::Config(format!(
                        "writer_priority must be raised or normal, not {v:?}"
                    ))
                })?;
            }
            _ => {
                return Err(ArchiveError::Config(format!(
                    "unknown sqlite URL parameter {pair:?}"
                )))
            }
        }
    }
    Ok(Arc::new(
        SqliteStore::open_with(std::path::Path::new(path), options).await?,
    ))
}
