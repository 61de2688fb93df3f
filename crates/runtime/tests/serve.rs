//! The shared server start (`streamgate_runtime::serve`) with certificates made in the
//! test: gRPC and HTTP over TLS, mTLS (a client without a certificate from the client
//! CA is refused at the handshake), the bearer interceptor, and the connection limits
//! (connection cap, header-read timeout, idle timeout).

use std::net::SocketAddr;
use std::time::{Duration, Instant};
use streamgate_proto::v1::ingest_service_client::IngestServiceClient;
use streamgate_proto::v1::ingest_service_server::{IngestService, IngestServiceServer};
use streamgate_proto::v1::{IngestAck, IngestChunk, ResumePointReply, ResumePointRequest};
use streamgate_runtime::rpc::{RequireBearer, SendBearer};
use streamgate_runtime::serve::{self, ClientTlsArgs, Limits, ServeOptions, TlsFiles};
use streamgate_testkit::pki::TestPki;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "serve-test-token";

fn tls(pki: &TestPki, mtls: bool) -> ServeOptions {
    ServeOptions {
        tls: Some(TlsFiles {
            cert: pki.server.cert.clone(),
            key: pki.server.key.clone(),
            client_ca: mtls.then(|| pki.ca.clone()),
        }),
        limits: Limits::default(),
    }
}

/// A stand-in IngestService: answers `ResumePoint` with chunk 7.
struct Stub;

#[tonic::async_trait]
impl IngestService for Stub {
    type IngestStream = futures::stream::Empty<Result<IngestAck, tonic::Status>>;

    async fn ingest(
        &self,
        _: tonic::Request<tonic::Streaming<IngestChunk>>,
    ) -> Result<tonic::Response<Self::IngestStream>, tonic::Status> {
        Ok(tonic::Response::new(futures::stream::empty()))
    }

    async fn resume_point(
        &self,
        _: tonic::Request<ResumePointRequest>,
    ) -> Result<tonic::Response<ResumePointReply>, tonic::Status> {
        Ok(tonic::Response::new(ResumePointReply {
            next_chunk: 7,
            closed: false,
        }))
    }
}

/// A gRPC server of [`Stub`] behind the bearer interceptor.
async fn grpc(opts: &ServeOptions, stop: &CancellationToken) -> SocketAddr {
    let s = serve::grpc::start(
        "127.0.0.1:0".parse().unwrap(),
        IngestServiceServer::new(Stub),
        RequireBearer::new(TOKEN),
        opts,
        stop.clone(),
    )
    .await
    .expect("start gRPC");
    tokio::spawn(s.task);
    s.addr
}

async fn health(
    addr: SocketAddr,
    client: &ClientTlsArgs,
    token: Option<&str>,
) -> Result<(), String> {
    let channel = client
        .endpoint(&addr.to_string())
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    let mut c = IngestServiceClient::with_interceptor(channel, SendBearer::new(token));
    c.resume_point(ResumePointRequest::default())
        .await
        .map(|r| assert_eq!(r.into_inner().next_chunk, 7))
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
}

fn client(pki: &TestPki, cert: Option<&streamgate_testkit::pki::CertFiles>) -> ClientTlsArgs {
    ClientTlsArgs {
        ca: Some(pki.ca.clone()),
        client_cert: cert.map(|c| c.cert.clone()),
        client_key: cert.map(|c| c.key.clone()),
    }
}

#[tokio::test]
async fn grpc_over_tls_with_the_bearer_interceptor() {
    let pki = TestPki::new();
    let stop = CancellationToken::new();
    let addr = grpc(&tls(&pki, false), &stop).await;
    health(addr, &client(&pki, None), Some(TOKEN))
        .await
        .expect("TLS round trip");
    let refused = health(addr, &client(&pki, None), Some("wrong")).await;
    assert!(refused.unwrap_err().starts_with("Unauthenticated"));
    // A plaintext client gets nothing from a TLS server.
    assert!(health(addr, &ClientTlsArgs::default(), Some(TOKEN))
        .await
        .is_err());
    stop.cancel();
}

#[tokio::test]
async fn grpc_mtls_refuses_a_client_without_a_trusted_certificate() {
    let pki = TestPki::new();
    let stop = CancellationToken::new();
    let addr = grpc(&tls(&pki, true), &stop).await;
    health(addr, &client(&pki, Some(&pki.client)), Some(TOKEN))
        .await
        .expect("mTLS round trip");
    assert!(health(addr, &client(&pki, None), Some(TOKEN))
        .await
        .is_err());
    assert!(
        health(addr, &client(&pki, Some(&pki.stranger)), Some(TOKEN))
            .await
            .is_err()
    );
    stop.cancel();
}

