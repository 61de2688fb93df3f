//! `ProjectorService`: a channel's own API (its bearer token, never the archive).
//!
//! `Subscribe` follows the reconnect protocol (spec §7.3): replay from `SG_EVENTS`
//! after the subscriber's `lastRenderedSeq`, then live, ending with the terminal event.
//! Live events are subscribed to *before* the replay is read, and every event is passed
//! only when its seq is exactly the next one, so the boundary has neither a duplicate nor
//! a gap; a lagging live stream falls back to re-reading the subject.
//!
//! `SetSettings` maps its request and reply in `settings`.
//!
//! `Watch` (in [`watch`]) is the same for every run at once, for `streamgate tail`.
//!
//! Both send display-safe events (docs/architecture.md §6, issue 11): a channel token holder gets
//! the events with thinking, commentary and tool text passed through the projection's one
//! redactor ([`streamgate_projection::EventRedactor`], on each lane's accumulated text);
//! final answers verbatim. Raw events stay operator-only (`ArchiveService`).
//!
//! A run is `(tenant, run id)`: requests naming a run carry `tenant`; an empty one means
//! the only tenant with a run of that id here (FAILED_PRECONDITION when there are
//! several), and every stream follows exactly one `(tenant, run id)`.
//!
//! Every answer comes from this replica: a channel's replicas split the partitions, so
//! `ListActiveRuns` and `GetDraft` know the runs of the partitions held here, and the
//! live part of `Subscribe` sees only events processed here (a run on another replica's
//! partition is replayed from `SG_EVENTS`, then not followed).

mod settings;
mod watch;

use crate::channel::{Channel, Lookup, RunKey};
use std::pin::Pin;
use std::sync::Arc;
use streamgate_grammar::{ids, RunEvent};
use streamgate_projection::EventRedactor;
use streamgate_proto::v1;
use streamgate_proto::v1::projector_service_server::ProjectorService;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

/// The gRPC implementation over one [`Channel`].
pub struct Projector {
    channel: Arc<Channel>,
    shutdown: CancellationToken,
}

impl Projector {
    /// The service for `channel`. Open `Subscribe` streams end with `UNAVAILABLE` when
    /// `shutdown` fires: a graceful server shutdown waits for every open stream, and a
    /// live run's stream would otherwise hold the process up until the run ends (the
    /// subscriber resumes from its `lastRenderedSeq` on the next instance).
    pub fn new(channel: Arc<Channel>, shutdown: CancellationToken) -> Projector {
        Projector { channel, shutdown }
    }
}

/// The display-safe form of `ev` (docs/architecture.md §6: channel surfaces are display-safe; raw
/// events stay operator-only): progress text redacted on each lane's accumulated text,
/// finals verbatim. `None` when the redactor has seen that seq already.
pub(crate) fn display_safe(redactor: &mut EventRedactor, ev: &RunEvent) -> Option<v1::Event> {
    let event = redactor.apply(&ev.event)?;
    Some(v1::Event::from(&RunEvent {
        envelope: ev.envelope.clone(),
        event,
    }))
}

/// Sends `events` with seq == `*next` onwards in order, display-safe; returns false when
/// the receiver is gone or the terminal event was sent. Earlier events only prime the
/// redactor (a resumed subscriber's secret may have started before its resume point).
async fn send_in_order(
    tx: &mpsc::Sender<Result<v1::Event, Status>>,
    events: impl IntoIterator<Item = RunEvent>,
    next: &mut u64,
    redactor: &mut EventRedactor,
) -> bool {
    for ev in events {
        if ev.event.seq < *next {
            let _ = redactor.apply(&ev.event);
            continue;
        }
        if ev.event.seq != *next {
            continue;
        }
        *next += 1;
        let end = ev.event.is_terminal();
        let Some(safe) = display_safe(redactor, &ev) else {
            continue;
        };
        if tx.send(Ok(safe)).await.is_err() || end {
            return false;
        }
    }
    true
}

/// FAILED_PRECONDITION for a run id that several tenants have here.
fn ambiguous(run_id: &str) -> Status {
    Status::failed_precondition(format!(
        "several tenants have a run `{run_id}` on this channel: name the tenant"
    ))
}

