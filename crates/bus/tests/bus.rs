//! The bus against a real nats-server (one per test, from streamgate-testkit).

use std::time::Duration;

use async_nats::jetstream;
use bytes::Bytes;
use futures::StreamExt as _;
use rand::Rng as _;
use streamgate_bus::raw::{self, CloseKind, RawChunk};
use streamgate_bus::subject::{self, decode_token, encode_token, partition_of, RunAddr};
use streamgate_bus::{
    consume, ensure_streams, ensure_streams_exist, events, BusError, StreamSettings,
};
use streamgate_bus::{DEFAULT_PARTITIONS, EVENTS_STREAM, RAW_STREAM};
use streamgate_grammar::{
    Assistant, AssistantPhase, Envelope, Event, EventData, Lifecycle, LifecyclePhase, RunEvent,
    RunStatus, StopReason,
};
use streamgate_testkit::NatsServer;

fn random_string(rng: &mut impl rand::Rng) -> String {
    // Pools chosen to hit every encoder branch: safe bytes, subject metacharacters,
    // '%' itself, whitespace/control, multi-byte UTF-8.
    const POOL: &[char] = &[
        'a', 'Z', '0', '9', '_', '-', '.', '*', '>', '%', ' ', '\t', '\r', '\n', '\0', '/', ':',
        'é', 'ß', '中', '🦀', '\u{7f}', '\u{ffff}',
    ];
    let len = rng.random_range(0..12);
    (0..len)
        .map(|_| {
            if rng.random_bool(0.2) {
                char::from_u32(rng.random_range(0..0x11_0000)).unwrap_or('x')
            } else {
                POOL[rng.random_range(0..POOL.len())]
            }
        })
        .collect()
}

#[test]
fn token_encoding_round_trips_random_strings() {
    let mut rng = rand::rng();
    for _ in 0..20_000 {
        let s = random_string(&mut rng);
        let t = encode_token(&s);
        assert!(!t.is_empty());
        assert!(
            t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-%".contains(&b)),
            "{s:?} -> {t:?} is not subject-safe"
        );
        assert_eq!(decode_token(&t).unwrap(), s, "token {t:?}");
        // The whole subject must parse back to the same run (when its ids pass the id
        // rule; one that breaks it is refused as the subject is parsed).
        let tenant = random_string(&mut rng);
        match RunAddr::parse(&tenant, &s, DEFAULT_PARTITIONS) {
            Ok(addr) => assert_eq!(RunAddr::parse_subject(&addr.raw_subject()).unwrap(), addr),
            Err(e) => {
                let subject = format!(
                    "sg.raw.{}.{}.{t}",
                    encode_token(&tenant),
                    partition_of(&s, DEFAULT_PARTITIONS)
                );
                assert_eq!(
                    RunAddr::parse_subject(&subject).unwrap_err(),
                    subject::SubjectError::InvalidId(e)
                );
            }
        }
    }
}

#[test]
fn decoding_is_canonical_on_random_tokens() {
    let mut rng = rand::rng();
    const ALPHABET: &[u8] = b"aZ09_-%AFaf.";
    for _ in 0..50_000 {
        let len = rng.random_range(0..8);
        let t: String = (0..len)
            .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
            .collect();
        if let Ok(s) = decode_token(&t) {
            assert_eq!(encode_token(&s), t, "{t:?} decoded to {s:?}");
        }
    }
}

#[test]
fn partitions_are_stable() {
    // FNV-1a 64 reference vectors: "" = cbf29ce484222325, "a" = af63dc4c8601ec8c,
    // "foobar" = 85944171f73967e8. Values mod 32 and mod 7 pin the function for producers
    // written in other languages.
    assert_eq!(partition_of("", 32), 0x25 % 32);
    assert_eq!(partition_of("a", 32), 12);
    assert_eq!(partition_of("foobar", 32), 8);
    assert_eq!(
        partition_of("foobar", 7),
        (0x8594_4171_f739_67e8_u64 % 7) as u32
    );
    assert_eq!(partition_of("a", 1), 0);
    assert_eq!(partition_of("a", 0), 0);
    assert_eq!(subject::raw_partition_filter(3), "sg.raw.*.3.*");
    assert_eq!(subject::events_partition_filter(31), "sg.evt.*.31.*");
}

async fn setup() -> (NatsServer, jetstream::Context) {
    let server = NatsServer::start();
    let js = jetstream::new(server.client().await);
    ensure_streams(&js, &StreamSettings::default())
        .await
        .unwrap();
    (server, js)
}

async fn message_count(js: &jetstream::Context, stream: &str) -> u64 {
    js.get_stream(stream)
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .state
        .messages
}

fn data_chunk(addr: &RunAddr, chunk: u64, body: &'static [u8]) -> RawChunk {
    RawChunk {
        addr: addr.clone(),
        session_key: Some("telegram:42".into()),
        family: "f1".into(),
        dialect: None,
        chunk,
        ingest_ts_ms: 1_700_000_000_000 + chunk as i64,
        close: None,
        body: Bytes::from_static(body),
    }
}

fn close_marker(addr: &RunAddr, chunk: u64, kind: CloseKind) -> RawChunk {
    RawChunk {
        close: Some(kind),
        body: Bytes::new(),
        ..data_chunk(addr, chunk, b"")
    }
}

