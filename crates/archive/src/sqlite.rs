//! SQLite backend: one database file in WAL mode.
//!
//! rusqlite is synchronous, so nothing here runs on the async runtime: all writes go to
//! one dedicated writer thread that owns the only read-write connection (SQLite allows
//! one writer at a time anyway, and a single owner keeps its prepared-statement cache
//! warm), and reads run on `spawn_blocking` with pooled read-only connections, which WAL
//! lets proceed while the writer commits. Two more threads serve the writer: the
//! checkpointer (`checkpoints`) and the WAL syncer (`wal_sync`), which makes commits
//! durable before their callers hear of them. The writer and the syncer ask for a core
//! ahead of the rest of the process (`priority`).

use crate::rows::{self, EventRow, Param, StoredContent, StoredRun};
use crate::{
    migrations, ArchiveError, ArchivedEvent, EraseScope, Erased, Erasure, ErasureRecord,
    GenerationOutcome, InsertOutcome, NewGeneration, Provenance, RawChunkRecord, RunFilter,
    RunPage, RunProvenance, RunRecord, SearchHit, StatsFilter, StatsRow, Store,
};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, TransactionBehavior};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

mod checkpoints;
mod priority;
mod wal_sync;
use checkpoints::Checkpoints;
pub use priority::{WriterPriority, RAISED_BY};
use wal_sync::{answer, Durable, PendingReply};

/// Jobs queued to the writer thread. The bound gives callers backpressure instead of an
/// unbounded queue when the disk is slower than the bus.
const WRITER_QUEUE: usize = 16;
/// Idle read connections kept for reuse.
const MAX_IDLE_READERS: usize = 8;
/// How long a statement waits for a lock held by another process before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

const INSERT_EVENT: &str = "INSERT INTO events \
     (run_id, seq, journal_seq, tenant, session_key, stream, phase, ts_ms, payload) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) ON CONFLICT (tenant, run_id, seq) DO NOTHING";
const SELECT_CONTENT: &str = "SELECT tenant, session_key, ts_ms, payload FROM events \
     WHERE tenant = ?1 AND run_id = ?2 AND seq = ?3";
use crate::rows::EVENT_COLUMNS;
const INSERT_RAW: &str = "INSERT INTO raw_chunks \
     (run_id, chunk, tenant, family, ingest_ts_ms, close, body) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (tenant, run_id, chunk) DO NOTHING";

/// The embedded archive: one SQLite file, WAL, one writer thread, pooled readers.
///
/// Commits survive power loss by default ([`SqliteDurability::Full`]): the archiver acks
/// JetStream after `insert_batch` returns, so a commit must survive power loss, not only a
/// process crash. The WAL is synced on a thread of its own before a commit's caller hears
/// of it (`wal_sync`), so the writer builds the next transaction meanwhile; batching,
/// group commit (batches queued behind a commit share the next one), one sync for every
/// commit that waits for it, and checkpointing on a separate thread amortize the fsync.
pub struct SqliteStore {
    writer: mpsc::Sender<WriteJob>,
    readers: Arc<Readers>,
    conflicts: Arc<AtomicU64>,
}

enum WriteJob {
    Events {
        batch: EventBatch,
        reply: oneshot::Sender<Result<InsertOutcome, ArchiveError>>,
    },
    Raw {
        chunks: Vec<RawChunkRecord>,
        reply: oneshot::Sender<Result<u64, ArchiveError>>,
    },
    Provenance {
        runs: Vec<RunProvenance>,
        reply: oneshot::Sender<Result<(), ArchiveError>>,
    },
    Generation {
        job: GenerationJob,
        reply: oneshot::Sender<Result<GenerationOutcome, ArchiveError>>,
    },
    Erase {
        job: EraseJob,
        reply: oneshot::Sender<Result<Erased, ArchiveError>>,
    },
    Exported {
        runs: Vec<(String, String)>,
        at_ms: i64,
        reply: oneshot::Sender<Result<(), ArchiveError>>,
    },
    Thinking {
        tenant: String,
        run_id: String,
        segments: Vec<(i64, String)>,
        at_ms: i64,
        reply: oneshot::Sender<Result<(), ArchiveError>>,
    },
    /// Retention: strip (`Some(at_ms)`) or drop (`None`) one run.
    Retain {
        tenant: String,
        run_id: String,
        strip_at_ms: Option<i64>,
        reply: oneshot::Sender<Result<u64, ArchiveError>>,
    },
}

/// One `insert_batch_with_provenance` moved to the writer thread: the rows, then the
/// provenance of their runs, in one transaction.
struct EventBatch {
    rows: Vec<EventRow>,
    provenance: Vec<RunProvenance>,
}

/// An [`Erasure`] moved to the writer thread.
struct EraseJob {
    tenant: String,
    scope: EraseScope,
    actor: String,
    at_ms: i64,
}

/// A [`NewGeneration`] moved to the writer thread.
struct GenerationJob {
    tenant: String,
    run_id: String,
    replaces: u32,
    events: Vec<streamgate_grammar::RunEvent>,
    provenance: Provenance,
    at_ms: i64,
}

/// How hard a commit is pushed to disk before `insert_batch` returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SqliteDurability {
    /// Every commit is on disk before its caller hears of it; it survives power loss.
    /// The default, because the archiver acks JetStream after the commit. The writer
    /// commits with `synchronous=NORMAL` and a thread of its own syncs the WAL file before
    /// the replies go out (SQLite's own `synchronous=FULL` where that file cannot be
    /// opened), so the writer does not wait for the disk. Readers may see a commit while
    /// it is being synced: a power loss then can take back what was read, never what a
    /// caller was told is committed.
    #[default]
    Full,
    /// `synchronous=NORMAL`: a commit survives a crash of the process but an OS crash or
    /// power loss may lose the last commits. Much faster where fsync is slow.
    Normal,
}

impl SqliteDurability {
    /// Parses `full` / `normal` (the `synchronous` URL parameter of [`crate::open_store`]).
    pub fn parse(s: &str) -> Option<SqliteDurability> {
        match s.to_ascii_lowercase().as_str() {
            "full" => Some(SqliteDurability::Full),
            "normal" => Some(SqliteDurability::Normal),
            _ => None,
        }
    }

    fn pragma(self) -> &'static str {
        match self {
            SqliteDurability::Full => "FULL",
            SqliteDurability::Normal => "NORMAL",
        }
    }
}

