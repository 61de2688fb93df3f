//! The built-in tier-T2 web channel: a [`WebSink`] that records each run's ops and fans
//! them out, and an axum server with one self-contained HTML page that lists active runs
//! and follows one live over SSE (`/runs/{run}/events`): thinking, tool rows, the final
//! answer.
//!
//! Routes: `GET /` (the page), `GET /api/runs` (active runs with their drafts, JSON),
//! `GET /runs/{run}/events` (SSE: every op of the run so far, then live; each SSE event
//! is one op as JSON, its SSE id the op's index within the run, so a reconnecting
//! `EventSource` can resume with `Last-Event-ID` without duplicates).
//!
//! The page is the rich surface (spec §7.2 tier B): draft lines arrive classified
//! ([`WebOp::lines`]) so thinking, tool rows and commentary are styled apart, and a
//! settle collapses the activity under its summary line instead of erasing it — the rows
//! stay one click away (and visible until then), the final answer below them. Only a
//! Reject retraction removes rendered rows (destructive settle, spec §3.5). A connection
//! badge shows whether the SSE stream is live.

use crate::channel::Channel;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use axum::{Json, Router};
use futures::future::BoxFuture;
use futures::{Stream, StreamExt as _};
use serde::Serialize;
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use streamgate_projection::{draft_line_kind, DraftLine, Op, Tier};
use streamgate_sinks::{ChatTarget, DeliveryState, Sink, SinkError};
use tokio::sync::broadcast;
use tokio_stream::wrappers::BroadcastStream;
use tokio_util::sync::CancellationToken;

/// One op as the page sees it.
#[derive(Debug, Clone, Serialize)]
pub struct WebOp {
    /// The run.
    pub run_id: String,
    /// Index of the op within the run (SSE id).
    pub index: u64,
    /// The op itself (`{"op":"draft","text":…}` etc.).
    pub op: Op,
    /// A draft's lines, each with its lane (absent for other ops): the page styles
    /// thinking, tool rows and commentary apart without knowing the row format.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lines: Vec<WebLine>,
}

/// One classified line of a draft.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WebLine {
    /// Thinking, tool row or text.
    pub kind: DraftLine,
    /// The line as rendered.
    pub text: String,
}

fn classify(op: &Op) -> Vec<WebLine> {
    match op {
        Op::Draft { text, .. } => text
            .lines()
            .map(|l| WebLine {
                kind: draft_line_kind(l),
                text: l.to_owned(),
            })
            .collect(),
        _ => Vec::new(),
    }
}

#[derive(Default)]
struct Runs {
    /// Ops per run, in delivery order (drafts are latest-wins: only the newest is kept).
    ops: HashMap<String, Vec<WebOp>>,
    next: HashMap<String, u64>,
}

/// The web channel's sink: idempotent by the delivery state like every sink, and
/// publishing each op to the page's SSE streams.
pub struct WebSink {
    channel: String,
    runs: Mutex<Runs>,
    tx: broadcast::Sender<WebOp>,
}

impl WebSink {
    /// A web sink for channel `channel`.
    pub fn new(channel: impl Into<String>) -> Arc<WebSink> {
        Arc::new(WebSink {
            channel: channel.into(),
            runs: Mutex::new(Runs::default()),
            tx: broadcast::channel(1024).0,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Runs> {
        self.runs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record(&self, run_id: &str, op: &Op) {
        let mut r = self.lock();
        let n = r.next.entry(run_id.to_owned()).or_insert(0);
        *n += 1;
        let w = WebOp {
            run_id: run_id.to_owned(),
            index: *n,
            op: op.clone(),
            lines: classify(op),
        };
        let list = r.ops.entry(run_id.to_owned()).or_default();
        if matches!(op, Op::Draft { .. }) {
            list.retain(|o| !matches!(o.op, Op::Draft { .. }));
        }
        list.push(w.clone());
        // No page open is fine.
        let _ = self.tx.send(w);
    }

    /// The ops of `run_id` so far (latest draft only).
    pub fn history(&self, run_id: &str) -> Vec<WebOp> {
        self.lock().ops.get(run_id).cloned().unwrap_or_default()
    }

    /// Live ops of every run.
    pub fn subscribe(&self) -> broadcast::Receiver<WebOp> {
        self.tx.subscribe()
    }
}

impl Sink for WebSink {
    fn channel(&self) -> &str {
        &self.channel
    }

    fn kind(&self) -> &'static str {
        "web"
    }

    fn tier(&self) -> Tier {
        Tier::T2 { status_line: false }
    }

    fn execute<'a>(
        &'a self,
        _chat: &'a ChatTarget,
        op: &'a Op,
        state: &'a mut DeliveryState,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            match op {
                Op::Typing => {}
                Op::Draft { key, text, seq } => {
                    if state.settled || state.draft_text.as_deref() == Some(text) {
                        return Ok(());
                    }
                    self.record(&key.run_id, op);
                    state.draft_text = Some(text.clone());
                    state.last_rendered_seq = Some(*seq);
                }
                Op::Settle { key, text, seq } => {
                    if state.settled {
                        return Ok(());
                    }
                    self.record(&key.run_id, op);
                    state.draft_text = Some(text.clone());
                    state.last_rendered_seq = Some(*seq);
                    state.settled = true;
                }
                Op::Dismiss { key } => {
                    if state.dismissed {
                        return Ok(());
                    }
                    self.record(&key.run_id, op);
                    state.dismissed = true;
                    state.settled = true;
                }
                Op::Final { key, .. } => {
                    if state.final_delivered {
                        return Ok(());
                    }
                    self.record(&key.run_id, op);
                    state.final_delivered = true;
                }
                Op::Retract { key, .. } => {
                    if state.retracted {
                        return Ok(());
                    }
                    self.record(&key.run_id, op);
                    state.retracted = true;
                }
                Op::Notice { key, seq, .. } => {
                    if !state.notices_sent.insert(*seq) {
                        return Ok(());
                    }
                    self.record(&key.run_id, op);
                }
            }
            Ok(())
        })
    }
}

