//! One run as an OpenTelemetry GenAI trace, and the OTLP/gRPC client that sends them.

use anyhow::{Context, Result};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{
    any_value, AnyValue, ArrayValue, InstrumentationScope, KeyValue,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{
    span, status, ResourceSpans, ScopeSpans, Span, Status,
};
use sha2::Digest as _;
use streamgate_grammar::{timeline, EntryKind, RunEvent, RunState};
use streamgate_proto::v1::Run;

/// Collects runs' spans and sends them in batches.
#[derive(Clone)]
pub struct Exporter {
    client: TraceServiceClient<tonic::transport::Channel>,
    content: bool,
    spans: Vec<Span>,
    runs: usize,
}

impl Exporter {
    /// Connects to the OTLP/gRPC endpoint.
    pub async fn connect(endpoint: &str, content: bool) -> Result<Exporter> {
        let client = TraceServiceClient::connect(endpoint.to_owned())
            .await
            .with_context(|| format!("cannot reach the OTLP endpoint {endpoint}"))?;
        Ok(Exporter {
            client,
            content,
            spans: Vec::new(),
            runs: 0,
        })
    }

    /// Adds one ended run's trace.
    pub fn add(&mut self, run: &Run, events: &[RunEvent]) {
        self.spans.extend(run_spans(run, events, self.content));
        self.runs += 1;
    }

    /// Runs added since the last flush.
    pub fn pending(&self) -> usize {
        self.runs
    }

    /// Sends what was added.
    pub async fn flush(&mut self) -> Result<()> {
        if self.spans.is_empty() {
            return Ok(());
        }
        let request = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![kv("service.name", text("streamgate"))],
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: "streamgate.export".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                        ..Default::default()
                    }),
                    spans: std::mem::take(&mut self.spans),
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        };
        self.client
            .export(request)
            .await
            .context("the OTLP endpoint refused the traces")?;
        self.runs = 0;
        Ok(())
    }
}