/// Options for [`SqliteStore::open_with`].
#[derive(Debug, Clone, Default)]
pub struct SqliteOptions {
    /// Commit durability; [`SqliteDurability::Full`] by default.
    pub durability: SqliteDurability,
    /// The page size of a new archive, bytes (8 KiB when `None`); an existing archive
    /// keeps the size it was made with. See [`ArchivePageSize`].
    pub page_size: Option<ArchivePageSize>,
    /// How the writer and the WAL syncer are scheduled; [`WriterPriority::Raised`] by
    /// default.
    pub writer_priority: WriterPriority,
}

/// The page size a new archive is made with (the `page_size` URL parameter of
/// [`crate::open_store`]): a power of two from 512 to 65536 bytes, as SQLite allows.
///
/// A commit writes every page it changed whole into the WAL, and each live run's events
/// sit on pages of their own (the events are keyed by run), so every commit writes at
/// least a page per run it touches. At a modest load — many runs, a few events each per
/// commit — that page is most of what reaches the disk: on `bench pipeline`'s 32 runs at
/// 1k events/s, 17 KB a 250-byte event with 16 KiB pages, 11 KB with 8 KiB, 9.6 KB with
/// 4 KiB (docs/performance.md, twentieth and twenty-third stops). Larger pages split
/// less at full speed, where 4 KiB fell behind (its commits wrote fewer bytes but more
/// pages); 8 KiB, the default, archived as many events per second as 16 KiB with the
/// same latency and wrote 20–37% less from full speed down to 1k events/s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchivePageSize(u32);

impl ArchivePageSize {
    /// Parses a page size in bytes; `None` unless a power of two from 512 to 65536.
    pub fn parse(s: &str) -> Option<ArchivePageSize> {
        let n: u32 = s.parse().ok()?;
        ((512..=65536).contains(&n) && n.is_power_of_two()).then_some(ArchivePageSize(n))
    }

    /// The size in bytes.
    pub fn bytes(self) -> u32 {
        self.0
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database file with default options, applies
    /// missing migrations and starts the writer thread.
    pub async fn open(path: &Path) -> Result<SqliteStore, ArchiveError> {
        SqliteStore::open_with(path, SqliteOptions::default()).await
    }

    /// Like [`SqliteStore::open`], with options.
    pub async fn open_with(
        path: &Path,
        options: SqliteOptions,
    ) -> Result<SqliteStore, ArchiveError> {
        let path = path.to_path_buf();
        let conflicts = Arc::new(AtomicU64::new(0));
        let (tx, rx) = mpsc::channel(WRITER_QUEUE);
        let (ready_tx, ready_rx) = oneshot::channel();
        let thread_path = path.clone();
        let thread_conflicts = conflicts.clone();
        std::thread::Builder::new()
            .name("sg-archive-sqlite".into())
            .spawn(move || match open_writer(&thread_path, &options) {
                Ok(conn) => {
                    let durable =
                        Durable::start(&conn, options.durability, options.writer_priority);
                    let _ = ready_tx.send(Ok(()));
                    let checkpoints = Checkpoints::start(&thread_path);
                    // Raised after the syncer and the checkpointer are spawned: a thread
                    // starts at its parent's nice value, and the checkpointer, which
                    // nothing waits for, keeps the process's (the syncer raises itself).
                    priority::apply_to_this_thread(options.writer_priority, "writer");
                    writer_loop(conn, rx, &thread_conflicts, &checkpoints, &durable);
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            })
            .map_err(|e| ArchiveError::WorkerGone(format!("cannot start writer thread: {e}")))?;
        ready_rx
            .await
            .map_err(|_| ArchiveError::WorkerGone("writer thread died while opening".into()))??;
        Ok(SqliteStore {
            writer: tx,
            readers: Arc::new(Readers {
                path,
                idle: Mutex::new(Vec::new()),
            }),
            conflicts,
        })
    }

    async fn read<R, F>(&self, f: F) -> Result<R, ArchiveError>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> Result<R, ArchiveError> + Send + 'static,
    {
        let readers = self.readers.clone();
        tokio::task::spawn_blocking(move || {
            let conn = readers.take()?;
            let result = f(&conn);
            readers.give(conn);
            result
        })
        .await
        .map_err(|e| ArchiveError::WorkerGone(e.to_string()))?
    }

    /// A phrase search over one of the FTS5 tables (`run_search`, `thinking_search`:
    /// tenant, run id, seq, text), one hit per run, best first.
    async fn search(
        &self,
        table: &'static str,
        tenant: Option<&str>,
        phrase: &str,
        limit: u32,
    ) -> Result<Vec<SearchHit>, ArchiveError> {
        let tenant = tenant.map(str::to_owned);
        let query = rows::fts5_phrase(phrase);
        let limit = i64::from(if limit == 0 { 50 } else { limit.min(1000) });
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT tenant, run_id, snippet({table}, 3, '[', ']', '…', 16) \
                 FROM {table} WHERE {table} MATCH ?1 AND (?2 IS NULL OR tenant = ?2) \
                 ORDER BY rank LIMIT ?3"
            ))?;
            let mut found = stmt.query(params![query, tenant, limit])?;
            let mut out: Vec<SearchHit> = Vec::new();
            while let Some(r) = found.next()? {
                let hit = SearchHit {
                    tenant: r.get(0)?,
                    run_id: r.get(1)?,
                    snippet: r.get(2)?,
                };
                if !out
                    .iter()
                    .any(|h| h.tenant == hit.tenant && h.run_id == hit.run_id)
                {
                    out.push(hit);
                }
            }
            Ok(out)
        })
        .await
    }

    async fn submit<R>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<R, ArchiveError>>) -> WriteJob,
    ) -> Result<R, ArchiveError> {
        let (reply, rx) = oneshot::channel();
        self.writer
            .send(make(reply))
            .await
            .map_err(|_| ArchiveError::WriterStopped("writer thread stopped".into()))?;
        rx.await
            .map_err(|_| ArchiveError::WriterStopped("writer thread dropped the job".into()))?
    }
}

