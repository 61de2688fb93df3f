//! Settings change pixels, never the record (docs/architecture.md §6, spec §4.3 "Archival"): the
//! same provider stream is pushed through two whole pipelines — nats-server, normalizer,
//! archiver on SQLite, and a projector channel — identical but for one thing: on one of
//! them the chat's `/reasoning` and `/verbose` are flipped several times mid-turn over the
//! projector's gRPC `SetSettings`. The archives must then hold the same events byte for
//! byte, as the operator's `ArchiveService.ReplayEvents` returns them (envelope and event),
//! and `SG_EVENTS` the same events on the same subjects. Not the same journal positions or
//! message boundaries: the normalizer joins a run's chunks that reach it in one pull into
//! one message (docs/architecture.md), so how events are grouped — and so where each
//! lands in the journal — follows the timing of the two pipelines, never their settings.

use crate::common;

use bytes::Bytes;
use common::*;
use prost::Message as _;
use std::time::{Duration, Instant};
use streamgate_bus::EVENTS_STREAM;
use streamgate_projector::{ChannelConfig, ChannelSink, Running};
use streamgate_proto::v1;
use streamgate_proto::v1::projector_service_client::ProjectorServiceClient;
use streamgate_runtime::rpc::SendBearer;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;

const CHANNEL_TOKEN: &str = "chan-token";

/// Captures with thinking, tool activity and an answer: what the flags gate.
const CAPTURES: &[(&str, &str, &str)] = &[
    (
        "run-tools",
        "codex-appserver",
        "codex-appserver/tooluse.jsonl",
    ),
    ("run-thinking", "f3", "f3/reasoning.sse"),
];

/// The settings flipped to before each later part of a run, in turn.
const FLIPS: &[(&str, &str)] = &[("stream", "full"), ("off", "off"), ("on", "on")];

type Projector = ProjectorServiceClient<InterceptedService<tonic::transport::Channel, SendBearer>>;

/// A pipeline with a web projector channel and its gRPC client.
async fn pipeline() -> (Pipeline, Running, Projector) {
    let p = Pipeline::start(Backend::Sqlite).await;
    let mut cfg = ChannelConfig::new(
        "web",
        ChannelSink::Web {
            listen: ([127, 0, 0, 1], 0).into(),
        },
    );
    cfg.token = Some(CHANNEL_TOKEN.into());
    // The chat defaults, not the web page's (`/reasoning on`): the flips below start
    // from `off`, so each one changes what the chat sees.
    cfg.settings = streamgate_projection::Settings::default();
    let running = streamgate_projector::start(
        p.nats.client().await,
        cfg,
        Some(([127, 0, 0, 1], 0).into()),
        CancellationToken::new(),
    )
    .await
    .expect("start projector");
    let addr = running.grpc.expect("projector gRPC");
    let ch = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("connect to the ProjectorService");
    let client = ProjectorServiceClient::with_interceptor(ch, SendBearer::new(Some(CHANNEL_TOKEN)));
    (p, running, client)
}

