//! The ingest front doors against a real nats-server: the id rule, one ingest per run,
//! a gRPC stream bound to its first run, size limits, and the bearer scheme.

use bytes::Bytes;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;
use streamgate_bus::consume::read_subject;
use streamgate_bus::subject::RunAddr;
use streamgate_bus::{DEFAULT_PARTITIONS, RAW_STREAM};
use streamgate_normalizer::{Listeners, NormalizerConfig};
use streamgate_proto::v1::ingest_service_client::IngestServiceClient;
use streamgate_proto::v1::{IngestAck, IngestChunk, ResumePointRequest};
use streamgate_testkit::NatsServer;
use tokio_util::sync::CancellationToken;
use tonic::Code;

const TOKEN: &str = "front-door-token";
const CAPTURE: &[u8] = b"data: {\"type\":\"message_stop\"}\n\n";

struct Doors {
    _nats: NatsServer,
    /// The normalizer's own connection (its statistics tell whether it reconnected).
    client: async_nats::Client,
    js: async_nats::jetstream::Context,
    http: SocketAddr,
    grpc: SocketAddr,
    stop: CancellationToken,
    _tasks: tokio::task::JoinSet<anyhow::Result<()>>,
}

impl Drop for Doors {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn start() -> Doors {
    let nats = NatsServer::start();
    let client = nats.client().await;
    let stop = CancellationToken::new();
    let running = streamgate_normalizer::start(
        client.clone(),
        NormalizerConfig::default(),
        Listeners {
            grpc: Some("127.0.0.1:0".parse().unwrap()),
            http: Some("127.0.0.1:0".parse().unwrap()),
            ingest_token: Some(TOKEN.into()),
            partitions: DEFAULT_PARTITIONS,
        },
        stop.clone(),
    )
    .await
    .expect("start normalizer");
    Doors {
        _tasks: running.tasks,
        js: nats.jetstream().await,
        _nats: nats,
        client,
        http: running.http.unwrap(),
        grpc: running.grpc.unwrap(),
        stop,
    }
}

impl Doors {
    fn url(&self, tenant: &str, run: &str, query: &str) -> String {
        format!(
            "http://{}/v1/ingest/{}/{}?family=f1{query}",
            self.http,
            pct(tenant),
            pct(run)
        )
    }

    async fn post(&self, tenant: &str, run: &str, query: &str, auth: &str) -> (u16, String) {
        let resp = reqwest::Client::new()
            .post(self.url(tenant, run, query))
            .header("Authorization", auth)
            .body(CAPTURE)
            .send()
            .await
            .expect("http ingest");
        (resp.status().as_u16(), resp.text().await.unwrap())
    }

    async fn grpc(
        &self,
        auth: &str,
    ) -> IngestServiceClient<
        tonic::service::interceptor::InterceptedService<
            tonic::transport::Channel,
            impl tonic::service::Interceptor,
        >,
    > {
        let channel = tonic::transport::Channel::from_shared(format!("http://{}", self.grpc))
            .unwrap()
            .connect()
            .await
            .expect("connect gRPC");
        let value: tonic::metadata::MetadataValue<_> = auth.parse().unwrap();
        IngestServiceClient::with_interceptor(channel, move |mut req: tonic::Request<()>| {
            req.metadata_mut().insert("authorization", value.clone());
            Ok(req)
        })
        .max_encoding_message_size(usize::MAX)
    }

    /// Sends `chunks` on one stream; the acks, then the status the stream ended with.
    async fn stream(&self, chunks: Vec<IngestChunk>) -> (Vec<IngestAck>, Option<tonic::Status>) {
        let mut client = self.grpc(&format!("Bearer {TOKEN}")).await;
        let mut acks = Vec::new();
        let mut stream = match client.ingest(futures::stream::iter(chunks)).await {
            Ok(r) => r.into_inner(),
            Err(s) => return (acks, Some(s)),
        };
        loop {
            match stream.message().await {
                Ok(Some(a)) => acks.push(a),
                Ok(None) => return (acks, None),
                Err(s) => return (acks, Some(s)),
            }
        }
    }

    /// Raw messages stored for a run.
    async fn stored(&self, tenant: &str, run: &str) -> usize {
        let addr = RunAddr::new(tenant, run, DEFAULT_PARTITIONS);
        read_subject(&self.js, RAW_STREAM, &addr.raw_subject())
            .await
            .expect("read run")
            .len()
    }