fn open_writer(path: &Path, options: &SqliteOptions) -> Result<Connection, ArchiveError> {
    make_private(path)?;
    let mut conn = Connection::open(path)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // 8 KiB pages for a new archive unless the URL names another size (an existing one
    // keeps the size it was made with: in WAL mode only a VACUUM outside it could change
    // that). The events B-tree is keyed by run and holds each event's JSON inline, and
    // batches insert into every live run's range: a 4 KiB page holds ~15 such rows and
    // splits every few inserts; but every page a commit touches is written whole
    // ([`ArchivePageSize`]).
    let wanted = options
        .page_size
        .map_or(NEW_ARCHIVE_PAGE_SIZE, |p| i64::from(p.bytes()));
    conn.pragma_update(None, "page_size", wanted)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    let made_with: i64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
    if options.page_size.is_some() && made_with != wanted {
        tracing::warn!(
            path = %path.display(),
            page_size = made_with,
            requested = wanted,
            "the archive keeps the page size it was made with; page_size applies to a new archive only"
        );
    }
    conn.pragma_update(None, "synchronous", options.durability.pragma())?;
    // Checkpoints run on their own thread; this is only the backstop.
    let backstop = pages_of(&conn, WRITER_AUTOCHECKPOINT_BYTES)?;
    conn.pragma_update(None, "wal_autocheckpoint", backstop)?;
    // Never shrink the WAL from here: truncating tens of MiB of page cache inside a commit
    // stalled it for ~45 ms about once a second under load. The checkpointer shrinks the
    // file once writes go idle (`IDLE_TRUNCATE_AFTER`).
    conn.pragma_update(None, "journal_size_limit", -1)?;
    // A bigger page cache keeps the upper levels of the events B-tree in memory while
    // batches from many concurrent runs insert all over it.
    conn.pragma_update(None, "cache_size", -65536)?;
    // Deleted content is overwritten, not left in free pages: an erasure (or retention)
    // must not leave the text it removed in the file. Deletes are rare, so the cost is too.
    conn.pragma_update(None, "secure_delete", "ON")?;
    conn.set_prepared_statement_cache_capacity(32);
    migrate(&mut conn)?;
    Ok(conn)
}

/// Creates the database file readable by its owner only before SQLite opens it (SQLite
/// creates the `-wal` and `-shm` files with the database file's mode), and narrows an
/// existing database's mode, and its `-wal`/`-shm` files', to 0600: the archive holds
/// every run's text.
fn make_private(path: &Path) -> Result<(), ArchiveError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let private = |p: &Path, e: std::io::Error| ArchiveError::Private {
            path: p.display().to_string(),
            source: e,
        };
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| private(path, e))?;
        let mode = std::fs::Permissions::from_mode(0o600);
        file.set_permissions(mode.clone())
            .map_err(|e| private(path, e))?;
        for suffix in ["-wal", "-shm"] {
            let mut side = path.as_os_str().to_owned();
            side.push(suffix);
            let side = std::path::PathBuf::from(side);
            match std::fs::set_permissions(&side, mode.clone()) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(private(&side, e)),
            }
        }
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

fn migrate(conn: &mut Connection) -> Result<(), ArchiveError> {
    conn.execute(migrations::CREATE_SCHEMA_MIGRATIONS, [])?;
    // IMMEDIATE takes the write lock up front, so two processes opening the same file
    // cannot both decide to apply the same version.
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let current: i64 = tx.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
        [],
        |r| r.get(0),
    )?;
    let known = migrations::SQLITE.last().map_or(0, |m| m.0);
    if current > known {
        return Err(ArchiveError::SchemaTooNew {
            found: current,
            known,
        });
    }
    for (version, sql) in migrations::SQLITE.iter().filter(|m| m.0 > current) {
        tx.execute_batch(sql)?;
        tx.execute(
            "INSERT INTO schema_migrations (version, applied_at_ms) VALUES (?1, ?2)",
            params![version, migrations::now_ms()],
        )?;
        tracing::info!(version, "applied sqlite archive migration");
    }
    tx.commit()?;
    Ok(())
}

/// Queued event batches that the writer may merge into one transaction.
const GROUP_MAX_ROWS: usize = 20_000;
/// Backstop auto-checkpoint on the writer in case the checkpointer is gone.
const WRITER_AUTOCHECKPOINT_BYTES: i64 = 200 << 20;
/// The page size of a new archive ([`open_writer`]).
const NEW_ARCHIVE_PAGE_SIZE: i64 = 8 << 10;

/// How many of the database's pages make `bytes` (SQLite counts the WAL in pages, and an
/// archive keeps the page size it was made with: 4 KiB before 16 KiB pages, 16 KiB before
/// 8 KiB ones).
fn pages_of(conn: &Connection, bytes: i64) -> rusqlite::Result<i64> {
    let page_size: i64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
    Ok(bytes / page_size.max(512))
}

type EventsReply = oneshot::Sender<Result<InsertOutcome, ArchiveError>>;

