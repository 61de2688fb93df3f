//! Routes agent events by `runId` into runs, each fed by its own task ([`super::feed`])
//! through a bounded queue.
//!
//! - A payload without a string `runId`, or with one that breaks the id rule
//!   ([`streamgate_grammar::ids`]), is rejected with a warning; nothing else happens.
//! - An event whose `seq` does not advance past the last one forwarded for its run (a
//!   re-delivery after a reconnect) is dropped here: the adapter would drop it too, with
//!   a `stale_seq` diagnostic, and the run's archive is meant to equal `normalize` of its
//!   distinct events. Events without `seq` are always forwarded.
//! - A run ends when its terminal event (lifecycle `end`/`error`, an `error` stream: the
//!   events after which the adapter accepts nothing) is forwarded; later events of that
//!   run are dropped (the last [`ENDED_REMEMBERED`] ended runs are remembered).
//! - The first event's `sessionKey` becomes the run's session when it is a valid session
//!   id.
//!
//! Bounded memory: each run's queue holds at most `queue` lines. A slow run fills only
//! its own queue; when one is full, routing waits — the WebSocket is not read meanwhile,
//! which pushes back on the gateway rather than buffering without bound.

use super::feed::{feed, FeedConfig, Line};
use super::sink::RunSink;
use crate::ingest::RunSpec;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use std::collections::{HashMap, HashSet, VecDeque};
use streamgate_grammar::ids::{RunId, SessionId, TenantId};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// The wire family followed runs are ingested as.
pub const FAMILY: &str = "openclaw-events";
/// Ended runs remembered, to drop their late events.
pub const ENDED_REMEMBERED: usize = 4096;
/// Above this many tracked runs, runs whose feeder has ended are forgotten.
const TRACKED_PRUNE: usize = 1024;

/// What became of one agent event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Routed {
    /// Queued for its run; `terminal` when it ends the run.
    Forwarded {
        /// The run.
        run: String,
        /// The run's terminal event.
        terminal: bool,
    },
    /// Its `seq` does not advance: a re-delivery.
    Duplicate,
    /// Its run has ended already.
    AfterEnd,
    /// Not routable (no or bad `runId`, not an object).
    Rejected(String),
}

/// The fields routing reads (`data` stays unparsed: it may be a large tool result).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Head<'a> {
    #[serde(default)]
    run_id: Option<Value>,
    #[serde(default)]
    seq: Option<Value>,
    #[serde(default)]
    stream: Option<Value>,
    #[serde(borrow, default)]
    data: Option<&'a RawValue>,
    #[serde(default)]
    session_key: Option<Value>,
}

/// A lifecycle event's phase.
#[derive(Deserialize)]
struct Phase {
    #[serde(default)]
    phase: Option<Value>,
}

impl Head<'_> {
    /// The events after which the `openclaw-events` adapter accepts nothing.
    fn is_terminal(&self) -> bool {
        match self.stream.as_ref().and_then(Value::as_str) {
            Some("lifecycle") => {
                let phase = self
                    .data
                    .and_then(|d| serde_json::from_str::<Phase>(d.get()).ok())
                    .and_then(|p| p.phase);
                matches!(
                    phase.as_ref().and_then(Value::as_str),
                    Some("end" | "error")
                )
            }
            Some("error") => true,
            _ => false,
        }
    }
}

struct RunState {
    tx: mpsc::Sender<Line>,
    spec: RunSpec,
    last_seq: Option<u64>,
}

/// Routes agent events into runs fed to a [`RunSink`].
pub struct Router<S: RunSink> {
    sink: S,
    tenant: TenantId,
    queue: usize,
    feed: FeedConfig,
    cancel: CancellationToken,
    runs: HashMap<String, RunState>,
    ended: HashSet<String>,
    ended_order: VecDeque<String>,
    tasks: JoinSet<()>,
}

impl<S: RunSink> Router<S> {
    /// Routes runs of `tenant` to `sink`, at most `queue` lines queued per run.
    pub fn new(
        sink: S,
        tenant: TenantId,
        queue: usize,
        feed: FeedConfig,
        cancel: CancellationToken,
    ) -> Router<S> {
        Router {
            sink,
            tenant,
            queue: queue.max(1),
            feed,
            cancel,
            runs: HashMap::new(),
            ended: HashSet::new(),
            ended_order: VecDeque::new(),
            tasks: JoinSet::new(),
        }
    }

