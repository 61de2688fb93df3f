//! The ingest front doors against a real nats-server: the id rule, one ingest per run,
//! a gRPC stream bound to its first run, size limits, the bearer scheme, and tokens
//! scoped to tenants; both doors over mTLS.

use bytes::Bytes;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;
use streamgate_bus::consume::read_subject;
use streamgate_bus::subject::{encode_token, partition_of, RunAddr};
use streamgate_bus::{DEFAULT_PARTITIONS, RAW_STREAM};
use streamgate_normalizer::{Listeners, NormalizerConfig};
use streamgate_proto::v1::ingest_service_client::IngestServiceClient;
use streamgate_proto::v1::{IngestAck, IngestChunk, ResumePointRequest};
use streamgate_runtime::serve::{ClientTlsArgs, ServeOptions, TlsFiles};
use streamgate_testkit::pki::TestPki;
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
    start_with(None).await
}

/// A normalizer requiring [`TOKEN`] (every tenant) and, when given, a token file's
/// tokens scoped to tenants.
async fn start_with(tokens: Option<std::path::PathBuf>) -> Doors {
    start_opts(tokens, ServeOptions::default()).await
}

/// [`start_with`], the doors served with `serve` (TLS, limits).
async fn start_opts(tokens: Option<std::path::PathBuf>, serve: ServeOptions) -> Doors {
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
            ingest_tokens: tokens,
            partitions: DEFAULT_PARTITIONS,
            serve,
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
        self.stream_as(&format!("Bearer {TOKEN}"), chunks).await
    }

    /// [`Doors::stream`] with the `authorization` value `auth`.
    async fn stream_as(
        &self,
        auth: &str,
        chunks: Vec<IngestChunk>,
    ) -> (Vec<IngestAck>, Option<tonic::Status>) {
        let mut client = self.grpc(auth).await;
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
        // Written by hand: a `RunAddr` cannot hold ids that break the rule.
        let subject = format!(
            "sg.raw.{}.{}.{}",
            encode_token(tenant),
            partition_of(run, DEFAULT_PARTITIONS),
            encode_token(run)
        );
        read_subject(&self.js, RAW_STREAM, &subject)
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
        let addr = RunAddr::parse("acme", "busy", DEFAULT_PARTITIONS).unwrap();
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

const ACME_TOKEN: &str = "acme-only-token-0123456789";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_write_only_their_tenants() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ingest-tokens");
    std::fs::write(&file, format!("# scoped\n{ACME_TOKEN} acme,globex\n")).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let d = start_with(Some(file)).await;
    let acme = format!("Bearer {ACME_TOKEN}");
    // HTTP: own tenant 200, another tenant 403, no/unknown token 401 naming the rule.
    let (code, body) = d.post("acme", "scoped-1", "", &acme).await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = d.post("initech", "scoped-2", "", &acme).await;
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("may not write tenant"), "{body}");
    assert!(!body.contains(ACME_TOKEN), "{body}");
    let resp = reqwest::Client::new()
        .post(d.url("acme", "scoped-3", ""))
        .body(CAPTURE)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    assert_eq!(
        resp.headers().get("www-authenticate").map(|v| v.as_bytes()),
        Some(&b"Bearer"[..])
    );
    let body = resp.text().await.unwrap();
    assert!(body.contains("Authorization: Bearer"), "{body}");
    // The all-tenant token still writes anyone.
    let (code, body) = d
        .post("initech", "scoped-4", "", &format!("Bearer {TOKEN}"))
        .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(d.stored("initech", "scoped-2").await, 0);

    // gRPC: the same rules, PERMISSION_DENIED for another tenant.
    let mut client = d.grpc(&acme).await;
    let denied = client
        .resume_point(ResumePointRequest {
            tenant: "initech".into(),
            run_id: "scoped-5".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    let (acks, status) = d.stream_as(&acme, run_chunks("initech", "scoped-5")).await;
    assert!(acks.is_empty(), "{acks:?}");
    assert_eq!(status.map(|s| s.code()), Some(Code::PermissionDenied));
    assert_eq!(d.stored("initech", "scoped-5").await, 0);
    let (acks, status) = d.stream_as(&acme, run_chunks("globex", "scoped-6")).await;
    assert!(status.is_none(), "{status:?}");
    assert!(acks.last().is_some_and(|a| a.close), "{acks:?}");
    let status = d
        .grpc("Bearer not-a-token-at-all")
        .await
        .resume_point(ResumePointRequest {
            tenant: "acme".into(),
            run_id: "scoped-7".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_doors_over_mtls() {
    let pki = TestPki::new();
    let d = start_opts(
        None,
        ServeOptions {
            tls: Some(TlsFiles {
                cert: pki.server.cert.clone(),
                key: pki.server.key.clone(),
                client_ca: Some(pki.ca.clone()),
            }),
            ..ServeOptions::default()
        },
    )
    .await;
    // gRPC: a client with the CA and a client certificate ingests a run.
    let tls = ClientTlsArgs {
        ca: Some(pki.ca.clone()),
        client_cert: Some(pki.client.cert.clone()),
        client_key: Some(pki.client.key.clone()),
    };
    let channel = tls
        .endpoint(&d.grpc.to_string())
        .unwrap()
        .connect()
        .await
        .expect("mTLS connect");
    let token: tonic::metadata::MetadataValue<_> = format!("Bearer {TOKEN}").parse().unwrap();
    let mut client =
        IngestServiceClient::with_interceptor(channel, move |mut r: tonic::Request<()>| {
            r.metadata_mut().insert("authorization", token.clone());
            Ok(r)
        });
    let mut acks = client
        .ingest(futures::stream::iter(run_chunks("acme", "tls-grpc")))
        .await
        .expect("ingest over mTLS")
        .into_inner();
    let mut last = None;
    while let Some(a) = acks.message().await.expect("acks") {
        last = Some(a);
    }
    assert!(last.is_some_and(|a| a.close));
    assert_eq!(d.stored("acme", "tls-grpc").await, 2);
    // Without a client certificate: refused at the handshake.
    let no_cert = ClientTlsArgs {
        ca: Some(pki.ca.clone()),
        ..Default::default()
    };
    let refused = match no_cert
        .endpoint(&d.grpc.to_string())
        .unwrap()
        .connect()
        .await
    {
        Err(_) => true,
        Ok(ch) => IngestServiceClient::new(ch)
            .resume_point(ResumePointRequest::default())
            .await
            .is_err(),
    };
    assert!(refused, "a client without a certificate was served");

    // HTTP: the same over https.
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&pki.ca).unwrap()).unwrap();
    let mut pem = std::fs::read(&pki.client.cert).unwrap();
    pem.extend(std::fs::read(&pki.client.key).unwrap());
    let https = |identity: bool| {
        let mut b = reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(ca.clone());
        if identity {
            b = b.identity(reqwest::Identity::from_pem(&pem).unwrap());
        }
        b.build().unwrap()
    };
    let url = format!("https://{}/v1/ingest/acme/tls-http?family=f1", d.http);
    let resp = https(true)
        .post(&url)
        .header("Authorization", format!("Bearer {TOKEN}"))
        .body(CAPTURE)
        .send()
        .await
        .expect("HTTP ingest over mTLS");
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(d.stored("acme", "tls-http").await, 2);
    assert!(https(false)
        .post(&url)
        .header("Authorization", format!("Bearer {TOKEN}"))
        .body(CAPTURE)
        .send()
        .await
        .is_err());
    // Plain HTTP to the TLS door gets nothing either.
    assert!(reqwest::Client::new()
        .post(format!(
            "http://{}/v1/ingest/acme/tls-plain?family=f1",
            d.http
        ))
        .body(CAPTURE)
        .send()
        .await
        .is_err());
}

/// A POST that failed part-way left chunks stored; sending the same body again skips
/// the bytes already stored, whatever the cut: the run holds every byte once, closed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_http_body_skips_the_bytes_already_stored() {
    let d = start().await;
    let auth = format!("Bearer {TOKEN}");
    // What the failed attempt stored: 11 bytes in two chunks of odd sizes.
    let (acks, status) = d
        .stream(vec![
            chunk("acme", "resent", 0, &CAPTURE[..8], false),
            chunk("acme", "resent", 1, &CAPTURE[8..11], false),
        ])
        .await;
    assert!(status.is_none(), "{status:?}");
    assert_eq!(acks.len(), 2);
    let (code, body) = d.post("acme", "resent", "&chunk_bytes=8", &auth).await;
    assert_eq!(code, 200, "{body}");
    let reply: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(reply["skipped_bytes"], 11, "{body}");
    assert_eq!(raw_of(&d, "acme", "resent").await, (CAPTURE.to_vec(), 1));
}

/// Every raw byte of a run in chunk order, and how many close markers it has.
async fn raw_of(d: &Doors, tenant: &str, run: &str) -> (Vec<u8>, usize) {
    let addr = RunAddr::parse(tenant, run, DEFAULT_PARTITIONS).unwrap();
    let msgs = read_subject(&d.js, RAW_STREAM, &addr.raw_subject())
        .await
        .unwrap();
    let closes = msgs
        .iter()
        .filter(|m| {
            m.headers
                .as_ref()
                .is_some_and(|h| h.get("Sg-Close").is_some())
        })
        .count();
    (
        msgs.iter().flat_map(|m| m.payload.to_vec()).collect(),
        closes,
    )
}

/// A thinking turn sent by a sender that pauses before its last frames (default chunk
/// size): every byte sent before the pause is stored while the body is still open —
/// complete lines at once, a frame still incomplete after the idle flush.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_ingest_is_live_while_the_sender_pauses() {
    let d = start().await;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    let url = d.url("acme", "live", "");
    let req = tokio::spawn(async move {
        let body = reqwest::Body::wrap_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
        let resp = reqwest::Client::new()
            .post(url)
            .header("Authorization", format!("Bearer {TOKEN}"))
            .body(body)
            .send()
            .await
            .expect("live request");
        (resp.status().as_u16(), resp.text().await.unwrap())
    });
    let mut sent = Vec::new();
    for part in [
        &b"data: {\"type\":\"ping\"}\n\n"[..],
        b"data: {\"type\":\"content_block_delta\"}\n\n",
        b"data: {\"type\":\"mess",
    ] {
        sent.extend_from_slice(part);
        tx.send(Ok(Bytes::copy_from_slice(part))).await.unwrap();
        // Stored within a second each, the body still open.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        loop {
            let (raw, closes) = raw_of(&d, "acme", "live").await;
            if raw == sent {
                assert_eq!(closes, 0);
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "not live: {} of {} bytes stored",
                raw.len(),
                sent.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    tx.send(Ok(Bytes::from_static(b"age_stop\"}\n\n")))
        .await
        .unwrap();
    drop(tx);
    let (code, body) = req.await.unwrap();
    assert_eq!(code, 200, "{body}");
    sent.extend_from_slice(b"age_stop\"}\n\n");
    assert_eq!(raw_of(&d, "acme", "live").await, (sent, 1));
}

/// A connection cut mid-body leaves the run open (no close marker), and the whole body
/// sent again — cut differently — stores every byte once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_http_body_resent_whole_is_stored_once() {
    let d = start().await;
    let whole: Vec<u8> = (0..40)
        .flat_map(|i| format!("data: {{\"n\":{i}}}\n\n").into_bytes())
        .collect();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    let url = d.url("acme", "cut", "");
    let req = tokio::spawn(async move {
        let body = reqwest::Body::wrap_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
        reqwest::Client::new()
            .post(url)
            .header("Authorization", format!("Bearer {TOKEN}"))
            .body(body)
            .send()
            .await
    });
    // 3 pieces of 101 bytes (cuts inside frames), each stored live, then the cut.
    for piece in whole[..303].chunks(101) {
        tx.send(Ok(Bytes::copy_from_slice(piece))).await.unwrap();
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while raw_of(&d, "acme", "cut").await.0.len() < 303 {
        assert!(tokio::time::Instant::now() < deadline, "not stored live");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tx.send(Err(std::io::Error::other("connection cut")))
        .await
        .unwrap();
    assert!(req.await.unwrap().is_err(), "the request broke off");
    assert_eq!(raw_of(&d, "acme", "cut").await.1, 0, "no close on a cut");
    // The resend (the claim is released once the cut request's handler ended).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let reply = loop {
        let resp = reqwest::Client::new()
            .post(d.url("acme", "cut", "&chunk_bytes=1024"))
            .header("Authorization", format!("Bearer {TOKEN}"))
            .body(whole.clone())
            .send()
            .await
            .unwrap();
        let code = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        if code == 200 {
            break text;
        }
        assert!(
            (code == 409 || code == 503) && tokio::time::Instant::now() < deadline,
            "{code} {text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let reply: serde_json::Value = serde_json::from_str(&reply).unwrap();
    assert_eq!(reply["skipped_bytes"], 303, "{reply}");
    assert_eq!(raw_of(&d, "acme", "cut").await, (whole, 1));
}

/// Lines that arrive while the body's previous chunk is on its way to the broker go out
/// together once its ack is back: a sender faster than a publish's round trip gets fewer
/// chunks than frames (less work for the broker per byte), and the run still holds every
/// byte once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lines_arriving_while_a_chunk_is_in_flight_share_the_next_chunk() {
    let d = start().await;
    let lines: Vec<Bytes> = (0..300)
        .map(|i| Bytes::from(format!("data: {{\"n\":{i}}}\n\n")))
        .collect();
    let whole = lines.concat();
    let frames = futures::stream::iter(lines.into_iter().map(Ok::<_, std::io::Error>));
    let resp = reqwest::Client::new()
        .post(d.url("acme", "burst", ""))
        .header("Authorization", format!("Bearer {TOKEN}"))
        .body(reqwest::Body::wrap_stream(frames))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let reply: serde_json::Value = resp.json().await.unwrap();
    let chunks = reply["chunks"].as_u64().unwrap();
    assert!(
        (1..300).contains(&chunks),
        "300 frames sent back to back made {chunks} chunks"
    );
    assert_eq!(raw_of(&d, "acme", "burst").await, (whole, 1));
}