    /// A normal ingest at both doors succeeds promptly, and the normalizer never had to
    /// reconnect to NATS.
    async fn still_healthy(&self, tag: &str) {
        let run = format!("healthy-{tag}");
        let (code, body) = tokio::time::timeout(
            Duration::from_secs(3),
            self.post("acme", &run, "", &format!("Bearer {TOKEN}")),
        )
        .await
        .expect("HTTP ingest is prompt");
        assert_eq!(code, 200, "{body}");
        let (acks, status) = tokio::time::timeout(
            Duration::from_secs(3),
            self.stream(run_chunks("acme", &format!("{run}-grpc"))),
        )
        .await
        .expect("gRPC ingest is prompt");
        assert!(status.is_none(), "{status:?}");
        assert_eq!(acks.len(), 2);
        assert_eq!(
            self.client.statistics().connects.load(Ordering::Relaxed),
            1,
            "the normalizer's NATS connection was dropped"
        );
        assert_eq!(
            self.client.connection_state(),
            async_nats::connection::State::Connected
        );
    }
}

/// Percent-encodes every byte outside `[A-Za-z0-9_-]`.
fn pct(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn chunk(tenant: &str, run: &str, index: u64, body: &[u8], close: bool) -> IngestChunk {
    IngestChunk {
        tenant: tenant.into(),
        run_id: run.into(),
        session_key: None,
        family: "f1".into(),
        dialect: None,
        chunk: index,
        body: body.to_vec(),
        close: close.then(|| "normal".into()),
    }
}

/// One data chunk and the close marker.
fn run_chunks(tenant: &str, run: &str) -> Vec<IngestChunk> {
    vec![
        chunk(tenant, run, 0, CAPTURE, false),
        chunk(tenant, run, 1, b"", true),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_breaking_the_rule_are_refused_and_the_connection_survives() {
    let d = start().await;
    let auth = format!("Bearer {TOKEN}");
    let long = "r".repeat(257);
    let huge = "r".repeat(4100);
    // (tenant, run, session, what the message must say)
    let cases: Vec<(&str, &str, Option<&str>, &str)> = vec![
        ("acme", "run\n1", None, "run id: no control characters"),
        ("acme", &long, None, "run id: at most 256 bytes (got 257)"),
        ("acme", &huge, None, "run id: at most 256 bytes (got 4100)"),
        (&huge, "run", None, "tenant: at most 256 bytes (got 4100)"),
        ("acme", "run", Some("s\r\nX-Evil: 1"), "session: no control"),
    ];
    for (tenant, run, session, want) in &cases {
        let query = session.map_or(String::new(), |s| format!("&session={}", pct(s)));
        let (code, body) = d.post(tenant, run, &query, &auth).await;
        assert_eq!(code, 400, "HTTP {want}: {body}");
        assert!(body.contains(want), "HTTP: {body:?} should say {want:?}");

        let mut c = chunk(tenant, run, 0, CAPTURE, false);
        c.session_key = session.map(str::to_owned);
        let (acks, status) = d.stream(vec![c]).await;
        assert!(acks.is_empty());
        let status = status.expect("a non-OK status");
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "gRPC {want}: {status:?}"
        );
        assert!(status.message().contains(want), "gRPC: {status:?}");
        if tenant.len() + run.len() < 1024 {
            // (A subject of kilobytes cannot even be looked up: that is the point.)
            assert_eq!(d.stored(tenant, run).await, 0);
        }
    }
    // ResumePoint applies the rule too.
    let status = d
        .grpc(&auth)
        .await
        .resume_point(ResumePointRequest {
            tenant: "acme".into(),
            run_id: huge.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("at most 256 bytes"), "{status:?}");
    d.still_healthy("ids").await;

    // 256 bytes (multi-byte UTF-8 included) is inside the rule and is stored.
    let max = format!("{}é", "r".repeat(254));
    assert_eq!(max.len(), 256);
    let (code, body) = d.post(&"t".repeat(256), &max, "", &auth).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(d.stored(&"t".repeat(256), &max).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_ingested_by_one_request_at_a_time() {
    let d = start().await;
    let auth = format!("Bearer {TOKEN}");
    // Request A: a body that stays open after its first chunk is stored.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    let a = {
        let url = d.url("acme", "busy", "&chunk_bytes=4");
        let auth = auth.clone();
        tokio::spawn(async move {
            let body = reqwest::Body::wrap_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
            let resp = reqwest::Client::new()
                .post(url)
                .header("Authorization", auth)
                .body(body)
                .send()
                .await
                .expect("request A");
            (resp.status().as_u16(), resp.text().await.unwrap())
        })
    };
    tx.send(Ok(Bytes::from_static(b"data"))).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while d.stored("acme", "busy").await == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "A's first chunk never stored"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // B, concurrently: refused, nothing of it stored.
    let (code, body) = d.post("acme", "busy", "", &auth).await;
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("being ingested by another request"), "{body}");
    // The gRPC door shares the registry.
    let (acks, status) = d.stream(vec![chunk("acme", "busy", 1, b"x", false)]).await;
    assert!(acks.is_empty());
    let status = status.expect("ABORTED");
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert_eq!(d.stored("acme", "busy").await, 1);
    // The lock is per (tenant, run): the same run id under another tenant is another
    // run, ingested while A still holds acme's, at both doors.
    let (code, body) = d.post("globex", "busy", "", &auth).await;
    assert_eq!(code, 200, "{body}");
    let (acks, status) = d
        .stream(vec![chunk("initech", "busy", 0, CAPTURE, false)])
        .await;
    assert!(status.is_none(), "{status:?}");
    assert_eq!(acks.len(), 1);
    assert_eq!(d.stored("acme", "busy").await, 1);
    // A finishes: 200, and only its bytes are in the run.
    tx.send(Ok(Bytes::from_static(b": {}\n\n"))).await.unwrap();
    drop(tx);
    let (code, body) = a.await.unwrap();
    assert_eq!(code, 200, "{body}");
    let raw: Vec<u8> = {
        let addr = RunAddr::new("acme", "busy", DEFAULT_PARTITIONS);
        read_subject(&d.js, RAW_STREAM, &addr.raw_subject())
            .await
            .unwrap()
            .iter()
            .flat_map(|m| m.payload.to_vec())
            .collect()
    };
    assert_eq!(raw, b"data: {}\n\n");

    // A gRPC stream holds its run until it ends; then the run is free again.
    let mut client = d.grpc(&auth).await;
    let (gtx, grx) = tokio::sync::mpsc::channel(4);
    gtx.send(chunk("acme", "held", 0, CAPTURE, false))
        .await
        .unwrap();
    let mut acks = client
        .ingest(tokio_stream::wrappers::ReceiverStream::new(grx))
        .await
        .unwrap()
        .into_inner();
    assert!(acks.message().await.unwrap().is_some());
    let (code, body) = d.post("acme", "held", "", &auth).await;
    assert_eq!(code, 409, "{body}");
    drop(gtx);
    assert!(acks.message().await.unwrap().is_none());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (acks, status) = d.stream(vec![chunk("acme", "held", 1, b"", true)]).await;
        match status {
            None => {
                assert_eq!(acks.len(), 1);
                break;
            }
            Some(s) if s.code() == Code::Aborted && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Some(s) => panic!("the run was not released: {s:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_stream_is_bound_to_its_first_run() {
    let d = start().await;
    // A closed run and a fresh one: neither may receive another stream's chunk.
    let (code, _) = d
        .post("acme", "closed", "", &format!("Bearer {TOKEN}"))
        .await;
    assert_eq!(code, 200);
    assert_eq!(d.stored("acme", "closed").await, 2);
    for (tenant, other) in [("acme", "closed"), ("acme", "fresh"), ("other", "first")] {
        let (acks, status) = d
            .stream(vec![
                chunk("acme", "first", 0, CAPTURE, false),
                chunk(tenant, other, 1, b"stray", false),
            ])
            .await;
        assert_eq!(acks.len(), 1, "{tenant}/{other}");
        let status = status.expect("INVALID_ARGUMENT");
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().contains("one run"),
            "{status:?} should explain the binding"
        );
    }
    assert_eq!(d.stored("acme", "closed").await, 2);
    assert_eq!(d.stored("acme", "fresh").await, 0);
    assert_eq!(d.stored("other", "first").await, 0);
    assert_eq!(d.stored("acme", "first").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_grpc_message_ends_the_stream_with_an_error() {
    let d = start().await;
    let big = vec![b'x'; 5 << 20];
    let (acks, status) = d
        .stream(vec![
            chunk("acme", "big", 0, CAPTURE, false),
            chunk("acme", "big", 1, &big, false),
        ])
        .await;
    assert!(acks.len() <= 1, "{acks:?}");
    let status = status.expect("a 5 MiB message must not end the stream with OK");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("too large"), "{status:?}");
    assert!(d.stored("acme", "big").await <= 1);
    d.still_healthy("big").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_scheme_is_case_insensitive() {
    let d = start().await;
    for (i, scheme) in ["bearer", "BEARER", "Bearer"].into_iter().enumerate() {
        let auth = format!("{scheme} {TOKEN}");
        let (code, body) = d.post("acme", &format!("case-{i}"), "", &auth).await;
        assert_eq!(code, 200, "{scheme}: {body}");
        let mut client = d.grpc(&auth).await;
        let point = client
            .resume_point(ResumePointRequest {
                tenant: "acme".into(),
                run_id: format!("case-{i}"),
            })
            .await
            .expect("gRPC with a lower-case scheme");
        assert!(point.into_inner().closed);
    }
    let (code, _) = d.post("acme", "nope", "", "bearer wrong").await;
    assert_eq!(code, 401);
    let (code, _) = d.post("acme", "nope", "", &format!("Basic {TOKEN}")).await;
    assert_eq!(code, 401);
    let status = d
        .grpc("bearer wrong")
        .await
        .resume_point(ResumePointRequest {
            tenant: "acme".into(),
            run_id: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
}
