//! Backend-independent row handling: events → rows, rows → per-run deltas, stored rows →
//! events, the list query and its cursor. Both backends use these so that they agree on
//! every derived value.

use crate::{ArchiveError, ArchivedEvent, RunFilter, RunStatusKind};
use streamgate_grammar::{
    AssistantPhase, Envelope, Event, EventData, ItemPhase, LifecyclePhase, RunEvent, SegmentPhase,
};

/// One `events` row, ready to bind. Built on the caller's task (the JSON encoding is the
/// expensive part) so that the SQLite writer thread only does SQLite work.
#[derive(Debug, Clone)]
pub(crate) struct EventRow {
    pub run_id: String,
    pub seq: i64,
    pub journal_seq: i64,
    pub tenant: String,
    pub session_key: Option<String>,
    pub stream: &'static str,
    pub phase: Option<&'static str>,
    pub ts_ms: i64,
    pub payload: String,
    /// What a lifecycle event contributes to `runs`.
    pub life: Option<LifeFacts>,
    /// The text of a final answer, for the search index.
    pub answer: Option<String>,
}

/// The `runs`-relevant parts of a lifecycle event.
#[derive(Debug, Clone)]
pub(crate) struct LifeFacts {
    pub phase: LifecyclePhase,
    pub provider: Option<String>,
    pub model: Option<String>,
    pub reason: Option<String>,
    pub usage: Option<String>,
    /// The token counts in `usage`.
    pub tokens: Option<streamgate_grammar::usage::Tokens>,
}

/// The stored columns compared to decide duplicate vs conflict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredContent {
    pub tenant: String,
    pub session_key: Option<String>,
    pub ts_ms: i64,
    pub payload: String,
}

impl EventRow {
    /// The primary key `(tenant, run_id, seq)`.
    pub fn key(&self) -> (&str, &str, i64) {
        (&self.tenant, &self.run_id, self.seq)
    }

    /// True when the stored row is the same event (journal_seq deliberately ignored).
    pub fn same_content(&self, stored: &StoredContent) -> bool {
        self.payload == stored.payload
            && self.ts_ms == stored.ts_ms
            && self.tenant == stored.tenant
            && self.session_key == stored.session_key
    }
}

/// Logs one conflict (shared by both backends).
pub(crate) fn log_conflict(row: &EventRow, stored_payload: &str) {
    tracing::warn!(
        tenant = %row.tenant,
        run_id = %row.run_id,
        seq = row.seq,
        journal_seq = row.journal_seq,
        stored = %stored_payload,
        incoming = %row.payload,
        "archive conflict: same (tenant, run_id, seq) with different content; original kept"
    );
}

/// Checked u64 → BIGINT.
pub(crate) fn to_i64(what: &'static str, value: u64) -> Result<i64, ArchiveError> {
    i64::try_from(value).map_err(|_| ArchiveError::OutOfRange { what, value })
}

/// Checked BIGINT → u64 (stored values were u64, so a negative one means corruption).
pub(crate) fn to_u64(what: &str, value: i64) -> Result<u64, ArchiveError> {
    u64::try_from(value).map_err(|_| ArchiveError::Corrupt {
        what: what.to_owned(),
        detail: format!("negative value {value}"),
    })
}

/// Rows for a batch, sorted by `(tenant, run_id, seq)` (the primary key); the sort is stable so repeated keys inside
/// one batch keep their order (the first one is the one that gets inserted). Sorting also
/// gives every transaction the same lock order, which keeps concurrent archiver replicas
/// on PostgreSQL from deadlocking on each other.
pub(crate) fn to_rows(events: &[ArchivedEvent]) -> Result<Vec<EventRow>, ArchiveError> {
    let mut rows = Vec::with_capacity(events.len());
    for ae in events {
        let RunEvent { envelope, event } = &ae.event;
        let life = match &event.data {
            EventData::Lifecycle(l) => Some(LifeFacts {
                phase: l.phase,
                provider: l.provider.clone(),
                model: l.model.clone(),
                reason: l.reason.as_ref().map(|r| r.as_str().to_owned()),
                usage: l.usage.as_ref().map(|u| u.get().to_owned()),
                tokens: l
                    .usage
                    .as_ref()
                    .map(streamgate_grammar::usage::Tokens::from_usage),
            }),
            _ => None,
        };
        rows.push(EventRow {
            run_id: envelope.run_id.clone(),
            seq: to_i64("seq", event.seq)?,
            journal_seq: to_i64("journal_seq", ae.journal_seq)?,
            tenant: envelope.tenant.clone(),
            session_key: envelope.session_key.clone(),
            stream: event.stream().as_str(),
            phase: phase_of(&event.data),
            ts_ms: envelope.ts_ms,
            payload: event.to_json(),
            life,
            answer: match &event.data {
                EventData::Assistant(a) if a.phase == Some(AssistantPhase::FinalAnswer) => a
                    .text
                    .clone()
                    .or_else(|| a.delta.clone())
                    .filter(|t| !t.is_empty()),
                _ => None,
            },
        });
    }
    rows.sort_by(|a, b| a.key().cmp(&b.key()));
    Ok(rows)
}

