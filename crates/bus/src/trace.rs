//! W3C trace context (<https://www.w3.org/TR/trace-context/>) through NATS headers, so a
//! trace started at ingest continues in the normalizer, archiver and projectors.
//!
//! Each hop makes a `tracing` span for the message it handles and calls [`follow`] with
//! the context the message carried: the span joins that trace, and `follow` returns the
//! context to put on what the hop publishes next. Exporting spans is the process's
//! OpenTelemetry setup (`streamgate_runtime::telemetry`); in a process without it,
//! `follow` hands the incoming context on unchanged, so a hop that does not export does
//! not cut the trace in two.

use async_nats::HeaderMap;
use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::hdr;

/// A W3C trace context as it travels between hops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// `version-traceid-parentid-flags`, valid per [`is_valid_traceparent`].
    pub traceparent: String,
    /// Vendor trace state, passed along untouched.
    pub tracestate: Option<String>,
}

impl TraceContext {
    /// A context from header values; `None` when `traceparent` is absent or malformed.
    pub fn parse(traceparent: Option<&str>, tracestate: Option<&str>) -> Option<TraceContext> {
        let traceparent = traceparent
            .map(str::trim)
            .filter(|v| is_valid_traceparent(v))?;
        Some(TraceContext {
            traceparent: traceparent.to_owned(),
            tracestate: tracestate
                .map(str::trim)
                .filter(|v| !v.is_empty() && !v.contains(['\r', '\n']))
                .map(str::to_owned),
        })
    }

    /// The 32-hex-digit trace id.
    pub fn trace_id(&self) -> &str {
        &self.traceparent[3..35]
    }

    /// The 16-hex-digit id of the span that sent it (the next span's parent).
    pub fn parent_id(&self) -> &str {
        &self.traceparent[36..52]
    }
}

/// The trace context a message carries, if any.
pub fn extract_context(headers: Option<&HeaderMap>) -> Option<TraceContext> {
    let h = headers?;
    TraceContext::parse(hdr::get(h, HDR_TRACEPARENT), hdr::get(h, HDR_TRACESTATE))
}

/// Puts `cx` on a message about to be published.
pub fn inject_context(headers: &mut HeaderMap, cx: &TraceContext) {
    inject(headers, &cx.traceparent);
    if let Some(state) = &cx.tracestate {
        inject_state(headers, state);
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
    let sc = own.span_context();
    if !sc.is_valid() {
        return incoming;
    }
    let state = sc.trace_state().header();
    Some(TraceContext {
        traceparent: format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        ),
        tracestate: (!state.is_empty()).then_some(state),
    })
}

impl TraceContext {
    /// The remote parent this context names, for OpenTelemetry.
    fn span_context(&self) -> Option<SpanContext> {
        let flags = u8::from_str_radix(&self.traceparent[53..55], 16).ok()?;
        let state = self
            .tracestate
            .as_deref()
            .and_then(|s| s.parse::<TraceState>().ok())
            .unwrap_or_default();
        Some(SpanContext::new(
            TraceId::from_hex(self.trace_id()).ok()?,
            SpanId::from_hex(self.parent_id()).ok()?,
            // Only the sampled bit is defined; the rest must not be propagated blindly.
            TraceFlags::new(flags) & TraceFlags::SAMPLED,
            true,
            state,
        ))
    }
}

/// Header carrying `version-traceid-parentid-flags`.
pub const HDR_TRACEPARENT: &str = "traceparent";
/// Header carrying vendor-specific trace state.
pub const HDR_TRACESTATE: &str = "tracestate";

/// Sets `traceparent`. A value that is not a valid `traceparent` is ignored (with a debug
/// log) rather than sent: a broken header would only break tracing downstream.
pub fn inject(headers: &mut HeaderMap, traceparent: &str) {
    if is_valid_traceparent(traceparent) {
        headers.insert(HDR_TRACEPARENT, traceparent);
    } else {
        tracing::debug!(traceparent, "not injecting invalid traceparent");
    }
}

/// Sets `tracestate` next to [`inject`]'s `traceparent`; ignored when it holds CR/LF or
/// is empty.
pub fn inject_state(headers: &mut HeaderMap, tracestate: &str) {
    if !tracestate.is_empty() && !tracestate.contains(['\r', '\n']) {
        headers.insert(HDR_TRACESTATE, tracestate);
    }
}

/// The `traceparent`, when present and well-formed. The header name is matched
/// case-insensitively because some clients canonicalize it to `Traceparent`.
pub fn extract(headers: &HeaderMap) -> Option<String> {
    hdr::get(headers, HDR_TRACEPARENT)
        .map(str::trim)
        .filter(|v| is_valid_traceparent(v))
        .map(str::to_owned)
}

/// The `tracestate`, when present.
pub fn extract_state(headers: &HeaderMap) -> Option<String> {
    hdr::get(headers, HDR_TRACESTATE)
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

/// `2hex-32hex-16hex-2hex`, lowercase, version not `ff`, ids not all zero (W3C §3.2).
/// Future versions may append fields after the flags; those are accepted too.
pub fn is_valid_traceparent(v: &str) -> bool {
    let b = v.as_bytes();
    let hex = |s: &[u8]| s.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
    let zero = |s: &[u8]| s.iter().all(|&c| c == b'0');
    if b.len() < 55 || !(b.len() == 55 || b[55] == b'-') {
        return false;
    }
    let (ver, trace, parent, flags) = (&b[0..2], &b[3..35], &b[36..52], &b[53..55]);
    b[2] == b'-'
        && b[35] == b'-'
        && b[52] == b'-'
        && hex(ver)
        && hex(trace)
        && hex(parent)
        && hex(flags)
        && ver != b"ff"
        // Version 00 has exactly these four fields.
        && (ver != b"00" || b.len() == 55)
        && !zero(trace)
        && !zero(parent)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn round_trip_and_validation() {
        let mut h = HeaderMap::new();
        inject(&mut h, TP);
        inject_state(&mut h, "congo=t61rcWkgMzE");
        assert_eq!(extract(&h).as_deref(), Some(TP));
        assert_eq!(extract_state(&h).as_deref(), Some("congo=t61rcWkgMzE"));

        let mut g = HeaderMap::new();
        g.insert("Traceparent", TP);
        assert_eq!(extract(&g).as_deref(), Some(TP));

        for bad in [
            "",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
        ] {
            let mut h = HeaderMap::new();
            inject(&mut h, bad);
            assert!(extract(&h).is_none(), "{bad:?}");
        }
        assert!(is_valid_traceparent(
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future"
        ));
    }
}
