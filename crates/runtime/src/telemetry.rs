//! Structured logs through `tracing`, Prometheus metrics over HTTP, and W3C trace context
//! that rides in NATS headers so one trace id follows a run's bytes from ingest through
//! normalization to the archive.

use std::net::SocketAddr;
use std::sync::OnceLock;
use tracing_subscriber::{fmt, prelude::*, EnvFilter};

/// How a process reports on itself.
#[derive(Debug, Clone, Default)]
pub struct TelemetryConfig {
    /// Log as JSON lines (for log shippers) instead of human text.
    pub log_json: bool,
    /// Serve Prometheus metrics at `http://<addr>/metrics`.
    pub metrics_addr: Option<SocketAddr>,
}

/// Telemetry setup failed.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The Prometheus listener could not start.
    #[error("cannot serve metrics on {addr}: {reason}")]
    Metrics {
        /// The requested address.
        addr: SocketAddr,
        /// Why.
        reason: String,
    },
}

static INSTALLED: OnceLock<()> = OnceLock::new();

/// Installs logging (filter from `RUST_LOG`, default `info`) and, when configured, the
/// Prometheus exporter. Safe to call more than once (later calls do nothing), so the
/// all-in-one `streamgate up` and each service binary share it.
pub fn init(cfg: &TelemetryConfig) -> Result<(), TelemetryError> {
    if INSTALLED.get().is_some() {
        return Ok(());
    }
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter);
    // try_init: a test harness may already have installed a subscriber.
    let _ = if cfg.log_json {
        registry
            .with(fmt::layer().json().with_writer(std::io::stderr))
            .try_init()
    } else {
        registry
            .with(fmt::layer().with_writer(std::io::stderr))
            .try_init()
    };
    if let Some(addr) = cfg.metrics_addr {
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(addr)
            .install()
            .map_err(|e| TelemetryError::Metrics {
                addr,
                reason: e.to_string(),
            })?;
    }
    let _ = INSTALLED.set(());
    Ok(())
}

/// A W3C trace context (`traceparent: 00-<trace id>-<span id>-<flags>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceParent {
    /// 32 lowercase hex digits.
    pub trace_id: String,
    /// 16 lowercase hex digits.
    pub span_id: String,
    /// Sampled flag.
    pub sampled: bool,
}

impl TraceParent {
    /// A new root trace.
    pub fn new_root() -> TraceParent {
        TraceParent {
            trace_id: format!("{:032x}", rand::random::<u128>().max(1)),
            span_id: format!("{:016x}", rand::random::<u64>().max(1)),
            sampled: true,
        }
    }

    /// The same trace, a new span (for the next hop).
    pub fn child(&self) -> TraceParent {
        TraceParent {
            trace_id: self.trace_id.clone(),
            span_id: format!("{:016x}", rand::random::<u64>().max(1)),
            sampled: self.sampled,
        }
    }

    /// Parses a header value; `None` when malformed.
    pub fn parse(value: &str) -> Option<TraceParent> {
        let mut parts = value.trim().split('-');
        let (version, trace, span, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
        if version != "00" || !hex(trace, 32) || !hex(span, 16) || !hex(flags, 2) {
            return None;
        }
        Some(TraceParent {
            trace_id: trace.to_ascii_lowercase(),
            span_id: span.to_ascii_lowercase(),
            sampled: u8::from_str_radix(flags, 16).ok()? & 1 == 1,
        })
    }

    /// The header value.
    pub fn header_value(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            self.trace_id,
            self.span_id,
            u8::from(self.sampled)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_round_trips() {
        let t = TraceParent::new_root();
        let parsed = TraceParent::parse(&t.header_value()).unwrap();
        assert_eq!(parsed, t);
        let c = t.child();
        assert_eq!(c.trace_id, t.trace_id);
        assert_ne!(c.span_id, t.span_id);
        assert!(TraceParent::parse("garbage").is_none());
        assert!(TraceParent::parse("00-zz-11-01").is_none());
    }
}
