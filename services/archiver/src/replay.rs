//! `streamgate.v1.ArchiveService`: operator-only replay of what the archive holds.
//!
//! A run is `(tenant, run_id)`: a run id is unique only within its tenant (docs/architecture.md
//! §3). Every per-run request names the tenant (empty = [`ids::DEFAULT_TENANT`]), and every
//! lookup — archive rows, the live follow subject, the raw fallback subject — is scoped
//! to it, so two tenants' runs with the same id never mix.
//!
//! `ReplayEvents` with `follow` is a catch-up subscription: it pages the run's archived
//! events, then reads the run's subject on SG_EVENTS from the start and forwards only
//! seqs above the last one sent. Per-run seqs are contiguous, so "send exactly
//! last+1" is all it takes to cross the archive→live boundary with no gap and no
//! duplicate (republished duplicates on the bus are skipped the same way). If the bus no
//! longer has a seq (retention), the gap is filled from the archive.

use crate::{convert, history};
use futures::StreamExt;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use streamgate_archive::{ArchivedEvent, EraseScope, RunFilter, RunStatusKind, Store};
use streamgate_bus::events::decode_msg;
use streamgate_bus::subject::RunAddr;
use streamgate_bus::EVENTS_STREAM;
use streamgate_grammar::ids::{self, RunId, RunRef, SessionId, TenantId};
use streamgate_grammar::{timeline, RunEvent, RunState};
use streamgate_proto::v1;
use streamgate_proto::v1::archive_service_server::ArchiveService;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// Events per archive page while replaying.
const PAGE: u32 = 1000;

/// The ArchiveService implementation.
#[derive(Clone)]
pub struct Replay {
    store: Arc<dyn Store>,
    js: async_nats::jetstream::Context,
    partitions: u32,
    retention: crate::retention::Policies,
    prices: crate::accounting::Prices,
    currency: String,
}

impl Replay {
    /// Replays from `store`; follows live events on `js`.
    pub fn new(
        store: Arc<dyn Store>,
        js: async_nats::jetstream::Context,
        partitions: u32,
    ) -> Replay {
        Replay {
            store,
            js,
            partitions,
            retention: crate::retention::Policies::default(),
            prices: crate::accounting::Prices::default(),
            currency: "USD".to_owned(),
        }
    }

    /// The price table the cost of runs comes from.
    pub fn with_prices(mut self, prices: crate::accounting::Prices, currency: String) -> Replay {
        self.prices = prices;
        if !currency.is_empty() {
            self.currency = currency;
        }
        self
    }

    /// A run as a reply, with its cost when the price table prices its model.
    fn run_reply(&self, r: &streamgate_archive::RunRecord) -> v1::Run {
        let mut reply = convert::run(r);
        if let (Some(model), Some(tokens)) = (&r.model, &r.tokens) {
            reply.cost = self.prices.cost(model, tokens);
        }
        reply
    }

    /// The retention policies `Retention` reports and applies.
    pub fn with_retention(mut self, retention: crate::retention::Policies) -> Replay {
        self.retention = retention;
        self
    }

    /// A page of the run's events after `after`: its current generation, or `generation`.
    async fn page(
        &self,
        tenant: &str,
        run_id: &str,
        generation: Option<u32>,
        after: u64,
    ) -> Result<Vec<ArchivedEvent>, Status> {
        match generation {
            None => self.store.events_after(tenant, run_id, after, PAGE).await,
            Some(g) => {
                self.store
                    .generation_events_after(tenant, run_id, g, after, PAGE)
                    .await
            }
        }
        .map_err(internal)
    }

    async fn all_events(
        &self,
        tenant: &str,
        run_id: &str,
        generation: Option<u32>,
    ) -> Result<Vec<ArchivedEvent>, Status> {
        let mut out = Vec::new();
        let mut after = 0;
        loop {
            let page = self.page(tenant, run_id, generation, after).await?;
            let Some(last) = page.last() else { break };
            after = last.event.event.seq;
            let full = page.len() as u32 == PAGE;
            out.extend(page);
            if !full {
                break;
            }
        }
        Ok(out)
    }
}

fn internal(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}