/// The `phase` column: the payload's own phase word, whatever the stream.
fn phase_of(data: &EventData) -> Option<&'static str> {
    match data {
        EventData::Assistant(a) => a.phase.map(|p| match p {
            AssistantPhase::Commentary => "commentary",
            AssistantPhase::FinalAnswer => "final_answer",
        }),
        EventData::Thinking(t) => t.phase.map(|p| match p {
            SegmentPhase::Start => "start",
            SegmentPhase::End => "end",
        }),
        EventData::Item(i) => Some(match i.phase {
            ItemPhase::Start => "start",
            ItemPhase::Update => "update",
            ItemPhase::End => "end",
        }),
        EventData::Lifecycle(l) => Some(match l.phase {
            LifecyclePhase::Start => "start",
            LifecyclePhase::Update => "update",
            LifecyclePhase::End => "end",
            LifecyclePhase::Error => "error",
        }),
    }
}

/// The terminal lifecycle event of a run seen in a batch.
#[derive(Debug, Clone)]
pub(crate) struct Terminal {
    pub seq: i64,
    pub status: RunStatusKind,
    pub reason: Option<String>,
}

/// What one batch adds to one `runs` row. The upsert merges it with min/max/sum and
/// "higher seq wins" rules, so the result does not depend on the order batches commit.
#[derive(Debug, Clone)]
pub(crate) struct RunDelta {
    pub run_id: String,
    pub tenant: String,
    pub session_key: Option<String>,
    pub provider: Option<String>,
    pub model: Option<String>,
    pub terminal: Option<Terminal>,
    pub usage: Option<(i64, String)>,
    /// Token counts: the per-field maximum of the batch's lifecycle usages.
    pub tokens: Option<streamgate_grammar::usage::Tokens>,
    /// Earliest ingest time of a thinking, assistant or item event.
    pub first_token_ts_ms: Option<i64>,
    /// Earliest ingest time of an assistant event.
    pub first_answer_ts_ms: Option<i64>,
    pub first_seq: i64,
    pub last_seq: i64,
    pub first_ts_ms: i64,
    pub last_ts_ms: i64,
    pub count: i64,
}

impl RunDelta {
    fn new(row: &EventRow) -> RunDelta {
        RunDelta {
            run_id: row.run_id.clone(),
            tenant: row.tenant.clone(),
            session_key: None,
            provider: None,
            model: None,
            terminal: None,
            usage: None,
            first_seq: row.seq,
            last_seq: row.seq,
            first_ts_ms: row.ts_ms,
            last_ts_ms: row.ts_ms,
            count: 0,
            tokens: None,
            first_token_ts_ms: None,
            first_answer_ts_ms: None,
        }
    }

    fn add(&mut self, row: &EventRow) {
        self.count += 1;
        let min = |a: Option<i64>, b: i64| Some(a.map_or(b, |a| a.min(b)));
        if row.stream != "lifecycle" {
            self.first_token_ts_ms = min(self.first_token_ts_ms, row.ts_ms);
        }
        if row.stream == "assistant" {
            self.first_answer_ts_ms = min(self.first_answer_ts_ms, row.ts_ms);
        }
        self.first_seq = self.first_seq.min(row.seq);
        self.last_seq = self.last_seq.max(row.seq);
        self.first_ts_ms = self.first_ts_ms.min(row.ts_ms);
        self.last_ts_ms = self.last_ts_ms.max(row.ts_ms);
        if self.session_key.is_none() {
            self.session_key.clone_from(&row.session_key);
        }
        let Some(life) = &row.life else { return };
        if life.phase == LifecyclePhase::Start {
            if self.provider.is_none() {
                self.provider.clone_from(&life.provider);
            }
            if self.model.is_none() {
                self.model.clone_from(&life.model);
            }
        }
        let status = match life.phase {
            LifecyclePhase::End => Some(RunStatusKind::Ended),
            LifecyclePhase::Error => Some(RunStatusKind::Failed),
            _ => None,
        };
        if let Some(status) = status {
            if self.terminal.as_ref().is_none_or(|t| row.seq > t.seq) {
                self.terminal = Some(Terminal {
                    seq: row.seq,
                    status,
                    reason: life.reason.clone(),
                });
            }
        }
        if let Some(usage) = &life.usage {
            if self.usage.as_ref().is_none_or(|(seq, _)| row.seq > *seq) {
                self.usage = Some((row.seq, usage.clone()));
            }
        }
        if let Some(tokens) = life.tokens {
            self.tokens = Some(self.tokens.map_or(tokens, |t| t.max(tokens)));
        }
    }
}

