//! The run stream across a 1 → 2 replica handover (issue #18): a client reads the first
//! events of a live run from replica A; replica B joins and A stops, so the run's
//! partition moves to B; the client reconnects to B with `Last-Event-ID` and gets exactly
//! the rest, ending with the terminal event.

use crate::common::start_with_grpc;
use std::time::Duration;
use streamgate_bus::subject::RunAddr;
use streamgate_grammar::{Envelope, Event, RunEvent};
use streamgate_projector::{start, ChannelConfig, ChannelSink, Running};
use streamgate_testkit::{poll_until, NatsServer};
use tokio_util::sync::CancellationToken;

type R = Result<(), Box<dyn std::error::Error>>;

const TOKEN: &str = "run-stream-token";

const RUN: &[&str] = &[
    r#"{"seq":1,"stream":"lifecycle","data":{"phase":"start","provider":"anthropic","model":"m"}}"#,
    r#"{"seq":2,"stream":"thinking","data":{"variant":"raw","phase":"start","id":"t"}}"#,
    r#"{"seq":3,"stream":"thinking","data":{"variant":"raw","delta":"Look it up. ","id":"t"}}"#,
    r#"{"seq":4,"stream":"thinking","data":{"variant":"raw","phase":"end","id":"t"}}"#,
    r#"{"seq":5,"stream":"assistant","data":{"id":"a","phase":"commentary","delta":"It is "}}"#,
    r#"{"seq":6,"stream":"assistant","data":{"id":"a","phase":"commentary","delta":"sunny."}}"#,
    r#"{"seq":7,"stream":"assistant","data":{"id":"a","phase":"final_answer","text":"It is sunny."}}"#,
    r#"{"seq":8,"stream":"lifecycle","data":{"phase":"end","reason":"completed","status":"completed"}}"#,
];

fn web_channel() -> ChannelConfig {
    let mut c = ChannelConfig::new(
        "web",
        ChannelSink::Web {
            listen: ([127, 0, 0, 1], 0).into(),
        },
    );
    c.token = Some(TOKEN.into());
    c
}

async fn publish(js: &async_nats::jetstream::Context, lines: &[&str]) -> R {
    let evs: Vec<RunEvent> = lines
        .iter()
        .map(|l| {
            Ok(RunEvent {
                envelope: Envelope {
                    tenant: "acme".into(),
                    session_key: Some("chat-1".into()),
                    run_id: "handover".into(),
                    ts_ms: 1_700_000_000_000,
                },
                event: Event::from_json(l)?,
            })
        })
        .collect::<Result<_, Box<dyn std::error::Error>>>()?;
    let addr = RunAddr::parse("acme", "handover", streamgate_bus::DEFAULT_PARTITIONS).unwrap();
    streamgate_bus::events::publish_events(js, &addr, &evs).await?;
    Ok(())
}