async fn http(opts: &ServeOptions, stop: &CancellationToken) -> SocketAddr {
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "hello" }))
        .route(
            "/stall",
            axum::routing::get(|| async {
                axum::body::Body::from_stream(futures::stream::pending::<
                    Result<bytes::Bytes, std::io::Error>,
                >())
            }),
        );
    let s = serve::http::start("127.0.0.1:0".parse().unwrap(), app, opts, stop.clone())
        .await
        .expect("start HTTP");
    tokio::spawn(s.task);
    s.addr
}

fn https_client(
    pki: &TestPki,
    cert: Option<&streamgate_testkit::pki::CertFiles>,
) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&pki.ca).unwrap()).unwrap();
    let mut b = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca);
    if let Some(c) = cert {
        let mut pem = std::fs::read(&c.cert).unwrap();
        pem.extend(std::fs::read(&c.key).unwrap());
        b = b.identity(reqwest::Identity::from_pem(&pem).unwrap());
    }
    b.build().unwrap()
}

async fn get(c: &reqwest::Client, addr: SocketAddr) -> Result<String, reqwest::Error> {
    c.get(format!("https://{addr}/"))
        .send()
        .await?
        .error_for_status()?
        .text()
        .await
}

#[tokio::test]
async fn http_over_tls_and_mtls() {
    let pki = TestPki::new();
    let stop = CancellationToken::new();
    let plain_tls = http(&tls(&pki, false), &stop).await;
    assert_eq!(
        get(&https_client(&pki, None), plain_tls).await.unwrap(),
        "hello"
    );
    let mtls = http(&tls(&pki, true), &stop).await;
    assert_eq!(
        get(&https_client(&pki, Some(&pki.client)), mtls)
            .await
            .unwrap(),
        "hello"
    );
    assert!(get(&https_client(&pki, None), mtls).await.is_err());
    assert!(get(&https_client(&pki, Some(&pki.stranger)), mtls)
        .await
        .is_err());
    stop.cancel();
}

#[tokio::test]
async fn bad_tls_files_fail_the_start_naming_the_file() {
    let pki = TestPki::new();
    let stop = CancellationToken::new();
    let mut opts = tls(&pki, false);
    opts.tls.as_mut().unwrap().key = pki.dir().join("missing.key");
    let app = axum::Router::new();
    let err = serve::http::start("127.0.0.1:0".parse().unwrap(), app, &opts, stop.clone())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("missing.key"), "{err}");
    opts.tls.as_mut().unwrap().key = pki.ca.clone();
    let err = serve::http::start(
        "127.0.0.1:0".parse().unwrap(),
        axum::Router::new(),
        &opts,
        stop.clone(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("private key"), "{err}");
}

fn limited(limits: Limits) -> ServeOptions {
    ServeOptions { tls: None, limits }
}

/// Reads until EOF or error; how long that took.
async fn until_closed(s: &mut tokio::net::TcpStream) -> Duration {
    let t = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return t.elapsed(),
            Ok(Ok(_)) => {}
            Err(_) => panic!("connection still open after 10 s"),
        }
    }
}

#[tokio::test]
async fn slow_headers_and_idle_connections_are_closed() {
    let stop = CancellationToken::new();
    let addr = http(
        &limited(Limits {
            max_connections: 16,
            header_read_timeout: Duration::from_millis(500),
            idle_timeout: Duration::from_millis(1500),
            ..Limits::default()
        }),
        &stop,
    )
    .await;
    // A peer that connects and sends nothing: closed at the header-read timeout counted
    // from accept, not at the idle timeout.
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    let took = until_closed(&mut silent).await;
    assert!(took < Duration::from_millis(1200), "closed after {took:?}");
    // Slowloris: half a request line, then nothing.
    let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let took = until_closed(&mut slow).await;
    assert!(took < Duration::from_millis(1400), "closed after {took:?}");
    // A keep-alive connection waiting for its next request: the header-read timeout.
    let mut keep = tokio::net::TcpStream::connect(addr).await.unwrap();
    keep.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let took = until_closed(&mut keep).await;
    assert!(took < Duration::from_millis(1400), "closed after {took:?}");
    // A response on which nothing moves: closed once idle.
    let mut idle = tokio::net::TcpStream::connect(addr).await.unwrap();
    idle.write_all(b"GET /stall HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let took = until_closed(&mut idle).await;
    assert!(
        took >= Duration::from_millis(1000) && took < Duration::from_secs(5),
        "closed after {took:?}"
    );
    stop.cancel();
}

/// Issue #17: a flood of connections that send nothing (no token needed to open one)
/// held every slot until their header timeout, so legitimate requests failed for as
/// long as the flood lasted. Now a new connection closes the longest-silent one.
#[tokio::test]
async fn silent_connections_make_room_for_a_peer_that_speaks() {
    let stop = CancellationToken::new();
    let addr = http(
        &limited(Limits {
            max_connections: 4,
            header_read_timeout: Duration::from_secs(30),
            ..Limits::default()
        }),
        &stop,
    )
    .await;
    let mut flood = Vec::new();
    for _ in 0..12 {
        flood.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = Instant::now();
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut out))
        .await
        .expect("served while the flood holds its connections")
        .unwrap();
    assert!(out.contains("hello"), "{out}");
    eprintln!(
        "served after {:?} behind 12 silent connections",
        t.elapsed()
    );
    stop.cancel();
}