/// Per-run deltas of the rows that were actually inserted. `rows` must be sorted by
/// `(tenant, run_id)` (as [`to_rows`] leaves them), so grouping is a single pass without
/// a map; the deltas come out sorted by that key, which is the lock order of the `runs`
/// upsert.
pub(crate) fn run_deltas<'a>(rows: impl IntoIterator<Item = &'a EventRow>) -> Vec<RunDelta> {
    let mut out: Vec<RunDelta> = Vec::new();
    for row in rows {
        match out.last_mut() {
            Some(d) if d.run_id == row.run_id && d.tenant == row.tenant => d.add(row),
            _ => {
                let mut d = RunDelta::new(row);
                d.add(row);
                out.push(d);
            }
        }
    }
    out
}

/// Rebuilds an archived event from its stored columns.
pub(crate) fn decode_event(
    run_id: String,
    journal_seq: i64,
    tenant: String,
    session_key: Option<String>,
    ts_ms: i64,
    payload: &str,
) -> Result<ArchivedEvent, ArchiveError> {
    let event = Event::from_json(payload).map_err(|e| ArchiveError::Corrupt {
        what: format!("event of run {tenant:?}/{run_id:?}"),
        detail: e.to_string(),
    })?;
    Ok(ArchivedEvent {
        journal_seq: to_u64("journal_seq", journal_seq)?,
        event: RunEvent {
            envelope: Envelope {
                tenant,
                session_key,
                run_id,
                ts_ms,
            },
            event,
        },
    })
}

/// A bound parameter of a dynamically built query.
#[derive(Debug, Clone)]
pub(crate) enum Param {
    Text(String),
    Int(i64),
}

/// The `runs` columns in the order every backend reads them.
pub(crate) const RUN_COLUMNS: &str = "tenant, run_id, session_key, provider, model, status, \
     stop_reason, usage, first_seq, last_seq, first_ts_ms, last_ts_ms, event_count, adapter, \
     adapter_version, grammar_version, generation, stripped_at_ms, input_tokens, output_tokens, \
     reasoning_tokens, cache_read_tokens, cache_write_tokens, first_token_ts_ms, first_answer_ts_ms";

/// Columns every event read selects, in the order the backends' row decoders expect.
pub(crate) const EVENT_COLUMNS: &str = "run_id, journal_seq, tenant, session_key, ts_ms, payload";

/// The journal page query: events after journal position `placeholder(1)`, ending after
/// whole journal entries. With `limited`, the page stops at the entry that holds the
/// `placeholder(2)`-th event — an SG_EVENTS batch message's events share one journal
/// position, and a page must not split them, or a reader resuming after the page's last
/// position would skip the rest of that entry.
pub(crate) fn journal_query(placeholder: impl Fn(usize) -> String, limited: bool) -> String {
    let (after, limit) = (placeholder(1), placeholder(2));
    let bound = if limited {
        format!(
            " AND journal_seq <= COALESCE((SELECT journal_seq FROM events \
             WHERE journal_seq > {after} ORDER BY journal_seq LIMIT 1 OFFSET {limit} - 1), \
             {})",
            i64::MAX
        )
    } else {
        String::new()
    };
    format!(
        "SELECT {EVENT_COLUMNS} FROM events WHERE journal_seq > {after}{bound} \
         ORDER BY journal_seq, tenant, run_id, seq"
    )
}