fn writer_loop(
    mut conn: Connection,
    mut rx: mpsc::Receiver<WriteJob>,
    conflicts: &AtomicU64,
    checkpoints: &Checkpoints,
    durable: &Durable,
) {
    let mut next: Option<WriteJob> = None;
    // Ends when the store (every sender) is dropped; the connection closes with it.
    loop {
        if durable.failed() {
            // Nothing written from here on could be called durable: stop, so every call
            // fails (`WriterStopped`) until a restart recovers from what the file holds.
            tracing::error!(
                "the archive's writer stops after a failed WAL sync; restart to recover"
            );
            break;
        }
        let job = match next.take() {
            Some(job) => job,
            None => match rx.blocking_recv() {
                Some(job) => job,
                None => break,
            },
        };
        let replies = match job {
            WriteJob::Events { batch, reply } => {
                // Group commit: batches that queued up while the previous commit was
                // being written share the next transaction.
                let mut total = batch.rows.len();
                let mut group = vec![(batch, reply)];
                while total < GROUP_MAX_ROWS {
                    match rx.try_recv() {
                        Ok(WriteJob::Events { batch, reply }) => {
                            total += batch.rows.len();
                            group.push((batch, reply));
                        }
                        Ok(other) => {
                            next = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                commit_group(&mut conn, group, conflicts)
            }
            WriteJob::Raw { chunks, reply } => {
                vec![answer(reply, write_raw(&mut conn, &chunks))]
            }
            WriteJob::Provenance { runs, reply } => {
                vec![answer(reply, write_provenance(&mut conn, &runs))]
            }
            WriteJob::Generation { job, reply } => {
                vec![answer(reply, write_generation(&mut conn, &job, conflicts))]
            }
            WriteJob::Erase { job, reply } => {
                vec![answer(reply, erase(&mut conn, &job))]
            }
            WriteJob::Exported { runs, at_ms, reply } => {
                vec![answer(reply, mark_exported(&mut conn, &runs, at_ms))]
            }
            WriteJob::Thinking {
                tenant,
                run_id,
                segments,
                at_ms,
                reply,
            } => {
                vec![answer(
                    reply,
                    index_thinking(&mut conn, &tenant, &run_id, &segments, at_ms),
                )]
            }
            WriteJob::Retain {
                tenant,
                run_id,
                strip_at_ms,
                reply,
            } => {
                vec![answer(
                    reply,
                    match strip_at_ms {
                        Some(at) => strip_run(&mut conn, &tenant, &run_id, at),
                        None => drop_run(&mut conn, &tenant, &run_id),
                    },
                )]
            }
        };
        durable.deliver(replies);
        checkpoints.after_write();
    }
}

/// Commits a group of batches in one transaction; if that fails, commits them one by one
/// so a bad batch only fails its own caller.
fn commit_group(
    conn: &mut Connection,
    group: Vec<(EventBatch, EventsReply)>,
    conflicts_total: &AtomicU64,
) -> Vec<PendingReply> {
    if group.len() > 1 {
        let batches: Vec<&EventBatch> = group.iter().map(|(batch, _)| batch).collect();
        match write_events(conn, &batches) {
            Ok(results) => {
                drop(batches);
                return group
                    .into_iter()
                    .zip(results)
                    .map(|((batch, reply), result)| {
                        finish(&batch.rows, &result, conflicts_total);
                        answer(reply, Ok(result.outcome))
                    })
                    .collect();
            }
            Err(e) => {
                tracing::debug!(error = %e, "group commit failed; committing batches one by one");
            }
        }
    }
    group
        .into_iter()
        .map(|(batch, reply)| {
            let result = write_events(conn, &[&batch]).map(|mut results| {
                let result = results.pop().unwrap_or_default();
                finish(&batch.rows, &result, conflicts_total);
                result.outcome
            });
            answer(reply, result)
        })
        .collect()
}

/// What one batch of a committed transaction did.
#[derive(Default)]
struct BatchResult {
    outcome: InsertOutcome,
    /// `(row index, stored payload)` of each conflict.
    conflicts: Vec<(usize, String)>,
}

/// Counts and logs conflicts, only once committed: a failed batch is retried and would
/// otherwise be counted twice.
fn finish(rows: &[EventRow], result: &BatchResult, conflicts_total: &AtomicU64) {
    conflicts_total.fetch_add(result.outcome.conflicts, Ordering::Relaxed);
    for (i, stored) in &result.conflicts {
        rows::log_conflict(&rows[*i], stored);
    }
}

fn write_events(
    conn: &mut Connection,
    batches: &[&EventBatch],
) -> Result<Vec<BatchResult>, ArchiveError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut results = Vec::with_capacity(batches.len());
    for batch in batches {
        results.push(write_batch(&tx, &batch.rows)?);
        // After the rows: their upsert makes the `runs` rows this stamps.
        update_provenance(&tx, &batch.provenance)?;
    }
    tx.commit()?;
    Ok(results)
}

fn write_batch(
    tx: &rusqlite::Transaction<'_>,
    rows: &[EventRow],
) -> Result<BatchResult, ArchiveError> {
    let mut result = BatchResult::default();
    let mut inserted = vec![false; rows.len()];
    let mut insert = tx.prepare_cached(INSERT_EVENT)?;
    for (i, (row, was_inserted)) in rows.iter().zip(inserted.iter_mut()).enumerate() {
        let n = insert.execute(params![
            row.run_id,
            row.seq,
            row.journal_seq,
            row.tenant,
            row.session_key,
            row.stream,
            row.phase,
            row.ts_ms,
            row.payload,
        ])?;
        if n == 1 {
            *was_inserted = true;
            result.outcome.inserted += 1;
            continue;
        }
        // Rare path (redelivery): compare with what is stored.
        let stored = tx.prepare_cached(SELECT_CONTENT)?.query_row(
            params![row.tenant, row.run_id, row.seq],
            |r| {
                Ok(StoredContent {
                    tenant: r.get(0)?,
                    session_key: r.get(1)?,
                    ts_ms: r.get(2)?,
                    payload: r.get(3)?,
                })
            },
        )?;
        if row.same_content(&stored) {
            result.outcome.duplicates += 1;
        } else {
            result.outcome.conflicts += 1;
            result.conflicts.push((i, stored.payload));
        }
    }
    {
        let mut index = tx.prepare_cached(
            "INSERT INTO run_search (tenant, run_id, seq, answer) VALUES (?1, ?2, ?3, ?4)",
        )?;
        for (row, _) in rows.iter().zip(&inserted).filter(|(_, ins)| **ins) {
            if let Some(answer) = &row.answer {
                index.execute(params![row.tenant, row.run_id, row.seq, answer])?;
            }
        }
    }
    let deltas = rows::run_deltas(
        rows.iter()
            .zip(&inserted)
            .filter(|(_, ins)| **ins)
            .map(|(r, _)| r),
    );
    let upsert = format!(
        "INSERT INTO runs ({}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, \
         ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22) \
         ON CONFLICT (tenant, run_id) DO UPDATE SET {}",
        rows::RUN_INSERT_COLUMNS,
        rows::RUN_UPSERT_SET
    );
    let mut upsert = tx.prepare_cached(&upsert)?;
    let mut indexed = tx.prepare_cached(RUNS_INDEXED_UPDATE)?;
    for d in &deltas {
        let status = d
            .terminal
            .as_ref()
            .map_or(crate::RunStatusKind::Open, |t| t.status);
        let a = rows::accounting_values(d);
        upsert.execute(params![
            d.run_id,
            d.tenant,
            d.session_key,
            d.provider,
            d.model,
            status.as_str(),
            d.terminal.as_ref().and_then(|t| t.reason.as_deref()),
            d.terminal.as_ref().map(|t| t.seq),
            d.usage.as_ref().map(|u| u.1.as_str()),
            d.usage.as_ref().map(|u| u.0),
            d.first_seq,
            d.last_seq,
            d.first_ts_ms,
            d.last_ts_ms,
            d.count,
            a[0],
            a[1],
            a[2],
            a[3],
            a[4],
            a[5],
            a[6],
        ])?;
        indexed.execute(params![d.tenant, d.run_id, d.session_key, d.first_ts_ms])?;
    }
    Ok(result)
}

/// The `runs` upsert's rules for its indexed columns ([`rows::RUN_UPSERT_SET_INDEXED`]),
/// as a statement that writes a row only where one of them changes: a session key where
/// the row has none, an earlier first time (a batch committed out of order). Naming
/// them in the upsert's `SET` would rewrite the run's entries in `runs_by_time`,
/// `runs_by_tenant_time` and `runs_by_session` at every commit, changed or not.
const RUNS_INDEXED_UPDATE: &str = "UPDATE runs SET session_key = COALESCE(session_key, ?3), \
     first_ts_ms = MIN(first_ts_ms, ?4) \
     WHERE tenant = ?1 AND run_id = ?2 \
       AND ((session_key IS NULL AND ?3 IS NOT NULL) OR first_ts_ms > ?4)";

fn write_provenance(conn: &mut Connection, runs: &[RunProvenance]) -> Result<(), ArchiveError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    update_provenance(&tx, runs)?;
    tx.commit()?;
    Ok(())
}

/// The provenance rule ([`rows::provenance_update`]) for each run, inside `tx`.
fn update_provenance(
    tx: &rusqlite::Transaction<'_>,
    runs: &[RunProvenance],
) -> Result<(), ArchiveError> {
    if runs.is_empty() {
        return Ok(());
    }
    let mut update = tx.prepare_cached(&rows::provenance_update(|n| format!("?{n}")))?;
    for r in runs {
        let p = &r.provenance;
        update.execute(params![
            r.tenant,
            r.run_id,
            p.adapter,
            i64::from(p.adapter_version),
            i64::from(p.grammar_version)
        ])?;
    }
    Ok(())
}

/// [`Store::write_generation`] in one transaction: keep the current generation in the
/// history, replace the events, rebuild and stamp the `runs` row.
fn write_generation(
    conn: &mut Connection,
    job: &GenerationJob,
    conflicts: &AtomicU64,
) -> Result<GenerationOutcome, ArchiveError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let current: Option<i64> = tx
        .prepare_cached("SELECT generation FROM runs WHERE tenant = ?1 AND run_id = ?2")?
        .query_row(params![job.tenant, job.run_id], |r| r.get(0))
        .optional()?;
    let Some(current) = current else {
        return Ok(GenerationOutcome::NoRun);
    };
    if current != i64::from(job.replaces) {
        return Ok(GenerationOutcome::Stale {
            current: u32::try_from(current).unwrap_or(u32::MAX),
        });
    }
    let p = |n: usize| format!("?{n}");
    tx.execute(
        &rows::keep_generation_events(p),
        params![job.tenant, job.run_id, current],
    )?;
    tx.execute(
        &rows::keep_generation_row(p),
        params![job.tenant, job.run_id, job.at_ms],
    )?;
    let journal = {
        let mut stmt = tx.prepare_cached(
            "SELECT seq, journal_seq FROM events WHERE tenant = ?1 AND run_id = ?2",
        )?;
        let found = stmt
            .query_map(params![job.tenant, job.run_id], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?
            .collect::<Result<std::collections::HashMap<i64, i64>, _>>()?;
        found
    };
    let new = NewGeneration {
        tenant: &job.tenant,
        run_id: &job.run_id,
        replaces: job.replaces,
        events: &job.events,
        provenance: job.provenance.clone(),
        at_ms: job.at_ms,
    };
    let rows = rows::generation_rows(&new, &journal)?;
    for table in ["events", "run_search", "thinking_search", "runs"] {
        tx.execute(
            &format!("DELETE FROM {table} WHERE tenant = ?1 AND run_id = ?2"),
            params![job.tenant, job.run_id],
        )?;
    }
    let result = write_batch(&tx, &rows)?;
    let generation = current + 1;
    let pr = &job.provenance;
    tx.execute(
        &rows::stamp_generation(p),
        params![
            job.tenant,
            job.run_id,
            generation,
            pr.adapter,
            i64::from(pr.adapter_version),
            i64::from(pr.grammar_version)
        ],
    )?;
    tx.commit()?;
    finish(&rows, &result, conflicts);
    Ok(GenerationOutcome::Written(
        u32::try_from(generation).unwrap_or(u32::MAX),
    ))
}

/// [`Store::erase`] on the writer connection: one transaction, then a truncating
/// checkpoint so no earlier version of the erased pages stays in the WAL file.
fn erase(conn: &mut Connection, job: &EraseJob) -> Result<Erased, ArchiveError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let targets: Vec<(String, String)> = {
        let sql = rows::erase_targets_query(&job.scope, |n| format!("?{n}"));
        let mut stmt = tx.prepare(&sql)?;
        let map = |r: &rusqlite::Row<'_>| Ok((r.get(0)?, r.get(1)?));
        let found = match job.scope {
            EraseScope::All => stmt.query_map(params![job.tenant], map)?,
            _ => stmt.query_map(
                params![job.tenant, rows::erase_scope_param(&job.scope)],
                map,
            )?,
        };
        found.collect::<Result<_, _>>()?
    };
    let mut erased = Erased::default();
    for (run_id, status) in &targets {
        for table in rows::RUN_TABLES {
            let n = tx.execute(
                &format!("DELETE FROM {table} WHERE tenant = ?1 AND run_id = ?2"),
                params![job.tenant, run_id],
            )? as u64;
            match table {
                "events" | "event_generations" => erased.events += n,
                "raw_chunks" => erased.raw_chunks += n,
                _ => {}
            }
        }
        erased.open_runs += u64::from(status == "open");
    }
    erased.runs = targets.into_iter().map(|(r, _)| r).collect();
    let request = Erasure {
        tenant: &job.tenant,
        scope: &job.scope,
        actor: &job.actor,
        at_ms: job.at_ms,
    };
    let (scope_hash, run_hashes) = rows::audit_hashes(&request, &erased.runs);
    tx.execute(
        "INSERT INTO erasures (at_ms, actor, tenant, scope, scope_hash, run_hashes, events, \
         raw_chunks) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            job.at_ms,
            job.actor,
            job.tenant,
            job.scope.kind(),
            scope_hash,
            run_hashes,
            rows::to_i64("events", erased.events)?,
            rows::to_i64("raw_chunks", erased.raw_chunks)?
        ],
    )?;
    erased.audit_id = tx.last_insert_rowid();
    tx.commit()?;
    // Readers finishing a snapshot can hold the checkpoint back for a moment.
    for _ in 0..50 {
        let busy: i64 = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))?;
        if busy == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(erased)
}