async fn follow(
    channel: Arc<Channel>,
    run_id: RunKey,
    subject: String,
    after_seq: u64,
    live: broadcast::Receiver<Arc<RunEvent>>,
    tx: mpsc::Sender<Result<v1::Event, Status>>,
    shutdown: CancellationToken,
) {
    tokio::select! {
        () = follow_run(channel, run_id, subject, after_seq, live, tx.clone()) => {}
        () = shutdown.cancelled() => {
            let _ = tx
                .send(Err(Status::unavailable(
                    "projector shutting down: subscribe again from the last rendered seq",
                )))
                .await;
        }
    }
}

async fn follow_run(
    channel: Arc<Channel>,
    run_id: RunKey,
    subject: String,
    after_seq: u64,
    mut live: broadcast::Receiver<Arc<RunEvent>>,
    tx: mpsc::Sender<Result<v1::Event, Status>>,
) {
    let mut next = after_seq.saturating_add(1);
    let mut redactor = EventRedactor::new();
    let mut reread = true;
    loop {
        if reread {
            reread = false;
            match channel.read_run(&subject).await {
                Ok(evs) => {
                    if !send_in_order(&tx, evs, &mut next, &mut redactor).await {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(Status::unavailable(e.to_string()))).await;
                    return;
                }
            }
        }
        match live.recv().await {
            Ok(ev) if ev.envelope.run_id == run_id.1 && ev.envelope.tenant == run_id.0 => {
                if ev.event.seq > next {
                    // A gap (we subscribed while the consumer was ahead of the read):
                    // fill it from the stream before going on.
                    reread = true;
                    continue;
                }
                if !send_in_order(&tx, [(*ev).clone()], &mut next, &mut redactor).await {
                    return;
                }
            }
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(_)) => reread = true,
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

type EventStream = Pin<Box<dyn futures::Stream<Item = Result<v1::Event, Status>> + Send>>;

#[tonic::async_trait]
impl ProjectorService for Projector {
    type SubscribeStream = EventStream;
    type WatchStream = EventStream;

    async fn watch(
        &self,
        req: Request<v1::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let req = req.into_inner();
        // Per run: `after` wins over the deprecated per-run-id map.
        let after = watch::AfterSeq {
            by_run_id: req.after_seq.into_iter().collect(),
            by_run: req
                .after
                .into_iter()
                .map(|r| ((r.tenant, r.run_id), r.seq))
                .collect(),
        };
        let live = self.channel.subscribe_events();
        let (tx, rx) = mpsc::channel(1024);
        let (channel, stop) = (self.channel.clone(), self.shutdown.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = watch::watch(channel, after, live, tx.clone()) => {}
                () = stop.cancelled() => {
                    let _ = tx
                        .send(Err(Status::unavailable(
                            "projector shutting down: watch again with the last seqs",
                        )))
                        .await;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn subscribe(
        &self,
        req: Request<v1::SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let req = req.into_inner();
        let runs = self.channel.active_runs();
        let run = match &req.target {
            Some(v1::subscribe_request::Target::RunId(r)) => {
                let mut matching = runs.into_iter().filter(|x| {
                    &x.run_id == r && (req.tenant.is_empty() || x.tenant == req.tenant)
                });
                let first = matching.next();
                if first.is_some() && matching.next().is_some() {
                    return Err(ambiguous(r));
                }
                first
            }
            Some(v1::subscribe_request::Target::SessionKey(s)) => {
                // A session is a tenant's: another tenant's session of the same name is
                // another chat.
                let mut matching = runs.into_iter().filter(|x| {
                    x.session_key.as_deref() == Some(s.as_str())
                        && (req.tenant.is_empty() || x.tenant == req.tenant)
                });
                let first = matching.next();
                if first
                    .as_ref()
                    .is_some_and(|f| matching.any(|x| x.tenant != f.tenant))
                {
                    return Err(Status::failed_precondition(format!(
                        "several tenants have an active run in session `{s}` on this channel: name the tenant"
                    )));
                }
                first
            }
            None => {
                return Err(Status::invalid_argument(
                    "run_id or session_key is required",
                ))
            }
        };
        // Only within an active turn: after the terminal event there is no progress
        // replay (spec §7.3, §5 item 6).
        let Some(run) = run else {
            return Err(Status::not_found("no active turn for that run or session"));
        };
        let live = self.channel.subscribe_events();
        let (tx, rx) = mpsc::channel(256);
        tokio::spawn(follow(
            self.channel.clone(),
            (run.tenant, run.run_id),
            run.subject,
            req.after_seq,
            live,
            tx,
            self.shutdown.clone(),
        ));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn get_draft(
        &self,
        req: Request<v1::GetDraftRequest>,
    ) -> Result<Response<v1::Draft>, Status> {
        let req = req.into_inner();
        let d = match self.channel.draft(&req.tenant, &req.run_id) {
            Lookup::Found(d) => d,
            Lookup::Missing => return Err(Status::not_found("run is not active on this channel")),
            Lookup::Ambiguous => return Err(ambiguous(&req.run_id)),
        };
        Ok(Response::new(v1::Draft {
            run_id: req.run_id,
            tenant: d.tenant,
            chat_id: d.chat_id,
            text: d.text,
            last_seq: d.last_seq,
            settled: d.settled,
        }))
    }

    async fn get_ended_run(
        &self,
        req: Request<v1::GetEndedRunRequest>,
    ) -> Result<Response<v1::EndedRun>, Status> {
        let req = req.into_inner();
        let ((tenant, run_id), ended) = match self.channel.ended_run(&req.tenant, &req.run_id) {
            Lookup::Found(e) => e,
            Lookup::Missing => {
                return Err(Status::not_found(
                    "no run of that id ended on this channel recently (`streamgate replay` has every run)",
                ))
            }
            Lookup::Ambiguous => return Err(ambiguous(&req.run_id)),
        };
        let ended_at_ms = streamgate_runtime::clock::ms_of(ended.ended_at);
        Ok(Response::new(v1::EndedRun {
            run_id,
            tenant,
            chat_id: ended.chat_id,
            final_text: ended.final_text,
            ended_at_ms,
        }))
    }

    async fn list_active_runs(
        &self,
        _req: Request<v1::ListActiveRunsRequest>,
    ) -> Result<Response<v1::ListActiveRunsReply>, Status> {
        let runs = self
            .channel
            .active_runs()
            .into_iter()
            .map(|r| v1::ActiveRun {
                run_id: r.run_id,
                tenant: r.tenant,
                chat_id: r.chat_id,
                session_key: r.session_key,
                last_seq: r.last_seq,
            })
            .collect();
        Ok(Response::new(v1::ListActiveRunsReply { runs }))
    }

    async fn list_parked(
        &self,
        _req: Request<v1::ListParkedRequest>,
    ) -> Result<Response<v1::ListParkedReply>, Status> {
        let finals = self
            .channel
            .parked()
            .into_iter()
            .map(|p| v1::ParkedFinal {
                tenant: p.run.tenant,
                run_id: p.run.run_id,
                chat_id: p.chat.chat_id,
                error: p.error,
                parked_at_ms: streamgate_runtime::clock::ms_of(p.at),
            })
            .collect();
        Ok(Response::new(v1::ListParkedReply { finals }))
    }

    async fn resend_parked(
        &self,
        _req: Request<v1::ResendParkedRequest>,
    ) -> Result<Response<v1::ResendParkedReply>, Status> {
        let n = self
            .channel
            .resend_parked()
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        Ok(Response::new(v1::ResendParkedReply {
            resent: u32::try_from(n).unwrap_or(u32::MAX),
        }))
    }

    async fn set_settings(
        &self,
        req: Request<v1::SetSettingsRequest>,
    ) -> Result<Response<v1::SetSettingsReply>, Status> {
        let req = req.into_inner();
        if req.chat_id.is_empty() {
            return Err(Status::invalid_argument("chat_id is required"));
        }
        let tenant = ids::TenantId::new(ids::tenant_or_default(&req.tenant))
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let (o, reset) = settings::change_of(&req)?;
        let (s, n) = self
            .channel
            .change_settings(&tenant, &req.chat_id, o, &reset)
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        Ok(Response::new(settings::reply_of(&s, n)))
    }
}
