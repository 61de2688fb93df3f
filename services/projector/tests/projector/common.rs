//! What the projector's end-to-end test binaries share: the test tenant, canonical
//! events with envelopes, publishing them to `SG_EVENTS` as the normalizer would, a
//! channel config with quick delivery, and polling.
#![allow(dead_code)]

use std::time::Duration;
use streamgate_bus::subject::RunAddr;
pub use streamgate_grammar::clock::now_ms;
use streamgate_grammar::{Envelope, Event, RunEvent};
use streamgate_projector::{ChannelConfig, ChannelSink, Running};
use streamgate_sinks::DeliveryConfig;
pub use streamgate_testkit::poll_until;
use streamgate_testkit::NatsServer;
use tokio_util::sync::CancellationToken;

pub type R = Result<(), Box<dyn std::error::Error>>;

/// Starts `cfg` as one projector replica on `nats` with its gRPC service on a free
/// loopback port (never told to stop: the test's end drops it).
pub async fn start_with_grpc(nats: &NatsServer, cfg: ChannelConfig) -> anyhow::Result<Running> {
    streamgate_projector::start(
        nats.client().await,
        cfg,
        Some(([127, 0, 0, 1], 0).into()),
        CancellationToken::new(),
    )
    .await
}

pub const TENANT: &str = "acme";

/// Canonical events checked against the grammar (a test run must be a valid run).
pub fn canonical(lines: &[&str]) -> Result<Vec<Event>, Box<dyn std::error::Error>> {
    let events: Vec<Event> = lines
        .iter()
        .map(|l| Event::from_json(l))
        .collect::<Result<_, _>>()?;
    let violations = streamgate_grammar::check(&events, &[], None);
    assert!(violations.is_empty(), "not a canonical run: {violations:?}");
    Ok(events)
}

pub fn run_events(run_id: &str, session: &str, events: &[Event], t0: i64) -> Vec<RunEvent> {
    tenant_events(TENANT, run_id, session, events, t0)
}

pub fn tenant_events(
    tenant: &str,
    run_id: &str,
    session: &str,
    events: &[Event],
    t0: i64,
) -> Vec<RunEvent> {
    events
        .iter()
        .map(|e| RunEvent {
            envelope: Envelope {
                tenant: tenant.to_owned(),
                session_key: Some(session.to_owned()),
                run_id: run_id.to_owned(),
                ts_ms: t0 + i64::try_from(e.seq).unwrap_or(0) * 10,
            },
            event: e.clone(),
        })
        .collect()
}

pub async fn publish(js: &async_nats::jetstream::Context, evs: &[RunEvent]) -> R {
    let Some(first) = evs.first() else {
        return Ok(());
    };
    let (tenant, run) = (&first.envelope.tenant, &first.envelope.run_id);
    const P: u32 = streamgate_bus::DEFAULT_PARTITIONS;
    match RunAddr::parse(tenant, run, P) {
        Ok(addr) => streamgate_bus::events::publish_events(js, &addr, evs).await?,
        // An id that breaks the id rule (a producer from before it, or a foreign one): no
        // `RunAddr` holds it, so the subject is written by hand, as such a producer would.
        Err(_) => {
            use streamgate_bus::subject::{encode_token, partition_of};
            let subject = format!(
                "sg.evt.{}.{}.{}",
                encode_token(tenant),
                partition_of(run, P),
                encode_token(run)
            );
            for ev in evs {
                for m in streamgate_bus::events::messages_for(std::slice::from_ref(ev))? {
                    js.publish_with_headers(subject.clone(), m.headers, m.payload)
                        .await?
                        .await?;
                }
            }
        }
    }
    Ok(())
}

pub fn fast_delivery() -> DeliveryConfig {
    DeliveryConfig {
        chat_rate: Some(streamgate_sinks::Rate::new(50.0, 10)),
        retry_base: Duration::from_millis(20),
        retry_max: Duration::from_millis(200),
        attempt_timeout: Duration::from_secs(5),
        ..DeliveryConfig::default()
    }
}

pub fn channel(name: &str, sink: ChannelSink) -> ChannelConfig {
    let mut c = ChannelConfig::new(name, sink);
    c.delivery = fast_delivery();
    c
}

/// A web channel on a free loopback port, thinking streamed, tool rows in full.
pub fn web_channel() -> ChannelConfig {
    let mut cfg = channel(
        "web",
        ChannelSink::Web {
            listen: ([127, 0, 0, 1], 0).into(),
        },
    );
    cfg.settings.reasoning = streamgate_projection::Reasoning::Stream;
    cfg.settings.verbose = streamgate_projection::Verbose::Full;
    cfg
}