fn erasure_record(r: &rusqlite::Row<'_>) -> Result<ErasureRecord, ArchiveError> {
    let hashes: String = r.get(6)?;
    Ok(ErasureRecord {
        id: r.get(0)?,
        at_ms: r.get(1)?,
        actor: r.get(2)?,
        tenant: r.get(3)?,
        scope: r.get(4)?,
        scope_hash: r.get(5)?,
        run_hashes: hashes.split_whitespace().map(str::to_owned).collect(),
        events: rows::to_u64("events", r.get(7)?)?,
        raw_chunks: rows::to_u64("raw_chunks", r.get(8)?)?,
    })
}

/// [`Store::mark_exported`] on the writer connection.
fn mark_exported(
    conn: &mut Connection,
    runs: &[(String, String)],
    at_ms: i64,
) -> Result<(), ArchiveError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    {
        let mut mark = tx.prepare_cached(
            "UPDATE runs SET exported_at_ms = ?3 WHERE tenant = ?1 AND run_id = ?2",
        )?;
        for (tenant, run_id) in runs {
            mark.execute(params![tenant, run_id, at_ms])?;
        }
    }
    tx.commit()?;
    Ok(())
}

/// [`Store::index_thinking`] on the writer connection.
fn index_thinking(
    conn: &mut Connection,
    tenant: &str,
    run_id: &str,
    segments: &[(i64, String)],
    at_ms: i64,
) -> Result<(), ArchiveError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute(
        "DELETE FROM thinking_search WHERE tenant = ?1 AND run_id = ?2",
        params![tenant, run_id],
    )?;
    {
        let mut index = tx.prepare_cached(
            "INSERT INTO thinking_search (tenant, run_id, seq, thinking) VALUES (?1, ?2, ?3, ?4)",
        )?;
        for (seq, text) in segments {
            index.execute(params![tenant, run_id, seq, text])?;
        }
    }
    tx.execute(
        "UPDATE runs SET thinking_indexed_at_ms = ?3 WHERE tenant = ?1 AND run_id = ?2",
        params![tenant, run_id, at_ms],
    )?;
    tx.commit()?;
    Ok(())
}

