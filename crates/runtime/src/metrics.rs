//! Every metric streamgate exports, with its help text: one catalogue, described when the
//! Prometheus exporter is installed (a description given before that is lost), so every
//! series carries `# HELP`. All names start with `streamgate_`; a test in the workspace
//! root checks that every metric the code records is listed here.

/// The kind of a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// A distribution (seconds).
    Histogram,
}

/// `(name, kind, help)` of every metric.
pub const CATALOGUE: &[(&str, Kind, &str)] = &[
    ("streamgate_build_info", Kind::Gauge, "Always 1; the version of the running binary as a label"),
    // Ingest and normalizer.
    ("streamgate_ingest_chunks_total", Kind::Counter, "Raw chunks accepted at the ingest front doors"),
    ("streamgate_ingest_bytes_total", Kind::Counter, "Provider bytes accepted at the ingest front doors (stored in SG_RAW)"),
    ("streamgate_server_responses_total", Kind::Counter, "Responses of the gRPC and HTTP servers, by server (grpc, http) and status: the HTTP status, or the gRPC code of an immediate answer (a stream's closing code travels in its trailers and is not counted here)"),
    ("streamgate_ingest_unavailable_total", Kind::Counter, "Ingest requests answered 503 / UNAVAILABLE because JetStream could not take chunks right now (by transport)"),
    ("streamgate_gateway_events_total", Kind::Counter, "OpenClaw gateway agent events forwarded into runs (follow-gateway)"),
    ("streamgate_gateway_events_rejected_total", Kind::Counter, "OpenClaw gateway agent events that could not be routed (no or bad runId)"),
    ("streamgate_gateway_frames_malformed_total", Kind::Counter, "OpenClaw gateway WebSocket frames that were not protocol frames"),
    ("streamgate_normalizer_chunks_total", Kind::Counter, "Raw chunks the normalizer applied to their runs"),
    ("streamgate_normalizer_events_published_total", Kind::Counter, "Canonical events the normalizer published to SG_EVENTS"),
    ("streamgate_normalizer_bad_raw_total", Kind::Counter, "Raw messages that could not be read (logged and passed over; their bytes stay in SG_RAW)"),
    ("streamgate_normalizer_delivery_gaps_total", Kind::Counter, "Raw deliveries that never reached the normalizer (a consumer sequence skipped): the partition was taken again from its first chunk not processed"),
    ("streamgate_connections_evicted_total", Kind::Counter, "Connections closed because every slot (or their peer address's share) was taken and they had sent nothing yet (the longest-silent first)"),
    ("streamgate_connections_refused_total", Kind::Counter, "New connections closed at once because their peer address held its share of the slots with connections that all spoke"),
    ("streamgate_normalizer_events_cut_total", Kind::Counter, "Events over the broker's max_payload whose longest texts were cut to fit (SG_RAW keeps the provider's bytes)"),
    ("streamgate_normalizer_final_text_bytes", Kind::Gauge, "Bytes of open runs' final-answer candidates held in memory (bounded by STREAMGATE_FINAL_BYTES_BUDGET)"),
    ("streamgate_normalizer_final_answers_cut_total", Kind::Counter, "Final answers over the bytes an open run keeps in memory (8 MiB), sent with their head and a note of the cut (SG_RAW keeps the provider's bytes)"),
    ("streamgate_normalizer_rebuilds_total", Kind::Counter, "Runs rebuilt from SG_RAW (restart, redelivery, partition move)"),
    ("streamgate_normalizer_pull_wait_seconds", Kind::Histogram, "From a chunk's ingest to the normalizer taking it from its partition's consumer (the broker's store and delivery, and the batches ahead of it)"),
    ("streamgate_normalizer_batch_seconds", Kind::Histogram, "Time a consumer batch spends in each of the normalizer's steps, by step: apply (normalize its chunks), publish (its events and the open-runs registry, until the broker's acks), ack (its one in-order ack)"),
    ("streamgate_normalizer_open_runs", Kind::Gauge, "Runs the normalizer holds open in memory"),
    ("streamgate_normalizer_runs_evicted_total", Kind::Counter, "Open runs evicted from memory under the budget (rebuilt when they go on)"),
    // Archiver.
    ("streamgate_archiver_events_inserted_total", Kind::Counter, "Events committed to the archive"),
    ("streamgate_archiver_duplicates_total", Kind::Counter, "Events the archive already held (redeliveries), skipped"),
    ("streamgate_archiver_conflicts_total", Kind::Counter, "Events whose (run, seq) the archive holds with other content"),
    ("streamgate_archiver_retention_stripped_runs_total", Kind::Counter, "Runs whose thinking text and tool payloads retention replaced with stubs"),
    ("streamgate_archiver_retention_dropped_runs_total", Kind::Counter, "Runs retention dropped from the archive"),
    ("streamgate_archiver_otlp_exported_runs_total", Kind::Counter, "Ended runs sent as OpenTelemetry GenAI traces by the continuous export"),
    ("streamgate_archiver_otlp_export_errors_total", Kind::Counter, "Continuous trace export passes that failed (retried on the next pass)"),
    ("streamgate_archiver_thinking_indexed_runs_total", Kind::Counter, "Ended runs whose thinking the opt-in thinking search indexed (--search-thinking)"),
    ("streamgate_archiver_undecodable_total", Kind::Counter, "SG_EVENTS messages that could not be decoded, skipped"),
    ("streamgate_archive_commit_latency_seconds", Kind::Histogram, "From a chunk's ingest to the commit of its events in the archive"),
    ("streamgate_archiver_pull_wait_seconds", Kind::Histogram, "From a chunk's ingest to the archiver taking its events from SG_EVENTS' consumer (the normalizer's hop, the broker's delivery and the batches ahead of it)"),
    ("streamgate_archiver_batch_seconds", Kind::Histogram, "Time a consumer batch spends in each of the archiver's steps, by step: decode, commit (the store's transaction), ack"),
    // Projector and delivery.
    ("streamgate_projector_event_to_submit_seconds", Kind::Histogram, "From an event's ingest to its ops' submission to the delivery engine"),
    ("streamgate_delivery_latency_seconds", Kind::Histogram, "From an op's submission to the sink's answer, by op (with the projector's part: event to sink)"),
    ("streamgate_delivery_step_seconds", Kind::Histogram, "Time one delivery attempt spends in each step, by step: load (the run's delivery state), slot (waiting for one of the sink's requests in flight), request (the sink's call), save (the changed state)"),
    ("streamgate_delivery_submitted_total", Kind::Counter, "Ops queued to the delivery engine, by op"),
    ("streamgate_delivery_ops_total", Kind::Counter, "Ops the delivery engine finished, by channel, op and outcome"),
    ("streamgate_delivery_parked_total", Kind::Counter, "Finals parked after their bounded retries (the receiver kept failing): the chat goes on, the run's marker stays, and the final is sent again on the next start, by channel"),
    ("streamgate_delivery_parked", Kind::Gauge, "Finals parked now, waiting for the next start"),
    ("streamgate_delivery_dropped_total", Kind::Counter, "Ops dropped without delivery, by channel, op and reason (permanent, too_large, retries_exhausted, lane_full)"),
    ("streamgate_delivery_drafts_coalesced_total", Kind::Counter, "Draft edits replaced by a later one before they were sent (latest wins)"),
    ("streamgate_delivery_typing_throttled_total", Kind::Counter, "Typing indicators not sent because one was sent recently"),
    ("streamgate_delivery_rate_limited_total", Kind::Counter, "Requests a chat API answered with a rate limit (retry_after honoured)"),
    ("streamgate_sink_breaker_open_total", Kind::Counter, "Times a sink's circuit breaker opened after repeated failures"),
    // Partition leases and consumers.
    ("streamgate_lease_partitions_held", Kind::Gauge, "Partitions this replica holds, by lease group"),
    ("streamgate_lease_acquired_total", Kind::Counter, "Partition leases acquired, by lease group"),
    ("streamgate_lease_released_total", Kind::Counter, "Partition leases released on purpose, by lease group"),
    ("streamgate_lease_lost_total", Kind::Counter, "Partition leases lost (not renewed in time), by lease group"),
    ("streamgate_consumer_pending_messages", Kind::Gauge, "Messages a durable consumer has not been delivered yet (its lag), by stream and consumer"),
    ("streamgate_consumer_ack_pending_messages", Kind::Gauge, "Messages delivered to a durable consumer and not yet acknowledged, by stream and consumer"),
];

/// Buckets of every `_seconds` histogram: 1 ms to 30 s.
pub const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Describes every metric of [`CATALOGUE`] to the installed recorder, registers every
/// counter at zero (a dashboard shows 0, not "No data", before the first event — a lost
/// lease, a dropped op) and sets `streamgate_build_info`.
pub fn describe_all() {
    for (name, kind, help) in CATALOGUE {
        match kind {
            Kind::Counter => {
                metrics::describe_counter!(*name, *help);
                metrics::counter!(*name).absolute(0);
            }
            Kind::Gauge => metrics::describe_gauge!(*name, *help),
            Kind::Histogram => {
                metrics::describe_histogram!(*name, metrics::Unit::Seconds, *help);
            }
        }
    }
    metrics::gauge!("streamgate_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
}
