//! One trace across real service processes: a producer's `traceparent` on an HTTP ingest
//! request is continued by the normalizer, the archiver and a projector — each a separate
//! `streamgate` process exporting spans over OTLP/gRPC to a collector this test serves.
//!
//! - `one_trace_follows_a_run_from_ingest_to_archive_and_channel`: every hop's span is in
//!   the producer's trace, each parented on the hop before it (ingest → normalize →
//!   archive / project), and each process names itself in `service.name`.

use crate::common;

use common::{archiver_args, normalizer_args, Backend, Service, TestStore};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use streamgate_bus::local::free_port;
use streamgate_bus::EVENTS_STREAM;

/// A span as the collector received it.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    name: String,
    trace_id: String,
    span_id: String,
    parent: String,
}

/// An OTLP trace collector that keeps what it is sent.
#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<Received>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        let mut got = Vec::new();
        for rs in request.into_inner().resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.as_ref()?.value.as_ref())
                .map(|v| match v {
                    AnyValue::StringValue(s) => s.clone(),
                    other => format!("{other:?}"),
                })
                .unwrap_or_default();
            for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                got.push(Received {
                    service: service.clone(),
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent: hex(&span.parent_span_id),
                });
            }
        }
        self.spans.lock().unwrap().extend(got);
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl Collector {
    /// Serves OTLP/gRPC on a free local port; returns its endpoint URL.
    async fn serve(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let svc = TraceServiceServer::new(self.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        format!("http://{addr}")
    }

    fn in_trace(&self, trace_id: &str) -> Vec<Received> {
        let spans = self.spans.lock().unwrap();
        spans
            .iter()
            .filter(|s| s.trace_id == trace_id)
            .cloned()
            .collect()
    }
}

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PRODUCER_SPAN: &str = "00f067aa0ba902b7";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_follows_a_run_from_ingest_to_archive_and_channel() {
    let collector = Collector::default();
    let otlp = collector.serve().await;
    let (nats, js) = streamgate_testkit::NatsServer::with_streams().await;
    let store = TestStore::new(Backend::Sqlite).await;
    let logs = tempfile::tempdir().unwrap();
    let http_port = free_port().unwrap();
    let with_otlp = |mut args: Vec<String>| {
        args.extend(["--otlp-endpoint".to_owned(), otlp.clone()]);
        args
    };
    let mut normalizer_flags = normalizer_args(&nats.url(), 600);
    let http_flag = normalizer_flags.iter().position(|a| a == "--http").unwrap();
    normalizer_flags[http_flag + 1] = format!("127.0.0.1:{http_port}");
    let mut services = [
        Service::spawn("normalizer", &with_otlp(normalizer_flags), logs.path()),
        Service::spawn(
            "archiver",
            &with_otlp(archiver_args(&nats.url(), &store.url)),
            logs.path(),
        ),
        Service::spawn(
            "projector",
            &with_otlp(
                [
                    "projector",
                    "--nats",
                    &nats.url(),
                    "--name",
                    "traced",
                    "--sink",
                    "plain=stdout",
                    "--grpc",
                    "127.0.0.1:0",
                ]
                .map(String::from)
                .to_vec(),
            ),
            logs.path(),
        ),
    ];
    common::wait_normalizer(&js, "sg-normalizer").await;
    common::wait_consumer(&js, EVENTS_STREAM, "sg-archiver").await;
    common::wait_projector(&js, "traced").await;

    let capture = common::fixture("f1/tool-use.sse");
    let reply = reqwest::Client::new()
        .post(format!(
            "http://127.0.0.1:{http_port}/v1/ingest/acme/run-traced?family=f1&chunk_bytes=200"
        ))
        .header("traceparent", format!("00-{TRACE_ID}-{PRODUCER_SPAN}-01"))
        .body(capture.clone())
        .send()
        .await
        .unwrap();
    assert!(reply.status().is_success(), "{:?}", reply.text().await);
    // Data chunks (cut as the body arrived) + the close marker, as stored.
    let addr = streamgate_bus::subject::RunAddr::parse(
        "acme",
        "run-traced",
        streamgate_bus::DEFAULT_PARTITIONS,
    )
    .unwrap();
    let chunks =
        streamgate_bus::consume::read_subject(&js, streamgate_bus::RAW_STREAM, &addr.raw_subject())
            .await
            .unwrap()
            .len();
    assert!(chunks >= 2, "{chunks}");

    // Spans reach the collector in the exporters' batches (every few seconds).
    let deadline = Instant::now() + Duration::from_secs(60);
    let count = |spans: &[Received], name: &str| spans.iter().filter(|s| s.name == name).count();
    let normalized =
        |spans: &[Received]| count(spans, "ingest") == 1 && count(spans, "normalize") == chunks;
    // Once every chunk is normalized (its span ends after its events are published), each
    // message of the run on SG_EVENTS gets an archive and a project span: all of them are
    // in before parentage is judged.
    let mut messages = None;
    let spans = loop {
        let spans = collector.in_trace(TRACE_ID);
        if messages.is_none() && normalized(&spans) {
            let on_events =
                streamgate_bus::consume::read_subject(&js, EVENTS_STREAM, &addr.events_subject())
                    .await
                    .unwrap()
                    .len();
            assert!(on_events >= 1, "no event message of the run on SG_EVENTS");
            messages = Some(on_events);
        }
        if let Some(n) = messages {
            if count(&spans, "archive") >= n && count(&spans, "project") >= n {
                break spans;
            }
        }
        for s in &mut services {
            s.assert_running();
        }
        assert!(
            Instant::now() < deadline,
            "incomplete trace after 60 s (want 1 ingest, {chunks} normalize, and an archive \
             and a project span per event message: {messages:?}): {spans:#?}\n{}",
            services
                .iter()
                .map(|s| common::tail(&s.log_text(), 20))
                .collect::<Vec<_>>()
                .join("\n---\n")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    let ingest: Vec<_> = spans.iter().filter(|s| s.name == "ingest").collect();
    assert_eq!(ingest.len(), 1, "{spans:#?}");
    assert_eq!(
        ingest[0].parent, PRODUCER_SPAN,
        "ingest continues the producer"
    );
    assert_eq!(ingest[0].service, "streamgate-normalizer");
    let normalize: Vec<_> = spans.iter().filter(|s| s.name == "normalize").collect();
    assert_eq!(normalize.len(), chunks, "one normalize span per raw chunk");
    for n in &normalize {
        assert_eq!(
            n.parent, ingest[0].span_id,
            "normalize is a child of ingest"
        );
        assert_eq!(n.service, "streamgate-normalizer");
    }
    let normalize_ids: Vec<&str> = normalize.iter().map(|s| s.span_id.as_str()).collect();
    for (name, service) in [
        ("archive", "streamgate-archiver"),
        ("project", "streamgate-projector"),
    ] {
        let hop: Vec<_> = spans.iter().filter(|s| s.name == name).collect();
        assert!(!hop.is_empty(), "no {name} span: {spans:#?}");
        for s in hop {
            assert!(
                normalize_ids.contains(&s.parent.as_str()),
                "{name} span {s:?} is not a child of a normalize span"
            );
            assert_eq!(s.service, service);
        }
    }
}
