//! Structured logs through `tracing`, Prometheus metrics over HTTP, and OpenTelemetry span
//! export over OTLP/gRPC when a collector is configured.
//!
//! Spans cross service hops through W3C trace context in NATS headers
//! (`streamgate_bus::trace`): one trace follows a run's bytes from ingest through
//! normalization to the archive and the channels.

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::{fmt, prelude::*, EnvFilter};

/// How a process reports on itself.
#[derive(Debug, Clone, Default)]
pub struct TelemetryConfig {
    /// Log as JSON lines (for log shippers) instead of human text.
    pub log_json: bool,
    /// Serve Prometheus metrics at `http://<addr>/metrics`.
    pub metrics_addr: Option<SocketAddr>,
    /// OTLP/gRPC collector endpoint (e.g. `http://otel-collector:4317`): when set, spans
    /// are exported there.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of exported spans (`streamgate-normalizer`, …).
    pub service_name: String,
    /// Log filter when `RUST_LOG` is unset; empty means `info`. `streamgate up` uses
    /// `warn` so library chatter stays out of its terminal.
    pub default_filter: &'static str,
}

/// The telemetry flags every service binary takes (flattened into its arguments).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TelemetryArgs {
    /// Prometheus metrics listen address.
    #[arg(long, env = "STREAMGATE_METRICS_ADDR")]
    pub metrics: Option<SocketAddr>,
    /// Log JSON lines.
    #[arg(long, env = "STREAMGATE_LOG_JSON")]
    pub log_json: bool,
    /// Export spans to this OTLP/gRPC collector (e.g. `http://otel-collector:4317`).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
}

impl TelemetryArgs {
    /// The configuration for a process named `service_name`.
    pub fn config(&self, service_name: &str) -> TelemetryConfig {
        TelemetryConfig {
            log_json: self.log_json,
            metrics_addr: self.metrics,
            otlp_endpoint: self.otlp_endpoint.clone(),
            service_name: service_name.to_owned(),
            default_filter: "",
        }
    }
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
    /// The OTLP exporter could not be built (e.g. a malformed endpoint).
    #[error("cannot export spans to {endpoint}: {reason}")]
    Otlp {
        /// The configured endpoint.
        endpoint: String,
        /// Why.
        reason: String,
    },
}

static INSTALLED: OnceLock<()> = OnceLock::new();
static TRACER_PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// How long an export may take before it is given up (a collector that is down must
/// not hold anything up).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the process_* metrics are read.
const PROCESS_METRICS_EVERY: Duration = Duration::from_secs(5);

/// Installs logging (filter from `RUST_LOG`, else [`TelemetryConfig::default_filter`]), the OTLP span exporter when
/// an endpoint is configured, and the Prometheus exporter when an address is. Safe to
/// call more than once (later calls do nothing), so the all-in-one `streamgate up` and
/// each service binary share it. Must run inside a Tokio runtime when exporting spans.
pub fn init(cfg: &TelemetryConfig) -> Result<(), TelemetryError> {
    if INSTALLED.get().is_some() {
        return Ok(());
    }
    let otel = match &cfg.otlp_endpoint {
        Some(endpoint) => {
            let provider = tracer_provider(endpoint, &cfg.service_name)?;
            let tracer = provider.tracer("streamgate");
            let _ = TRACER_PROVIDER.set(provider);
            Some(tracing_opentelemetry::layer().with_tracer(tracer))
        }
        None => None,
    };
    let fallback = match cfg.default_filter {
        "" => "info",
        f => f,
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(fallback));
    let registry = tracing_subscriber::registry().with(filter).with(otel);
    // try_init: a test harness may already have installed a subscriber.
    let _ = if cfg.log_json {
        registry
            .with(fmt::layer().json().with_writer(std::io::stderr))
            .try_init()
    } else {
        registry
            .with(
                fmt::layer()
                    // Colours only for a person at a terminal, never into a log file
                    // or a pipe.
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                    .with_writer(std::io::stderr),
            )
            .try_init()
    };
    if let Some(addr) = cfg.metrics_addr {
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(addr)
            .set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Suffix("_seconds".into()),
                crate::metrics::SECONDS_BUCKETS,
            )
            .map_err(|e| TelemetryError::Metrics {
                addr,
                reason: e.to_string(),
            })?
            .install()
            .map_err(|e| TelemetryError::Metrics {
                addr,
                reason: e.to_string(),
            })?;
        crate::metrics::describe_all();
        // process_* (CPU seconds, resident and virtual memory, open and max fds, threads,
        // start time) as every Prometheus client library exports them: read by the
        // metrics-process crate, refreshed every few seconds.
        let process = metrics_process::Collector::default();
        process.describe();
        process.collect();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(PROCESS_METRICS_EVERY);
            loop {
                tick.tick().await;
                process.collect();
            }
        });
    }
    let _ = INSTALLED.set(());
    Ok(())
}

fn tracer_provider(
    endpoint: &str,
    service_name: &str,
) -> Result<SdkTracerProvider, TelemetryError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|e| TelemetryError::Otlp {
            endpoint: endpoint.to_owned(),
            reason: e.to_string(),
        })?;
    let name = if service_name.is_empty() {
        "streamgate"
    } else {
        service_name
    };
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(name.to_owned())
                .build(),
        )
        .build())
}

/// True when spans are exported (an OTLP endpoint was configured at [`init`]).
pub fn exporting() -> bool {
    TRACER_PROVIDER.get().is_some()
}

/// An `info` span for one message a service handles (one hop of a run's trace), or
/// `Span::none()` when spans are not exported: these spans are never entered, so without
/// an exporter they would only cost the log layer formatting their fields, per message.
/// Same arguments as `tracing::info_span!`.
#[macro_export]
macro_rules! hop_span {
    ($($arg:tt)*) => {
        if $crate::telemetry::exporting() {
            ::tracing::info_span!($($arg)*)
        } else {
            ::tracing::Span::none()
        }
    };
}

/// Exports every span recorded so far and waits for the collector (bounded by the
/// export timeout). Services call it on shutdown so the last spans are not lost; a no-op
/// when spans are not exported.
pub async fn flush() {
    let Some(provider) = TRACER_PROVIDER.get() else {
        return;
    };
    // The SDK's flush blocks until its export thread answers.
    let flushed = tokio::task::spawn_blocking(|| provider.force_flush()).await;
    match flushed {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "span export flush failed"),
        Err(e) => tracing::warn!(error = %e, "span export flush panicked"),
    }
}