/// Builds the list query for `filter`. `placeholder(n)` spells the n-th (1-based) bind
/// parameter in the backend's syntax. The query fetches one row more than the page size,
/// which tells whether there is a next page.
pub(crate) fn list_query(
    filter: &RunFilter,
    placeholder: impl Fn(usize) -> String,
) -> Result<(String, Vec<Param>), ArchiveError> {
    let mut conds: Vec<String> = Vec::new();
    let mut params: Vec<Param> = Vec::new();
    let bind = |params: &mut Vec<Param>, p: Param| {
        params.push(p);
        placeholder(params.len())
    };
    let text_filters = [
        ("tenant", &filter.tenant),
        ("session_key", &filter.session_key),
        ("provider", &filter.provider),
        ("model", &filter.model),
    ];
    for (column, value) in text_filters {
        if let Some(v) = value {
            let ph = bind(&mut params, Param::Text(v.clone()));
            conds.push(format!("{column} = {ph}"));
        }
    }
    if let Some(status) = filter.status {
        let ph = bind(&mut params, Param::Text(status.as_str().to_owned()));
        conds.push(format!("status = {ph}"));
    }
    if let Some(since) = filter.since_ts_ms {
        let ph = bind(&mut params, Param::Int(since));
        conds.push(format!("first_ts_ms >= {ph}"));
    }
    if let Some(until) = filter.until_ts_ms {
        let ph = bind(&mut params, Param::Int(until));
        conds.push(format!("first_ts_ms < {ph}"));
    }
    if filter.unstripped {
        conds.push("stripped_at_ms IS NULL".to_owned());
    }
    if filter.unexported {
        conds.push("exported_at_ms IS NULL".to_owned());
    }
    if filter.thinking_unindexed {
        conds.push("thinking_indexed_at_ms IS NULL".to_owned());
    }
    if let Some(cursor) = &filter.cursor {
        let (ts, tenant, run_id) = decode_cursor(cursor)?;
        let ts1 = bind(&mut params, Param::Int(ts));
        let ts2 = bind(&mut params, Param::Int(ts));
        let t1 = bind(&mut params, Param::Text(tenant.clone()));
        let t2 = bind(&mut params, Param::Text(tenant));
        let rid = bind(&mut params, Param::Text(run_id));
        // Keyset pagination on (first_ts_ms desc, tenant asc, run_id asc).
        conds.push(format!(
            "(first_ts_ms < {ts1} OR (first_ts_ms = {ts2} AND \
             (tenant > {t1} OR (tenant = {t2} AND run_id > {rid}))))"
        ));
    }
    let limit = bind(
        &mut params,
        Param::Int(i64::from(filter.effective_limit()) + 1),
    );
    let where_clause = if conds.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conds.join(" AND "))
    };
    let sql = format!(
        "SELECT {RUN_COLUMNS} FROM runs{where_clause} \
         ORDER BY first_ts_ms DESC, tenant ASC, run_id ASC LIMIT {limit}"
    );
    Ok((sql, params))
}

/// Stamps a run with what made its events, keeping the lowest versions seen; only the
/// live generation (a backfilled run's stamp is the backfill's). Placeholders: tenant,
/// run id, adapter, adapter version, grammar version.
///
/// A row already stamped as low or lower is left alone (the `WHERE` repeats the `CASE`s'
/// conditions): the archiver stamps every run of every batch, and an update that
/// rewrote an unchanged row would dirty its page (SQLite: a WAL frame and an fsync per
/// batch) or leave a dead tuple (PostgreSQL) each time.
pub(crate) fn provenance_update(p: impl Fn(usize) -> String) -> String {
    let (t, r, a, av, gv) = (p(1), p(2), p(3), p(4), p(5));
    format!(
        "UPDATE runs SET \
         adapter = CASE WHEN adapter_version IS NULL OR {av} < adapter_version \
                        THEN {a} ELSE adapter END, \
         adapter_version = CASE WHEN adapter_version IS NULL OR {av} < adapter_version \
                        THEN {av} ELSE adapter_version END, \
         grammar_version = CASE WHEN grammar_version IS NULL OR {gv} < grammar_version \
                        THEN {gv} ELSE grammar_version END \
         WHERE tenant = {t} AND run_id = {r} AND generation = 1 \
         AND (adapter_version IS NULL OR {av} < adapter_version \
              OR grammar_version IS NULL OR {gv} < grammar_version)"
    )
}

/// Copies a run's current events into the generations history under generation
/// `p(3)`. Placeholders: tenant, run id, generation.
pub(crate) fn keep_generation_events(p: impl Fn(usize) -> String) -> String {
    let (t, r, g) = (p(1), p(2), p(3));
    format!(
        "INSERT INTO event_generations (tenant, run_id, generation, seq, journal_seq, \
         session_key, stream, phase, ts_ms, payload) \
         SELECT tenant, run_id, {g}, seq, journal_seq, session_key, stream, phase, ts_ms, \
         payload FROM events WHERE tenant = {t} AND run_id = {r}"
    )
}

/// Records what had made the generation being replaced. Placeholders: tenant, run id,
/// replaced-at ms.
pub(crate) fn keep_generation_row(p: impl Fn(usize) -> String) -> String {
    let (t, r, at) = (p(1), p(2), p(3));
    format!(
        "INSERT INTO run_generations (tenant, run_id, generation, adapter, adapter_version, \
         grammar_version, event_count, replaced_at_ms) \
         SELECT tenant, run_id, generation, adapter, adapter_version, grammar_version, \
         event_count, {at} FROM runs WHERE tenant = {t} AND run_id = {r}"
    )
}

/// Stamps the rebuilt `runs` row with its generation and provenance. Placeholders:
/// tenant, run id, generation, adapter, adapter version, grammar version.
pub(crate) fn stamp_generation(p: impl Fn(usize) -> String) -> String {
    let (t, r, g, a, av, gv) = (p(1), p(2), p(3), p(4), p(5), p(6));
    format!(
        "UPDATE runs SET generation = {g}, adapter = {a}, adapter_version = {av}, \
         grammar_version = {gv} WHERE tenant = {t} AND run_id = {r}"
    )
}

