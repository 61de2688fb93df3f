//! End-to-end tests of the projector against a real nats-server and the sinks' fake chat
//! APIs. Fixture events come from `fixtures/*/index.tsv` and, when `$STREAMGATE_CORPUS` is
//! set, the shared corpus's `index.tsv` (their expected, normalized
//! event streams) and are published to `SG_EVENTS` exactly as the normalizer would.
#![allow(missing_docs)]

use crate::common;

use common::*;

use std::time::{Duration, Instant};

use streamgate_grammar::{AssistantPhase, Event, EventData, RunEvent};
use streamgate_projection::{is_silent, TRUNCATED_SUFFIX};
use streamgate_projector::{start, ChannelConfig, ChannelSink, Running};
use streamgate_sinks::fakes::{Behavior, FakeServer};
use streamgate_sinks::{slack, telegram, webhook, SinkConfig};
use streamgate_testkit::captures::probe;
use streamgate_testkit::NatsServer;
use tokio_util::sync::CancellationToken;

type Fixture = streamgate_testkit::captures::Capture;

fn fixtures() -> Vec<Fixture> {
    streamgate_testkit::captures::captures()
}

/// The final answer a chat should show for these events, if any.
fn expected_final(events: &[Event]) -> Option<String> {
    events.iter().rev().find_map(|e| match &e.data {
        EventData::Assistant(a) if a.phase == Some(AssistantPhase::FinalAnswer) => {
            let text = a.text.clone().unwrap_or_default();
            if is_silent(&text) {
                return None;
            }
            Some(if a.truncated == Some(true) {
                if text.ends_with('\n') {
                    format!("{text}{TRUNCATED_SUFFIX}")
                } else {
                    format!("{text}\n{TRUNCATED_SUFFIX}")
                }
            } else {
                text
            })
        }
        _ => None,
    })
}

/// The final answer as the Telegram fake shows it: the model's markdown rendered to
/// Telegram HTML by the sink (with the truncation suffix line), read back as text.
fn expected_on_telegram(events: &[Event]) -> Option<String> {
    events.iter().rev().find_map(|e| match &e.data {
        EventData::Assistant(a) if a.phase == Some(AssistantPhase::FinalAnswer) => {
            let text = a.text.clone().unwrap_or_default();
            if is_silent(&text) {
                return None;
            }
            let suffix = (a.truncated == Some(true)).then_some(TRUNCATED_SUFFIX);
            let html = streamgate_sinks::format::Target::Telegram
                .parts(&text, suffix, usize::MAX)
                .concat();
            streamgate_sinks::telegram::fake::parse_html(&html).ok()
        }
        _ => None,
    })
}

/// Simulates a crash: every task aborted, the engine's lanes dropped with the channel.
async fn crash(mut running: Running) {
    running.tasks.abort_all();
    while running.tasks.join_next().await.is_some() {}
    drop(running);
    // Let the aborted lane tasks unwind.
    tokio::time::sleep(Duration::from_millis(50)).await;
}

const TG_TOKEN: &str = "123:TESTTOKEN";

fn telegram_channel(fake: &FakeServer) -> ChannelConfig {
    let mut tg = telegram::TelegramConfig::new("tg", TG_TOKEN);
    tg.base_url = fake.base_url.clone();
    channel("tg", ChannelSink::Sink(SinkConfig::Telegram(tg)))
}

/// A Telegram channel whose drafts are a sent-and-edited message in every chat (what
/// groups get; private chats otherwise get native drafts): for tests of how a draft
/// message is edited and settled.
fn telegram_channel_editing(fake: &FakeServer) -> ChannelConfig {
    let mut tg = telegram::TelegramConfig::new("tg", TG_TOKEN);
    tg.base_url = fake.base_url.clone();
    tg.drafts = telegram::DraftMode::Edit;
    channel("tg", ChannelSink::Sink(SinkConfig::Telegram(tg)))
}

/// One fixture's own Telegram: the fake's 429 window is bot-wide (like Telegram's
/// global limit) while the engine paces per chat, so each run gets its own bot, tenant
/// and channel — which also exercises many channels on one bus.
struct TgRun {
    fake: FakeServer,
    tenant: String,
    events: Vec<RunEvent>,
    expected: Option<String>,
}