    /// Routes one `agent` event payload; waits while its run's queue is full.
    pub async fn route(&mut self, payload: &RawValue) -> Routed {
        let routed = self.route_inner(payload).await;
        match &routed {
            Routed::Forwarded { .. } => {}
            Routed::Rejected(why) => {
                metrics::counter!("streamgate_gateway_events_rejected_total").increment(1);
                tracing::warn!(reason = %why, "gateway agent event not routable");
            }
            other => tracing::debug!(outcome = ?other, "gateway agent event dropped"),
        }
        routed
    }

    async fn route_inner(&mut self, payload: &RawValue) -> Routed {
        let head: Head<'_> = match serde_json::from_str(payload.get()) {
            Ok(h) => h,
            Err(e) => return Routed::Rejected(format!("payload is not an agent event: {e}")),
        };
        let run = match &head.run_id {
            Some(Value::String(s)) => match RunId::new(s.as_str()) {
                Ok(run) => run,
                Err(e) => return Routed::Rejected(e.to_string()),
            },
            Some(_) => return Routed::Rejected("runId is not a string".to_owned()),
            None => return Routed::Rejected("no runId".to_owned()),
        };
        if self.ended.contains(&*run) {
            return Routed::AfterEnd;
        }
        let seq = head.seq.as_ref().and_then(Value::as_u64);
        if !self.runs.contains_key(&*run) {
            self.track(&run, &head);
        }
        let Some(state) = self.runs.get_mut(&*run) else {
            return Routed::Rejected("untracked run".to_owned());
        };
        if let (Some(seq), Some(last)) = (seq, state.last_seq) {
            if seq <= last {
                return Routed::Duplicate;
            }
        }
        let terminal = head.is_terminal();
        // Valid JSON holds line breaks only as whitespace between tokens.
        let mut text = payload.get().replace(['\n', '\r'], " ");
        text.push('\n');
        self.send(&run, Line { text, terminal }).await;
        if let Some(state) = self.runs.get_mut(&*run) {
            state.last_seq = seq.or(state.last_seq);
        }
        if terminal {
            self.end(&run);
        }
        metrics::counter!("streamgate_gateway_events_total").increment(1);
        Routed::Forwarded {
            run: run.into(),
            terminal,
        }
    }

    /// Starts tracking `run` (first seen now).
    fn track(&mut self, run: &RunId, head: &Head<'_>) {
        if self.runs.len() >= TRACKED_PRUNE {
            self.runs.retain(|_, s| !s.tx.is_closed());
        }
        let session_key = match &head.session_key {
            Some(Value::String(s)) => SessionId::new(s.as_str()).ok(),
            _ => None,
        };
        let spec = RunSpec {
            tenant: self.tenant.clone(),
            run_id: run.clone(),
            session_key,
            family: FAMILY.to_owned(),
            dialect: None,
        };
        tracing::info!(run = %run, "gateway run followed");
        let tx = self.spawn(spec.clone());
        self.runs.insert(
            run.to_string(),
            RunState {
                tx,
                spec,
                last_seq: None,
            },
        );
    }

    /// A feeder for `spec`; its queue's sender.
    fn spawn(&mut self, spec: RunSpec) -> mpsc::Sender<Line> {
        while self.tasks.try_join_next().is_some() {}
        let (tx, rx) = mpsc::channel(self.queue);
        let task = feed(
            self.sink.clone(),
            spec,
            rx,
            self.feed.clone(),
            self.cancel.clone(),
        );
        self.tasks.spawn(task);
        tx
    }

    /// Queues `line` for `run`, starting a new feeder when the last one idled out.
    async fn send(&mut self, run: &str, line: Line) {
        let Some(state) = self.runs.get(run) else {
            return;
        };
        let Err(mpsc::error::SendError(line)) = state.tx.send(line).await else {
            return;
        };
        let spec = state.spec.clone();
        let tx = self.spawn(spec);
        // A fresh queue has room.
        let _ = tx.send(line).await;
        if let Some(state) = self.runs.get_mut(run) {
            state.tx = tx;
        }
    }

    /// Forgets `run`'s queue (its feeder stores the close marker) and remembers it ended.
    fn end(&mut self, run: &str) {
        self.runs.remove(run);
        if self.ended_order.len() >= ENDED_REMEMBERED {
            if let Some(old) = self.ended_order.pop_front() {
                self.ended.remove(&old);
            }
        }
        self.ended.insert(run.to_owned());
        self.ended_order.push_back(run.to_owned());
    }

    /// Runs being followed (not ended).
    pub fn open_runs(&self) -> usize {
        self.runs.len()
    }

    /// Closes every queue and waits for the feeders to store what was queued (runs not
    /// ended stay open).
    pub async fn finish(mut self) {
        self.runs.clear();
        while self.tasks.join_next().await.is_some() {}
    }
}