/// Rows of a new generation: the events encoded as rows, each with the journal position
/// of the event it replaces (same seq), or the run's last position when the new
/// generation is longer. A backfill is not a journal entry of its own: the journal
/// (`SG_EVENTS`) never carried these bytes.
pub(crate) fn generation_rows(
    g: &crate::NewGeneration<'_>,
    journal: &std::collections::HashMap<i64, i64>,
) -> Result<Vec<EventRow>, ArchiveError> {
    if g.events.is_empty() {
        return Err(ArchiveError::Config(format!(
            "a new generation of run {:?} must hold events",
            g.run_id
        )));
    }
    if let Some(ev) = g
        .events
        .iter()
        .find(|e| e.envelope.tenant != g.tenant || e.envelope.run_id != g.run_id)
    {
        return Err(ArchiveError::Config(format!(
            "event {}/{} in a new generation of {}/{}",
            ev.envelope.tenant, ev.envelope.run_id, g.tenant, g.run_id
        )));
    }
    let last = journal.values().copied().max().unwrap_or(0);
    let archived: Vec<ArchivedEvent> = g
        .events
        .iter()
        .map(|e| ArchivedEvent {
            event: e.clone(),
            journal_seq: 0,
        })
        .collect();
    let mut rows = to_rows(&archived)?;
    for row in &mut rows {
        row.journal_seq = journal.get(&row.seq).copied().unwrap_or(last);
    }
    Ok(rows)
}

/// The tables that hold a run, each keyed by `(tenant, run_id, …)`: what an erasure
/// deletes from (the search index included). `runs` goes last (its row is what lists
/// the run).
pub(crate) const RUN_TABLES: [&str; 7] = [
    "events",
    "event_generations",
    "run_generations",
    "raw_chunks",
    "run_search",
    "thinking_search",
    "runs",
];

/// The run ids of a tenant an erasure scope names, with whether each is open. A single
/// run is named even when only its raw chunks are archived.
pub(crate) fn erase_targets_query(
    scope: &crate::EraseScope,
    p: impl Fn(usize) -> String,
) -> String {
    let (t, x) = (p(1), p(2));
    match scope {
        crate::EraseScope::Run(_) => format!(
            "SELECT {x} AS run_id, COALESCE((SELECT status FROM runs WHERE tenant = {t} \
             AND run_id = {x}), 'ended')"
        ),
        crate::EraseScope::Session(_) => {
            format!("SELECT run_id, status FROM runs WHERE tenant = {t} AND session_key = {x}")
        }
        crate::EraseScope::All => format!(
            "SELECT run_id, status FROM runs WHERE tenant = {t} UNION \
             SELECT DISTINCT run_id, 'ended' FROM raw_chunks WHERE tenant = {t} \
             AND run_id NOT IN (SELECT run_id FROM runs WHERE tenant = {t})"
        ),
    }
}

/// The audit row's values: (scope hash, run hashes joined by spaces).
pub(crate) fn audit_hashes(e: &crate::Erasure<'_>, runs: &[String]) -> (String, String) {
    let scope_hash = match e.scope {
        crate::EraseScope::Run(id) | crate::EraseScope::Session(id) => crate::id_hash(e.tenant, id),
        crate::EraseScope::All => String::new(),
    };
    let runs = runs
        .iter()
        .map(|r| crate::id_hash(e.tenant, r))
        .collect::<Vec<_>>()
        .join(" ");
    (scope_hash, runs)
}

/// The value an erasure scope binds as its second parameter (the tenant is the first).
pub(crate) fn erase_scope_param(scope: &crate::EraseScope) -> &str {
    match scope {
        crate::EraseScope::Run(id) | crate::EraseScope::Session(id) => id,
        crate::EraseScope::All => "",
    }
}

/// Columns of the audit, in [`crate::ErasureRecord`] order.
pub(crate) const ERASURE_COLUMNS: &str =
    "id, at_ms, actor, tenant, scope, scope_hash, run_hashes, events, raw_chunks";

/// The new payloads of a run's stored events once retention stubs them: for each
/// `(generation, seq, payload)` that changes, `(generation, seq, new payload)`
/// (generation `None` = the current events). A payload that does not parse is left as
/// it is (and logged): retention never makes an archive less readable.
pub(crate) fn stripped_payloads(
    stored: Vec<(Option<i64>, i64, String)>,
) -> Vec<(Option<i64>, i64, String)> {
    stored
        .into_iter()
        .filter_map(|(generation, seq, payload)| {
            match streamgate_grammar::Event::from_json(&payload) {
                Ok(event) => {
                    crate::retention::strip(&event).map(|e| (generation, seq, e.to_json()))
                }
                Err(e) => {
                    tracing::warn!(seq, error = %e, "archived event unreadable; retention left it");
                    None
                }
            }
        })
        .collect()
}