/// Waits until the normalizer and archiver are idle and the projector has folded every
/// event of `run` published so far (the run is in flight there).
async fn settle_part(p: &Pipeline, projector: &Running, run: &str) {
    wait_quiet(&p.js).await;
    let want = p
        .store
        .get_run(TENANT, run)
        .await
        .expect("get_run")
        .map_or(0, |r| r.event_count);
    let deadline = Instant::now() + PATIENCE;
    loop {
        let seen = projector
            .channel
            .active_runs()
            .iter()
            .find(|r| r.run_id == run)
            .map_or(0, |r| r.last_seq);
        if want > 0 && seen == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "projector folded {seen} of {want} events of {run}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Ingests every capture as its own run, in three parts; with `flip`, the run's chat
/// settings change over gRPC before the second and third parts (mid-turn). Returns every
/// draft the projector showed after a flip.
async fn ingest(
    p: &Pipeline,
    projector: &Running,
    client: &mut Projector,
    flip: bool,
    ts_ms: i64,
) -> Vec<String> {
    let mut drafts = Vec::new();
    for (run, family, path) in CAPTURES {
        let sp = spec(run, family);
        let bytes = fixture(path);
        let chunks: Vec<Bytes> = bytes.chunks(48).map(Bytes::copy_from_slice).collect();
        // Same chunks, same ingest time on both pipelines: the events must come out
        // identical, envelope included.
        let raws = raw_chunks(&sp, &chunks, ts_ms);
        let (data, close) = raws.split_at(raws.len() - 1);
        let cuts = [0, data.len() / 3, 2 * data.len() / 3, data.len()];
        for (part, w) in cuts.windows(2).enumerate() {
            if part > 0 {
                settle_part(p, projector, run).await;
                if flip {
                    let (reasoning, verbose) = FLIPS[(part - 1) % FLIPS.len()];
                    let before = draft(client, run).await;
                    let reply = client
                        .set_settings(v1::SetSettingsRequest {
                            chat_id: sp.session_key.clone().map(String::from).unwrap_or_default(),
                            tenant: sp.tenant.to_string(),
                            reasoning: reasoning.into(),
                            verbose: verbose.into(),
                            ..Default::default()
                        })
                        .await
                        .expect("SetSettings")
                        .into_inner();
                    assert_eq!(reply.rerendered, 1, "{run}: the flip was not mid-turn");
                    let after = draft(client, run).await;
                    if after != before {
                        drafts.push(after);
                    }
                }
            }
            publish_all(&p.js, &data[w[0]..w[1]]).await;
        }
        publish_all(&p.js, close).await;
        let want = expected(family, &bytes).len();
        wait_run(&*p.store, run, want, PATIENCE).await;
    }
    drafts
}

async fn draft(client: &mut Projector, run: &str) -> String {
    client
        .get_draft(v1::GetDraftRequest {
            run_id: run.into(),
            tenant: String::new(),
        })
        .await
        .expect("GetDraft")
        .into_inner()
        .text
}

/// Every archived event of every run, protobuf-encoded as `ReplayEvents` sends its event
/// (envelope and data; its journal position is left out, see the module doc).
async fn archived(p: &Pipeline) -> Vec<(String, Vec<Vec<u8>>)> {
    let mut client = archive_client(p.archive_grpc, Some(TOKEN)).await;
    let mut out = Vec::new();
    for (run, _, _) in CAPTURES {
        let mut stream = client
            .replay_events(v1::ReplayEventsRequest {
                run_id: (*run).into(),
                after_seq: 0,
                follow: false,
                tenant: TENANT.into(),
                generation: None,
            })
            .await
            .expect("ReplayEvents")
            .into_inner();
        let mut events = Vec::new();
        while let Some(e) = stream.message().await.expect("replay stream") {
            events.push(e.event.expect("an archived event").encode_to_vec());
        }
        assert!(!events.is_empty(), "{run}: nothing archived");
        out.push(((*run).to_owned(), events));
    }
    out
}

/// Every event on `SG_EVENTS`, in journal order: its subject and the event,
/// protobuf-encoded (whichever message carried it).
async fn journal(p: &Pipeline) -> Vec<(String, Vec<u8>)> {
    let stream = p.js.get_stream(EVENTS_STREAM).await.expect("SG_EVENTS");
    let last = stream
        .get_info()
        .await
        .expect("stream info")
        .state
        .last_sequence;
    let mut out = Vec::new();
    for seq in 1..=last {
        let m = stream.get_raw_message(seq).await.expect("raw message");
        let events = streamgate_bus::events::decode_message(Some(&m.headers), &m.payload)
            .expect("an SG_EVENTS message");
        for event in events {
            let encoded = v1::Event::from(&event).encode_to_vec();
            out.push((m.subject.to_string(), encoded));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_flips_mid_turn_leave_the_archive_byte_identical() {
    let ts_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(0))
        .unwrap_or(0);

    let (calm, calm_projector, mut calm_client) = pipeline().await;
    let unflipped = ingest(&calm, &calm_projector, &mut calm_client, false, ts_ms).await;
    assert!(unflipped.is_empty());
    let want = archived(&calm).await;
    let want_journal = journal(&calm).await;

    let (flipped, flipped_projector, mut flipped_client) = pipeline().await;
    let drafts = ingest(
        &flipped,
        &flipped_projector,
        &mut flipped_client,
        true,
        ts_ms,
    )
    .await;
    // The flips did change what the chat saw (else the test proves nothing).
    assert!(
        drafts.len() >= 2,
        "flipping settings never re-rendered a draft: {drafts:?}"
    );
    let got = archived(&flipped).await;
    for ((run, w), (_, g)) in want.iter().zip(&got) {
        assert_eq!(g.len(), w.len(), "{run}: archived event count");
        if let Some(i) = (0..w.len()).find(|&i| w[i] != g[i]) {
            panic!(
                "{run}: archived event {} differs after settings flips\n flipped: {:?}\n   calm: {:?}",
                i + 1,
                v1::ArchivedEvent::decode(g[i].as_slice()),
                v1::ArchivedEvent::decode(w[i].as_slice()),
            );
        }
    }
    assert_eq!(got, want);
    assert_eq!(
        journal(&flipped).await,
        want_journal,
        "SG_EVENTS differs after settings flips"
    );
}