/// SSE message ids of a run stream, reading at most `max` messages.
async fn ids(web: std::net::SocketAddr, last: Option<&str>, max: usize) -> Vec<String> {
    use futures::StreamExt as _;
    let mut req = reqwest::Client::new()
        .get(format!("http://{web}/v1/runs/acme/handover/events"))
        .bearer_auth(TOKEN);
    if let Some(l) = last {
        req = req.header("Last-Event-ID", l);
    }
    let Ok(resp) = req.send().await else {
        return Vec::new();
    };
    let mut body = resp.bytes_stream();
    let (mut buf, mut out) = (String::new(), Vec::new());
    while let Some(Ok(chunk)) = body.next().await {
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            if let Some(id) = block.lines().find_map(|l| l.strip_prefix("id:")) {
                out.push(id.trim().to_owned());
                if out.len() >= max {
                    return out;
                }
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_run_stream_resumes_across_a_replica_handover() -> R {
    let (nats, js) = NatsServer::with_streams().await;
    let stop_a = CancellationToken::new();
    let a: Running = start(nats.client().await, web_channel(), None, stop_a.clone()).await?;
    let web_a = a.web.ok_or("replica A has no web address")?;
    publish(&js, &RUN[..5]).await?;
    let first = tokio::time::timeout(Duration::from_secs(10), ids(web_a, None, 3)).await?;
    assert_eq!(first, ["1", "2", "3"]);
    // 1 → 2: B joins, then A stops; B ends up with every partition.
    let b: Running = start(
        nats.client().await,
        web_channel(),
        None,
        CancellationToken::new(),
    )
    .await?;
    let web_b = b.web.ok_or("replica B has no web address")?;
    stop_a.cancel();
    let mut a_tasks = a.tasks;
    while a_tasks.join_next().await.is_some() {}
    assert!(
        poll_until(Duration::from_secs(30), || b.partitions.borrow().len()
            == streamgate_bus::DEFAULT_PARTITIONS as usize)
        .await,
        "B never took A's partitions"
    );
    publish(&js, &RUN[5..]).await?;
    let rest =
        tokio::time::timeout(Duration::from_secs(10), ids(web_b, Some("3"), usize::MAX)).await?;
    assert_eq!(rest, ["4", "5", "6", "7", "8"], "exactly the rest, from B");
    Ok(())
}

/// Issue #18: every channel serves the run stream, not only web channels. A channel
/// without a page serves it on its `ProjectorService` port (HTTP/1.1 beside gRPC),
/// behind the channel's token: 401 with a JSON reason without it, the run's events with
/// it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_without_a_page_serves_the_run_stream_beside_its_grpc_service() -> R {
    let (nats, js) = NatsServer::with_streams().await;
    let mut cfg = ChannelConfig::new(
        "plain",
        ChannelSink::Sink(streamgate_sinks::SinkConfig::Plain(
            streamgate_sinks::plain::PlainConfig {
                name: "plain".into(),
                target: streamgate_sinks::plain::PlainTarget::Stderr,
            },
        )),
    );
    cfg.token = Some(TOKEN.into());
    cfg.cors_origins = vec!["http://app.example".into()];
    let running = start_with_grpc(&nats, cfg).await?;
    let grpc = running.grpc.ok_or("no gRPC address")?;
    publish(&js, RUN).await?;
    let url = format!("http://{grpc}/v1/runs/acme/handover/events");
    let refused = reqwest::Client::new().get(&url).send().await?;
    assert_eq!(refused.status(), 401);
    let why: serde_json::Value = refused.json().await?;
    assert_eq!(why["code"], "unauthorized", "{why}");
    let got = tokio::time::timeout(Duration::from_secs(10), ids(grpc, None, usize::MAX)).await?;
    assert_eq!(got, ["1", "2", "3", "4", "5", "6", "7", "8"]);
    // CORS for the configured origin only: the preflight (no token) is answered, the
    // stream carries the origin; another origin gets no grant.
    let client = reqwest::Client::new();
    let pre = client
        .request(reqwest::Method::OPTIONS, &url)
        .header("Origin", "http://app.example")
        .header("Access-Control-Request-Method", "GET")
        .header(
            "Access-Control-Request-Headers",
            "authorization,last-event-id",
        )
        .send()
        .await?;
    assert!(pre.status().is_success(), "{}", pre.status());
    assert_eq!(
        pre.headers()["access-control-allow-origin"],
        "http://app.example"
    );
    let ended = format!("{url}?after=8");
    let ok = client
        .get(&ended)
        .header("Origin", "http://app.example")
        .bearer_auth(TOKEN)
        .send()
        .await?;
    assert_eq!(
        ok.headers()["access-control-allow-origin"],
        "http://app.example"
    );
    let other = client
        .get(&ended)
        .header("Origin", "http://evil.example")
        .bearer_auth(TOKEN)
        .send()
        .await?;
    assert!(other.headers().get("access-control-allow-origin").is_none());
    // gRPC still answers on the same port.
    let mut client = streamgate_proto::v1::projector_service_client::ProjectorServiceClient::new(
        tonic::transport::Channel::from_shared(format!("http://{grpc}"))?
            .connect()
            .await?,
    );
    let status = client
        .list_active_runs(streamgate_proto::v1::ListActiveRunsRequest {})
        .await
        .expect_err("no token");
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    Ok(())
}
