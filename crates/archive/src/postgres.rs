//! PostgreSQL backend: a deadpool pool of tokio-postgres connections.
//!
//! A batch is a handful of round trips whatever its size: one `INSERT … SELECT FROM
//! UNNEST(arrays) ON CONFLICT DO NOTHING RETURNING` for the events, one keyed `SELECT`
//! only when some rows were not inserted (to tell duplicates from conflicts), and one
//! `UNNEST` upsert for the runs touched by the batch.

use crate::rows::{self, EventRow, Param, StoredContent, StoredRun};
use crate::{
    migrations, ArchiveError, ArchivedEvent, EraseScope, Erased, Erasure, ErasureRecord,
    GenerationOutcome, InsertOutcome, NewGeneration, RawChunkRecord, RunFilter, RunPage,
    RunProvenance, RunRecord, RunStatusKind, SearchHit, StatsFilter, StatsRow, Store,
};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use tokio_postgres::types::ToSql;
use tokio_postgres::NoTls;

/// Connections in the pool. Writers hold one per batch; readers one per query.
const POOL_SIZE: usize = 16;
/// `pg_advisory_xact_lock` key serializing migrations across replicas ("sgarch01").
const MIGRATION_LOCK: i64 = 0x7367_6172_6368_3031;

const INSERT_EVENTS: &str = "INSERT INTO events \
     (run_id, seq, journal_seq, tenant, session_key, stream, phase, ts_ms, payload) \
     SELECT * FROM UNNEST($1::text[], $2::int8[], $3::int8[], $4::text[], $5::text[], \
                          $6::text[], $7::text[], $8::int8[], $9::text[]) \
     ON CONFLICT (tenant, run_id, seq) DO NOTHING RETURNING tenant, run_id, seq";
const SELECT_CONTENT: &str = "SELECT e.tenant, e.run_id, e.seq, e.session_key, e.ts_ms, \
     e.payload FROM events e \
     JOIN UNNEST($1::text[], $2::text[], $3::int8[]) AS k(tenant, run_id, seq) \
     ON e.tenant = k.tenant AND e.run_id = k.run_id AND e.seq = k.seq";
use crate::rows::EVENT_COLUMNS;
const INSERT_RAW: &str = "INSERT INTO raw_chunks \
     (run_id, chunk, tenant, family, ingest_ts_ms, close, body) \
     SELECT * FROM UNNEST($1::text[], $2::int8[], $3::text[], $4::text[], $5::int8[], \
                          $6::text[], $7::bytea[]) \
     ON CONFLICT (tenant, run_id, chunk) DO NOTHING";

/// The PostgreSQL archive: a connection pool, `UNNEST` batch inserts, the same schema
/// and semantics as [`crate::SqliteStore`].
pub struct PostgresStore {
    pool: Pool,
    conflicts: AtomicU64,
}

impl PostgresStore {
    /// Connects (`postgres://user@host:port/db`, no TLS), applies missing migrations
    /// under an advisory lock (so replicas starting together are safe).
    pub async fn connect(url: &str) -> Result<PostgresStore, ArchiveError> {
        let config: tokio_postgres::Config = url
            .parse()
            .map_err(|e| ArchiveError::Config(format!("bad postgres url: {e}")))?;
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .build()
            .map_err(|e| ArchiveError::Config(format!("postgres pool: {e}")))?;
        let mut client = pool.get().await?;
        migrate(&mut client).await?;
        drop(client);
        Ok(PostgresStore {
            pool,
            conflicts: AtomicU64::new(0),
        })
    }

    async fn read_events(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<ArchivedEvent>, ArchiveError> {
        let client = self.pool.get().await?;
        let stmt = client.prepare_cached(sql).await?;
        let found = client.query(&stmt, params).await?;
        let mut out = Vec::with_capacity(found.len());
        for r in found {
            let payload: &str = r.try_get(5)?;
            out.push(rows::decode_event(
                r.try_get(0)?,
                r.try_get(1)?,
                r.try_get(2)?,
                r.try_get(3)?,
                r.try_get(4)?,
                payload,
            )?);
        }
        Ok(out)
    }
}

async fn migrate(client: &mut deadpool_postgres::Client) -> Result<(), ArchiveError> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    tx.batch_execute(migrations::CREATE_SCHEMA_MIGRATIONS)
        .await?;
    let current: i64 = tx
        .query_one(
            "SELECT COALESCE(MAX(version), 0)::int8 FROM schema_migrations",
            &[],
        )
        .await?
        .try_get(0)?;
    let known = migrations::POSTGRES.last().map_or(0, |m| m.0);
    if current > known {
        return Err(ArchiveError::SchemaTooNew {
            found: current,
            known,
        });
    }
    for (version, sql) in migrations::POSTGRES.iter().filter(|m| m.0 > current) {
        tx.batch_execute(sql).await?;
        tx.execute(
            "INSERT INTO schema_migrations (version, applied_at_ms) VALUES ($1, $2)",
            &[version, &migrations::now_ms()],
        )
        .await?;
        tracing::info!(version, "applied postgres archive migration");
    }
    tx.commit().await?;
    Ok(())
}