/// [`Store::strip_run`] on the writer connection.
fn strip_run(
    conn: &mut Connection,
    tenant: &str,
    run_id: &str,
    at_ms: i64,
) -> Result<u64, ArchiveError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let stored: Vec<(Option<i64>, i64, String)> = {
        let mut stmt = tx.prepare(
            "SELECT NULL, seq, payload FROM events WHERE tenant = ?1 AND run_id = ?2 \
             UNION ALL SELECT generation, seq, payload FROM event_generations \
             WHERE tenant = ?1 AND run_id = ?2",
        )?;
        let found = stmt.query_map(params![tenant, run_id], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?;
        found.collect::<Result<_, _>>()?
    };
    let changed = rows::stripped_payloads(stored);
    for (generation, seq, payload) in &changed {
        match generation {
            None => tx.execute(
                "UPDATE events SET payload = ?3 WHERE tenant = ?1 AND run_id = ?2 AND seq = ?4",
                params![tenant, run_id, payload, seq],
            )?,
            Some(g) => tx.execute(
                "UPDATE event_generations SET payload = ?3 WHERE tenant = ?1 AND run_id = ?2 \
                 AND generation = ?5 AND seq = ?4",
                params![tenant, run_id, payload, seq, g],
            )?,
        };
    }
    for table in ["raw_chunks", "thinking_search"] {
        tx.execute(
            &format!("DELETE FROM {table} WHERE tenant = ?1 AND run_id = ?2"),
            params![tenant, run_id],
        )?;
    }
    tx.execute(
        "UPDATE runs SET stripped_at_ms = ?3 WHERE tenant = ?1 AND run_id = ?2",
        params![tenant, run_id, at_ms],
    )?;
    tx.commit()?;
    Ok(changed.len() as u64)
}

/// [`Store::drop_run`] on the writer connection.
fn drop_run(conn: &mut Connection, tenant: &str, run_id: &str) -> Result<u64, ArchiveError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut events = 0;
    for table in rows::RUN_TABLES {
        let n = tx.execute(
            &format!("DELETE FROM {table} WHERE tenant = ?1 AND run_id = ?2"),
            params![tenant, run_id],
        )? as u64;
        if matches!(table, "events" | "event_generations") {
            events += n;
        }
    }
    tx.commit()?;
    Ok(events)
}

fn write_raw(conn: &mut Connection, chunks: &[RawChunkRecord]) -> Result<u64, ArchiveError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut inserted = 0u64;
    {
        let mut insert = tx.prepare_cached(INSERT_RAW)?;
        for c in chunks {
            inserted += insert.execute(params![
                c.run_id,
                rows::to_i64("chunk", c.chunk)?,
                c.tenant,
                c.family,
                c.ingest_ts_ms,
                c.close,
                c.body,
            ])? as u64;
        }
    }
    tx.commit()?;
    Ok(inserted)
}

/// Pooled read-only connections.
struct Readers {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

impl Readers {
    fn take(&self) -> Result<Connection, ArchiveError> {
        // A poisoned lock only means another reader panicked; the Vec is still valid.
        if let Some(conn) = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            return Ok(conn);
        }
        let conn = Connection::open_with_flags(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        conn.set_prepared_statement_cache_capacity(32);
        Ok(conn)
    }

    fn give(&self, conn: Connection) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < MAX_IDLE_READERS {
            idle.push(conn);
        }
    }
}

fn read_events(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<ArchivedEvent>, ArchiveError> {
    let mut stmt = conn.prepare_cached(sql)?;
    let mut rows = stmt.query(params)?;
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        let payload: String = r.get(5)?;
        out.push(rows::decode_event(
            r.get(0)?,
            r.get(1)?,
            r.get(2)?,
            r.get(3)?,
            r.get(4)?,
            &payload,
        )?);
    }
    Ok(out)
}

fn stored_run(r: &rusqlite::Row<'_>) -> rusqlite::Result<StoredRun> {
    Ok(StoredRun {
        tenant: r.get(0)?,
        run_id: r.get(1)?,
        session_key: r.get(2)?,
        provider: r.get(3)?,
        model: r.get(4)?,
        status: r.get(5)?,
        stop_reason: r.get(6)?,
        usage: r.get(7)?,
        first_seq: r.get(8)?,
        last_seq: r.get(9)?,
        first_ts_ms: r.get(10)?,
        last_ts_ms: r.get(11)?,
        event_count: r.get(12)?,
        adapter: r.get(13)?,
        adapter_version: r.get(14)?,
        grammar_version: r.get(15)?,
        generation: r.get(16)?,
        stripped_at_ms: r.get(17)?,
        accounting: {
            let mut a = [None; 7];
            for (i, slot) in a.iter_mut().enumerate() {
                *slot = r.get(18 + i)?;
            }
            a
        },
    })
}

impl rusqlite::ToSql for Param {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        match self {
            Param::Text(s) => s.to_sql(),
            Param::Int(i) => i.to_sql(),
        }
    }
}

/// SQLite's "no limit".
fn sqlite_limit(limit: u32) -> i64 {
    if limit == 0 {
        -1
    } else {
        i64::from(limit)
    }
}

