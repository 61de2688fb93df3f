//! Normalizer settings: flags, environment (`STREAMGATE_*`) and an optional TOML-free
//! key=value file, resolved in that order of precedence by the binary.

use std::time::Duration;
use streamgate_bus::StreamSettings;

/// Everything the normalizer worker needs.
#[derive(Debug, Clone)]
pub struct NormalizerConfig {
    /// JetStream stream settings (provisioned idempotently at start).
    pub streams: StreamSettings,
    /// Prefix of the per-partition durable consumers: partition p is consumed by
    /// `<durable>-pNN` by whichever replica holds its lease.
    pub durable: String,
    /// Raw messages per batch.
    pub batch: usize,
    /// How long the broker waits for an ack before redelivering.
    pub ack_wait: Duration,
    /// Unacknowledged raw messages the broker lets the partitions' consumers hold
    /// together (backpressure); each partition's consumer gets its share of it.
    pub max_ack_pending: i64,
    /// A run with no chunk for this long gets a `timeout` close marker.
    pub idle_timeout: Duration,
    /// How often idle runs are looked for.
    pub idle_check: Duration,
    /// Runs whose adapter state is kept in memory, across all partitions this replica
    /// holds; beyond it the least recently active runs are unloaded (and rebuilt from
    /// SG_RAW if they continue).
    pub max_open_runs: usize,
    /// Partition lease TTL (`SG_LEASES`): a replica that dies loses its partitions this
    /// long after its last renewal. Applies when the bucket is created (see
    /// `streamgate_bus::lease`).
    pub lease_ttl: Duration,
    /// The NATS connection lease renewals go over: one of their own, so that bulk
    /// publishes and deliveries on the main connection never hold a renewal back (a
    /// starved renewal loses the partition). `None`: the main connection (tests).
    pub lease_nats: Option<async_nats::Client>,
    /// Chunk publishes one ingest request keeps in flight (`ingest::flow`): more lets
    /// one large body go faster, fewer shares the connection more finely.
    pub ingest_window: usize,
    /// Bytes of one open run's final-answer candidate kept in memory (the head; the
    /// rest is counted and the final says it was cut).
    pub max_final_bytes: usize,
    /// Bytes of every open run's final-answer candidate together, per process.
    pub final_bytes_budget: usize,
}

impl Default for NormalizerConfig {
    fn default() -> Self {
        NormalizerConfig {
            streams: StreamSettings::default(),
            durable: "sg-normalizer".to_owned(),
            batch: 256,
            ack_wait: Duration::from_secs(10),
            max_ack_pending: 20_000,
            idle_timeout: Duration::from_secs(120),
            idle_check: Duration::from_secs(1),
            max_open_runs: 10_000,
            lease_ttl: streamgate_bus::lease::DEFAULT_LEASE_TTL,
            lease_nats: None,
            ingest_window: crate::ingest::flow::DEFAULT_WINDOW,
            max_final_bytes: streamgate_wire::families::final_text::FINAL_TEXT_CAP,
            final_bytes_budget: streamgate_wire::families::final_text::FINAL_TEXT_BUDGET,
        }
    }
}