fn tg_run_channel(r: &TgRun) -> ChannelConfig {
    let mut c = telegram_channel(&r.fake);
    c.name = format!("tg-{}", r.tenant);
    c.tenant = Some(r.tenant.clone());
    c.fixed_chat = Some("1000".into());
    if let ChannelSink::Sink(SinkConfig::Telegram(t)) = &mut c.sink {
        t.name = c.name.clone();
    }
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telegram_every_fixture_one_final_through_429s_and_a_restart() -> R {
    let (nats, js) = NatsServer::with_streams().await;
    let fx = fixtures();
    assert!(fx.len() >= 20, "fixtures not found: {}", fx.len());
    let t0 = now_ms();
    let mut runs = Vec::new();
    for (i, f) in fx.iter().enumerate() {
        let tenant = format!("t{i}");
        runs.push(TgRun {
            fake: FakeServer::telegram(
                TG_TOKEN,
                Behavior {
                    rate_limit_every: Some(3),
                    retry_after_secs: 1.0,
                    ..Behavior::default()
                },
            )
            .await?,
            events: tenant_events(&tenant, &format!("run-{i}"), "s", &f.events, t0),
            expected: expected_on_telegram(&f.events),
            tenant,
        });
    }
    let client = nats.client().await;
    let clock = Instant::now();
    let mut first = Vec::new();
    for r in &runs {
        first.push(
            start(
                client.clone(),
                tg_run_channel(r),
                None,
                CancellationToken::new(),
            )
            .await?,
        );
    }
    for r in &runs {
        publish(&js, &r.events[..r.events.len() / 2]).await?;
    }
    // Mid-turn: let the first life render drafts (and meet 429s), then crash it.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let drafted = runs
        .iter()
        .filter(|r| !r.fake.messages().is_empty())
        .count();
    assert!(drafted > 0, "no draft rendered before the crash");
    for a in first {
        crash(a).await;
    }
    for r in &runs {
        publish(&js, &r.events[r.events.len() / 2..]).await?;
    }
    eprintln!("first life done at {:?}", clock.elapsed());
    let mut second = Vec::new();
    for r in &runs {
        let b = start(
            client.clone(),
            tg_run_channel(r),
            None,
            CancellationToken::new(),
        )
        .await?;
        second.push(b);
    }
    let done = poll_until(Duration::from_secs(120), || {
        runs.iter().zip(&second).all(|(r, b)| {
            b.channel.active_runs().is_empty()
                && r.expected
                    .as_ref()
                    .is_none_or(|f| r.fake.live_messages().iter().any(|m| &m.text == f))
        })
    })
    .await;
    // Done means every run's terminal ops were executed: the channels remove a run's
    // active marker only after their engine flushed.
    let kv = js
        .get_key_value(streamgate_projector::kv::DELIVERY_BUCKET)
        .await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        use futures::StreamExt as _;
        let mut keys = kv.keys().await?;
        let mut markers = 0;
        while let Some(k) = keys.next().await {
            markers += usize::from(k?.starts_with("active."));
        }
        if markers == 0 || Instant::now() > deadline {
            assert_eq!(markers, 0, "runs never finished delivering");
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("second life settled at {:?}", clock.elapsed());
    // The second life took the partitions over once the crashed life's leases expired,
    // and recovered every marked run without mistaking a live one for an orphan.
    assert!(
        second.iter().all(|b| b.channel.interrupted() == 0),
        "a live run was settled as interrupted"
    );
    for r in &runs {
        let msgs = r.fake.messages();
        // Live messages: a draft whose text equalled the final is dismissed (deleted).
        let finals = r.expected.as_ref().map_or(0, |f| {
            msgs.iter().filter(|m| !m.deleted && &m.text == f).count()
        });
        assert_eq!(
            finals,
            usize::from(r.expected.is_some()),
            "{}: finals {msgs:#?}",
            r.tenant
        );
        // One draft at most: a restart must edit the draft it already created.
        // Error notices are messages of their own, each sent once.
        let notices: Vec<_> = msgs
            .iter()
            .filter(|m| {
                m.edits == 0
                    && !m.deleted
                    && ["❌", "⚠", "⛔"].iter().any(|p| m.text.starts_with(p))
                    && r.expected.as_ref() != Some(&m.text)
            })
            .collect();
        let mut distinct: Vec<_> = notices.iter().map(|m| &m.text).collect();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            notices.len(),
            "{}: notice repeated",
            r.tenant
        );
        assert!(
            msgs.len() <= 1 + finals + notices.len(),
            "{}: duplicated drafts {msgs:#?}",
            r.tenant
        );
        let refused = r.fake.calls().iter().filter(|c| c.status == 400).count();
        assert_eq!(
            refused, 0,
            "{}: a request was refused (over the limit?)",
            r.tenant
        );
        assert_eq!(
            r.fake.early_calls(),
            0,
            "{}: a request ignored retry_after",
            r.tenant
        );
    }
    assert!(done, "not every final arrived");
    let rate_limited: usize = runs
        .iter()
        .map(|r| r.fake.calls().iter().filter(|c| c.status == 429).count())
        .sum();
    assert!(rate_limited > 0, "the fakes never rate limited");
    Ok(())
}

fn find(name_part: &str) -> Option<Fixture> {
    fixtures().into_iter().find(|f| f.name.contains(name_part))
}

/// A fixture with thinking, a tool and a final answer, for the mid-turn tests.
fn rich_fixture() -> Option<Fixture> {
    fixtures()
        .into_iter()
        .filter(|f| {
            f.events
                .iter()
                .any(|e| matches!(e.data, EventData::Thinking(_)))
                && f.events
                    .iter()
                    .any(|e| matches!(e.data, EventData::Item(_)))
                && expected_final(&f.events).is_some()
        })
        .max_by_key(|f| f.events.len())
        .or_else(|| find("end-turn"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_reconnect_mid_turn_has_no_duplicate_and_no_gap() -> R {
    use streamgate_proto::v1;
    use streamgate_proto::v1::projector_service_client::ProjectorServiceClient;
    let (nats, js) = NatsServer::with_streams().await;
    let f = rich_fixture().ok_or("no fixture")?;
    let evs = run_events("run-sub", "chat-sub", &f.events, now_ms());
    let mut cfg = channel(
        "web",
        ChannelSink::Web {
            listen: ([127, 0, 0, 1], 0).into(),
        },
    );
    cfg.token = Some("chan-token".into());
    let running = start_with_grpc(&nats, cfg).await?;
    let grpc = running.grpc.ok_or("no grpc")?;
    let third = evs.len() / 3;
    publish(&js, &evs[..third]).await?;
    assert!(
        poll_until(Duration::from_secs(10), || running
            .channel
            .draft("", "run-sub")
            .found()
            .is_some())
        .await,
        "run never became active"
    );
    let channel = tonic::transport::Channel::from_shared(format!("http://{grpc}"))?
        .connect()
        .await?;
    // Without the channel token: refused.
    let mut anon = ProjectorServiceClient::new(channel.clone());
    assert!(anon
        .list_active_runs(v1::ListActiveRunsRequest {})
        .await
        .is_err());
    fn authed<T>(t: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(t);
        if let Ok(v) = "Bearer chan-token".parse() {
            r.metadata_mut().insert("authorization", v);
        }
        r
    }
    let auth = |r: tonic::Request<v1::SubscribeRequest>| authed(r.into_inner());
    let mut client = ProjectorServiceClient::new(channel);
    let active = client
        .list_active_runs(authed(v1::ListActiveRunsRequest {}))
        .await?
        .into_inner();
    assert_eq!(active.runs.len(), 1);
    assert_eq!(active.runs[0].chat_id, "chat-sub");
    let draft = client
        .get_draft(authed(v1::GetDraftRequest {
            run_id: "run-sub".into(),
            tenant: String::new(),
        }))
        .await?
        .into_inner();
    assert_eq!(draft.last_seq, u64::try_from(third)?);
    // First connection: read a few events, then drop (the "disconnect").
    let mut s1 = client
        .subscribe(auth(tonic::Request::new(v1::SubscribeRequest {
            target: Some(v1::subscribe_request::Target::RunId("run-sub".into())),
            after_seq: 0,
            tenant: String::new(),
        })))
        .await?
        .into_inner();
    let mut seen: Vec<u64> = Vec::new();
    let keep = third.clamp(1, 3);
    while seen.len() < keep {
        let Some(ev) = s1.message().await? else {
            break;
        };
        seen.push(ev.seq);
    }
    drop(s1);
    // More events arrive while disconnected.
    publish(&js, &evs[third..2 * third]).await?;
    let last_rendered = seen.last().copied().unwrap_or(0);
    let mut s2 = client
        .subscribe(auth(tonic::Request::new(v1::SubscribeRequest {
            target: Some(v1::subscribe_request::Target::SessionKey("chat-sub".into())),
            after_seq: last_rendered,
            tenant: String::new(),
        })))
        .await?
        .into_inner();
    let rest = evs[2 * third..].to_vec();
    let js2 = js.clone();
    let pub_task = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        publish(&js2, &rest).await.map_err(|e| e.to_string())
    });
    while let Some(ev) = tokio::time::timeout(Duration::from_secs(20), s2.message()).await?? {
        seen.push(ev.seq);
    }
    pub_task.await??;
    let want: Vec<u64> = (1..=u64::try_from(evs.len())?).collect();
    assert_eq!(seen, want, "duplicate or gap across the reconnect");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flipping_settings_mid_turn_leaves_events_byte_identical() -> R {
    use futures::StreamExt as _;
    let (nats, js) = NatsServer::with_streams().await;
    let f = rich_fixture().ok_or("no fixture")?;
    let evs = run_events("run-set", "chat-set", &f.events, now_ms());
    let running = start(
        nats.client().await,
        channel(
            "web",
            ChannelSink::Web {
                listen: ([127, 0, 0, 1], 0).into(),
            },
        ),
        None,
        CancellationToken::new(),
    )
    .await?;
    let half = evs.len() / 2;
    publish(&js, &evs[..half]).await?;
    assert!(
        poll_until(Duration::from_secs(10), || running
            .channel
            .draft("", "run-set")
            .found()
            .is_some_and(|d| d.last_seq == u64::try_from(half).unwrap_or(0)))
        .await
    );
    let snapshot = |js: async_nats::jetstream::Context| async move {
        let mut stream = js.get_stream(streamgate_bus::EVENTS_STREAM).await?;
        let info = stream.info().await?;
        let n = info.state.last_sequence;
        let mut out = Vec::new();
        for seq in 1..=n {
            let m = stream.get_raw_message(seq).await?;
            out.push((m.subject.to_string(), m.payload.to_vec()));
        }
        Ok::<_, Box<dyn std::error::Error>>(out)
    };
    let before = snapshot(js.clone()).await?;
    let before_draft = running.channel.draft("", "run-set").found().map(|d| d.text);
    let (s, n) = running
        .channel
        .set_settings(
            TENANT,
            "chat-set",
            streamgate_projector::kv::SettingsOverride {
                reasoning: Some(streamgate_projection::Reasoning::Stream),
                verbose: Some(streamgate_projection::Verbose::Full),
                ..Default::default()
            },
        )
        .await?;
    assert_eq!(n, 1, "the active run was not re-rendered");
    assert_eq!(s.reasoning, streamgate_projection::Reasoning::Stream);
    let after = snapshot(js.clone()).await?;
    assert_eq!(before, after, "SG_EVENTS changed when settings flipped");
    let after_draft = running.channel.draft("", "run-set").found().map(|d| d.text);
    assert_ne!(
        before_draft, after_draft,
        "flipping settings did not re-render"
    );
    // Stored in SG_SETTINGS for the next projector life.
    let kv = js
        .get_key_value(streamgate_projector::kv::SETTINGS_BUCKET)
        .await?;
    let mut keys = kv.keys().await?;
    let mut found = false;
    while let Some(k) = keys.next().await {
        found |= k? == format!("web.{TENANT}.chat-set");
    }
    assert!(found, "settings override not in KV");
    Ok(())
}

/// A signed webhook channel `hook` to `fake`.
fn hook_channel(fake: &FakeServer, secret: &str) -> ChannelConfig {
    channel(
        "hook",
        ChannelSink::Sink(SinkConfig::Webhook(webhook::WebhookConfig::new(
            "hook",
            fake.base_url.clone(),
            secret,
        ))),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_gets_the_exact_final_with_a_valid_signature() -> R {
    let (nats, js) = NatsServer::with_streams().await;
    let secret = "whsec-test";
    let fake = FakeServer::webhook(secret, Behavior::default()).await?;
    let f = rich_fixture().ok_or("no fixture")?;
    let expected = expected_final(&f.events).ok_or("fixture has no final")?;
    let evs = run_events("run-hook", "chat-hook", &f.events, now_ms());
    let cfg = hook_channel(&fake, secret);
    let _running = start(nats.client().await, cfg, None, CancellationToken::new()).await?;
    publish(&js, &evs).await?;
    let ok = poll_until(Duration::from_secs(20), || {
        fake.events()
            .iter()
            .any(|e| e.get("op").and_then(|v| v.as_str()) == Some("final"))
    })
    .await;
    assert!(ok, "no final delivered");
    let finals: Vec<_> = fake
        .events()
        .into_iter()
        .filter(|e| e.get("op").and_then(|v| v.as_str()) == Some("final"))
        .collect();
    assert_eq!(finals.len(), 1);
    let text = finals[0].get("text").and_then(|v| v.as_str()).unwrap_or("");
    let suffix = finals[0].get("suffix").and_then(|v| v.as_str());
    let shown = match suffix {
        Some(s) => format!("{text}\n{s}"),
        None => text.to_owned(),
    };
    assert_eq!(shown, expected);
    // The fake verifies every signature; a bad one would have been answered 401.
    assert!(
        fake.calls().iter().all(|c| c.status < 300),
        "{:?}",
        fake.calls()
    );
    assert_eq!(fake.duplicates(), 0);
    Ok(())
}

/// A message of an ended run that comes again (its ack was lost, or a failed attempt
/// was retried after the run's later messages went through) finds the run gone from
/// memory: the run is rebuilt, caught up with what `SG_EVENTS` holds after the message
/// (its end included), and leaves memory again — it is not kept as in flight, waiting
/// for events that never come again — and its final is not sent twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_message_of_an_ended_run_leaves_no_run_in_flight() -> R {
    let (nats, js) = NatsServer::with_streams().await;
    let fake = FakeServer::webhook("whsec-test", Behavior::default()).await?;
    let f = rich_fixture().ok_or("no fixture")?;
    let evs = run_events("run-again", "chat-again", &f.events, now_ms());
    let cfg = hook_channel(&fake, "whsec-test");
    let running = start(nats.client().await, cfg, None, CancellationToken::new()).await?;
    publish(&js, &evs).await?;
    let is_final = |e: &serde_json::Value| e.get("op").and_then(|v| v.as_str()) == Some("final");
    assert!(
        poll_until(Duration::from_secs(20), || fake
            .events()
            .iter()
            .any(is_final))
        .await,
        "no final delivered"
    );
    assert!(
        poll_until(Duration::from_secs(10), || running
            .channel
            .active_runs()
            .is_empty())
        .await,
        "the run stayed in flight after its end"
    );
    // Two of the run's middle events once more, as a message of their own (a new id:
    // the broker would drop a copy of one already stored).
    let mid = evs.len() / 2;
    let addr = streamgate_bus::subject::RunAddr::parse(
        TENANT,
        "run-again",
        streamgate_bus::DEFAULT_PARTITIONS,
    )
    .unwrap();
    streamgate_bus::events::publish_batches(&js, &addr, [&evs[mid..mid + 2]]).await?;
    assert!(
        all_acked(&js, Duration::from_secs(20)).await?,
        "the message was never acked"
    );
    let in_flight = running.channel.active_runs();
    assert!(in_flight.is_empty(), "runs left in flight: {in_flight:?}");
    assert_eq!(fake.events().iter().filter(|e| is_final(e)).count(), 1);
    Ok(())
}

/// A partition's consumer lives in the broker's memory. A broker that restarts forgets
/// it; the projector notices, records how far it got, and opens the consumer again right
/// after that point (not at the start of `SG_EVENTS`); a run published after the
/// restart, on the same partition, is delivered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_resumes_each_partition_after_its_recorded_point() -> R {
    use async_nats::jetstream::consumer::DeliverPolicy;
    use streamgate_bus::subject::partition_of;
    let (mut nats, js) = NatsServer::with_streams().await;
    let fake = FakeServer::webhook("whsec-test", Behavior::default()).await?;
    let f = rich_fixture().ok_or("no fixture")?;
    let cfg = hook_channel(&fake, "whsec-test");
    let partition = partition_of("run-before", cfg.partitions);
    let after = (0..)
        .map(|i| format!("run-after-{i}"))
        .find(|id| partition_of(id, cfg.partitions) == partition)
        .ok_or("no run id on the partition")?;
    let durable = cfg.partition_durable(partition);
    let _running = start(nats.client().await, cfg, None, CancellationToken::new()).await?;
    let finals = |run: &str| {
        fake.events()
            .iter()
            .filter(|e| e.get("op").and_then(|v| v.as_str()) == Some("final"))
            .filter(|e| e.get("run_id").and_then(|v| v.as_str()) == Some(run))
            .count()
    };
    publish(
        &js,
        &run_events("run-before", "chat-a", &f.events, now_ms()),
    )
    .await?;
    assert!(
        poll_until(Duration::from_secs(20), || finals("run-before") == 1).await,
        "no final before the restart"
    );
    let last = js
        .get_stream(streamgate_bus::EVENTS_STREAM)
        .await?
        .info()
        .await?
        .state
        .last_sequence;
    let kv = js
        .get_key_value(streamgate_bus::kv::DELIVERY_BUCKET)
        .await?;
    let point_key = streamgate_bus::kv::key(&["resume", &durable]);
    let mut recorded = 0;
    for _ in 0..100 {
        if let Some(v) = kv.get(&point_key).await? {
            recorded = std::str::from_utf8(&v)?.parse()?;
        }
        if recorded >= last {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(recorded, last, "the partition's point after its run");
    let stream = js.get_stream(streamgate_bus::EVENTS_STREAM).await?;
    assert!(stream.consumer_info(&durable).await?.config.memory_storage);

    nats.restart();
    publish(&js, &run_events(&after, "chat-b", &f.events, now_ms())).await?;
    assert!(
        poll_until(Duration::from_secs(60), || finals(&after) == 1).await,
        "no final after the restart"
    );
    let info = stream.consumer_info(&durable).await?;
    assert!(info.config.memory_storage);
    assert_eq!(
        info.config.deliver_policy,
        DeliverPolicy::ByStartSequence {
            start_sequence: last + 1
        },
        "reopened right after the recorded point"
    );
    assert_eq!(finals("run-before"), 1);
    assert_eq!(fake.duplicates(), 0);
    Ok(())
}

/// Waits (up to `limit`) until the consumers of `SG_EVENTS` have acked every message
/// of the stream: none pending or unacked, and the stream's last message acked.
async fn all_acked(
    js: &async_nats::jetstream::Context,
    limit: Duration,
) -> Result<bool, Box<dyn std::error::Error>> {
    use futures::TryStreamExt as _;
    let t = Instant::now();
    let mut stream = js.get_stream(streamgate_bus::EVENTS_STREAM).await?;
    loop {
        let last = stream.info().await?.state.last_sequence;
        let consumers: Vec<_> = stream.consumers().try_collect().await?;
        let idle = consumers
            .iter()
            .all(|c| c.num_pending == 0 && c.num_ack_pending == 0);
        if idle
            && consumers
                .iter()
                .any(|c| c.ack_floor.stream_sequence >= last)
        {
            return Ok(true);
        }
        if t.elapsed() > limit {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_orphaned_draft_settles_to_agent_interrupted() -> R {
    let (nats, js) = NatsServer::with_streams().await;
    let fake = FakeServer::telegram(TG_TOKEN, Behavior::default()).await?;
    let f = rich_fixture().ok_or("no fixture")?;
    // Old ingest times: the run's agent is long gone.
    let evs = run_events("run-orphan", "77", &f.events, now_ms() - 3_600_000);
    let a = start(
        nats.client().await,
        telegram_channel_editing(&fake),
        None,
        CancellationToken::new(),
    )
    .await?;
    let upto = evs
        .iter()
        .position(|e| {
            matches!(&e.event.data, EventData::Assistant(a) if a.phase == Some(AssistantPhase::FinalAnswer))
        })
        .unwrap_or(evs.len() - 1);
    publish(&js, &evs[..upto]).await?;
    assert!(
        poll_until(Duration::from_secs(10), || !fake.live_messages().is_empty()).await,
        "no draft before the crash"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    crash(a).await;
    let mut cfg = telegram_channel_editing(&fake);
    cfg.orphan_after = Duration::from_secs(60);
    let b = start(nats.client().await, cfg, None, CancellationToken::new()).await?;
    // The crashed replica's leases run out after their TTL; recovery of the partition
    // then settles the orphan.
    assert!(
        poll_until(Duration::from_secs(60), || b.channel.interrupted() == 1).await,
        "the orphaned run was not settled"
    );
    let msgs = fake.live_messages();
    assert_eq!(msgs.len(), 1, "{msgs:#?}");
    assert!(msgs[0].text.contains("agent interrupted"), "{msgs:#?}");
    Ok(())
}

/// A turn with everything the web page shows apart: a streamed thinking block (4 s), two
/// tool calls with arguments and results, commentary that becomes the final answer
/// (markdown, LaTeX, emoji), and the end. Written as canonical events so the page test
/// does not depend on which captures a corpus happens to hold.
const BROWSER_RUN: &[&str] = &[
    r###"{"seq":1,"stream":"lifecycle","data":{"phase":"start","provider":"anthropic","model":"claude-test"}}"###,
    r###"{"seq":2,"stream":"thinking","data":{"variant":"raw","phase":"start","id":"th_1"}}"###,
    r###"{"seq":3,"stream":"thinking","data":{"variant":"raw","delta":"The user asks about the weather in Paris. ","id":"th_1"}}"###,
    r###"{"seq":4,"stream":"thinking","data":{"variant":"raw","delta":"Look it up instead of guessing.","id":"th_1"}}"###,
    r###"{"seq":5,"stream":"thinking","data":{"variant":"raw","phase":"end","id":"th_1"}}"###,
    r###"{"seq":6,"stream":"item","data":{"phase":"start","id":"call_1","kind":"tool","name":"web_search","status":"in_progress","arguments":{"query":"Paris weather today"}}}"###,
    r###"{"seq":7,"stream":"item","data":{"phase":"end","id":"call_1","kind":"tool","name":"web_search","status":"completed","arguments":{"query":"Paris weather today"},"result":"18 °C, sunny, light breeze"}}"###,
    r###"{"seq":8,"stream":"item","data":{"phase":"start","id":"call_2","kind":"tool","name":"read_file","status":"in_progress","arguments":{"path":"notes/trip.md"}}}"###,
    r###"{"seq":9,"stream":"item","data":{"phase":"end","id":"call_2","kind":"tool","name":"read_file","status":"completed","arguments":{"path":"notes/trip.md"},"result":"Pack sunglasses"}}"###,
    r###"{"seq":10,"stream":"assistant","data":{"phase":"commentary","delta":"## Paris today\n\n- **18 °C**, sunny ☀️\n- light breeze\n\nPack your `sunglasses` 😎 — UV index $\\approx 6$.\n\n```sh\nstreamgate tail --run run-browser\n```\n\nSource: [forecast](https://example.com/paris)","id":"msg_1","status":"in_progress"}}"###,
    r###"{"seq":11,"stream":"assistant","data":{"phase":"final_answer","text":"## Paris today\n\n- **18 °C**, sunny ☀️\n- light breeze\n\nPack your `sunglasses` 😎 — UV index $\\approx 6$.\n\n```sh\nstreamgate tail --run run-browser\n```\n\nSource: [forecast](https://example.com/paris)","id":"msg_1","status":"completed"}}"###,
    r###"{"seq":12,"stream":"lifecycle","data":{"phase":"end","reason":"completed","status":"completed"}}"###,
];

type ProjectorClient = streamgate_proto::v1::projector_service_client::ProjectorServiceClient<
    tonic::service::interceptor::InterceptedService<
        tonic::transport::Channel,
        streamgate_runtime::rpc::SendBearer,
    >,
>;

/// A `ProjectorService` client with the channel's bearer token.
async fn projector_client(
    addr: std::net::SocketAddr,
    token: &str,
) -> Result<ProjectorClient, Box<dyn std::error::Error>> {
    let ch = tonic::transport::Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    Ok(
        streamgate_proto::v1::projector_service_client::ProjectorServiceClient::with_interceptor(
            ch,
            streamgate_runtime::rpc::SendBearer::new(Some(token)),
        ),
    )
}

/// Polls `settings_for` (async) until it reports `want`.
async fn wait_settings(
    running: &Running,
    chat: &str,
    want: streamgate_projection::Reasoning,
) -> Result<bool, Box<dyn std::error::Error>> {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        if running.channel.settings_for(TENANT, chat).await?.reasoning == want {
            return Ok(true);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(false)
}

/// Two replicas of one channel on one nats-server: `/reasoning` and `/verbose` changed
/// over one replica's gRPC re-render the run in flight on the other replica (its own
/// `GetDraft` shows the thinking and the tool details, as does the Telegram draft), and a
/// change back through the second replica reaches the first — no restart.
///
/// The replicas split the partitions, so the run is in flight on exactly one of them
/// (the owner); the other answers `GetDraft` for it with `NOT_FOUND`. When the second
/// replica joins, the run's partition may move to it: the new owner rebuilds the run
/// from its marker and keeps editing the same Telegram message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_changed_on_one_replica_rerender_runs_on_another() -> R {
    use streamgate_projection::{Reasoning, Verbose};
    use streamgate_proto::v1;
    let (nats, js) = NatsServer::with_streams().await;
    let fake = FakeServer::telegram(TG_TOKEN, Behavior::default()).await?;
    let events: Vec<Event> = BROWSER_RUN
        .iter()
        .map(|l| Event::from_json(l))
        .collect::<Result<_, _>>()?;
    let chat = "4242";
    let run = "run-replicas";
    let evs = run_events(run, chat, &events, now_ms());
    let cfg = || {
        let mut c = telegram_channel_editing(&fake);
        c.token = Some("chan-token".into());
        c
    };
    let grpc_any = Some(([127, 0, 0, 1], 0).into());
    // Replica B consumes the first part of the run alone; replica A, started
    // afterwards, takes half the partitions — perhaps the run's.
    let b = start(
        nats.client().await,
        cfg(),
        grpc_any,
        CancellationToken::new(),
    )
    .await?;
    publish(&js, &evs[..9]).await?;
    assert!(
        poll_until(Duration::from_secs(10), || b
            .channel
            .draft("", run)
            .found()
            .is_some_and(|d| d.last_seq == 9))
        .await,
        "B never rendered the run"
    );
    let a = start(
        nats.client().await,
        cfg(),
        grpc_any,
        CancellationToken::new(),
    )
    .await?;
    let split = |a: &Running, b: &Running| {
        let (x, y) = (a.partitions.borrow().clone(), b.partitions.borrow().clone());
        x.len() * 2 == streamgate_bus::DEFAULT_PARTITIONS as usize
            && y.len() * 2 == streamgate_bus::DEFAULT_PARTITIONS as usize
            && x.is_disjoint(&y)
    };
    assert!(
        poll_until(Duration::from_secs(30), || split(&a, &b)
            && (a.channel.draft("", run).found().is_some()
                != b.channel.draft("", run).found().is_some()))
        .await,
        "the replicas never split the partitions with the run on one of them"
    );
    let (owner, other) = if a.channel.draft("", run).found().is_some() {
        (&a, &b)
    } else {
        (&b, &a)
    };
    let mut owner_client = projector_client(owner.grpc.ok_or("no grpc")?, "chan-token").await?;
    let mut other_client = projector_client(other.grpc.ok_or("no grpc")?, "chan-token").await?;
    let get_draft = |c: &mut ProjectorClient| {
        let mut c = c.clone();
        async move {
            Ok::<_, tonic::Status>(
                c.get_draft(v1::GetDraftRequest {
                    run_id: run.into(),
                    tenant: String::new(),
                })
                .await?
                .into_inner()
                .text,
            )
        }
    };
    // Channel defaults: no thinking, tool rows without details.
    let d = get_draft(&mut owner_client).await?;
    assert!(d.contains("web_search"), "{d}");
    assert!(
        !d.contains("🧠") && !d.contains("Paris weather today"),
        "{d}"
    );
    let elsewhere = get_draft(&mut other_client).await.err().map(|s| s.code());
    assert_eq!(
        elsewhere,
        Some(tonic::Code::NotFound),
        "the run is in flight on one replica"
    );

    let reply = other_client
        .set_settings(v1::SetSettingsRequest {
            chat_id: chat.into(),
            tenant: TENANT.into(),
            reasoning: "stream".into(),
            verbose: "full".into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(
        (reply.reasoning.as_str(), reply.verbose.as_str()),
        ("stream", "full")
    );
    assert_eq!(reply.rerendered, 0, "no run of the chat is in flight there");

    // The owner re-renders the run from the watch.
    let thinking = "🧠 The user asks about the weather in Paris.";
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut owner_draft = get_draft(&mut owner_client).await?;
    while !owner_draft.contains(thinking) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        owner_draft = get_draft(&mut owner_client).await?;
    }
    assert!(
        owner_draft.contains(thinking) && owner_draft.contains("Paris weather today"),
        "the owner's draft was not re-rendered: {owner_draft}"
    );
    let s = owner.channel.settings_for(TENANT, chat).await?;
    assert_eq!((s.reasoning, s.verbose), (Reasoning::Stream, Verbose::Full));
    let tg = |fake: &FakeServer| {
        fake.live_messages()
            .into_iter()
            .map(|m| m.text)
            .collect::<Vec<_>>()
    };
    assert!(
        poll_until(Duration::from_secs(10), || tg(&fake)
            .iter()
            .any(|t| t.contains(thinking)))
        .await,
        "the Telegram draft does not show the thinking: {:#?}",
        fake.messages()
    );

    // And back, through the owner: the other replica follows.
    let reply = owner_client
        .set_settings(v1::SetSettingsRequest {
            chat_id: chat.into(),
            tenant: TENANT.into(),
            reasoning: "off".into(),
            verbose: String::new(),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(
        (reply.reasoning.as_str(), reply.verbose.as_str()),
        ("off", "full")
    );
    assert_eq!(reply.rerendered, 1);
    assert!(
        wait_settings(other, chat, Reasoning::Off).await?,
        "the other replica never saw the owner's change"
    );
    assert_eq!(
        other.channel.settings_for(TENANT, chat).await?.verbose,
        Verbose::Full
    );
    let owner_draft = get_draft(&mut owner_client).await?;
    assert!(
        !owner_draft.contains("🧠") && owner_draft.contains("Paris weather today"),
        "the owner's draft: {owner_draft}"
    );
    assert!(
        poll_until(Duration::from_secs(10), || tg(&fake)
            .iter()
            .all(|t| !t.contains("🧠")))
        .await,
        "the Telegram draft still shows the thinking: {:#?}",
        fake.messages()
    );
    // One draft message the whole time, edited in place — across a partition move too.
    assert_eq!(fake.live_messages().len(), 1, "{:#?}", fake.messages());
    Ok(())
}

/// A graceful shutdown waits for open connections: a browser tab on the page (SSE) and a
/// `Subscribe` stream of a live run must not hold the projector up. Both streams end
/// (the subscriber with `UNAVAILABLE`, so it resumes elsewhere) and every task returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_open_streams_so_the_projector_stops() -> R {
    use streamgate_proto::v1;
    let (nats, js) = NatsServer::with_streams().await;
    let events: Vec<Event> = BROWSER_RUN
        .iter()
        .map(|l| Event::from_json(l))
        .collect::<Result<_, _>>()?;
    let evs = run_events("run-stop", "chat-stop", &events, now_ms());
    let mut cfg = channel(
        "web",
        ChannelSink::Web {
            listen: ([127, 0, 0, 1], 0).into(),
        },
    );
    cfg.token = Some("chan-token".into());
    let shutdown = CancellationToken::new();
    let mut running = start(
        nats.client().await,
        cfg,
        Some(([127, 0, 0, 1], 0).into()),
        shutdown.clone(),
    )
    .await?;
    publish(&js, &evs[..6]).await?;
    assert!(
        poll_until(Duration::from_secs(10), || running
            .channel
            .draft("", "run-stop")
            .found()
            .is_some_and(|d| d.last_seq == 6))
        .await
    );
    let web = running.web.ok_or("no web")?;
    let mut sse = reqwest::get(format!("http://{web}/runs/run-stop/events")).await?;
    let first = tokio::time::timeout(Duration::from_secs(10), sse.chunk()).await??;
    assert!(first.is_some(), "no SSE history");
    let mut client = projector_client(running.grpc.ok_or("no grpc")?, "chan-token").await?;
    let mut sub = client
        .subscribe(v1::SubscribeRequest {
            target: Some(v1::subscribe_request::Target::RunId("run-stop".into())),
            after_seq: 0,
            tenant: String::new(),
        })
        .await?
        .into_inner();
    for _ in 0..6 {
        assert!(sub.message().await?.is_some());
    }

    shutdown.cancel();
    let limit = Duration::from_secs(20);
    let sub_end = tokio::time::timeout(limit, sub.message()).await?;
    let status = sub_end.err().ok_or("the Subscribe stream did not fail")?;
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    // Keep-alives keep arriving on an open SSE stream: bound the whole drain.
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, sse.chunk()).await {
            Ok(Ok(Some(_))) => continue,
            Ok(Ok(None) | Err(_)) => break,
            Err(_) => return Err("the page's SSE stream outlived the shutdown".into()),
        }
    }
    while let Some(r) = tokio::time::timeout(limit, running.tasks.join_next()).await? {
        r??;
    }
    Ok(())
}

/// Two replicas of one Telegram channel on one nats-server split the partitions half and half.
/// Every fixture runs in its own chat. While the first half of every run goes through,
/// each run is rendered by the replica holding its partition only: the partition sets do
/// not move, a replica consumes only its partitions' durable consumers, and none of them
/// redelivers a message (each event was taken once). Then one replica is stopped
/// mid-turn; the other takes its partitions over at once (a graceful release), rebuilds
/// their runs from the active-run markers and finishes them: every chat ends with
/// exactly one final with the expected text and at most one draft.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_render_each_run_once_and_a_stopped_ones_runs_finish_elsewhere() -> R {
    use streamgate_bus::subject::partition_of;
    use streamgate_bus::{DEFAULT_PARTITIONS, EVENTS_STREAM};
    let (nats, js) = NatsServer::with_streams().await;
    let fake = FakeServer::telegram(TG_TOKEN, Behavior::default()).await?;
    let fx = fixtures();
    assert!(fx.len() >= 20, "fixtures not found: {}", fx.len());
    let t0 = now_ms();
    struct Turn {
        chat: String,
        run: String,
        events: Vec<RunEvent>,
        expected: Option<String>,
    }
    let turns: Vec<Turn> = fx
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let (chat, run) = ((2000 + i).to_string(), format!("run-rep-{i}"));
            Turn {
                events: run_events(&run, &chat, &f.events, t0),
                expected: expected_on_telegram(&f.events),
                chat,
                run,
            }
        })
        .collect();
    let a = start(
        nats.client().await,
        telegram_channel(&fake),
        None,
        CancellationToken::new(),
    )
    .await?;
    let b_stop = CancellationToken::new();
    // b stops with the default shutdown grace: what it queued and did not send is left
    // to a, and a request it already sent finishes and is recorded before a takes over.
    let mut b = start(
        nats.client().await,
        telegram_channel(&fake),
        None,
        b_stop.clone(),
    )
    .await?;
    let held = |r: &Running| r.partitions.borrow().clone();
    assert!(
        poll_until(Duration::from_secs(30), || {
            let (x, y) = (held(&a), held(&b));
            x.len() * 2 == streamgate_bus::DEFAULT_PARTITIONS as usize
                && y.len() * 2 == streamgate_bus::DEFAULT_PARTITIONS as usize
                && x.is_disjoint(&y)
        })
        .await,
        "the replicas never split the partitions"
    );
    let (held_a, held_b) = (held(&a), held(&b));

    for t in &turns {
        publish(&js, &t.events[..t.events.len() / 2]).await?;
    }
    // Until both replicas consumed and acknowledged every first half.
    let cfg = telegram_channel(&fake);
    let stream = js.get_stream(EVENTS_STREAM).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let redelivered = loop {
        let mut quiet = true;
        let mut redelivered = 0;
        for p in 0..DEFAULT_PARTITIONS {
            let info = stream.consumer_info(cfg.partition_durable(p)).await?;
            quiet &= info.num_pending == 0 && info.num_ack_pending == 0;
            redelivered += info.num_redelivered;
        }
        if quiet || Instant::now() > deadline {
            assert!(quiet, "the first halves were never all consumed");
            break redelivered;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(redelivered, 0, "an event was delivered twice");
    assert_eq!(
        (held(&a), held(&b)),
        (held_a.clone(), held_b.clone()),
        "partitions moved while the first halves went through"
    );
    let mut on_b = 0;
    for t in &turns {
        let part = partition_of(&t.run, DEFAULT_PARTITIONS);
        let elsewhere = if held_a.contains(&part) {
            &b
        } else {
            on_b += 1;
            &a
        };
        assert!(
            elsewhere.channel.draft("", &t.run).found().is_none(),
            "{}: in flight on the replica without its partition",
            t.run
        );
    }
    assert!(on_b > 0, "no run on the replica to be stopped");
    let in_flight_on_b = b.channel.active_runs().len();
    assert!(
        in_flight_on_b > 0,
        "no turn in flight on the replica to be stopped"
    );

    // Stop b mid-turn: a takes its partitions at once and finishes its runs.
    b_stop.cancel();
    while let Some(r) = b.tasks.join_next().await {
        r??;
    }
    assert!(
        poll_until(Duration::from_secs(10), || held(&a).len()
            == DEFAULT_PARTITIONS as usize)
        .await,
        "a never took the stopped replica's partitions"
    );
    for t in &turns {
        publish(&js, &t.events[t.events.len() / 2..]).await?;
    }
    let finals_in = |t: &Turn| {
        t.expected.as_ref().map_or(0, |f| {
            fake.messages()
                .iter()
                .filter(|m| m.chat == t.chat && !m.deleted && &m.text == f)
                .count()
        })
    };
    let done = poll_until(Duration::from_secs(120), || {
        a.channel.active_runs().is_empty()
            && turns
                .iter()
                .all(|t| finals_in(t) == usize::from(t.expected.is_some()))
    })
    .await;
    let msgs = fake.messages();
    for t in &turns {
        let mine: Vec<_> = msgs.iter().filter(|m| m.chat == t.chat).collect();
        assert_eq!(
            finals_in(t),
            usize::from(t.expected.is_some()),
            "{}: finals {mine:#?}",
            t.run
        );
        let notices = mine
            .iter()
            .filter(|m| {
                m.edits == 0
                    && !m.deleted
                    && ["❌", "⚠", "⛔"].iter().any(|p| m.text.starts_with(p))
                    && t.expected.as_ref() != Some(&m.text)
            })
            .count();
        assert!(
            mine.len() <= 1 + finals_in(t) + notices,
            "{}: duplicated drafts {mine:#?}",
            t.run
        );
    }
    assert!(done, "not every run finished");
    assert_eq!(
        a.channel.interrupted(),
        0,
        "a live run was settled as interrupted"
    );
    eprintln!(
        "{} runs ({on_b} on the stopped replica, {in_flight_on_b} in flight when it stopped), {} Telegram messages, {} finals",
        turns.len(),
        msgs.len(),
        turns.iter().filter(|t| t.expected.is_some()).count()
    );
    Ok(())
}

const SLACK_TOKEN: &str = "xoxb-e2e";

/// One chat kind of the replica test: its platform, channel and chat of run `i`.
struct Platform {
    name: &'static str,
    fake: FakeServer,
    cfg: ChannelConfig,
    /// (chat id the run goes to, chat the platform records).
    chat: fn(usize) -> (String, String),
}

async fn platforms(behavior: &Behavior) -> Result<Vec<Platform>, Box<dyn std::error::Error>> {
    let tenanted = |name: &str, sink: SinkConfig| {
        let mut c = channel(name, ChannelSink::Sink(sink));
        c.tenant = Some(name.to_owned());
        c
    };
    let slack_cfg = |fake: &FakeServer, name: &str| {
        let mut c = slack::SlackConfig::new(name, SLACK_TOKEN);
        c.base_url = fake.base_url.clone();
        SinkConfig::Slack(c)
    };
    let tg_cfg = |fake: &FakeServer, name: &str| {
        let mut c = telegram::TelegramConfig::new(name, TG_TOKEN);
        c.base_url = fake.base_url.clone();
        SinkConfig::Telegram(c)
    };
    let mut out = Vec::new();
    let fake = FakeServer::slack(SLACK_TOKEN, behavior.clone()).await?;
    out.push(Platform {
        name: "slack-thread",
        cfg: tenanted("slack-thread", slack_cfg(&fake, "slack-thread")),
        fake,
        chat: |i| (format!("D{i}/1700000000.{i:06}"), format!("D{i}")),
    });
    let fake = FakeServer::slack(SLACK_TOKEN, behavior.clone()).await?;
    out.push(Platform {
        name: "slack-channel",
        cfg: tenanted("slack-channel", slack_cfg(&fake, "slack-channel")),
        fake,
        chat: |i| (format!("C{i}"), format!("C{i}")),
    });
    let fake = FakeServer::telegram(TG_TOKEN, behavior.clone()).await?;
    out.push(Platform {
        name: "tg-private",
        cfg: tenanted("tg-private", tg_cfg(&fake, "tg-private")),
        fake,
        chat: |i| ((3000 + i).to_string(), (3000 + i).to_string()),
    });
    let fake = FakeServer::telegram(TG_TOKEN, behavior.clone()).await?;
    out.push(Platform {
        name: "tg-group",
        cfg: tenanted("tg-group", tg_cfg(&fake, "tg-group")),
        fake,
        chat: |i| (format!("-100{i}"), format!("-100{i}")),
    });
    let fake = FakeServer::discord("77", "dc-token", behavior.clone()).await?;
    let mut dc = streamgate_sinks::discord::DiscordConfig::new("discord", "77", "dc-token");
    dc.base_url = fake.base_url.clone();
    out.push(Platform {
        name: "discord",
        cfg: tenanted("discord", SinkConfig::Discord(dc)),
        fake,
        chat: |i| ((900 + i).to_string(), (900 + i).to_string()),
    });
    let fake = FakeServer::webhook("s3cret", behavior.clone()).await?;
    let hook = webhook::WebhookConfig::new("webhook", fake.base_url.clone(), "s3cret");
    out.push(Platform {
        name: "webhook",
        cfg: tenanted("webhook", SinkConfig::Webhook(hook)),
        fake,
        chat: |i| (format!("chat-{i}"), format!("chat-{i}")),
    });
    Ok(out)
}

/// How many times `platform` shows the answer `probe` in `chat` (a webhook: how many
/// distinct finals it received there).
fn shown(p: &Platform, chat: &str, probe: &str) -> usize {
    if p.name == "webhook" {
        return p
            .fake
            .events()
            .iter()
            .filter(|e| e["chat"] == chat && e["op"] == "final")
            .count();
    }
    p.fake
        .live_messages()
        .iter()
        .filter(|m| m.chat == chat)
        .map(|m| m.text.matches(probe).count())
        .sum()
}

/// Replicas 1 → 3 → 1 while every fixture goes to six chat kinds (Slack thread: native
/// stream; Slack channel; Telegram private: native drafts; Telegram group; Discord;
/// webhook): one replica takes the first third of every run, two more join (partitions
/// and their runs' delivery state move), and the two are stopped (SIGTERM's path: a
/// graceful stop) right after the last third went out, while the platforms hold the
/// responses of the finals they were sent. Each chat shows its answer exactly once and
/// no stream is left open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_three_one_replicas_and_a_stop_mid_final_show_each_answer_once() -> R {
    let (nats, js) = NatsServer::with_streams().await;
    let held_finals = Behavior {
        delay_first: usize::MAX,
        delay: Duration::from_millis(300),
        ..Behavior::default()
    };
    let platforms = platforms(&held_finals).await?;
    let fx = fixtures();
    let t0 = now_ms();
    // (platform, chat as stored, events, expected answer, fixture)
    let mut turns = Vec::new();
    for p in &platforms {
        for (i, f) in fx.iter().enumerate() {
            let (chat, stored) = (p.chat)(i);
            let evs = tenant_events(p.name, &format!("run-{i}"), &chat, &f.events, t0);
            turns.push((p, stored, evs, expected_final(&f.events), f.name.clone()));
        }
    }
    let start_replica = |stop: CancellationToken| {
        let client = nats.client();
        let cfgs: Vec<ChannelConfig> = platforms.iter().map(|p| p.cfg.clone()).collect();
        async move {
            let client = client.await;
            let mut out = Vec::new();
            for cfg in cfgs {
                out.push(start(client.clone(), cfg, None, stop.clone()).await?);
            }
            Ok::<_, Box<dyn std::error::Error>>(out)
        }
    };
    let held = |rs: &[Running]| -> usize { rs.iter().map(|r| r.partitions.borrow().len()).sum() };
    let all = platforms.len() * streamgate_bus::DEFAULT_PARTITIONS as usize;
    let a = start_replica(CancellationToken::new()).await?;
    assert!(
        poll_until(Duration::from_secs(30), || held(&a) == all).await,
        "the first replica never held every partition"
    );
    let third = |evs: &[RunEvent], k: usize| -> Vec<RunEvent> {
        let n = evs.len();
        evs[n * k / 3..n * (k + 1) / 3].to_vec()
    };
    for (_, _, evs, _, _) in &turns {
        publish(&js, &third(evs, 0)).await?;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let stop = CancellationToken::new();
    let mut b = start_replica(stop.clone()).await?;
    let mut c = start_replica(stop.clone()).await?;
    assert!(
        poll_until(Duration::from_secs(30), || held(&b) > 0 && held(&c) > 0).await,
        "the new replicas never got partitions"
    );
    for (_, _, evs, _, _) in &turns {
        publish(&js, &third(evs, 1)).await?;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for (_, _, evs, _, _) in &turns {
        publish(&js, &third(evs, 2)).await?;
    }
    // Finals are going out (and the platforms hold their responses): stop two replicas.
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.cancel();
    for r in b.iter_mut().chain(c.iter_mut()) {
        while let Some(j) = r.tasks.join_next().await {
            j??;
        }
    }
    // A Telegram group shows the answer twice for a moment — the progress message that
    // streamed it and the final — until the progress message is deleted or settled, a
    // request paced to the group's 20 messages a minute: wait for every chat to settle.
    let all_shown = || {
        turns.iter().all(|(p, chat, _, expected, _)| {
            expected
                .as_deref()
                .and_then(probe)
                .is_none_or(|pr| shown(p, chat, &pr) == 1)
        })
    };
    let done = poll_until(Duration::from_secs(180), || {
        a.iter().all(|r| r.channel.active_runs().is_empty()) && all_shown()
    })
    .await;
    for (p, chat, _, expected, name) in &turns {
        let Some(pr) = expected.as_deref().and_then(probe) else {
            continue;
        };
        let mine: Vec<_> = p
            .fake
            .live_messages()
            .into_iter()
            .filter(|m| &m.chat == chat)
            .collect();
        assert_eq!(
            shown(p, chat, &pr),
            1,
            "{} {name} in {chat}: {mine:#?}",
            p.name
        );
    }
    for p in &platforms {
        let open: Vec<_> = p
            .fake
            .streams()
            .into_iter()
            .filter(|s| s.streaming)
            .collect();
        assert!(open.is_empty(), "{}: streams left open: {open:?}", p.name);
    }
    let in_flight: Vec<_> = a.iter().flat_map(|r| r.channel.active_runs()).collect();
    assert!(done, "not every run finished; in flight: {in_flight:?}");
    for p in &platforms {
        eprintln!(
            "{}: {} runs, {} API calls",
            p.name,
            fx.len(),
            p.fake.calls().len()
        );
    }
    Ok(())
}

/// A run whose thinking, tool arguments and results carry secrets (one split across
/// deltas), and whose final answer quotes one.
const SECRET_RUN: &[&str] = &[
    r###"{"seq":1,"stream":"lifecycle","data":{"phase":"start","provider":"anthropic","model":"claude-test"}}"###,
    r###"{"seq":2,"stream":"thinking","data":{"variant":"raw","phase":"start","id":"th_1"}}"###,
    r###"{"seq":3,"stream":"thinking","data":{"variant":"raw","delta":"I found the key sk-ant-api03-Zq9Xw","id":"th_1"}}"###,
    r###"{"seq":4,"stream":"thinking","data":{"variant":"raw","delta":"7Vk3Lm1Np5Rt in .env and password=Hq7","id":"th_1"}}"###,
    r###"{"seq":5,"stream":"thinking","data":{"variant":"raw","delta":"Zt2Wv9x there. ","id":"th_1"}}"###,
    r###"{"seq":6,"stream":"thinking","data":{"variant":"raw","phase":"end","id":"th_1"}}"###,
    r###"{"seq":7,"stream":"item","data":{"phase":"start","id":"call_1","kind":"tool","name":"bash","status":"in_progress","arguments":{"command":"psql postgres://app:S3cr3tPw@db/x"}}}"###,
    r###"{"seq":8,"stream":"item","data":{"phase":"end","id":"call_1","kind":"tool","name":"bash","status":"completed","result":{"db_pass":"Mn4Bv6Cx8Zl","rows":1}}}"###,
    r###"{"seq":9,"stream":"assistant","data":{"phase":"commentary","delta":"Done. ","id":"msg_1","status":"in_progress"}}"###,
    r###"{"seq":10,"stream":"assistant","data":{"phase":"final_answer","text":"The key is sk-ant-api03-Zq9Xw7Vk3Lm1Np5Rt.","id":"msg_2","status":"completed"}}"###,
    r###"{"seq":11,"stream":"lifecycle","data":{"phase":"end","reason":"completed","status":"completed"}}"###,
];

/// Issue 11: `Subscribe` and `Watch` hand channel token holders display-safe events —
/// thinking, tool arguments and results redacted (a secret split across deltas too, and
/// for a subscriber resuming between the halves), the final answer verbatim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_and_watch_send_display_safe_events() -> R {
    use streamgate_proto::v1;
    let (nats, js) = NatsServer::with_streams().await;
    let events: Vec<Event> = SECRET_RUN
        .iter()
        .map(|l| Event::from_json(l))
        .collect::<Result<_, _>>()?;
    let evs = run_events("run-secret", "chat-secret", &events, now_ms());
    let mut cfg = web_channel();
    cfg.token = Some("chan-token".into());
    let running = start_with_grpc(&nats, cfg).await?;
    publish(&js, &evs[..4]).await?;
    assert!(
        poll_until(Duration::from_secs(10), || running
            .channel
            .draft("", "run-secret")
            .found()
            .is_some_and(|d| d.last_seq == 4))
        .await
    );
    let mut client = projector_client(running.grpc.ok_or("no grpc")?, "chan-token").await?;
    let sub = |after_seq: u64| v1::SubscribeRequest {
        target: Some(v1::subscribe_request::Target::RunId("run-secret".into())),
        after_seq,
        tenant: String::new(),
    };
    let mut from_start = client.subscribe(sub(0)).await?.into_inner();
    // Resumes between the two halves of the split key.
    let mut resumed = client.subscribe(sub(3)).await?.into_inner();
    let mut watch = client
        .watch(v1::WatchRequest::default())
        .await?
        .into_inner();
    publish(&js, &evs[4..]).await?;

    let limit = Duration::from_secs(20);
    let mut streams: Vec<(&str, Vec<RunEvent>)> = Vec::new();
    for (name, s) in [
        ("subscribe", &mut from_start),
        ("resumed", &mut resumed),
        ("watch", &mut watch),
    ] {
        let mut got = Vec::new();
        while let Some(ev) = tokio::time::timeout(limit, s.message()).await?? {
            let ev = RunEvent::try_from(ev)?;
            let end = ev.event.is_terminal();
            got.push(ev);
            if end {
                break;
            }
        }
        streams.push((name, got));
    }
    let hidden = ["Zq9Xw7Vk3Lm1Np5Rt", "Hq7Zt2Wv9x", "S3cr3tPw", "Mn4Bv6Cx8Zl"];
    for (name, got) in &streams {
        let first = if *name == "resumed" { 4 } else { 1 };
        let seqs: Vec<u64> = got.iter().map(|e| e.event.seq).collect();
        assert_eq!(seqs, (first..=11).collect::<Vec<u64>>(), "{name}");
        for ev in got {
            if ev.event.seq == 10 {
                assert_eq!(
                    ev.event, events[9],
                    "{name}: the final answer passes verbatim"
                );
                continue;
            }
            let line = ev.event.to_json();
            for h in hidden {
                for w in h.as_bytes().windows(5) {
                    let piece = std::str::from_utf8(w)?;
                    assert!(!line.contains(piece), "{name}: {piece} in {line}");
                }
            }
        }
        let text: String = got
            .iter()
            .filter_map(|e| match &e.event.data {
                EventData::Thinking(t) => t.delta.clone(),
                _ => None,
            })
            .collect();
        if *name != "resumed" {
            assert_eq!(
                text, "I found the key sk-ant-*** in .env and password=*** there. ",
                "{name}"
            );
        }
    }
    Ok(())
}