#[async_trait::async_trait]
impl Store for SqliteStore {
    /// One writer thread takes every job from one FIFO queue (batches queued together
    /// share a transaction, in queue order).
    fn commits_in_submission_order(&self) -> bool {
        true
    }

    async fn insert_batch(&self, events: &[ArchivedEvent]) -> Result<InsertOutcome, ArchiveError> {
        self.insert_batch_with_provenance(events, &[]).await
    }

    async fn insert_batch_with_provenance(
        &self,
        events: &[ArchivedEvent],
        runs: &[RunProvenance],
    ) -> Result<InsertOutcome, ArchiveError> {
        if events.is_empty() {
            self.record_provenance(runs).await?;
            return Ok(InsertOutcome::default());
        }
        // Encoding happens here, on the caller's task, in parallel with the writer
        // thread committing the previous batch.
        let batch = EventBatch {
            rows: rows::to_rows(events)?,
            provenance: runs.to_vec(),
        };
        self.submit(|reply| WriteJob::Events { batch, reply }).await
    }

    async fn events_after(
        &self,
        tenant: &str,
        run_id: &str,
        after_seq: u64,
        limit: u32,
    ) -> Result<Vec<ArchivedEvent>, ArchiveError> {
        let (tenant, run_id) = (tenant.to_owned(), run_id.to_owned());
        let after = rows::to_i64("after_seq", after_seq)?;
        self.read(move |conn| {
            read_events(
                conn,
                &format!(
                    "SELECT {EVENT_COLUMNS} FROM events WHERE tenant = ?1 AND run_id = ?2 \
                     AND seq > ?3 ORDER BY seq LIMIT ?4"
                ),
                params![tenant, run_id, after, sqlite_limit(limit)],
            )
        })
        .await
    }

    async fn journal_after(
        &self,
        after_journal_seq: u64,
        limit: u32,
    ) -> Result<Vec<ArchivedEvent>, ArchiveError> {
        let after = rows::to_i64("after_journal_seq", after_journal_seq)?;
        self.read(move |conn| {
            let sql = rows::journal_query(|n| format!("?{n}"), limit != 0);
            if limit == 0 {
                read_events(conn, &sql, params![after])
            } else {
                read_events(conn, &sql, params![after, i64::from(limit)])
            }
        })
        .await
    }

    async fn get_run(&self, tenant: &str, run_id: &str) -> Result<Option<RunRecord>, ArchiveError> {
        let (tenant, run_id) = (tenant.to_owned(), run_id.to_owned());
        self.read(move |conn| {
            let sql = format!(
                "SELECT {} FROM runs WHERE tenant = ?1 AND run_id = ?2",
                rows::RUN_COLUMNS
            );
            conn.prepare_cached(&sql)?
                .query_row([tenant, run_id], stored_run)
                .optional()?
                .map(StoredRun::into_record)
                .transpose()
        })
        .await
    }

    async fn list_runs(&self, filter: &RunFilter) -> Result<RunPage, ArchiveError> {
        let filter = filter.clone();
        self.read(move |conn| {
            let (sql, params) = rows::list_query(&filter, |n| format!("?{n}"))?;
            let mut stmt = conn.prepare_cached(&sql)?;
            let runs = stmt
                .query_map(rusqlite::params_from_iter(params.iter()), stored_run)?
                .collect::<Result<Vec<_>, _>>()?;
            rows::into_page(runs, &filter)
        })
        .await
    }

    async fn insert_raw(&self, chunks: &[RawChunkRecord]) -> Result<u64, ArchiveError> {
        if chunks.is_empty() {
            return Ok(0);
        }
        let chunks = chunks.to_vec();
        self.submit(|reply| WriteJob::Raw { chunks, reply }).await
    }