#[derive(Clone)]
struct AppState {
    channel: Arc<Channel>,
    sink: Arc<WebSink>,
    shutdown: CancellationToken,
}

/// The web page's router. SSE streams end when `shutdown` fires: a graceful shutdown
/// waits for open connections, and an open page would otherwise hold the process up
/// (the page's `EventSource` reconnects to the next instance by itself).
pub fn router(channel: Arc<Channel>, sink: Arc<WebSink>, shutdown: CancellationToken) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/api/runs", get(runs))
        .route("/runs/{run}/events", get(run_events))
        .with_state(AppState {
            channel,
            sink,
            shutdown,
        })
}

async fn page() -> Html<&'static str> {
    Html(PAGE)
}

#[derive(Serialize)]
struct RunRow {
    run_id: String,
    chat_id: String,
    session_key: Option<String>,
    last_seq: u64,
    draft: String,
}

async fn runs(State(s): State<AppState>) -> Json<Vec<RunRow>> {
    Json(
        s.channel
            .active_runs()
            .into_iter()
            .map(|r| RunRow {
                draft: s
                    .channel
                    .draft(&r.run_id)
                    .map(|d| d.text)
                    .unwrap_or_default(),
                run_id: r.run_id,
                chat_id: r.chat_id,
                session_key: r.session_key,
                last_seq: r.last_seq,
            })
            .collect(),
    )
}

fn sse_of(w: &WebOp) -> Result<SseEvent, Infallible> {
    let data = serde_json::to_string(w).unwrap_or_else(|_| "{}".to_owned());
    Ok(SseEvent::default().id(w.index.to_string()).data(data))
}

async fn run_events(
    State(s): State<AppState>,
    Path(run): Path<String>,
    headers: HeaderMap,
) -> impl IntoResponse {
    let after: u64 = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // Subscribe before reading the history so nothing falls between the two; the index
    // filter drops what both contain.
    let rx = s.sink.subscribe();
    let history = s.sink.history(&run);
    let last = history.last().map_or(after, |w| w.index.max(after));
    let head: Vec<_> = history
        .iter()
        .filter(|w| w.index > after)
        .map(sse_of)
        .collect();
    let live = BroadcastStream::new(rx).filter_map(move |w| {
        let run = run.clone();
        async move {
            match w {
                Ok(w) if w.run_id == run && w.index > last => Some(sse_of(&w)),
                _ => None,
            }
        }
    });
    let stream: std::pin::Pin<Box<dyn Stream<Item = Result<SseEvent, Infallible>> + Send>> =
        Box::pin(
            futures::stream::iter(head)
                .chain(live)
                .take_until(s.shutdown.cancelled_owned()),
        );
    Sse::new(stream).keep_alive(KeepAlive::default())
}