/// Issue #17: one peer address holds at most its share of the slots. At the share its
/// own silent connection makes room; when all of its connections spoke, its new one is
/// refused at once — while another address is still served.
#[tokio::test]
async fn one_address_holds_at_most_its_share_of_the_slots() {
    let stop = CancellationToken::new();
    let addr = http(
        &limited(Limits {
            max_connections: 8,
            max_connections_per_ip: 2,
            header_read_timeout: Duration::from_secs(30),
            ..Limits::default()
        }),
        &stop,
    )
    .await;
    let from = |ip: [u8; 4]| async move {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind((ip, 0).into()).unwrap();
        sock.connect(addr).await.unwrap()
    };
    let served = |mut s: tokio::net::TcpStream| async move {
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut out)).await;
        out.contains("hello")
    };
    // Two silent connections from .1: a third from .1 closes the older one and is served.
    let _quiet = [from([127, 0, 0, 1]).await, from([127, 0, 0, 1]).await];
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        served(from([127, 0, 0, 1]).await).await,
        "a silent one made room"
    );
    // Two keep-alive connections of .1 that spoke: a third from .1 is refused at once.
    let spoke = |ip| async move {
        let mut s = from(ip).await;
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 512];
        let _ = s.read(&mut buf).await.unwrap();
        s
    };
    let _a = spoke([127, 0, 0, 1]).await;
    let _b = spoke([127, 0, 0, 1]).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut refused = from([127, 0, 0, 1]).await;
    let took = until_closed(&mut refused).await;
    assert!(took < Duration::from_secs(2), "refused after {took:?}");
    // Another address still has room.
    assert!(
        served(from([127, 0, 0, 2]).await).await,
        "another address was held up"
    );
    stop.cancel();
}

#[tokio::test]
async fn connections_beyond_the_limit_wait_for_a_free_slot() {
    let stop = CancellationToken::new();
    let addr = http(
        &limited(Limits {
            max_connections: 2,
            ..Limits::default()
        }),
        &stop,
    )
    .await;
    // Two keep-alive connections that spoke (served, now waiting for their next
    // request): they are not closed to make room; a third waits for one to end.
    let open = |addr| async move {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 512];
        let _ = s.read(&mut buf).await.unwrap();
        s
    };
    let a = open(addr).await;
    let b = open(addr).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let request = |mut s: tokio::net::TcpStream| async move {
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    };
    let c = tokio::net::TcpStream::connect(addr).await.unwrap();
    let third = tokio::spawn(request(c));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !third.is_finished(),
        "a third connection was served beyond the limit"
    );
    drop(a);
    let reply = tokio::time::timeout(Duration::from_secs(5), third)
        .await
        .expect("served once a slot was free")
        .unwrap();
    assert!(reply.contains("hello"), "{reply}");
    drop(b);
    stop.cancel();
}

/// Reflection lists what the port serves — its service, health, reflection — not every
/// streamgate service (an ingest port does not advertise the archive's operator API).
#[tokio::test]
async fn reflection_lists_only_the_services_of_the_port() {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    let stop = CancellationToken::new();
    let addr = grpc(&ServeOptions::default(), &stop).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut c = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut replies = c
        .server_reflection_info(futures::stream::iter([request]))
        .await
        .expect("reflection")
        .into_inner();
    let reply = replies.message().await.expect("reply").expect("one reply");
    let Some(MessageResponse::ListServicesResponse(list)) = reply.message_response else {
        panic!("not a service list: {reply:?}");
    };
    let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection",
            "streamgate.v1.IngestService"
        ]
    );
    stop.cancel();
}