    async fn raw_chunks(
        &self,
        tenant: &str,
        run_id: &str,
    ) -> Result<Vec<RawChunkRecord>, ArchiveError> {
        let (tenant, run_id) = (tenant.to_owned(), run_id.to_owned());
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT tenant, run_id, chunk, family, ingest_ts_ms, close, body \
                 FROM raw_chunks WHERE tenant = ?1 AND run_id = ?2 ORDER BY chunk",
            )?;
            let mut rows = stmt.query([tenant, run_id])?;
            let mut out = Vec::new();
            while let Some(r) = rows.next()? {
                out.push(raw_record(r)?);
            }
            Ok(out)
        })
        .await
    }

    async fn record_provenance(&self, runs: &[RunProvenance]) -> Result<(), ArchiveError> {
        if runs.is_empty() {
            return Ok(());
        }
        let runs = runs.to_vec();
        self.submit(|reply| WriteJob::Provenance { runs, reply })
            .await
    }

    async fn raw_chunks_from(
        &self,
        tenant: &str,
        run_id: &str,
        from_chunk: u64,
        limit: u32,
    ) -> Result<Vec<RawChunkRecord>, ArchiveError> {
        let (tenant, run_id) = (tenant.to_owned(), run_id.to_owned());
        let from = rows::to_i64("from_chunk", from_chunk)?;
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT tenant, run_id, chunk, family, ingest_ts_ms, close, body \
                 FROM raw_chunks WHERE tenant = ?1 AND run_id = ?2 AND chunk >= ?3 \
                 ORDER BY chunk LIMIT ?4",
            )?;
            let mut rows = stmt.query(params![tenant, run_id, from, sqlite_limit(limit)])?;
            let mut out = Vec::new();
            while let Some(r) = rows.next()? {
                out.push(raw_record(r)?);
            }
            Ok(out)
        })
        .await
    }

    async fn write_generation(
        &self,
        generation: &NewGeneration<'_>,
    ) -> Result<GenerationOutcome, ArchiveError> {
        let job = GenerationJob {
            tenant: generation.tenant.to_owned(),
            run_id: generation.run_id.to_owned(),
            replaces: generation.replaces,
            events: generation.events.to_vec(),
            provenance: generation.provenance.clone(),
            at_ms: generation.at_ms,
        };
        self.submit(|reply| WriteJob::Generation { job, reply })
            .await
    }

    async fn generation_events_after(
        &self,
        tenant: &str,
        run_id: &str,
        generation: u32,
        after_seq: u64,
        limit: u32,
    ) -> Result<Vec<ArchivedEvent>, ArchiveError> {
        let (tenant, run_id) = (tenant.to_owned(), run_id.to_owned());
        let after = rows::to_i64("after_seq", after_seq)?;
        let generation = i64::from(generation);
        self.read(move |conn| {
            // One read transaction, so a backfill committing meanwhile cannot move the
            // generation between the check and the read.
            conn.execute_batch("BEGIN")?;
            let result = (|| {
                let current: Option<i64> = conn
                    .prepare_cached(
                        "SELECT generation FROM runs WHERE tenant = ?1 AND run_id = ?2",
                    )?
                    .query_row(params![tenant, run_id], |r| r.get(0))
                    .optional()?;
                if current == Some(generation) {
                    return read_events(
                        conn,
                        &format!(
                            "SELECT {EVENT_COLUMNS} FROM events WHERE tenant = ?1 AND \
                             run_id = ?2 AND seq > ?3 ORDER BY seq LIMIT ?4"
                        ),
                        params![tenant, run_id, after, sqlite_limit(limit)],
                    );
                }
                read_events(
                    conn,
                    &format!(
                        "SELECT {EVENT_COLUMNS} FROM event_generations WHERE tenant = ?1 AND \
                         run_id = ?2 AND generation = ?3 AND seq > ?4 ORDER BY seq LIMIT ?5"
                    ),
                    params![tenant, run_id, generation, after, sqlite_limit(limit)],
                )
            })();
            conn.execute_batch("COMMIT")?;
            result
        })
        .await
    }

    async fn erase(&self, erasure: &Erasure<'_>) -> Result<Erased, ArchiveError> {
        let job = EraseJob {
            tenant: erasure.tenant.to_owned(),
            scope: erasure.scope.clone(),
            actor: erasure.actor.to_owned(),
            at_ms: erasure.at_ms,
        };
        self.submit(|reply| WriteJob::Erase { job, reply }).await
    }

    async fn strip_run(&self, tenant: &str, run_id: &str, at_ms: i64) -> Result<u64, ArchiveError> {
        let (tenant, run_id) = (tenant.to_owned(), run_id.to_owned());
        self.submit(|reply| WriteJob::Retain {
            tenant,
            run_id,
            strip_at_ms: Some(at_ms),
            reply,
        })
        .await
    }

    async fn mark_exported(
        &self,
        runs: &[(String, String)],
        at_ms: i64,
    ) -> Result<(), ArchiveError> {
        if runs.is_empty() {
            return Ok(());
        }
        let runs = runs.to_vec();
        self.submit(|reply| WriteJob::Exported { runs, at_ms, reply })
            .await
    }

    async fn drop_run(&self, tenant: &str, run_id: &str) -> Result<u64, ArchiveError> {
        let (tenant, run_id) = (tenant.to_owned(), run_id.to_owned());
        self.submit(|reply| WriteJob::Retain {
            tenant,
            run_id,
            strip_at_ms: None,
            reply,
        })
        .await
    }

    async fn run_stats(&self, filter: &StatsFilter) -> Result<Vec<StatsRow>, ArchiveError> {
        let filter = filter.clone();
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(&rows::stats_query(|n| format!("?{n}")))?;
            let mut found = stmt.query(params![
                filter.tenant,
                filter.since_ts_ms,
                filter.until_ts_ms
            ])?;
            let mut out = Vec::new();
            while let Some(r) = found.next()? {
                let mut v = [0i64; 10];
                for (i, slot) in v.iter_mut().enumerate() {
                    *slot = r.get(i + 2)?;
                }
                out.push(rows::stats_row(r.get(0)?, r.get(1)?, v));
            }
            Ok(out)
        })
        .await
    }

    async fn search_runs(
        &self,
        tenant: Option<&str>,
        phrase: &str,
        limit: u32,
    ) -> Result<Vec<SearchHit>, ArchiveError> {
        self.search("run_search", tenant, phrase, limit).await
    }

    async fn search_thinking(
        &self,
        tenant: Option<&str>,
        phrase: &str,
        limit: u32,
    ) -> Result<Vec<SearchHit>, ArchiveError> {
        self.search("thinking_search", tenant, phrase, limit).await
    }

    async fn index_thinking(
        &self,
        tenant: &str,
        run_id: &str,
        segments: &[(i64, String)],
        at_ms: i64,
    ) -> Result<(), ArchiveError> {
        let (tenant, run_id, segments) = (tenant.to_owned(), run_id.to_owned(), segments.to_vec());
        self.submit(|reply| WriteJob::Thinking {
            tenant,
            run_id,
            segments,
            at_ms,
            reply,
        })
        .await
    }

    async fn erasures(
        &self,
        tenant: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ErasureRecord>, ArchiveError> {
        let tenant = tenant.map(str::to_owned);
        let limit = i64::from(if limit == 0 { 100 } else { limit });
        self.read(move |conn| {
            let sql = format!(
                "SELECT {} FROM erasures WHERE (?1 IS NULL OR tenant = ?1) \
                 ORDER BY id DESC LIMIT ?2",
                rows::ERASURE_COLUMNS
            );
            let mut stmt = conn.prepare_cached(&sql)?;
            let mut found = stmt.query(params![tenant, limit])?;
            let mut out = Vec::new();
            while let Some(r) = found.next()? {
                out.push(erasure_record(r)?);
            }
            Ok(out)
        })
        .await
    }

    fn conflicts_total(&self) -> u64 {
        self.conflicts.load(Ordering::Relaxed)
    }
}

fn raw_record(r: &rusqlite::Row<'_>) -> Result<RawChunkRecord, ArchiveError> {
    Ok(RawChunkRecord {
        tenant: r.get(0)?,
        run_id: r.get(1)?,
        chunk: rows::to_u64("raw chunk index", r.get(2)?)?,
        family: r.get(3)?,
        ingest_ts_ms: r.get(4)?,
        close: r.get(5)?,
        body: r.get(6)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_writers_connection_leaves_the_sync_to_a_thread_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("archive.db");
        let conn = open_writer(&path, &SqliteOptions::default()).unwrap();
        let durable = Durable::start(&conn, SqliteDurability::Full, WriterPriority::Normal);
        assert!(
            matches!(durable, Durable::Synced { .. }),
            "the WAL file is there to sync"
        );
        let synchronous: i64 = conn
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .unwrap();
        assert_eq!(
            synchronous, 1,
            "NORMAL: SQLite leaves the sync to the thread"
        );
        let (tx, mut rx) = oneshot::channel();
        durable.deliver(vec![answer(tx, Ok(7))]);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let answered = loop {
            match rx.try_recv() {
                Err(oneshot::error::TryRecvError::Empty)
                    if std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(1));
                }
                other => break other,
            }
        };
        assert_eq!(answered.unwrap().unwrap(), 7);
        // Asked for NORMAL, nothing waits for a sync.
        let normal = Durable::start(&conn, SqliteDurability::Normal, WriterPriority::Normal);
        assert!(matches!(normal, Durable::Inline));
    }
}