fn stored_run(r: &tokio_postgres::Row) -> Result<StoredRun, ArchiveError> {
    Ok(StoredRun {
        tenant: r.try_get(0)?,
        run_id: r.try_get(1)?,
        session_key: r.try_get(2)?,
        provider: r.try_get(3)?,
        model: r.try_get(4)?,
        status: r.try_get(5)?,
        stop_reason: r.try_get(6)?,
        usage: r.try_get(7)?,
        first_seq: r.try_get(8)?,
        last_seq: r.try_get(9)?,
        first_ts_ms: r.try_get(10)?,
        last_ts_ms: r.try_get(11)?,
        event_count: r.try_get(12)?,
        adapter: r.try_get(13)?,
        adapter_version: r.try_get(14)?,
        grammar_version: r.try_get(15)?,
        generation: r.try_get(16)?,
        stripped_at_ms: r.try_get(17)?,
        accounting: {
            let mut a = [None; 7];
            for (i, slot) in a.iter_mut().enumerate() {
                *slot = r.try_get(18 + i)?;
            }
            a
        },
    })
}

impl PostgresStore {
    /// Counts and logs conflicts, only once committed (a failed batch is retried).
    fn counted(&self, outcome: &InsertOutcome, conflicts: Vec<(&EventRow, String)>) {
        self.conflicts
            .fetch_add(outcome.conflicts, Ordering::Relaxed);
        for (row, stored) in conflicts {
            rows::log_conflict(row, &stored);
        }
    }

    /// A phrase search over one of the `tsvector` tables (`run_search` over `answer`,
    /// `thinking_search` over `thinking`), one hit per run, best first.
    async fn search(
        &self,
        table: &'static str,
        column: &'static str,
        tenant: Option<&str>,
        phrase: &str,
        limit: u32,
    ) -> Result<Vec<SearchHit>, ArchiveError> {
        let limit = i64::from(if limit == 0 { 50 } else { limit.min(1000) });
        let client = self.pool.get().await?;
        let found = client
            .query(
                &format!(
                    "SELECT tenant, run_id, ts_headline('simple', {column}, q, \
                       'StartSel=[, StopSel=], MaxWords=16, MinWords=4') FROM ( \
                       SELECT DISTINCT ON (tenant, run_id) tenant, run_id, {column}, q, \
                         ts_rank(doc, q) AS rank \
                       FROM {table}, phraseto_tsquery('simple', $1) AS q \
                       WHERE doc @@ q AND ($2::text IS NULL OR tenant = $2) \
                       ORDER BY tenant, run_id, rank DESC \
                     ) hits ORDER BY rank DESC LIMIT $3"
                ),
                &[&phrase, &tenant, &limit],
            )
            .await?;
        found
            .iter()
            .map(|r| {
                Ok(SearchHit {
                    tenant: r.try_get(0)?,
                    run_id: r.try_get(1)?,
                    snippet: r.try_get(2)?,
                })
            })
            .collect()
    }
}

fn raw_record(r: &tokio_postgres::Row) -> Result<RawChunkRecord, ArchiveError> {
    Ok(RawChunkRecord {
        tenant: r.try_get(0)?,
        run_id: r.try_get(1)?,
        chunk: rows::to_u64("raw chunk index", r.try_get(2)?)?,
        family: r.try_get(3)?,
        ingest_ts_ms: r.try_get(4)?,
        close: r.try_get(5)?,
        body: r.try_get(6)?,
    })
}

/// PostgreSQL's "no limit": `LIMIT NULL`.
fn pg_limit(limit: u32) -> Option<i64> {
    (limit != 0).then_some(i64::from(limit))
}