/// A search phrase as an FTS5 query: one quoted phrase (quotes doubled), so operators'
/// words are matched as words, never parsed as FTS5 syntax.
pub(crate) fn fts5_phrase(phrase: &str) -> String {
    format!("\"{}\"", phrase.replace('"', "\"\""))
}

/// The accounting query: placeholders tenant, since, until (each may be NULL).
pub(crate) fn stats_query(p: impl Fn(usize) -> String) -> String {
    let (t, since, until) = (p(1), p(2), p(3));
    format!(
        "SELECT tenant, COALESCE(model, ''), first_ts_ms / 86400000 AS day, COUNT(*), \
         CAST(SUM(COALESCE(input_tokens, 0)) AS BIGINT), CAST(SUM(COALESCE(output_tokens, 0)) AS BIGINT), \
         CAST(SUM(COALESCE(reasoning_tokens, 0)) AS BIGINT), CAST(SUM(COALESCE(cache_read_tokens, 0)) AS BIGINT), \
         CAST(SUM(COALESCE(cache_write_tokens, 0)) AS BIGINT), \
         CAST(SUM(CASE WHEN first_token_ts_ms IS NULL THEN 0 \
         ELSE first_token_ts_ms - first_ts_ms END) AS BIGINT), \
         COUNT(first_token_ts_ms), CAST(SUM(last_ts_ms - first_ts_ms) AS BIGINT) \
         FROM runs WHERE ({t} IS NULL OR tenant = {t}) \
         AND ({since} IS NULL OR first_ts_ms >= {since}) \
         AND ({until} IS NULL OR first_ts_ms < {until}) \
         GROUP BY tenant, COALESCE(model, ''), first_ts_ms / 86400000 \
         ORDER BY day DESC, tenant, 2"
    )
}

/// A stats row from its columns (in [`stats_query`] order).
pub(crate) fn stats_row(tenant: String, model: String, v: [i64; 10]) -> crate::StatsRow {
    let u = |x: i64| x.max(0) as u64;
    crate::StatsRow {
        tenant,
        model,
        day: v[0],
        runs: u(v[1]),
        tokens: streamgate_grammar::usage::Tokens {
            input: u(v[2]),
            output: u(v[3]),
            reasoning: u(v[4]),
            cache_read: u(v[5]),
            cache_write: u(v[6]),
        },
        ttft_ms_sum: v[7],
        ttft_runs: u(v[8]),
        duration_ms_sum: v[9],
    }
}

/// The cursor after the last run of a page: `v2:<first_ts_ms>:<tenant byte length>:<tenant><run id>`
/// (the length keeps any tenant unambiguous). Versioned so its format can change; `v1`
/// cursors (no tenant, from before schema version 2) are refused as bad cursors.
pub(crate) fn encode_cursor(first_ts_ms: i64, tenant: &str, run_id: &str) -> String {
    format!("v2:{first_ts_ms}:{}:{tenant}{run_id}", tenant.len())
}

