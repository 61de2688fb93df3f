//! W3C trace context (<https://www.w3.org/TR/trace-context/>) through NATS headers, so a
//! trace started at ingest continues in the normalizer, archiver and projectors.
//!
//! Only the header plumbing lives here; turning the value into a span parent is the
//! services' job (they own the OpenTelemetry setup).

use async_nats::HeaderMap;

use crate::hdr;

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