type Stream<T> = Pin<Box<dyn futures::Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl ArchiveService for Replay {
    async fn list_runs(
        &self,
        request: Request<v1::ListRunsRequest>,
    ) -> Result<Response<v1::ListRunsReply>, Status> {
        let r = request.into_inner();
        let status = match r.status.as_deref() {
            None => None,
            Some("open") => Some(RunStatusKind::Open),
            Some("ended") => Some(RunStatusKind::Ended),
            Some("failed") => Some(RunStatusKind::Failed),
            Some(other) => {
                return Err(Status::invalid_argument(format!(
                    "status must be open, ended or failed, not `{other}`"
                )))
            }
        };
        if let Some(phrase) = r.search.as_deref() {
            let phrase = phrase.trim();
            if phrase.is_empty() || phrase.len() > 1000 {
                return Err(Status::invalid_argument(
                    "search needs 1 to 1000 bytes of words",
                ));
            }
            let tenant = r.tenant.map(|t| ids::tenant_or_default(&t).to_owned());
            let hits = if r.search_thinking {
                self.store
                    .search_thinking(tenant.as_deref(), phrase, r.limit)
                    .await
            } else {
                self.store
                    .search_runs(tenant.as_deref(), phrase, r.limit)
                    .await
            }
            .map_err(internal)?;
            let mut runs = Vec::with_capacity(hits.len());
            for hit in hits {
                if let Some(run) = self
                    .store
                    .get_run(&hit.tenant, &hit.run_id)
                    .await
                    .map_err(internal)?
                {
                    let mut run = self.run_reply(&run);
                    run.snippet = Some(hit.snippet);
                    runs.push(run);
                }
            }
            return Ok(Response::new(v1::ListRunsReply {
                runs,
                next_cursor: None,
            }));
        }
        let page = self
            .store
            .list_runs(&RunFilter {
                tenant: r.tenant.map(|t| ids::tenant_or_default(&t).to_owned()),
                session_key: r.session_key,
                status,
                provider: r.provider,
                model: r.model,
                since_ts_ms: r.since_ts_ms,
                until_ts_ms: r.until_ts_ms,
                unstripped: false,
                unexported: false,
                thinking_unindexed: false,
                limit: r.limit,
                cursor: r.cursor,
            })
            .await
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        Ok(Response::new(v1::ListRunsReply {
            runs: page.runs.iter().map(|r| self.run_reply(r)).collect(),
            next_cursor: page.next_cursor,
        }))
    }

    async fn get_run(
        &self,
        request: Request<v1::GetRunRequest>,
    ) -> Result<Response<v1::Run>, Status> {
        let r = request.into_inner();
        let tenant = ids::tenant_or_default(&r.tenant);
        let id = r.run_id;
        match self.store.get_run(tenant, &id).await.map_err(internal)? {
            Some(r) => Ok(Response::new(self.run_reply(&r))),
            None => Err(not_found(tenant, &id)),
        }
    }

    type ReplayEventsStream = Stream<v1::ArchivedEvent>;

    async fn replay_events(
        &self,
        request: Request<v1::ReplayEventsRequest>,
    ) -> Result<Response<Self::ReplayEventsStream>, Status> {
        let r = request.into_inner();
        let run = run_ref(&r.tenant, &r.run_id)?;
        if r.follow && r.generation.is_some() {
            return Err(Status::invalid_argument(
                "follow reads the run's current generation: leave out generation",
            ));
        }
        let (tx, rx) = mpsc::channel(256);
        let this = self.clone();
        tokio::spawn(async move {
            if let Err(status) = this
                .replay_into(&run, r.generation, r.after_seq, r.follow, &tx)
                .await
            {
                let _ = tx.send(Err(status)).await;
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    type ReplayJournalStream = Stream<v1::ArchivedEvent>;

    async fn replay_journal(
        &self,
        request: Request<v1::ReplayJournalRequest>,
    ) -> Result<Response<Self::ReplayJournalStream>, Status> {
        let r = request.into_inner();
        let (tx, rx) = mpsc::channel(256);
        let store = self.store.clone();
        tokio::spawn(async move {
            let mut after = r.after_journal_seq;
            let mut left = if r.limit == 0 {
                u64::MAX
            } else {
                u64::from(r.limit)
            };
            while left > 0 {
                let page = match store
                    .journal_after(after, PAGE.min(left.min(u64::from(PAGE)) as u32))
                    .await
                {
                    Ok(p) => p,
                    Err(e) => {
                        let _ = tx.send(Err(internal(e))).await;
                        return;
                    }
                };
                if page.is_empty() {
                    break;
                }
                // Pages end on whole journal entries, so one may exceed what is left.
                left = left.saturating_sub(page.len() as u64);
                for e in &page {
                    after = e.journal_seq;
                    if tx.send(Ok(convert::event(e))).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn replay_state(
        &self,
        request: Request<v1::ReplayStateRequest>,
    ) -> Result<Response<v1::RunState>, Status> {
        let r = request.into_inner();
        let tenant = ids::tenant_or_default(&r.tenant);
        let events = self.all_events(tenant, &r.run_id, r.generation).await?;
        if events.is_empty() {
            return Err(not_found(tenant, &r.run_id));
        }
        let upto = if r.at_seq == 0 { u64::MAX } else { r.at_seq };
        let state = RunState::fold(
            events
                .iter()
                .map(|e| &e.event.event)
                .filter(|e| e.seq <= upto),
        );
        Ok(Response::new(convert::state(tenant, &r.run_id, &state)))
    }

    async fn replay_timeline(
        &self,
        request: Request<v1::ReplayTimelineRequest>,
    ) -> Result<Response<v1::Timeline>, Status> {
        let r = request.into_inner();
        let tenant = ids::tenant_or_default(&r.tenant);
        let events: Vec<RunEvent> = self
            .all_events(tenant, &r.run_id, r.generation)
            .await?
            .into_iter()
            .map(|e| e.event)
            .collect();
        if events.is_empty() {
            return Err(not_found(tenant, &r.run_id));
        }
        Ok(Response::new(convert::timeline(
            tenant,
            &r.run_id,
            &timeline(&events),
        )))
    }

    type RawChunksStream = Stream<v1::RawChunk>;

    async fn raw_chunks(
        &self,
        request: Request<v1::RawChunksRequest>,
    ) -> Result<Response<Self::RawChunksStream>, Status> {
        let r = request.into_inner();
        let run = run_ref(&r.tenant, &r.run_id)?;
        let mut chunks = self
            .store
            .raw_chunks(&run.tenant, &run.run)
            .await
            .map_err(internal)?;
        if chunks.is_empty() {
            // No raw archive: SG_RAW itself is the provider-native transcript, read from
            // this tenant's subject of the run only.
            let subject = RunAddr::new(&run, self.partitions).raw_subject();
            let msgs = streamgate_bus::consume::read_subject(
                &self.js,
                streamgate_bus::RAW_STREAM,
                &subject,
            )
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
            chunks = msgs
                .iter()
                .filter_map(|m| streamgate_bus::raw::RawChunk::from_message(m).ok())
                .map(convert::raw_record)
                .collect();
        }
        let items: Vec<Result<v1::RawChunk, Status>> =
            chunks.into_iter().map(|c| Ok(convert::raw(c))).collect();
        Ok(Response::new(Box::pin(futures::stream::iter(items))))
    }

    type VerifyStream = Stream<v1::VerifyReport>;

    async fn verify(
        &self,
        request: Request<v1::VerifyRequest>,
    ) -> Result<Response<Self::VerifyStream>, Status> {
        let scope = history::rpc::scope(Some(request.into_inner()))?;
        let rx = history::rpc::spawn(self.store.clone(), scope, self.max_payload(), None);
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn erase(
        &self,
        request: Request<v1::EraseRequest>,
    ) -> Result<Response<v1::EraseReply>, Status> {
        let peer = request
            .remote_addr()
            .map_or_else(String::new, |a| format!(" from {a}"));
        let r = request.into_inner();
        let tenant = TenantId::new(ids::tenant_or_default(&r.tenant)).map_err(invalid)?;
        let scope = match r.scope {
            Some(v1::erase_request::Scope::RunId(run)) => {
                EraseScope::Run(RunId::new(run).map_err(invalid)?.into_string())
            }
            Some(v1::erase_request::Scope::SessionKey(session)) => {
                EraseScope::Session(SessionId::new(session).map_err(invalid)?.into_string())
            }
            Some(v1::erase_request::Scope::All(true)) => EraseScope::All,
            Some(v1::erase_request::Scope::All(false)) | None => {
                return Err(Status::invalid_argument(
                    "name what to erase: run_id, session_key or all",
                ))
            }
        };
        let actor = match r.actor.trim() {
            "" => format!("operator{peer}"),
            who => format!("{}{peer}", who.chars().take(200).collect::<String>()),
        };
        let report = crate::erase::erase(
            &self.store,
            &self.js,
            self.partitions,
            &tenant,
            &scope,
            &actor,
            streamgate_runtime::clock::now_ms(),
        )
        .await
        .map_err(|e| match e {
            crate::erase::EraseError::InvalidId(e) => Status::invalid_argument(e.to_string()),
            e => Status::unavailable(format!("{e} (erased so far stays erased; run it again)")),
        })?;
        let a = report.archive;
        Ok(Response::new(v1::EraseReply {
            runs: a.runs.len() as u64,
            open_runs: a.open_runs,
            events: a.events,
            raw_chunks: a.raw_chunks,
            bus_messages: report.bus_messages,
            audit_id: a.audit_id,
        }))
    }

    async fn list_erasures(
        &self,
        request: Request<v1::ListErasuresRequest>,
    ) -> Result<Response<v1::ListErasuresReply>, Status> {
        let r = request.into_inner();
        let tenant = r.tenant.map(|t| ids::tenant_or_default(&t).to_owned());
        let found = self
            .store
            .erasures(tenant.as_deref(), r.limit)
            .await
            .map_err(internal)?;
        Ok(Response::new(v1::ListErasuresReply {
            erasures: found
                .into_iter()
                .map(|e| v1::Erasure {
                    id: e.id,
                    at_ms: e.at_ms,
                    actor: e.actor,
                    tenant: e.tenant,
                    scope: e.scope,
                    scope_hash: e.scope_hash,
                    run_hashes: e.run_hashes,
                    events: e.events,
                    raw_chunks: e.raw_chunks,
                })
                .collect(),
        }))
    }

    async fn retention(
        &self,
        request: Request<v1::RetentionRequest>,
    ) -> Result<Response<v1::RetentionReply>, Status> {
        let apply = request.into_inner().apply;
        let r = crate::retention::enforce(
            &*self.store,
            &self.retention,
            streamgate_runtime::clock::now_ms(),
            apply,
        )
        .await
        .map_err(internal)?;
        Ok(Response::new(v1::RetentionReply {
            policies: self.retention.0.iter().map(ToString::to_string).collect(),
            stripped_runs: r.stripped_runs,
            stripped_events: r.stripped_events,
            dropped_runs: r.dropped_runs,
            dropped_events: r.dropped_events,
            applied: apply,
        }))
    }

    async fn run_stats(
        &self,
        request: Request<v1::RunStatsRequest>,
    ) -> Result<Response<v1::RunStatsReply>, Status> {
        let r = request.into_inner();
        let rows = self
            .store
            .run_stats(&streamgate_archive::StatsFilter {
                tenant: r.tenant.map(|t| ids::tenant_or_default(&t).to_owned()),
                since_ts_ms: r.since_ts_ms,
                until_ts_ms: r.until_ts_ms,
            })
            .await
            .map_err(internal)?;
        Ok(Response::new(v1::RunStatsReply {
            rows: rows
                .into_iter()
                .map(|s| v1::RunStatsRow {
                    cost: self.prices.cost(&s.model, &s.tokens),
                    day: streamgate_runtime::clock::utc_date(s.day),
                    runs: s.runs,
                    input_tokens: s.tokens.input,
                    output_tokens: s.tokens.output,
                    reasoning_tokens: s.tokens.reasoning,
                    cache_read_tokens: s.tokens.cache_read,
                    cache_write_tokens: s.tokens.cache_write,
                    mean_ttft_ms: (s.ttft_runs > 0).then(|| s.ttft_ms_sum / s.ttft_runs as i64),
                    mean_duration_ms: s.duration_ms_sum / (s.runs.max(1) as i64),
                    tenant: s.tenant,
                    model: s.model,
                })
                .collect(),
            currency: self.currency.clone(),
        }))
    }

    type BackfillStream = Stream<v1::VerifyReport>;

    async fn backfill(
        &self,
        request: Request<v1::BackfillRequest>,
    ) -> Result<Response<Self::BackfillStream>, Status> {
        let r = request.into_inner();
        let scope = history::rpc::scope(r.scope)?;
        let rx = history::rpc::spawn(self.store.clone(), scope, self.max_payload(), Some(r.apply));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// The run a request names (an empty tenant is the default one), held as a [`RunRef`]
/// once its ids pass the rule ([`streamgate_grammar::ids`]): they become a NATS subject
/// (follow, raw chunks), and an id of kilobytes would push the subject past the broker's
/// control-line limit and drop this service's connection.
fn run_ref(tenant: &str, run_id: &str) -> Result<RunRef, Status> {
    RunRef::new(ids::tenant_or_default(tenant), run_id).map_err(invalid)
}

/// INVALID_ARGUMENT naming the id rule an id breaks.
fn invalid(e: ids::IdError) -> Status {
    Status::invalid_argument(e.to_string())
}

/// NOT_FOUND for the run `(tenant, run_id)`.
fn not_found(tenant: &str, run_id: &str) -> Status {
    Status::not_found(format!(
        "no run `{run_id}` of tenant `{tenant}` in the archive"
    ))
}

impl Replay {
    /// The broker's message limit: the size live events were cut to, which a
    /// re-normalization must cut to as well.
    fn max_payload(&self) -> usize {
        self.js.client().server_info().max_payload
    }

    /// Sends the run's events after `after_seq`, then (with `follow`) live ones until
    /// the terminal event.
    async fn replay_into(
        &self,
        run: &RunRef,
        generation: Option<u32>,
        after_seq: u64,
        follow: bool,
        tx: &mpsc::Sender<Result<v1::ArchivedEvent, Status>>,
    ) -> Result<(), Status> {
        let mut last = after_seq;
        let mut done = false;
        loop {
            let page = self.page(&run.tenant, &run.run, generation, last).await?;
            let full = page.len() as u32 == PAGE;
            for e in &page {
                last = e.event.event.seq;
                done |= e.event.event.is_terminal();
                if tx.send(Ok(convert::event(e))).await.is_err() {
                    return Ok(());
                }
            }
            if !full {
                break;
            }
        }
        if !follow || done {
            return Ok(());
        }
        // Live: this tenant's subject of the run from the start of SG_EVENTS; only
        // last+1 goes out.
        let subject = RunAddr::new(run, self.partitions).events_subject();
        let stream = self
            .js
            .get_stream(EVENTS_STREAM)
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        let consumer = stream
            .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig {
                filter_subject: subject,
                deliver_policy: async_nats::jetstream::consumer::DeliverPolicy::All,
                ..Default::default()
            })
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        let mut live = consumer
            .messages()
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        let mut ticker = tokio::time::interval(Duration::from_secs(15));
        loop {
            let msg = tokio::select! {
                m = live.next() => m,
                _ = tx.closed() => return Ok(()),
                _ = ticker.tick() => continue,
            };
            let Some(msg) = msg else { break };
            let msg = msg.map_err(|e| Status::unavailable(e.to_string()))?;
            let Ok(evs) = decode_msg(&msg) else {
                continue;
            };
            let journal_seq = msg.info().map(|i| i.stream_sequence).unwrap_or(0);
            for ev in evs {
                if self
                    .forward_live(run, ev, journal_seq, &mut last, tx)
                    .await?
                {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Sends one live event of a follow replay if it is `last + 1` (filling a gap from the
    /// archive first). Returns true when the replay is over: the event was terminal or
    /// the client left.
    async fn forward_live(
        &self,
        run: &RunRef,
        ev: RunEvent,
        journal_seq: u64,
        last: &mut u64,
        tx: &mpsc::Sender<Result<v1::ArchivedEvent, Status>>,
    ) -> Result<bool, Status> {
        let seq = ev.event.seq;
        if seq <= *last {
            return Ok(false);
        }
        if seq > *last + 1 {
            // The bus lost the middle (retention); the archive has it.
            let fill = self
                .store
                .events_after(&run.tenant, &run.run, *last, (seq - *last - 1) as u32)
                .await
                .map_err(internal)?;
            for e in &fill {
                if e.event.event.seq >= seq {
                    break;
                }
                *last = e.event.event.seq;
                if tx.send(Ok(convert::event(e))).await.is_err() {
                    return Ok(true);
                }
            }
            if *last + 1 != seq {
                return Err(Status::data_loss(format!(
                    "run {run}: seq {} to {} are in neither the archive nor the bus",
                    *last + 1,
                    seq - 1
                )));
            }
        }
        *last = seq;
        let terminal = ev.event.is_terminal();
        let sent = tx
            .send(Ok(convert::event(&ArchivedEvent {
                event: ev,
                journal_seq,
            })))
            .await;
        Ok(sent.is_err() || terminal)
    }
}