/// Inserts event rows (sorted by key) and upserts their runs inside `tx`: the body of
/// [`Store::insert_batch`], shared with [`Store::write_generation`]. Returns the outcome
/// and the conflicts (row, stored payload) to log once committed.
async fn write_rows<'r>(
    tx: &deadpool_postgres::Transaction<'_>,
    rows: &'r [EventRow],
) -> Result<(InsertOutcome, Vec<(&'r EventRow, String)>), ArchiveError> {
    // Rows are sorted by key, so a key repeated inside the batch is adjacent. Only
    // its first occurrence goes into the INSERT; the repeats are judged afterwards
    // against whatever row won, like any other duplicate.
    let first: Vec<bool> = (0..rows.len())
        .map(|i| i == 0 || rows[i].key() != rows[i - 1].key())
        .collect();
    let main: Vec<&EventRow> = rows
        .iter()
        .zip(&first)
        .filter(|(_, f)| **f)
        .map(|(r, _)| r)
        .collect();

    let insert = tx.prepare_cached(INSERT_EVENTS).await?;
    let returned = tx
        .query(
            &insert,
            &[
                &main.iter().map(|r| r.run_id.as_str()).collect::<Vec<_>>(),
                &main.iter().map(|r| r.seq).collect::<Vec<_>>(),
                &main.iter().map(|r| r.journal_seq).collect::<Vec<_>>(),
                &main.iter().map(|r| r.tenant.as_str()).collect::<Vec<_>>(),
                &main
                    .iter()
                    .map(|r| r.session_key.as_deref())
                    .collect::<Vec<_>>(),
                &main.iter().map(|r| r.stream).collect::<Vec<_>>(),
                &main.iter().map(|r| r.phase).collect::<Vec<_>>(),
                &main.iter().map(|r| r.ts_ms).collect::<Vec<_>>(),
                &main.iter().map(|r| r.payload.as_str()).collect::<Vec<_>>(),
            ],
        )
        .await?;

    let mut inserted = vec![false; rows.len()];
    if returned.len() == main.len() {
        // Fast path: everything new.
        for (ins, f) in inserted.iter_mut().zip(&first) {
            *ins = *f;
        }
    } else {
        let keys = returned
            .iter()
            .map(|r| {
                Ok((
                    r.try_get::<_, &str>(0)?,
                    r.try_get::<_, &str>(1)?,
                    r.try_get::<_, i64>(2)?,
                ))
            })
            .collect::<Result<HashSet<_>, tokio_postgres::Error>>()?;
        for ((ins, f), row) in inserted.iter_mut().zip(&first).zip(rows) {
            *ins = *f && keys.contains(&row.key());
        }
    }

    let mut outcome = InsertOutcome {
        inserted: returned.len() as u64,
        ..InsertOutcome::default()
    };
    let mut conflicts: Vec<(&EventRow, String)> = Vec::new();
    let pending: Vec<&EventRow> = rows
        .iter()
        .zip(&inserted)
        .filter(|(_, ins)| !**ins)
        .map(|(r, _)| r)
        .collect();
    if !pending.is_empty() {
        let select = tx.prepare_cached(SELECT_CONTENT).await?;
        let found = tx
            .query(
                &select,
                &[
                    &pending
                        .iter()
                        .map(|r| r.tenant.as_str())
                        .collect::<Vec<_>>(),
                    &pending
                        .iter()
                        .map(|r| r.run_id.as_str())
                        .collect::<Vec<_>>(),
                    &pending.iter().map(|r| r.seq).collect::<Vec<_>>(),
                ],
            )
            .await?;
        let mut stored: HashMap<(String, String, i64), StoredContent> = HashMap::new();
        for r in found {
            stored.insert(
                (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?),
                StoredContent {
                    tenant: r.try_get(0)?,
                    session_key: r.try_get(3)?,
                    ts_ms: r.try_get(4)?,
                    payload: r.try_get(5)?,
                },
            );
        }
        for row in pending {
            let key = (row.tenant.clone(), row.run_id.clone(), row.seq);
            let s = stored.get(&key).ok_or_else(|| ArchiveError::Corrupt {
                what: format!("event {}/{}/{}", row.tenant, row.run_id, row.seq),
                detail: "neither inserted nor found".into(),
            })?;
            if row.same_content(s) {
                outcome.duplicates += 1;
            } else {
                outcome.conflicts += 1;
                conflicts.push((row, s.payload.clone()));
            }
        }
    }

    let answers: Vec<&EventRow> = rows
        .iter()
        .zip(&inserted)
        .filter(|(r, ins)| **ins && r.answer.is_some())
        .map(|(r, _)| r)
        .collect();
    if !answers.is_empty() {
        let index = tx
            .prepare_cached(
                "INSERT INTO run_search (tenant, run_id, seq, answer) \
                 SELECT * FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::text[]) \
                 ON CONFLICT (tenant, run_id, seq) DO NOTHING",
            )
            .await?;
        tx.execute(
            &index,
            &[
                &answers
                    .iter()
                    .map(|r| r.tenant.as_str())
                    .collect::<Vec<_>>(),
                &answers
                    .iter()
                    .map(|r| r.run_id.as_str())
                    .collect::<Vec<_>>(),
                &answers.iter().map(|r| r.seq).collect::<Vec<_>>(),
                &answers
                    .iter()
                    .map(|r| r.answer.as_deref().unwrap_or_default())
                    .collect::<Vec<_>>(),
            ],
        )
        .await?;
    }
    let deltas = rows::run_deltas(
        rows.iter()
            .zip(&inserted)
            .filter(|(_, ins)| **ins)
            .map(|(r, _)| r),
    );
    if !deltas.is_empty() {
        let upsert = tx
            .prepare_cached(&format!(
                "INSERT INTO runs ({}) SELECT * FROM UNNEST($1::text[], $2::text[], \
                 $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::int8[], \
                 $9::text[], $10::int8[], $11::int8[], $12::int8[], $13::int8[], \
                 $14::int8[], $15::int8[], $16::int8[], $17::int8[], $18::int8[], $19::int8[], \
                 $20::int8[], $21::int8[], $22::int8[]) \
                 ON CONFLICT (tenant, run_id) DO UPDATE SET {}, {}",
                rows::RUN_INSERT_COLUMNS,
                rows::RUN_UPSERT_SET_INDEXED,
                rows::RUN_UPSERT_SET
            ))
            .await?;
        let accounting: Vec<Vec<Option<i64>>> = (0..7)
            .map(|i| {
                deltas
                    .iter()
                    .map(|d| rows::accounting_values(d)[i])
                    .collect()
            })
            .collect();
        let status = |d: &rows::RunDelta| {
            d.terminal
                .as_ref()
                .map_or(RunStatusKind::Open, |t| t.status)
                .as_str()
        };
        tx.execute(
            &upsert,
            &[
                &deltas.iter().map(|d| d.run_id.as_str()).collect::<Vec<_>>(),
                &deltas.iter().map(|d| d.tenant.as_str()).collect::<Vec<_>>(),
                &deltas
                    .iter()
                    .map(|d| d.session_key.as_deref())
                    .collect::<Vec<_>>(),
                &deltas
                    .iter()
                    .map(|d| d.provider.as_deref())
                    .collect::<Vec<_>>(),
                &deltas
                    .iter()
                    .map(|d| d.model.as_deref())
                    .collect::<Vec<_>>(),
                &deltas.iter().map(status).collect::<Vec<_>>(),
                &deltas
                    .iter()
                    .map(|d| d.terminal.as_ref().and_then(|t| t.reason.as_deref()))
                    .collect::<Vec<_>>(),
                &deltas
                    .iter()
                    .map(|d| d.terminal.as_ref().map(|t| t.seq))
                    .collect::<Vec<_>>(),
                &deltas
                    .iter()
                    .map(|d| d.usage.as_ref().map(|u| u.1.as_str()))
                    .collect::<Vec<_>>(),
                &deltas
                    .iter()
                    .map(|d| d.usage.as_ref().map(|u| u.0))
                    .collect::<Vec<_>>(),
                &deltas.iter().map(|d| d.first_seq).collect::<Vec<_>>(),
                &deltas.iter().map(|d| d.last_seq).collect::<Vec<_>>(),
                &deltas.iter().map(|d| d.first_ts_ms).collect::<Vec<_>>(),
                &deltas.iter().map(|d| d.last_ts_ms).collect::<Vec<_>>(),
                &deltas.iter().map(|d| d.count).collect::<Vec<_>>(),
                &accounting[0],
                &accounting[1],
                &accounting[2],
                &accounting[3],
                &accounting[4],
                &accounting[5],
                &accounting[6],
            ],
        )
        .await?;
    }
    Ok((outcome, conflicts))
}

/// The provenance rule ([`rows::provenance_update`]) for each run, inside `tx`. One
/// statement per run, in order (a run named twice gets the rule twice), sent pipelined:
/// one round trip for the lot, not one per run.
async fn update_provenance(
    tx: &deadpool_postgres::Transaction<'_>,
    runs: &[RunProvenance],
) -> Result<(), ArchiveError> {
    if runs.is_empty() {
        return Ok(());
    }
    let update = tx
        .prepare_cached(&rows::provenance_update(|n| match n {
            4 | 5 => format!("${n}::int8"),
            _ => format!("${n}"),
        }))
        .await?;
    let versions: Vec<(i64, i64)> = runs
        .iter()
        .map(|r| {
            (
                i64::from(r.provenance.adapter_version),
                i64::from(r.provenance.grammar_version),
            )
        })
        .collect();
    let params: Vec<[&(dyn ToSql + Sync); 5]> = runs
        .iter()
        .zip(&versions)
        .map(|(r, (adapter, grammar))| -> [&(dyn ToSql + Sync); 5] {
            [
                &r.tenant,
                &r.run_id,
                &r.provenance.adapter,
                adapter,
                grammar,
            ]
        })
        .collect();
    let updates = params.iter().map(|params| tx.execute(&update, params));
    for updated in futures::future::join_all(updates).await {
        updated?;
    }
    Ok(())
}

#[async_trait::async_trait]
impl Store for PostgresStore {
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
        let rows = rows::to_rows(events)?;
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let (outcome, conflicts) = write_rows(&tx, &rows).await?;
        // After the rows: their upsert makes the `runs` rows this stamps.
        update_provenance(&tx, runs).await?;
        tx.commit().await?;
        self.counted(&outcome, conflicts);
        Ok(outcome)
    }

    async fn events_after(
        &self,
        tenant: &str,
        run_id: &str,
        after_seq: u64,
        limit: u32,
    ) -> Result<Vec<ArchivedEvent>, ArchiveError> {
        let after = rows::to_i64("after_seq", after_seq)?;
        self.read_events(
            &format!(
                "SELECT {EVENT_COLUMNS} FROM events WHERE tenant = $1 AND run_id = $2 \
                 AND seq > $3 ORDER BY seq LIMIT $4"
            ),
            &[&tenant, &run_id, &after, &pg_limit(limit)],
        )
        .await
    }

    async fn journal_after(
        &self,
        after_journal_seq: u64,
        limit: u32,
    ) -> Result<Vec<ArchivedEvent>, ArchiveError> {
        let after = rows::to_i64("after_journal_seq", after_journal_seq)?;
        // Typed: `$2 - 1` would otherwise make PostgreSQL infer int4 for the limit.
        let sql = rows::journal_query(|n| format!("${n}::bigint"), limit != 0);
        match pg_limit(limit) {
            None => self.read_events(&sql, &[&after]).await,
            Some(limit) => self.read_events(&sql, &[&after, &limit]).await,
        }
    }

    async fn get_run(&self, tenant: &str, run_id: &str) -> Result<Option<RunRecord>, ArchiveError> {
        let client = self.pool.get().await?;
        let stmt = client
            .prepare_cached(&format!(
                "SELECT {} FROM runs WHERE tenant = $1 AND run_id = $2",
                rows::RUN_COLUMNS
            ))
            .await?;
        match client.query_opt(&stmt, &[&tenant, &run_id]).await? {
            Some(r) => Ok(Some(stored_run(&r)?.into_record()?)),
            None => Ok(None),
        }
    }

    async fn list_runs(&self, filter: &RunFilter) -> Result<RunPage, ArchiveError> {
        let (sql, params) = rows::list_query(filter, |n| format!("${n}"))?;
        let boxed: Vec<Box<dyn ToSql + Sync + Send>> = params
            .into_iter()
            .map(|p| -> Box<dyn ToSql + Sync + Send> {
                match p {
                    Param::Text(s) => Box::new(s),
                    Param::Int(i) => Box::new(i),
                }
            })
            .collect();
        let refs: Vec<&(dyn ToSql + Sync)> =
            boxed.iter().map(|b| &**b as &(dyn ToSql + Sync)).collect();
        let client = self.pool.get().await?;
        let stmt = client.prepare_cached(&sql).await?;
        let runs = client
            .query(&stmt, &refs)
            .await?
            .iter()
            .map(stored_run)
            .collect::<Result<Vec<_>, _>>()?;
        rows::into_page(runs, filter)
    }

    async fn insert_raw(&self, chunks: &[RawChunkRecord]) -> Result<u64, ArchiveError> {
        if chunks.is_empty() {
            return Ok(0);
        }
        let chunk_ids = chunks
            .iter()
            .map(|c| rows::to_i64("chunk", c.chunk))
            .collect::<Result<Vec<_>, _>>()?;
        let client = self.pool.get().await?;
        let stmt = client.prepare_cached(INSERT_RAW).await?;
        // One statement is one transaction: all chunks or none.
        Ok(client
            .execute(
                &stmt,
                &[
                    &chunks.iter().map(|c| c.run_id.as_str()).collect::<Vec<_>>(),
                    &chunk_ids,
                    &chunks.iter().map(|c| c.tenant.as_str()).collect::<Vec<_>>(),
                    &chunks.iter().map(|c| c.family.as_str()).collect::<Vec<_>>(),
                    &chunks.iter().map(|c| c.ingest_ts_ms).collect::<Vec<_>>(),
                    &chunks
                        .iter()
                        .map(|c| c.close.as_deref())
                        .collect::<Vec<_>>(),
                    &chunks.iter().map(|c| c.body.as_slice()).collect::<Vec<_>>(),
                ],
            )
            .await?)
    }

    async fn raw_chunks(
        &self,
        tenant: &str,
        run_id: &str,
    ) -> Result<Vec<RawChunkRecord>, ArchiveError> {
        let client = self.pool.get().await?;
        let stmt = client
            .prepare_cached(
                "SELECT tenant, run_id, chunk, family, ingest_ts_ms, close, body \
                 FROM raw_chunks WHERE tenant = $1 AND run_id = $2 ORDER BY chunk",
            )
            .await?;
        client
            .query(&stmt, &[&tenant, &run_id])
            .await?
            .iter()
            .map(raw_record)
            .collect()
    }

    async fn record_provenance(&self, runs: &[RunProvenance]) -> Result<(), ArchiveError> {
        if runs.is_empty() {
            return Ok(());
        }
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        update_provenance(&tx, runs).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn raw_chunks_from(
        &self,
        tenant: &str,
        run_id: &str,
        from_chunk: u64,
        limit: u32,
    ) -> Result<Vec<RawChunkRecord>, ArchiveError> {
        let from = rows::to_i64("from_chunk", from_chunk)?;
        let client = self.pool.get().await?;
        let stmt = client
            .prepare_cached(
                "SELECT tenant, run_id, chunk, family, ingest_ts_ms, close, body \
                 FROM raw_chunks WHERE tenant = $1 AND run_id = $2 AND chunk >= $3 \
                 ORDER BY chunk LIMIT $4",
            )
            .await?;
        client
            .query(&stmt, &[&tenant, &run_id, &from, &pg_limit(limit)])
            .await?
            .iter()
            .map(raw_record)
            .collect()
    }

    async fn write_generation(
        &self,
        g: &NewGeneration<'_>,
    ) -> Result<GenerationOutcome, ArchiveError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let current: Option<i64> = tx
            .query_opt(
                "SELECT generation FROM runs WHERE tenant = $1 AND run_id = $2 FOR UPDATE",
                &[&g.tenant, &g.run_id],
            )
            .await?
            .map(|r| r.try_get(0))
            .transpose()?;
        let Some(current) = current else {
            return Ok(GenerationOutcome::NoRun);
        };
        if current != i64::from(g.replaces) {
            return Ok(GenerationOutcome::Stale {
                current: u32::try_from(current).unwrap_or(u32::MAX),
            });
        }
        let p = |n: usize| format!("${n}");
        tx.execute(
            &rows::keep_generation_events(p),
            &[&g.tenant, &g.run_id, &current],
        )
        .await?;
        tx.execute(
            &rows::keep_generation_row(p),
            &[&g.tenant, &g.run_id, &g.at_ms],
        )
        .await?;
        let mut journal = HashMap::new();
        for r in tx
            .query(
                "SELECT seq, journal_seq FROM events WHERE tenant = $1 AND run_id = $2",
                &[&g.tenant, &g.run_id],
            )
            .await?
        {
            journal.insert(r.try_get::<_, i64>(0)?, r.try_get::<_, i64>(1)?);
        }
        let rows = rows::generation_rows(g, &journal)?;
        for table in ["events", "run_search", "thinking_search", "runs"] {
            tx.execute(
                &format!("DELETE FROM {table} WHERE tenant = $1 AND run_id = $2"),
                &[&g.tenant, &g.run_id],
            )
            .await?;
        }
        let (outcome, conflicts) = write_rows(&tx, &rows).await?;
        let generation = current + 1;
        let pr = &g.provenance;
        tx.execute(
            &rows::stamp_generation(p),
            &[
                &g.tenant,
                &g.run_id,
                &generation,
                &pr.adapter,
                &i64::from(pr.adapter_version),
                &i64::from(pr.grammar_version),
            ],
        )
        .await?;
        tx.commit().await?;
        self.counted(&outcome, conflicts);
        Ok(GenerationOutcome::Written(
            u32::try_from(generation).unwrap_or(u32::MAX),
        ))
    }

    async fn generation_events_after(
        &self,
        tenant: &str,
        run_id: &str,
        generation: u32,
        after_seq: u64,
        limit: u32,
    ) -> Result<Vec<ArchivedEvent>, ArchiveError> {
        let after = rows::to_i64("after_seq", after_seq)?;
        let generation = i64::from(generation);
        // One statement: the current generation from `events`, an older one from the
        // history, decided by the `runs` row in the same snapshot.
        self.read_events(
            &format!(
                "SELECT {EVENT_COLUMNS} FROM ( \
                   SELECT {EVENT_COLUMNS}, seq FROM events WHERE tenant = $1 AND run_id = $2 \
                     AND seq > $4 AND EXISTS (SELECT 1 FROM runs r WHERE r.tenant = $1 \
                     AND r.run_id = $2 AND r.generation = $3) \
                   UNION ALL \
                   SELECT {EVENT_COLUMNS}, seq FROM event_generations WHERE tenant = $1 \
                     AND run_id = $2 AND generation = $3 AND seq > $4 \
                 ) e ORDER BY seq LIMIT $5"
            ),
            &[&tenant, &run_id, &generation, &after, &pg_limit(limit)],
        )
        .await
    }

    async fn erase(&self, e: &Erasure<'_>) -> Result<Erased, ArchiveError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let sql = rows::erase_targets_query(e.scope, |n| match n {
            2 => "$2::text".to_owned(),
            _ => format!("${n}"),
        });
        let found = match e.scope {
            EraseScope::All => tx.query(&sql, &[&e.tenant]).await?,
            _ => {
                tx.query(&sql, &[&e.tenant, &rows::erase_scope_param(e.scope)])
                    .await?
            }
        };
        let mut erased = Erased::default();
        for r in found {
            let run_id: String = r.try_get(0)?;
            let status: String = r.try_get(1)?;
            for table in rows::RUN_TABLES {
                let n = tx
                    .execute(
                        &format!("DELETE FROM {table} WHERE tenant = $1 AND run_id = $2"),
                        &[&e.tenant, &run_id],
                    )
                    .await?;
                match table {
                    "events" | "event_generations" => erased.events += n,
                    "raw_chunks" => erased.raw_chunks += n,
                    _ => {}
                }
            }
            erased.open_runs += u64::from(status == "open");
            erased.runs.push(run_id);
        }
        let (scope_hash, run_hashes) = rows::audit_hashes(e, &erased.runs);
        erased.audit_id = tx
            .query_one(
                "INSERT INTO erasures (at_ms, actor, tenant, scope, scope_hash, run_hashes, \
                 events, raw_chunks) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id",
                &[
                    &e.at_ms,
                    &e.actor,
                    &e.tenant,
                    &e.scope.kind(),
                    &scope_hash,
                    &run_hashes,
                    &rows::to_i64("events", erased.events)?,
                    &rows::to_i64("raw_chunks", erased.raw_chunks)?,
                ],
            )
            .await?
            .try_get(0)?;
        tx.commit().await?;
        // Dead tuples keep the erased rows' bytes until vacuumed.
        client
            .batch_execute(&format!("VACUUM {}", rows::RUN_TABLES.join(", ")))
            .await?;
        Ok(erased)
    }

    async fn strip_run(&self, tenant: &str, run_id: &str, at_ms: i64) -> Result<u64, ArchiveError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        // The run's row, locked: a concurrent backfill of the run waits for this one.
        tx.query(
            "SELECT 1 FROM runs WHERE tenant = $1 AND run_id = $2 FOR UPDATE",
            &[&tenant, &run_id],
        )
        .await?;
        let mut stored = Vec::new();
        for r in tx
            .query(
                "SELECT NULL::int8, seq, payload FROM events WHERE tenant = $1 AND run_id = $2 \
                 UNION ALL SELECT generation, seq, payload FROM event_generations \
                 WHERE tenant = $1 AND run_id = $2",
                &[&tenant, &run_id],
            )
            .await?
        {
            stored.push((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?));
        }
        let changed = rows::stripped_payloads(stored);
        for (generation, seq, payload) in &changed {
            match generation {
                None => {
                    tx.execute(
                        "UPDATE events SET payload = $3 WHERE tenant = $1 AND run_id = $2 \
                         AND seq = $4",
                        &[&tenant, &run_id, payload, seq],
                    )
                    .await?
                }
                Some(g) => {
                    tx.execute(
                        "UPDATE event_generations SET payload = $3 WHERE tenant = $1 \
                         AND run_id = $2 AND generation = $5 AND seq = $4",
                        &[&tenant, &run_id, payload, seq, g],
                    )
                    .await?
                }
            };
        }
        for table in ["raw_chunks", "thinking_search"] {
            tx.execute(
                &format!("DELETE FROM {table} WHERE tenant = $1 AND run_id = $2"),
                &[&tenant, &run_id],
            )
            .await?;
        }
        tx.execute(
            "UPDATE runs SET stripped_at_ms = $3 WHERE tenant = $1 AND run_id = $2",
            &[&tenant, &run_id, &at_ms],
        )
        .await?;
        tx.commit().await?;
        Ok(changed.len() as u64)
    }

    async fn mark_exported(
        &self,
        runs: &[(String, String)],
        at_ms: i64,
    ) -> Result<(), ArchiveError> {
        if runs.is_empty() {
            return Ok(());
        }
        let client = self.pool.get().await?;
        client
            .execute(
                "UPDATE runs SET exported_at_ms = $3 FROM UNNEST($1::text[], $2::text[]) \
                 AS k(tenant, run_id) WHERE runs.tenant = k.tenant AND runs.run_id = k.run_id",
                &[
                    &runs.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(),
                    &runs.iter().map(|r| r.1.as_str()).collect::<Vec<_>>(),
                    &at_ms,
                ],
            )
            .await?;
        Ok(())
    }

    async fn drop_run(&self, tenant: &str, run_id: &str) -> Result<u64, ArchiveError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let mut events = 0;
        for table in rows::RUN_TABLES {
            let n = tx
                .execute(
                    &format!("DELETE FROM {table} WHERE tenant = $1 AND run_id = $2"),
                    &[&tenant, &run_id],
                )
                .await?;
            if matches!(table, "events" | "event_generations") {
                events += n;
            }
        }
        tx.commit().await?;
        Ok(events)
    }

    async fn run_stats(&self, filter: &StatsFilter) -> Result<Vec<StatsRow>, ArchiveError> {
        let client = self.pool.get().await?;
        let sql = rows::stats_query(|n| match n {
            1 => "$1::text".to_owned(),
            _ => format!("${n}::int8"),
        });
        let mut out = Vec::new();
        for r in client
            .query(
                &sql,
                &[&filter.tenant, &filter.since_ts_ms, &filter.until_ts_ms],
            )
            .await?
        {
            let mut v = [0i64; 10];
            for (i, slot) in v.iter_mut().enumerate() {
                *slot = r.try_get(i + 2)?;
            }
            out.push(rows::stats_row(r.try_get(0)?, r.try_get(1)?, v));
        }
        Ok(out)
    }

    async fn search_runs(
        &self,
        tenant: Option<&str>,
        phrase: &str,
        limit: u32,
    ) -> Result<Vec<SearchHit>, ArchiveError> {
        self.search("run_search", "answer", tenant, phrase, limit)
            .await
    }

    async fn search_thinking(
        &self,
        tenant: Option<&str>,
        phrase: &str,
        limit: u32,
    ) -> Result<Vec<SearchHit>, ArchiveError> {
        self.search("thinking_search", "thinking", tenant, phrase, limit)
            .await
    }

    async fn index_thinking(
        &self,
        tenant: &str,
        run_id: &str,
        segments: &[(i64, String)],
        at_ms: i64,
    ) -> Result<(), ArchiveError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        tx.execute(
            "DELETE FROM thinking_search WHERE tenant = $1 AND run_id = $2",
            &[&tenant, &run_id],
        )
        .await?;
        tx.execute(
            "INSERT INTO thinking_search (tenant, run_id, seq, thinking) \
             SELECT $1, $2, * FROM UNNEST($3::int8[], $4::text[])",
            &[
                &tenant,
                &run_id,
                &segments.iter().map(|s| s.0).collect::<Vec<_>>(),
                &segments.iter().map(|s| s.1.as_str()).collect::<Vec<_>>(),
            ],
        )
        .await?;
        tx.execute(
            "UPDATE runs SET thinking_indexed_at_ms = $3 WHERE tenant = $1 AND run_id = $2",
            &[&tenant, &run_id, &at_ms],
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn erasures(
        &self,
        tenant: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ErasureRecord>, ArchiveError> {
        let limit = i64::from(if limit == 0 { 100 } else { limit });
        let client = self.pool.get().await?;
        let sql = format!(
            "SELECT {} FROM erasures WHERE ($1::text IS NULL OR tenant = $1) \
             ORDER BY id DESC LIMIT $2",
            rows::ERASURE_COLUMNS
        );
        let mut out = Vec::new();
        for r in client.query(&sql, &[&tenant, &limit]).await? {
            let hashes: String = r.try_get(6)?;
            out.push(ErasureRecord {
                id: r.try_get(0)?,
                at_ms: r.try_get(1)?,
                actor: r.try_get(2)?,
                tenant: r.try_get(3)?,
                scope: r.try_get(4)?,
                scope_hash: r.try_get(5)?,
                run_hashes: hashes.split_whitespace().map(str::to_owned).collect(),
                events: rows::to_u64("events", r.try_get(7)?)?,
                raw_chunks: rows::to_u64("raw_chunks", r.try_get(8)?)?,
            });
        }
        Ok(out)
    }

    fn conflicts_total(&self) -> u64 {
        self.conflicts.load(Ordering::Relaxed)
    }
}