fn kv(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

fn text(s: impl Into<String>) -> any_value::Value {
    any_value::Value::StringValue(s.into())
}

fn int(n: u64) -> any_value::Value {
    any_value::Value::IntValue(i64::try_from(n).unwrap_or(i64::MAX))
}

/// `n` bytes of SHA-256 over the parts: stable trace and span ids.
fn id(parts: &[&str], n: usize) -> Vec<u8> {
    let mut h = sha2::Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    h.finalize()[..n].to_vec()
}

fn nanos(ms: i64) -> u64 {
    u64::try_from(ms).unwrap_or(0) * 1_000_000
}

/// The spans of one run.
pub fn run_spans(run: &Run, events: &[RunEvent], content: bool) -> Vec<Span> {
    let trace_id = id(&["streamgate", &run.tenant, &run.run_id], 16);
    let root_id = id(&["agent", &run.tenant, &run.run_id], 8);
    let chat_id = id(&["chat", &run.tenant, &run.run_id], 8);
    let (start, end) = (nanos(run.first_ts_ms), nanos(run.last_ts_ms));
    let model = run.model.clone().unwrap_or_default();
    let failed = run.status == "failed";
    let status = Some(Status {
        code: if failed {
            status::StatusCode::Error
        } else {
            status::StatusCode::Unset
        } as i32,
        message: if failed {
            run.stop_reason.clone().unwrap_or_default()
        } else {
            String::new()
        },
    });
    let usage = |attrs: &mut Vec<KeyValue>| {
        let pairs = [
            ("gen_ai.usage.input_tokens", run.input_tokens),
            ("gen_ai.usage.output_tokens", run.output_tokens),
        ];
        for (k, v) in pairs {
            if let Some(v) = v {
                attrs.push(kv(k, int(v)));
            }
        }
    };

    let mut root_attrs = vec![
        kv("gen_ai.operation.name", text("invoke_agent")),
        kv("streamgate.tenant", text(&run.tenant)),
        kv("streamgate.run_id", text(&run.run_id)),
    ];
    if let Some(p) = &run.provider {
        root_attrs.push(kv("gen_ai.provider.name", text(p)));
    }
    if let Some(s) = &run.session_key {
        root_attrs.push(kv("gen_ai.conversation.id", text(s)));
    }
    if failed {
        root_attrs.push(kv(
            "error.type",
            text(run.stop_reason.clone().unwrap_or_else(|| "failed".into())),
        ));
    }
    usage(&mut root_attrs);

    let mut chat_attrs = vec![
        kv("gen_ai.operation.name", text("chat")),
        kv("gen_ai.request.model", text(&model)),
        kv("gen_ai.response.model", text(&model)),
    ];
    if let Some(p) = &run.provider {
        chat_attrs.push(kv("gen_ai.provider.name", text(p)));
    }
    if let Some(reason) = &run.stop_reason {
        chat_attrs.push(kv(
            "gen_ai.response.finish_reasons",
            any_value::Value::ArrayValue(ArrayValue {
                values: vec![AnyValue {
                    value: Some(text(reason)),
                }],
            }),
        ));
    }
    usage(&mut chat_attrs);
    for (k, v) in [
        ("gen_ai.usage.reasoning.output_tokens", run.reasoning_tokens),
        (
            "gen_ai.usage.cache_read.input_tokens",
            run.cache_read_tokens,
        ),
        (
            "gen_ai.usage.cache_creation.input_tokens",
            run.cache_write_tokens,
        ),
    ] {
        if let Some(v) = v.filter(|v| *v > 0) {
            chat_attrs.push(kv(k, int(v)));
        }
    }
    if let Some(ttft) = run.ttft_ms {
        chat_attrs.push(kv(
            "gen_ai.response.time_to_first_chunk",
            any_value::Value::DoubleValue(ttft as f64 / 1000.0),
        ));
    }
    let state = RunState::fold(events.iter().map(|e| &e.event));
    if content {
        if let Some(answer) = &state.final_text {
            let messages = serde_json::json!([{
                "role": "assistant",
                "parts": [{"type": "text", "content": answer}],
                "finish_reason": run.stop_reason,
            }]);
            chat_attrs.push(kv("gen_ai.output.messages", text(messages.to_string())));
        }
    }

    let mut spans = vec![
        Span {
            trace_id: trace_id.clone(),
            span_id: root_id.clone(),
            name: "invoke_agent".into(),
            kind: span::SpanKind::Internal as i32,
            start_time_unix_nano: start,
            end_time_unix_nano: end,
            attributes: root_attrs,
            status: status.clone(),
            ..Default::default()
        },
        Span {
            trace_id: trace_id.clone(),
            span_id: chat_id,
            parent_span_id: root_id.clone(),
            name: format!("chat {model}").trim_end().to_owned(),
            kind: span::SpanKind::Client as i32,
            start_time_unix_nano: start,
            end_time_unix_nano: end,
            attributes: chat_attrs,
            status,
            ..Default::default()
        },
    ];
    for (i, entry) in timeline(events)
        .iter()
        .filter(|e| e.kind == EntryKind::Item)
        .enumerate()
    {
        let call_id = entry.id.clone().unwrap_or_else(|| i.to_string());
        let mut attrs = vec![
            kv("gen_ai.operation.name", text("execute_tool")),
            kv("gen_ai.tool.name", text(&entry.label)),
            kv("gen_ai.tool.call.id", text(&call_id)),
            kv("gen_ai.tool.type", text("function")),
        ];
        let item = state
            .items
            .iter()
            .find(|it| it.id.is_some() && it.id == entry.id);
        if let (true, Some(item)) = (content, item) {
            let args = item
                .arguments
                .as_ref()
                .or(item.input.as_ref())
                .map(|j| j.get().to_owned())
                .unwrap_or_else(|| item.input_text.clone());
            attrs.push(kv("gen_ai.tool.call.arguments", text(args)));
            let result = item
                .result
                .as_ref()
                .map(|j| j.get().to_owned())
                .unwrap_or_else(|| item.output_text.clone());
            attrs.push(kv("gen_ai.tool.call.result", text(result)));
        }
        spans.push(Span {
            trace_id: trace_id.clone(),
            span_id: id(
                &["tool", &run.tenant, &run.run_id, &call_id, &i.to_string()],
                8,
            ),
            parent_span_id: root_id.clone(),
            name: format!("execute_tool {}", entry.label),
            kind: span::SpanKind::Internal as i32,
            start_time_unix_nano: nanos(entry.start_ts_ms),
            end_time_unix_nano: nanos(entry.end_ts_ms),
            attributes: attrs,
            ..Default::default()
        });
    }
    spans
}