/// The page: plain HTML, CSS and JS, no external assets.
const PAGE: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>streamgate · live runs</title>
<style>
body{font:15px/1.45 system-ui,sans-serif,"Noto Color Emoji";margin:0;display:flex;height:100vh;background:#f6f7f9;color:#1c1e21}
aside{width:300px;border-right:1px solid #ddd;overflow:auto;background:#fff}
aside h1{font-size:16px;margin:12px}
.run{padding:8px 12px;border-bottom:1px solid #eee;cursor:pointer}
.run:hover,.run.sel{background:#eef3ff}
.run small{color:#777;display:block}
main{flex:1;overflow:auto;padding:16px 24px}
header{display:flex;align-items:center;gap:12px;margin-bottom:12px}
#title{font-weight:600}
.conn{font-size:13px;padding:2px 8px;border-radius:10px;background:#eee;color:#777}
.conn.on{background:#e3f6e8;color:#1b7f3b}
#activity{background:#fff;border:1px solid #ddd;border-radius:8px;margin-bottom:12px}
#activity .head{padding:8px 12px;color:#555;cursor:pointer;border-bottom:1px solid #eee}
#activity.live .head::before{content:"⏳ ";}
#activity.collapsed #rows{display:none}
#activity.collapsed .head{border-bottom:none}
#rows{padding:8px 12px}
.row{white-space:pre-wrap;margin:2px 0}
.row.thinking{color:#666;font-style:italic;border-left:3px solid #c9c2f0;padding-left:10px;margin:0}
.row.tool{font-family:ui-monospace,monospace,"Noto Color Emoji";font-size:14px;background:#f3f5f8;border-radius:6px;padding:3px 8px;margin:4px 0}
.final{white-space:pre-wrap;background:#e9f9ee;border:1px solid #9c9;border-radius:8px;padding:12px;margin-bottom:12px}
.notice{color:#a40;margin:6px 0}
</style></head><body>
<aside><h1>Active runs</h1><div id="runs"><p style="margin:12px">loading…</p></div></aside>
<main><header><span id="title">Pick a run</span><span id="conn" class="conn">○ offline</span></header>
<section id="activity" hidden><div class="head" id="head"></div><div id="rows"></div></section>
<div id="out"></div></main>
<script>
let es=null,cur=null;
const $=id=>document.getElementById(id);
function el(t,c,x){const e=document.createElement(t);if(c)e.className=c;if(x!==undefined)e.textContent=x;return e}
function conn(open){const c=$('conn');c.className='conn'+(open?' on':'');c.textContent=open?'● live':'○ reconnecting…';document.body.dataset.sse=open?'open':'closed'}
function activity(state,head){const a=$('activity');a.hidden=false;a.className=state+(a.classList.contains('collapsed')?' collapsed':'');$('head').textContent=head}
function rows(lines){const r=$('rows');r.textContent='';
 for(const l of lines){const text=l.kind==='thinking'?l.text.replace(/^> ?/,''):l.text;r.appendChild(el('div','row '+l.kind,text))}}
function follow(run){if(es)es.close();cur=run;$('title').textContent='Run '+run;
 $('out').textContent='';$('rows').textContent='';$('activity').hidden=true;
 es=new EventSource('/runs/'+encodeURIComponent(run)+'/events');
 es.onopen=()=>conn(true);es.onerror=()=>conn(false);
 es.onmessage=m=>{const w=JSON.parse(m.data),o=w.op;
  if(o.op==='draft'){activity('live','working…');rows(w.lines||[])}
  else if(o.op==='settle'){activity('settled',o.text)}
  else if(o.op==='dismiss')$('activity').hidden=true;
  else if(o.op==='final'){$('out').appendChild(el('div','final',o.text+(o.suffix?'\n'+o.suffix:'')))}
  else if(o.op==='retract'){rows([{kind:'text',text:o.placeholder}]);$('out').appendChild(el('div','notice',o.placeholder))}
  else if(o.op==='notice')$('out').appendChild(el('div','notice',o.text));
 };document.querySelectorAll('.run').forEach(r=>r.classList.toggle('sel',r.dataset.run===run))}
$('head').onclick=()=>$('activity').classList.toggle('collapsed');
async function refresh(){try{const r=await fetch('/api/runs');const runs=await r.json();const box=$('runs');box.textContent='';
 if(!runs.length)box.appendChild(el('p','', 'no active runs'));
 for(const x of runs){const d=el('div','run'+(x.run_id===cur?' sel':''));d.dataset.run=x.run_id;d.appendChild(el('b','',x.run_id));
  d.appendChild(el('small','',(x.session_key||x.chat_id)+' · seq '+x.last_seq));d.onclick=()=>follow(x.run_id);box.appendChild(d)}
 if(!cur&&runs.length)follow(runs[0].run_id)}catch(e){}}
const q=new URLSearchParams(location.search).get('run');if(q)follow(q);
refresh();setInterval(refresh,1000);
</script></body></html>
"#;
