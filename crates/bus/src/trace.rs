//! W3C trace context (<https://www.w3.org/TR/trace-context/>) through NATS headers, so a
//! trace started at ingest continues in the normalizer, archiver and projectors.
//!
//! Each hop makes a `tracing` span for the message it handles and calls [`follow`] with
//! the context the message carried: the span joins that trace, and `follow` returns the
//! context to put on what the hop publishes next. Exporting spans is the process's
//! OpenTelemetry setup (`streamgate_runtime::telemetry`); in a process without it,
//! `follow` hands the incoming context on unchanged, so a hop that does not export does
//! not cut the trace in two.
//!
//! Reading and writing the `traceparent` / `tracestate` headers is OpenTelemetry's own
//! W3C propagator (`TraceContextPropagator`): what it refuses is no context, and what it
//! accepts goes on in its canonical form.

use std::collections::HashMap;

use async_nats::HeaderMap;
use opentelemetry::propagation::{Extractor, TextMapPropagator as _};
use opentelemetry::trace::{SpanContext, TraceContextExt as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::hdr;

/// A W3C trace context as it travels between hops, in the propagator's canonical form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// `version-traceid-parentid-flags`, as the propagator writes it.
    traceparent: String,
    /// Vendor trace state (dropped when the propagator finds it malformed).
    tracestate: Option<String>,
}

/// The two header values, as the propagator reads them.
struct Fields<'a> {
    traceparent: Option<&'a str>,
    tracestate: Option<&'a str>,
}

impl Extractor for Fields<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            HDR_TRACEPARENT => self.traceparent,
            HDR_TRACESTATE => self.tracestate,
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec![HDR_TRACEPARENT, HDR_TRACESTATE]
    }
}

impl TraceContext {
    /// A context from header values; `None` when `traceparent` is absent or malformed.
    pub fn parse(traceparent: Option<&str>, tracestate: Option<&str>) -> Option<TraceContext> {
        TraceContext::of(&remote_parent(traceparent, tracestate)?)
    }

    /// The context that names `sc` as the parent; `None` for an invalid span context.
    fn of(sc: &SpanContext) -> Option<TraceContext> {
        if !sc.is_valid() {
            return None;
        }
        let cx = opentelemetry::Context::new().with_remote_span_context(sc.clone());
        let mut headers: HashMap<String, String> = HashMap::new();
        TraceContextPropagator::new().inject_context(&cx, &mut headers);
        Some(TraceContext {
            traceparent: headers.remove(HDR_TRACEPARENT)?,
            tracestate: headers.remove(HDR_TRACESTATE).filter(|s| !s.is_empty()),
        })
    }

    /// The `traceparent` header value.
    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    /// The `tracestate` header value, if any.
    pub fn tracestate(&self) -> Option<&str> {
        self.tracestate.as_deref()
    }

    /// The 32-hex-digit trace id.
    pub fn trace_id(&self) -> &str {
        self.traceparent.get(3..35).unwrap_or_default()
    }

    /// The 16-hex-digit id of the span that sent it (the next span's parent).
    pub fn parent_id(&self) -> &str {
        self.traceparent.get(36..52).unwrap_or_default()
    }

    /// The remote parent this context names, for OpenTelemetry.
    fn span_context(&self) -> Option<SpanContext> {
        remote_parent(Some(&self.traceparent), self.tracestate.as_deref())
    }
}

/// The remote span context the header values name, read by the W3C propagator.
fn remote_parent(traceparent: Option<&str>, tracestate: Option<&str>) -> Option<SpanContext> {
    let fields = Fields {
        traceparent: traceparent.map(str::trim),
        tracestate: tracestate.map(str::trim),
    };
    let cx = TraceContextPropagator::new().extract(&fields);
    let sc = cx.span().span_context().clone();
    sc.is_valid().then_some(sc)
}

/// The trace context a message carries, if any (header names matched case-insensitively:
/// some clients send `Traceparent`).
pub fn extract_context(headers: Option<&HeaderMap>) -> Option<TraceContext> {
    let h = headers?;
    TraceContext::parse(hdr::get(h, HDR_TRACEPARENT), hdr::get(h, HDR_TRACESTATE))
}

/// Puts `cx` on a message about to be published, as it is: a context is only made by
/// the propagator (`parse`, `of`), so it is valid and canonical already.
pub fn inject_context(headers: &mut HeaderMap, cx: &TraceContext) {
    hdr::put(headers, HDR_TRACEPARENT, cx.traceparent.as_str());
    if let Some(state) = &cx.tracestate {
        hdr::put(headers, HDR_TRACESTATE, state.as_str());
    }
}

/// Makes `span` continue `incoming` (or start a trace when there is none) and returns
/// the context the next hop should carry: `span`'s own when OpenTelemetry records it,
/// otherwise `incoming` unchanged.
///
/// Call it right after creating the span, before entering it.
pub fn follow(span: &tracing::Span, incoming: Option<TraceContext>) -> Option<TraceContext> {
    if let Some(parent) = incoming.as_ref().and_then(TraceContext::span_context) {
        // Without an OpenTelemetry layer there is nothing to attach to; that is fine.
        let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(parent));
    }
    let own = span.context();
    let own = own.span();
    TraceContext::of(own.span_context()).or(incoming)
}

/// Header carrying `version-traceid-parentid-flags`.
pub const HDR_TRACEPARENT: &str = "traceparent";
/// Header carrying vendor-specific trace state.
pub const HDR_TRACESTATE: &str = "tracestate";

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn through_headers(traceparent: &str, tracestate: Option<&str>) -> Option<TraceContext> {
        let mut h = HeaderMap::new();
        h.insert(HDR_TRACEPARENT, traceparent);
        if let Some(s) = tracestate {
            h.insert(HDR_TRACESTATE, s);
        }
        extract_context(Some(&h))
    }

    #[test]
    fn round_trip_and_validation() {
        let cx = through_headers(TP, Some("congo=t61rcWkgMzE")).unwrap();
        assert_eq!(cx.traceparent, TP);
        assert_eq!(cx.tracestate.as_deref(), Some("congo=t61rcWkgMzE"));
        assert_eq!(cx.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(cx.parent_id(), "00f067aa0ba902b7");
        let mut out = HeaderMap::new();
        inject_context(&mut out, &cx);
        assert_eq!(extract_context(Some(&out)), Some(cx));

        let mut g = HeaderMap::new();
        g.insert("Traceparent", TP);
        assert_eq!(extract_context(Some(&g)).unwrap().traceparent, TP);

        for bad in [
            "",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
        ] {
            assert_eq!(through_headers(bad, None), None, "{bad:?}");
        }
        // A later version's extra fields are accepted; it goes on as version 00.
        let future = through_headers(
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future",
            None,
        )
        .unwrap();
        assert_eq!(future.traceparent, TP);
    }
}