#[tokio::test]
async fn ensure_streams_is_idempotent_and_applies_changes() {
    let server = NatsServer::start();
    let js = jetstream::new(server.client().await);
    let defaults = StreamSettings::default();
    ensure_streams(&js, &defaults).await.unwrap();
    ensure_streams(&js, &defaults).await.unwrap();
    let raw = js.get_stream(RAW_STREAM).await.unwrap();
    let cfg = &raw.cached_info().config;
    assert_eq!(cfg.subjects, vec!["sg.raw.>".to_owned()]);
    assert_eq!(cfg.storage, jetstream::stream::StorageType::File);
    assert_eq!(cfg.max_age, Duration::from_secs(7 * 24 * 3600));
    assert_eq!(cfg.duplicate_window, Duration::from_secs(120));
    assert_eq!(cfg.max_consumers, defaults.max_consumers);

    let changed = StreamSettings {
        raw_max_bytes: 64 << 20,
        events_max_age: Duration::from_secs(3600),
        duplicate_window: Duration::from_secs(30),
        ..defaults.clone()
    };
    ensure_streams(&js, &changed).await.unwrap();
    ensure_streams(&js, &changed).await.unwrap();
    let raw = js.get_stream(RAW_STREAM).await.unwrap();
    assert_eq!(raw.cached_info().config.max_bytes, 64 << 20);
    assert_eq!(
        raw.cached_info().config.duplicate_window,
        Duration::from_secs(30)
    );
    let evt = js.get_stream(EVENTS_STREAM).await.unwrap();
    assert_eq!(evt.cached_info().config.max_age, Duration::from_secs(3600));
    assert_eq!(
        evt.cached_info().config.subjects,
        vec!["sg.evt.>".to_owned()]
    );

    // A stream someone created with memory storage cannot be fixed in place: say so.
    js.delete_stream(EVENTS_STREAM).await.unwrap();
    js.create_stream(jetstream::stream::Config {
        name: EVENTS_STREAM.into(),
        subjects: vec!["sg.evt.>".into()],
        storage: jetstream::stream::StorageType::Memory,
        ..Default::default()
    })
    .await
    .unwrap();
    let err = ensure_streams(&js, &defaults).await.unwrap_err();
    assert!(
        matches!(
            err,
            BusError::ImmutableSetting {
                setting: "storage",
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn a_reader_creates_missing_streams_but_never_changes_existing_ones() {
    let server = NatsServer::start();
    let js = jetstream::new(server.client().await);
    // A projector channel starting first: the streams appear with its settings.
    ensure_streams_exist(&js, &StreamSettings::default())
        .await
        .unwrap();
    assert!(js.get_stream(RAW_STREAM).await.is_ok());
    assert!(js.get_stream(EVENTS_STREAM).await.is_ok());

    // The normalizer applies the operator's settings; a channel restarting afterwards
    // with its own defaults leaves them alone.
    let operator = StreamSettings {
        raw_max_age: Duration::from_secs(3600),
        events_max_bytes: 32 << 20,
        ..StreamSettings::default()
    };
    ensure_streams(&js, &operator).await.unwrap();
    ensure_streams_exist(&js, &StreamSettings::default())
        .await
        .unwrap();
    let raw = js.get_stream(RAW_STREAM).await.unwrap();
    assert_eq!(raw.cached_info().config.max_age, Duration::from_secs(3600));
    let evt = js.get_stream(EVENTS_STREAM).await.unwrap();
    assert_eq!(evt.cached_info().config.max_bytes, 32 << 20);
}

#[tokio::test]
async fn a_service_with_another_partition_count_is_refused_with_the_fix() {
    let server = NatsServer::start();
    let js = jetstream::new(server.client().await);
    let eight = StreamSettings {
        partitions: 8,
        ..StreamSettings::default()
    };
    ensure_streams(&js, &eight).await.unwrap();
    let raw = js.get_stream(RAW_STREAM).await.unwrap();
    assert_eq!(
        raw.cached_info()
            .config
            .metadata
            .get(streamgate_bus::PARTITIONS_METADATA),
        Some(&"8".to_owned())
    );
    let sixteen = StreamSettings {
        partitions: 16,
        ..StreamSettings::default()
    };
    for err in [
        ensure_streams(&js, &sixteen).await.unwrap_err(),
        ensure_streams_exist(&js, &sixteen).await.unwrap_err(),
    ] {
        assert!(
            matches!(err, BusError::PartitionMismatch { wanted: 16, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("STREAMGATE_PARTITIONS"), "{err}");
        assert!(err.to_string().contains("to 8"), "{err}");
    }
    // The same count passes, and the owner's start keeps the recorded count.
    ensure_streams_exist(&js, &eight).await.unwrap();
    ensure_streams(&js, &eight).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_starting_together_all_succeed() {
    let server = NatsServer::start();
    let js = jetstream::new(server.client().await);
    let tasks: Vec<_> = (0..6)
        .map(|_| {
            let js = js.clone();
            tokio::spawn(async move { ensure_streams(&js, &StreamSettings::default()).await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(message_count(&js, RAW_STREAM).await, 0);
}

#[tokio::test]
async fn publish_raw_dedupes_on_msg_id() {
    let (_server, js) = setup().await;
    let addr = RunAddr::parse("acme", "run-dedupe", DEFAULT_PARTITIONS).unwrap();
    let c = data_chunk(&addr, 0, b"data: hello\n\n");
    let first = raw::publish_raw(&js, &c).await.unwrap();
    let again = raw::publish_raw_with(&js, &c, None).await.unwrap();
    assert!(again.duplicate);
    assert_eq!(again.sequence, first);
    assert_eq!(message_count(&js, RAW_STREAM).await, 1);
}

/// A fenced publish that finds the run moved on is refused with a typed
/// `WrongLastSequence` (what HTTP ingest turns into "send it again"), and is permanent.
#[tokio::test]
async fn a_fenced_publish_after_the_run_moved_on_is_refused_by_kind() {
    use async_nats::jetstream::context::PublishErrorKind;
    let (_server, js) = setup().await;
    let addr = RunAddr::parse("acme", "run-fence", DEFAULT_PARTITIONS).unwrap();
    let first = raw::publish_raw(&js, &data_chunk(&addr, 0, b"a"))
        .await
        .unwrap();
    let fenced = |chunk, seq| {
        let js = js.clone();
        let c = data_chunk(&addr, chunk, b"b");
        async move {
            let at = raw::Placement {
                offset: None,
                expect_last_seq: Some(seq),
            };
            raw::send_raw_placed(&js, &c, None, at).await?.await
        }
    };
    let e = fenced(1, first + 7).await.unwrap_err();
    assert_eq!(
        e.publish_error(),
        Some(PublishErrorKind::WrongLastSequence),
        "{e}"
    );
    assert!(!e.is_transient(), "{e}");
    // The right fence is taken.
    assert!(fenced(1, first).await.is_ok());
}

#[tokio::test]
async fn only_one_close_marker_per_run() {
    let (_server, js) = setup().await;
    let addr = RunAddr::parse("acme", "run-close", DEFAULT_PARTITIONS).unwrap();
    raw::publish_raw(&js, &data_chunk(&addr, 0, b"x"))
        .await
        .unwrap();
    raw::publish_raw(&js, &close_marker(&addr, 1, CloseKind::Normal))
        .await
        .unwrap();
    // A reaper racing the producer: different kind, same fixed id → dropped.
    let late = raw::publish_raw_with(&js, &close_marker(&addr, 1, CloseKind::Timeout), None)
        .await
        .unwrap();
    assert!(late.duplicate);
    let msgs = consume::read_subject(&js, RAW_STREAM, &addr.raw_subject())
        .await
        .unwrap();
    let chunks: Vec<RawChunk> = msgs
        .iter()
        .map(|m| RawChunk::from_message(m).unwrap())
        .collect();
    assert_eq!(chunks.len(), 2);
    assert_eq!(chunks[1].close, Some(CloseKind::Normal));

    // A close marker with a body is refused before it reaches the bus.
    let mut bad = close_marker(&addr, 1, CloseKind::Abnormal);
    bad.body = Bytes::from_static(b"lost");
    assert!(matches!(
        raw::publish_raw(&js, &bad).await,
        Err(BusError::CloseWithBody(_))
    ));
}

fn run_events(tenant: &str, run_id: &str) -> Vec<RunEvent> {
    let envelope = |ts_ms| Envelope {
        tenant: tenant.into(),
        session_key: Some("s1".into()),
        run_id: run_id.into(),
        ts_ms,
    };
    let start = Lifecycle {
        provider: Some("anthropic".into()),
        model: Some("claude".into()),
        ..Lifecycle::new(LifecyclePhase::Start)
    };
    let end = Lifecycle {
        reason: Some(StopReason::Completed),
        status: Some(RunStatus::Completed),
        ..Lifecycle::new(LifecyclePhase::End)
    };
    let datas = vec![
        EventData::from(start),
        EventData::Assistant(Assistant {
            delta: Some("Hel".into()),
            ..Default::default()
        }),
        EventData::Assistant(Assistant {
            delta: Some("lo".into()),
            ..Default::default()
        }),
        EventData::Assistant(Assistant {
            phase: Some(AssistantPhase::FinalAnswer),
            text: Some("Hello".into()),
            ..Default::default()
        }),
        EventData::from(end),
    ];
    datas
        .into_iter()
        .enumerate()
        .map(|(i, data)| RunEvent {
            envelope: envelope(1_700_000_000_000 + i as i64),
            event: Event {
                seq: i as u64 + 1,
                data,
            },
        })
        .collect()
}

#[tokio::test]
async fn events_round_trip_through_a_durable_pull_consumer() {
    let (_server, js) = setup().await;
    let addr = RunAddr::parse("acme", "run-events", DEFAULT_PARTITIONS).unwrap();
    let evs = run_events("acme", "run-events");
    events::publish_events(&js, &addr, &evs).await.unwrap();
    // Re-publishing (a normalizer replaying after a crash) adds nothing.
    events::publish_events(&js, &addr, &evs).await.unwrap();
    assert_eq!(message_count(&js, EVENTS_STREAM).await, evs.len() as u64);

    let filters = vec![subject::events_partition_filter(addr.partition)];
    let ack_wait = Duration::from_secs(30);
    // Idempotent: a second replica gets the same consumer.
    consume::durable_pull(
        &js,
        EVENTS_STREAM,
        "archiver",
        filters.clone(),
        ack_wait,
        1000,
    )
    .await
    .unwrap();
    let consumer = consume::durable_pull(&js, EVENTS_STREAM, "archiver", filters, ack_wait, 1000)
        .await
        .unwrap();
    let mut batch = consumer
        .fetch()
        .max_messages(100)
        .expires(Duration::from_secs(2))
        .messages()
        .await
        .unwrap();
    let mut got = Vec::new();
    while let Some(msg) = batch.next().await {
        let msg = msg.unwrap();
        let ev = events::decode_event(&msg.payload).unwrap();
        assert_eq!(
            events::streams_of(msg.headers.as_ref()),
            vec![ev.event.stream()]
        );
        assert_eq!(events::decode_msg(&msg).unwrap(), vec![ev.clone()]);
        assert_eq!(msg.subject.as_str(), addr.events_subject());
        msg.ack().await.unwrap();
        got.push(ev);
    }
    assert_eq!(got, evs);

    // Multi-filter consumers (one replica owning several partitions) work too.
    let multi = consume::durable_pull(
        &js,
        EVENTS_STREAM,
        "projector",
        vec![
            subject::events_partition_filter(addr.partition),
            subject::events_partition_filter((addr.partition + 1) % DEFAULT_PARTITIONS),
        ],
        ack_wait,
        10,
    )
    .await
    .unwrap();
    assert_eq!(multi.cached_info().config.filter_subjects.len(), 2);

    // Events of another run cannot be published under this address.
    let other = run_events("acme", "someone-else");
    assert!(matches!(
        events::publish_events(&js, &addr, &other).await,
        Err(BusError::RunMismatch { .. })
    ));
    assert!(events::decode_event(b"\xff\xff").is_err());
}

/// `n` consecutive assistant deltas of one run, from seq 1.
fn many_events(run_id: &str, n: u64) -> Vec<RunEvent> {
    (1..=n)
        .map(|seq| RunEvent {
            envelope: Envelope {
                tenant: "acme".into(),
                session_key: None,
                run_id: run_id.into(),
                ts_ms: 1_700_000_000_000,
            },
            event: Event {
                seq,
                data: EventData::Assistant(Assistant {
                    delta: Some(format!("token {seq} ")),
                    ..Default::default()
                }),
            },
        })
        .collect()
}

#[tokio::test]
async fn batches_travel_as_one_message_each_and_republish_adds_nothing() {
    let (_server, js) = setup().await;
    let addr = RunAddr::parse("acme", "run-batches", DEFAULT_PARTITIONS).unwrap();
    let evs = run_events("acme", "run-batches");
    // What three raw chunks yielded: [start], [delta, delta], [final, end].
    let groups = [&evs[..1], &evs[1..3], &evs[3..]];
    events::publish_batches(&js, &addr, groups).await.unwrap();
    // A normalizer rebuilding the run publishes the same groups again: same ids.
    events::publish_batches(&js, &addr, groups).await.unwrap();
    let msgs = consume::read_subject(&js, EVENTS_STREAM, &addr.events_subject())
        .await
        .unwrap();
    assert_eq!(msgs.len(), 3);
    let ids: Vec<&str> = msgs
        .iter()
        .map(|m| {
            m.headers
                .as_ref()
                .and_then(|h| h.get("Nats-Msg-Id"))
                .map_or("", |v| v.as_str())
        })
        .collect();
    assert_eq!(
        ids,
        [
            "acme/run-batches/1",
            "acme/run-batches/2-3",
            "acme/run-batches/4-5"
        ]
    );
    assert_eq!(
        events::streams_of(msgs[2].headers.as_ref()),
        [
            streamgate_grammar::Stream::Assistant,
            streamgate_grammar::Stream::Lifecycle
        ]
    );
    let got: Vec<RunEvent> = msgs
        .iter()
        .flat_map(|m| events::decode_msg(m).unwrap())
        .collect();
    assert_eq!(got, evs);

    // A batch claims a seq range; a hole in it is refused before anything is sent.
    let holed = [evs[0].clone(), evs[2].clone()];
    assert!(matches!(
        events::publish_batches(&js, &addr, [&holed[..]]).await,
        Err(BusError::BatchGap {
            after: 1,
            next: 3,
            ..
        })
    ));
}

#[test]
fn oversized_batches_split_the_same_way_every_time() {
    let evs = many_events("run-big", 2_500);
    let a = events::messages_for(&evs).unwrap();
    let b = events::messages_for(&evs).unwrap();
    let ids = |ms: &[events::EventMessage]| -> Vec<String> {
        ms.iter()
            .map(|m| m.headers.get("Nats-Msg-Id").unwrap().to_string())
            .collect()
    };
    assert_eq!(ids(&a), ids(&b));
    assert_eq!(
        ids(&a),
        [
            "acme/run-big/1-1024",
            "acme/run-big/1025-2048",
            "acme/run-big/2049-2500"
        ]
    );
    let mut decoded = Vec::new();
    for m in &a {
        assert!(m.payload.len() <= events::MAX_BATCH_BYTES);
        decoded.extend(events::decode_message(Some(&m.headers), &m.payload).unwrap());
    }
    assert_eq!(decoded, evs);

    // Big events split by bytes before the count limit.
    let mut fat = many_events("run-fat", 40);
    for ev in &mut fat {
        if let EventData::Assistant(a) = &mut ev.event.data {
            a.delta = Some("x".repeat(20_000));
        }
    }
    let ms = events::messages_for(&fat).unwrap();
    assert!(ms.len() >= 4, "{} messages", ms.len());
    assert!(ms
        .iter()
        .all(|m| m.payload.len() <= events::MAX_BATCH_BYTES));
    let n: usize = ms
        .iter()
        .map(|m| {
            events::decode_message(Some(&m.headers), &m.payload)
                .unwrap()
                .len()
        })
        .sum();
    assert_eq!(n, 40);
    // Under a smaller limit (a broker with a lower max_payload), smaller messages.
    let small = events::messages_within(&fat, 50_000).unwrap();
    assert!(small.len() > ms.len(), "{} messages", small.len());
    assert!(small.iter().all(|m| m.payload.len() <= 50_000));

    // A batch header that disagrees with the body is an error, not a silent loss.
    let mut lying = ms[0].headers.clone();
    lying.insert(events::HDR_BATCH, "1");
    assert!(events::decode_message(Some(&lying), &ms[0].payload).is_err());
}

#[tokio::test]
async fn read_subject_returns_exactly_the_runs_messages_in_order() {
    let (_server, js) = setup().await;
    // Same tenant and (by construction) same partition, interleaved publishes.
    let a = RunAddr::parse("acme", "run-a", 1).unwrap();
    let b = RunAddr::parse("acme", "run-b", 1).unwrap();
    for i in 0..20u64 {
        raw::publish_raw(&js, &data_chunk(&a, i, b"a"))
            .await
            .unwrap();
        raw::publish_raw(&js, &data_chunk(&b, i, b"b"))
            .await
            .unwrap();
    }
    raw::publish_raw(&js, &close_marker(&a, 20, CloseKind::Normal))
        .await
        .unwrap();
    let msgs = consume::read_subject(&js, RAW_STREAM, &a.raw_subject())
        .await
        .unwrap();
    assert_eq!(msgs.len(), 21);
    for (i, m) in msgs.iter().enumerate() {
        let c = RawChunk::from_message(m).unwrap();
        assert_eq!(c.addr, a);
        assert_eq!(c.chunk, i as u64);
    }
    let none = consume::read_subject(&js, RAW_STREAM, "sg.raw.acme.0.nobody")
        .await
        .unwrap();
    assert!(none.is_empty());
}

#[tokio::test]
async fn messages_survive_a_server_kill_and_restart() {
    let (mut server, js) = setup().await;
    let addr = RunAddr::parse("t", "run-crash", DEFAULT_PARTITIONS).unwrap();
    for i in 0..5 {
        raw::publish_raw(&js, &data_chunk(&addr, i, b"payload"))
            .await
            .unwrap();
    }
    let evs = run_events("t", "run-crash");
    events::publish_events(&js, &addr, &evs).await.unwrap();

    server.kill();
    server.restart();

    let js = jetstream::new(server.client().await);
    // Every replica calls this at start; after a crash it must find the streams intact.
    ensure_streams(&js, &StreamSettings::default())
        .await
        .unwrap();
    let raw_msgs = consume::read_subject(&js, RAW_STREAM, &addr.raw_subject())
        .await
        .unwrap();
    assert_eq!(raw_msgs.len(), 5);
    let ev_msgs = consume::read_subject(&js, EVENTS_STREAM, &addr.events_subject())
        .await
        .unwrap();
    let got: Vec<RunEvent> = ev_msgs
        .iter()
        .map(|m| events::decode_event(&m.payload).unwrap())
        .collect();
    assert_eq!(got, evs);
}

#[tokio::test]
async fn a_foreign_client_can_ingest_with_plain_headers() {
    // What the `nats pub` example in docs/raw-messages.md sends, subject spelled out by
    // hand: no Sg-Ingest-Ts on the close marker, a token-encoded session, lowercase name.
    let (_server, js) = setup().await;
    assert_eq!(partition_of("run-42", DEFAULT_PARTITIONS), 3);
    let subject = "sg.raw.acme.3.run-42";
    let publish = |h: async_nats::HeaderMap, body: &'static [u8]| {
        let js = js.clone();
        async move {
            js.publish_with_headers(subject, h, Bytes::from_static(body))
                .await
                .unwrap()
                .await
                .unwrap()
        }
    };
    let mut h = async_nats::HeaderMap::new();
    h.insert("Nats-Msg-Id", "acme/run-42/raw/0");
    h.insert("sg-chunk", "0");
    h.insert("Sg-Family", "f1");
    h.insert("Sg-Ingest-Ts", "1700000000000");
    h.insert("Sg-Session", "telegram%3A12345");
    publish(h, b"event: ping\n\n").await;
    let mut h = async_nats::HeaderMap::new();
    h.insert("Nats-Msg-Id", "acme/run-42/raw/close");
    h.insert("Sg-Chunk", "1");
    h.insert("Sg-Close", "normal");
    publish(h, b"").await;

    let msgs = consume::read_subject(&js, RAW_STREAM, subject)
        .await
        .unwrap();
    let c: Vec<RawChunk> = msgs
        .iter()
        .map(|m| RawChunk::from_message(m).unwrap())
        .collect();
    assert_eq!(
        c[0].addr,
        RunAddr::parse("acme", "run-42", DEFAULT_PARTITIONS).unwrap()
    );
    assert_eq!((c[0].family.as_str(), c[0].chunk), ("f1", 0));
    assert_eq!(c[0].session_key.as_deref(), Some("telegram:12345"));
    assert_eq!(c[0].ingest_ts_ms, 1_700_000_000_000);
    assert_eq!(c[0].msg_id(), "acme/run-42/raw/0");
    assert_eq!(
        (c[1].close, c[1].family.as_str()),
        (Some(CloseKind::Normal), "auto")
    );
    assert_eq!(c[1].msg_id(), "acme/run-42/raw/close");
    // No Sg-Ingest-Ts: JetStream's stored time stands in.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!(
        (now_ms - c[1].ingest_ts_ms).abs() < 60_000,
        "{}",
        c[1].ingest_ts_ms
    );
}

#[tokio::test]
async fn a_stopped_local_server_shuts_down_cleanly_and_keeps_its_store() {
    use streamgate_bus::local::{free_port, nats_server_binary, LocalNats};
    let dir = tempfile::tempdir().unwrap();
    let server = LocalNats::spawn(
        &nats_server_binary().unwrap(),
        free_port().unwrap(),
        dir.path(),
    )
    .expect("nats-server");
    let js = jetstream::new(async_nats::connect(server.url()).await.unwrap());
    ensure_streams(&js, &StreamSettings::default())
        .await
        .unwrap();
    let addr = RunAddr::parse("t", "run-stop", DEFAULT_PARTITIONS).unwrap();
    raw::publish_raw(&js, &data_chunk(&addr, 0, b"kept"))
        .await
        .unwrap();

    // stop() blocks while the server shuts down.
    let server = tokio::task::spawn_blocking(move || {
        let mut server = server;
        server.stop(Duration::from_secs(10));
        assert!(!server.is_running());
        // A signal-driven shutdown, not a kill: the server said goodbye.
        assert!(server.log().contains("Server Exiting"), "{}", server.log());
        server.restart().unwrap();
        server
    })
    .await
    .unwrap();
    let js = jetstream::new(async_nats::connect(server.url()).await.unwrap());
    let msgs = consume::read_subject(&js, RAW_STREAM, &addr.raw_subject())
        .await
        .unwrap();
    assert_eq!(msgs.len(), 1);
    assert_eq!(&msgs[0].payload[..], b"kept");
}

/// Upgrading to per-partition consumers: a new partition durable starts right after the
/// ack floor of the single consumer that served every partition before, not at the
/// start of the stream; once it exists it keeps its own position.
#[tokio::test]
async fn partition_durables_start_after_the_legacy_consumers_ack_floor() {
    let (_server, js) = setup().await;
    let addr = RunAddr::parse("t", "r", DEFAULT_PARTITIONS).unwrap();
    for i in 0..10 {
        raw::publish_raw(&js, &data_chunk(&addr, i, b"x"))
            .await
            .unwrap();
    }
    assert_eq!(
        consume::start_after_legacy(&js, RAW_STREAM, "legacy")
            .await
            .unwrap(),
        jetstream::consumer::DeliverPolicy::All,
        "no legacy consumer: the whole stream"
    );
    let legacy = consume::durable_pull(
        &js,
        RAW_STREAM,
        "legacy",
        vec!["sg.raw.>".into()],
        Duration::from_secs(30),
        100,
    )
    .await
    .unwrap();
    let mut batch = legacy.fetch().max_messages(6).messages().await.unwrap();
    while let Some(m) = batch.next().await {
        m.unwrap().double_ack().await.unwrap();
    }
    let start = consume::start_after_legacy(&js, RAW_STREAM, "legacy")
        .await
        .unwrap();
    let filter = subject::raw_partition_filter(addr.partition);
    let first_seq = |c: jetstream::consumer::PullConsumer| async move {
        let mut m = c.fetch().max_messages(1).messages().await.unwrap();
        let msg = m.next().await.unwrap().unwrap();
        msg.info().unwrap().stream_sequence
    };
    let part = consume::durable_pull_from(
        &js,
        RAW_STREAM,
        "legacy-p07",
        vec![filter.clone()],
        Duration::from_secs(30),
        100,
        start,
    )
    .await
    .unwrap();
    assert_eq!(
        first_seq(part).await,
        7,
        "starts after the legacy ack floor"
    );
    // Existing: its deliver policy stays whatever start is asked for now.
    let again = consume::durable_pull_from(
        &js,
        RAW_STREAM,
        "legacy-p07",
        vec![filter],
        Duration::from_secs(30),
        100,
        jetstream::consumer::DeliverPolicy::All,
    )
    .await
    .unwrap();
    assert_eq!(
        again.cached_info().config.deliver_policy,
        jetstream::consumer::DeliverPolicy::ByStartSequence { start_sequence: 7 }
    );
}

/// A partition's consumer incarnations: each starts right after what the earlier ones
/// acknowledged (in order), a fresh one's floor is just before its start, an explicit
/// start wins, and making one deletes the others — a fixed-name consumer of an earlier
/// release included.
#[tokio::test]
async fn each_consumer_incarnation_starts_after_what_the_earlier_ones_acknowledged() {
    use streamgate_bus::incarnation::{self, Start};
    let (_server, js) = setup().await;
    let addr = RunAddr::parse("t", "r", DEFAULT_PARTITIONS).unwrap();
    for i in 0..10 {
        raw::publish_raw(&js, &data_chunk(&addr, i, b"x"))
            .await
            .unwrap();
    }
    let base = "sg-normalizer-p07";
    let spec = incarnation::Spec {
        stream: RAW_STREAM.into(),
        base: base.into(),
        filter: subject::raw_partition_filter(addr.partition),
        ack_wait: Duration::from_secs(30),
        max_ack_pending: 100,
    };
    let consumers = || async {
        let stream = js.get_stream(RAW_STREAM).await.unwrap();
        let mut names: Vec<String> = incarnation::list(&stream, base)
            .await
            .unwrap()
            .into_iter()
            .map(|c| c.name)
            .collect();
        names.sort();
        names
    };
    let take = |c: jetstream::consumer::PullConsumer, n: usize| async move {
        let mut got = c.fetch().max_messages(n).messages().await.unwrap();
        let mut out = Vec::new();
        while let Some(m) = got.next().await {
            out.push(m.unwrap());
        }
        out
    };
    // An earlier release's fixed-name consumer, acknowledged up to seq 3.
    let old = consume::durable_pull(
        &js,
        RAW_STREAM,
        base,
        vec![spec.filter.clone()],
        Duration::from_secs(30),
        100,
    )
    .await
    .unwrap();
    for m in take(old, 3).await {
        m.double_ack().await.unwrap();
    }
    let first = incarnation::open(&js, &spec, Start::Resume(None))
        .await
        .unwrap();
    assert_eq!(first.start, 4, "after the fixed-name consumer's floor");
    assert_eq!(
        consumers().await,
        std::slice::from_ref(&first.name),
        "the old one is deleted"
    );
    let msgs = take(first.consumer.clone(), 4).await;
    let seqs: Vec<u64> = msgs
        .iter()
        .map(|m| m.info().unwrap().stream_sequence)
        .collect();
    assert_eq!(seqs, [4, 5, 6, 7]);
    // One in-order ack of the second: 4 and 5 are done, 6 and 7 were never processed.
    msgs[1].double_ack().await.unwrap();
    let second = incarnation::open(&js, &spec, Start::Resume(None))
        .await
        .unwrap();
    assert_eq!(second.start, 6);
    assert_eq!(consumers().await, std::slice::from_ref(&second.name));
    // A fresh incarnation that acknowledged nothing: its floor is just before its start.
    let third = incarnation::open(&js, &spec, Start::At(9)).await.unwrap();
    assert_eq!(third.start, 9, "an explicit start wins");
    let fourth = incarnation::open(&js, &spec, Start::Resume(None))
        .await
        .unwrap();
    assert_eq!(fourth.start, 9);
    let msgs = take(fourth.consumer.clone(), 5).await;
    let seqs: Vec<u64> = msgs
        .iter()
        .map(|m| m.info().unwrap().stream_sequence)
        .collect();
    assert_eq!(seqs, [9, 10]);
    assert_eq!(
        incarnation::current(&js, RAW_STREAM, base)
            .await
            .unwrap()
            .map(|c| c.name),
        Some(fourth.name)
    );
}

/// Every file under `dir` whose bytes contain `needle`.
fn files_holding(dir: &std::path::Path, needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = e.path();
            if path.is_dir() {
                stack.push(path);
            } else if std::fs::read(&path)
                .is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes()))
            {
                found.push(path.display().to_string());
            }
        }
    }
    found
}

/// A key written over and deleted through the erasing writes leaves none of its earlier
/// values in the broker's files — unlike a plain `put`, whose history limit only unlinks
/// the value it replaces (checked too, so the search is known to see the files).
#[tokio::test]
async fn overwritten_kv_values_are_erased_from_the_files() {
    use streamgate_bus::kv::{
        delete_erasing, erasures_done, open_erasable, put_erasing, ERASABLE_HISTORY,
    };
    let (server, js) = setup().await;
    let config = |bucket: &str, history| async_nats::jetstream::kv::Config {
        bucket: bucket.to_owned(),
        history,
        storage: jetstream::stream::StorageType::File,
        ..Default::default()
    };
    let erasing = open_erasable(&js, config("ERASING", ERASABLE_HISTORY))
        .await
        .unwrap();
    let plain = open_erasable(&js, config("PLAIN", 1)).await.unwrap();
    for (i, value) in ["first-value-qx17", "second-value-qx17", "third-value-qx17"]
        .into_iter()
        .enumerate()
    {
        put_erasing(&erasing, "k", Bytes::from(value))
            .await
            .unwrap();
        plain.put("k", Bytes::from(value)).await.unwrap();
        assert_eq!(
            erasing.get("k").await.unwrap().as_deref(),
            Some(value.as_bytes()),
            "write {i}"
        );
    }
    erasures_done().await;
    let on_disk = |needle: &str| {
        let mut found = files_holding(server.store_dir(), needle);
        found.sort();
        found
    };
    for overwritten in ["first-value-qx17", "second-value-qx17"] {
        let found = on_disk(overwritten);
        assert!(
            found.iter().all(|f| f.contains("KV_PLAIN")),
            "{overwritten}: {found:?}"
        );
        assert!(!found.is_empty(), "the plain bucket keeps {overwritten}");
    }
    assert!(on_disk("third-value-qx17")
        .iter()
        .any(|f| f.contains("KV_ERASING")));

    delete_erasing(&erasing, "k").await.unwrap();
    erasures_done().await;
    assert_eq!(erasing.get("k").await.unwrap(), None);
    assert!(on_disk("third-value-qx17")
        .iter()
        .all(|f| f.contains("KV_PLAIN")));
    // Only the tombstone is left of the key.
    let stream = js.get_stream("KV_ERASING").await.unwrap();
    assert_eq!(stream.cached_info().state.messages, 1);
}

/// The lag a service reports: durables by their exact names among many other
/// consumers (one info request each; a name with no consumer is left out), and a
/// normalizer partition's base as the incarnation it works on.
#[tokio::test]
async fn lag_is_read_for_the_named_durables_and_an_incarnation_under_its_base() {
    use consume::LagOf;
    use streamgate_bus::incarnation::{self, Start};
    let (_server, js) = setup().await;
    let addr = RunAddr::parse("t", "r", DEFAULT_PARTITIONS).unwrap();
    for i in 0..5 {
        raw::publish_raw(&js, &data_chunk(&addr, i, b"x"))
            .await
            .unwrap();
    }
    let filter = subject::raw_partition_filter(addr.partition);
    // Another service's consumers crowd the stream.
    for n in 0..20 {
        consume::durable_pull(
            &js,
            RAW_STREAM,
            &format!("other-{n}"),
            vec![filter.clone()],
            Duration::from_secs(30),
            100,
        )
        .await
        .unwrap();
    }
    let mine = consume::durable_pull(
        &js,
        RAW_STREAM,
        "mine",
        vec![filter.clone()],
        Duration::from_secs(30),
        100,
    )
    .await
    .unwrap();
    let mut got = mine.fetch().max_messages(2).messages().await.unwrap();
    while let Some(m) = got.next().await {
        m.unwrap().double_ack().await.unwrap();
    }
    let of = LagOf::Durables(vec!["mine".into(), "missing".into()]);
    let read = consume::lag(&js, RAW_STREAM, &of).await;
    let read: Vec<_> = read.iter().map(|(n, i)| (*n, i.num_pending)).collect();
    assert_eq!(read, [("mine", 3)], "pending after two of five");

    let spec = incarnation::Spec {
        stream: RAW_STREAM.into(),
        base: "sg-normalizer-p03".into(),
        filter,
        ack_wait: Duration::from_secs(30),
        max_ack_pending: 100,
    };
    let made = incarnation::open(&js, &spec, Start::At(2)).await.unwrap();
    let of = LagOf::Incarnations(vec![spec.base.clone(), "sg-normalizer-p04".into()]);
    let read = consume::lag(&js, RAW_STREAM, &of).await;
    assert_eq!(read.len(), 1, "only the base with an incarnation");
    assert_eq!(read[0].0, spec.base);
    assert_eq!(read[0].1.name, made.name);
    assert_eq!(read[0].1.num_pending, 4, "from seq 2 of 5");
}

/// The stream sequence of the next message `consumer` delivers (acked, so the consumer
/// moves on).
async fn next_seq(consumer: &jetstream::consumer::PullConsumer) -> u64 {
    let mut got = consumer.fetch().max_messages(1).messages().await.unwrap();
    let msg = got.next().await.expect("a message").unwrap();
    msg.double_ack().await.unwrap();
    msg.info().unwrap().stream_sequence
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_in_memory_resumes_after_its_owners_point_when_the_broker_forgot_it() {
    use consume::durable_pull;
    use jetstream::consumer::DeliverPolicy;
    use streamgate_bus::memory_pull::{self, Spec};
    let (mut server, js) = setup().await;
    let addr = RunAddr::parse("t", "r", DEFAULT_PARTITIONS).unwrap();
    for i in 0..6 {
        raw::publish_raw(&js, &data_chunk(&addr, i, b"x"))
            .await
            .unwrap();
    }
    let spec = |durable| Spec {
        stream: RAW_STREAM,
        durable,
        filters: vec![subject::raw_partition_filter(addr.partition)],
        ack_wait: Duration::from_secs(30),
        max_ack_pending: 100,
    };
    let start_of = |c: &jetstream::consumer::PullConsumer| c.cached_info().config.deliver_policy;
    let after = |seq: u64| DeliverPolicy::ByStartSequence {
        start_sequence: seq + 1,
    };
    let from_start = || std::future::ready(Ok(DeliverPolicy::All));
    // A fallback that fails `open` if it is awaited: while there is a point, it is not.
    let not_looked_up =
        || std::future::ready(Err(streamgate_bus::BusError::MissingHeader("the fallback")));
    // Missing, and no point of the owner's: the fallback.
    let (mine, from) = memory_pull::open(&js, spec("mine"), None, from_start())
        .await
        .unwrap();
    assert_eq!((start_of(&mine), from), (DeliverPolicy::All, 0));
    assert!(mine.cached_info().config.memory_storage);
    assert_eq!(next_seq(&mine).await, 1);
    assert_eq!(next_seq(&mine).await, 2);
    // Every delivery acked: a new consumer after the last one, past an older point.
    let (mine, from) = memory_pull::open(&js, spec("mine"), Some(1), not_looked_up())
        .await
        .unwrap();
    assert_eq!((start_of(&mine), from), (after(2), 2));
    assert_eq!(next_seq(&mine).await, 3);
    // A delivery not acked: after the ack floor, so the message comes again.
    let mut got = mine.fetch().max_messages(1).messages().await.unwrap();
    let unacked = got.next().await.unwrap().unwrap();
    assert_eq!(unacked.info().unwrap().stream_sequence, 4);
    let (mine, from) = memory_pull::open(&js, spec("mine"), Some(1), not_looked_up())
        .await
        .unwrap();
    assert_eq!(from, 3);
    assert_eq!(next_seq(&mine).await, 4);

    // A consumer in a file (an earlier version's) at ack floor 4 moves to memory there.
    let old = durable_pull(
        &js,
        RAW_STREAM,
        "old",
        spec("old").filters,
        Duration::from_secs(30),
        100,
    )
    .await
    .unwrap();
    for _ in 0..4 {
        next_seq(&old).await;
    }
    let (old, from) = memory_pull::open(&js, spec("old"), Some(1), not_looked_up())
        .await
        .unwrap();
    assert_eq!(from, 4);
    assert!(old.cached_info().config.memory_storage);
    assert_eq!(next_seq(&old).await, 5);

    // No consumer, and the owner's point: after it, with no look at the fallback.
    let (pointed, from) = memory_pull::open(&js, spec("pointed"), Some(3), not_looked_up())
        .await
        .unwrap();
    assert_eq!((start_of(&pointed), from), (after(3), 3));
    assert_eq!(next_seq(&pointed).await, 4);

    // A point beyond the stream's last message (the stream was made again) is ignored,
    // and the fallback's own start is taken.
    let fallback = std::future::ready(Ok(after(1)));
    let (fresh, from) = memory_pull::open(&js, spec("fresh"), Some(100), fallback)
        .await
        .unwrap();
    assert_eq!((start_of(&fresh), from), (after(1), 1));

    // The broker restarts and forgets what it held in memory: the consumer starts after
    // the owner's point, not at its fallback.
    server.restart();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let reopened = loop {
        match memory_pull::open(&js, spec("mine"), Some(4), not_looked_up()).await {
            Ok(opened) => break Some(opened),
            Err(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(_) => break None,
        }
    };
    let (mine, from) = reopened.expect("the consumer opens once the broker is back");
    assert_eq!((start_of(&mine), from), (after(4), 4));
    assert_eq!(next_seq(&mine).await, 5);
}