fn decode_cursor(cursor: &str) -> Result<(i64, String, String), ArchiveError> {
    let bad = || ArchiveError::BadCursor(cursor.to_owned());
    let rest = cursor.strip_prefix("v2:").ok_or_else(bad)?;
    let (ts, rest) = rest.split_once(':').ok_or_else(bad)?;
    let (len, rest) = rest.split_once(':').ok_or_else(bad)?;
    let len: usize = len.parse().map_err(|_| bad())?;
    let tenant = rest.get(..len).ok_or_else(bad)?;
    let run_id = rest.get(len..).ok_or_else(bad)?;
    Ok((
        ts.parse().map_err(|_| bad())?,
        tenant.to_owned(),
        run_id.to_owned(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_round_trips_run_ids_with_colons() {
        let c = encode_cursor(-5, "t:1", "a:b:c");
        assert_eq!(
            decode_cursor(&c).unwrap(),
            (-5, "t:1".to_owned(), "a:b:c".to_owned())
        );
        let c = encode_cursor(7, "é", "");
        assert_eq!(
            decode_cursor(&c).unwrap(),
            (7, "é".to_owned(), String::new())
        );
        assert!(decode_cursor("v1:1:a").is_err());
        assert!(decode_cursor("v2:x:1:ab").is_err());
        assert!(decode_cursor("v2:1:9:ab").is_err());
        assert!(decode_cursor("v2:1:1:éa").is_err());
    }
}

/// A `runs` row as stored, before validation (read in [`RUN_COLUMNS`] order).
#[derive(Debug, Clone)]
pub(crate) struct StoredRun {
    pub tenant: String,
    pub run_id: String,
    pub session_key: Option<String>,
    pub provider: Option<String>,
    pub model: Option<String>,
    pub status: String,
    pub stop_reason: Option<String>,
    pub usage: Option<String>,
    pub first_seq: i64,
    pub last_seq: i64,
    pub first_ts_ms: i64,
    pub last_ts_ms: i64,
    pub event_count: i64,
    pub adapter: Option<String>,
    pub adapter_version: Option<i64>,
    pub grammar_version: Option<i64>,
    pub generation: i64,
    pub stripped_at_ms: Option<i64>,
    /// input, output, reasoning, cache read, cache write tokens; first token and first
    /// answer ingest times.
    pub accounting: [Option<i64>; 7],
}

impl StoredRun {
    /// Validates and converts into the public record.
    pub fn into_record(self) -> Result<crate::RunRecord, ArchiveError> {
        let what = format!("run {:?}", self.run_id);
        let corrupt = |detail: String| ArchiveError::Corrupt {
            what: what.clone(),
            detail,
        };
        let status = RunStatusKind::parse(&self.status)
            .ok_or_else(|| corrupt(format!("unknown status {:?}", self.status)))?;
        let usage = match self.usage {
            None => None,
            Some(text) => Some(
                streamgate_grammar::Json::parse(&text)
                    .ok_or_else(|| corrupt("usage is not JSON".to_owned()))?,
            ),
        };
        let version =
            |v: i64| u32::try_from(v).map_err(|_| corrupt(format!("version {v} is out of range")));
        let provenance = match (self.adapter, self.adapter_version, self.grammar_version) {
            (Some(adapter), Some(a), Some(g)) => Some(crate::Provenance {
                adapter,
                adapter_version: version(a)?,
                grammar_version: version(g)?,
            }),
            _ => None,
        };
        let generation = version(self.generation)?;
        let [input, output, reasoning, cache_read, cache_write, first_token, first_answer] =
            self.accounting;
        let tokens = input.map(|_| streamgate_grammar::usage::Tokens {
            input: input.map_or(0, |v| v.max(0) as u64),
            output: output.map_or(0, |v| v.max(0) as u64),
            reasoning: reasoning.map_or(0, |v| v.max(0) as u64),
            cache_read: cache_read.map_or(0, |v| v.max(0) as u64),
            cache_write: cache_write.map_or(0, |v| v.max(0) as u64),
        });
        Ok(crate::RunRecord {
            provenance,
            generation,
            stripped_at_ms: self.stripped_at_ms,
            tokens,
            first_token_ts_ms: first_token,
            first_answer_ts_ms: first_answer,
            first_seq: to_u64(&what, self.first_seq)?,
            last_seq: to_u64(&what, self.last_seq)?,
            event_count: to_u64(&what, self.event_count)?,
            tenant: self.tenant,
            run_id: self.run_id,
            session_key: self.session_key,
            provider: self.provider,
            model: self.model,
            status,
            stop_reason: self.stop_reason,
            usage,
            first_ts_ms: self.first_ts_ms,
            last_ts_ms: self.last_ts_ms,
        })
    }
}

/// Turns the fetched `limit + 1` rows into a page and its cursor.
pub(crate) fn into_page(
    mut runs: Vec<StoredRun>,
    filter: &RunFilter,
) -> Result<crate::RunPage, ArchiveError> {
    let limit = filter.effective_limit() as usize;
    let more = runs.len() > limit;
    runs.truncate(limit);
    let next_cursor = match (more, runs.last()) {
        (true, Some(last)) => Some(encode_cursor(last.first_ts_ms, &last.tenant, &last.run_id)),
        _ => None,
    };
    Ok(crate::RunPage {
        runs: runs
            .into_iter()
            .map(StoredRun::into_record)
            .collect::<Result<_, _>>()?,
        next_cursor,
    })
}

/// Column list of the `runs` upsert, in bind order; the conflict target is
/// `(tenant, run_id)`, the primary key.
pub(crate) const RUN_INSERT_COLUMNS: &str = "run_id, tenant, session_key, provider, model, \
     status, stop_reason, terminal_seq, usage, usage_seq, first_seq, last_seq, first_ts_ms, \
     last_ts_ms, event_count, input_tokens, output_tokens, reasoning_tokens, \
     cache_read_tokens, cache_write_tokens, first_token_ts_ms, first_answer_ts_ms";

/// The accounting values of a delta, in [`RUN_INSERT_COLUMNS`] order after `event_count`.
pub(crate) fn accounting_values(d: &RunDelta) -> [Option<i64>; 7] {
    let t = d.tokens;
    let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    [
        t.map(|t| n(t.input)),
        t.map(|t| n(t.output)),
        t.map(|t| n(t.reasoning)),
        t.map(|t| n(t.cache_read)),
        t.map(|t| n(t.cache_write)),
        d.first_token_ts_ms,
        d.first_answer_ts_ms,
    ]
}

/// The merge rules of the `runs` upsert, valid SQL for both backends (CASE rather than
/// MIN/MAX or LEAST/GREATEST, which the two spell differently and treat NULL differently;
/// SQLite's own `sqlite::RUNS_INDEXED_UPDATE` uses its `MIN` on two non-null values).
/// Every rule is commutative, so batches may commit in any order:
/// provider/model/session: first non-null wins (only `lifecycle/start` sets them);
/// status/stop_reason: the terminal event with the highest seq wins; usage: the lifecycle
/// event with the highest seq that carried one wins; seq/ts ranges: min/max; count: sum.
///
/// These are the rules of the two indexed columns, `session_key` and `first_ts_ms`;
/// [`RUN_UPSERT_SET`] holds the rest. SQLite rewrites its entry in every index on a column
/// a `SET` names, whether or not the value changes (three index pages per live run and
/// commit), so its upsert takes only the rest and changes the two in a statement of its
/// own, only where they do change (`sqlite::RUNS_INDEXED_UPDATE`). PostgreSQL compares
/// the values (an unchanged index is not written) and takes both.
pub(crate) const RUN_UPSERT_SET_INDEXED: &str = "
    session_key  = COALESCE(runs.session_key, excluded.session_key),
    first_ts_ms  = CASE WHEN excluded.first_ts_ms < runs.first_ts_ms
                        THEN excluded.first_ts_ms ELSE runs.first_ts_ms END";

/// The merge rules of the `runs` upsert for its unindexed columns (see
/// [`RUN_UPSERT_SET_INDEXED`]).
pub(crate) const RUN_UPSERT_SET: &str = "
    provider     = COALESCE(runs.provider, excluded.provider),
    model        = COALESCE(runs.model, excluded.model),
    status       = CASE WHEN excluded.terminal_seq > COALESCE(runs.terminal_seq, -1)
                        THEN excluded.status ELSE runs.status END,
    stop_reason  = CASE WHEN excluded.terminal_seq > COALESCE(runs.terminal_seq, -1)
                        THEN excluded.stop_reason ELSE runs.stop_reason END,
    terminal_seq = CASE WHEN excluded.terminal_seq > COALESCE(runs.terminal_seq, -1)
                        THEN excluded.terminal_seq ELSE runs.terminal_seq END,
    usage        = CASE WHEN excluded.usage_seq > COALESCE(runs.usage_seq, -1)
                        THEN excluded.usage ELSE runs.usage END,
    usage_seq    = CASE WHEN excluded.usage_seq > COALESCE(runs.usage_seq, -1)
                        THEN excluded.usage_seq ELSE runs.usage_seq END,
    first_seq    = CASE WHEN excluded.first_seq < runs.first_seq
                        THEN excluded.first_seq ELSE runs.first_seq END,
    last_seq     = CASE WHEN excluded.last_seq > runs.last_seq
                        THEN excluded.last_seq ELSE runs.last_seq END,
    last_ts_ms   = CASE WHEN excluded.last_ts_ms > runs.last_ts_ms
                        THEN excluded.last_ts_ms ELSE runs.last_ts_ms END,
    event_count  = runs.event_count + excluded.event_count,
    input_tokens = CASE WHEN excluded.input_tokens > COALESCE(runs.input_tokens, -1)
                        THEN excluded.input_tokens ELSE runs.input_tokens END,
    output_tokens = CASE WHEN excluded.output_tokens > COALESCE(runs.output_tokens, -1)
                        THEN excluded.output_tokens ELSE runs.output_tokens END,
    reasoning_tokens = CASE WHEN excluded.reasoning_tokens > COALESCE(runs.reasoning_tokens, -1)
                        THEN excluded.reasoning_tokens ELSE runs.reasoning_tokens END,
    cache_read_tokens = CASE WHEN excluded.cache_read_tokens > COALESCE(runs.cache_read_tokens, -1)
                        THEN excluded.cache_read_tokens ELSE runs.cache_read_tokens END,
    cache_write_tokens = CASE WHEN excluded.cache_write_tokens > COALESCE(runs.cache_write_tokens, -1)
                        THEN excluded.cache_write_tokens ELSE runs.cache_write_tokens END,
    first_token_ts_ms = CASE WHEN excluded.first_token_ts_ms IS NOT NULL AND
                        (runs.first_token_ts_ms IS NULL OR excluded.first_token_ts_ms < runs.first_token_ts_ms)
                        THEN excluded.first_token_ts_ms ELSE runs.first_token_ts_ms END,
    first_answer_ts_ms = CASE WHEN excluded.first_answer_ts_ms IS NOT NULL AND
                        (runs.first_answer_ts_ms IS NULL OR excluded.first_answer_ts_ms < runs.first_answer_ts_ms)
                        THEN excluded.first_answer_ts_ms ELSE runs.first_answer_ts_ms END";
