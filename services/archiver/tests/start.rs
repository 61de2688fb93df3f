//! The archiver's start opens its consumers before it spawns their loops: a consumer the
//! broker will not give it fails `start` itself — where the service's start-up retry
//! (`streamgate_runtime::startup`) sees a JetStream timeout — not a task that already
//! reported the archiver as started.

use async_nats::jetstream::consumer::push;
use streamgate_archive::open_store;
use streamgate_archiver::consumer::ConsumerConfig;
use streamgate_archiver::service::ArchiverListen;
use streamgate_bus::{StreamSettings, EVENTS_STREAM, RAW_STREAM};
use streamgate_testkit::NatsServer;
use tokio_util::sync::CancellationToken;

/// Starts an archiver whose durable name on `stream` is already a push consumer's.
async fn start_beside_a_push_consumer(stream: &str, durable: &str) -> anyhow::Result<()> {
    let nats = NatsServer::start();
    let client = nats.client().await;
    let js = async_nats::jetstream::new(client.clone());
    streamgate_bus::ensure_streams(&js, &StreamSettings::default())
        .await
        .unwrap();
    js.get_stream(stream)
        .await
        .unwrap()
        .create_consumer(push::Config {
            durable_name: Some(durable.to_owned()),
            deliver_subject: "elsewhere".to_owned(),
            ..Default::default()
        })
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(&format!("sqlite://{}", dir.path().join("a.db").display()))
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let started = streamgate_archiver::start(
        client,
        store,
        ConsumerConfig {
            archive_raw: true,
            ..ConsumerConfig::default()
        },
        ArchiverListen {
            grpc: None,
            operator_token: "operator".into(),
            partitions: StreamSettings::default().partitions,
            ..Default::default()
        },
        stop.clone(),
    )
    .await;
    stop.cancel();
    if let Ok(mut running) = started {
        while running.tasks.join_next().await.is_some() {}
        return Ok(());
    }
    started.map(drop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_the_broker_refuses_fails_the_start() {
    let durable = ConsumerConfig::default().durable;
    let events = start_beside_a_push_consumer(EVENTS_STREAM, &durable).await;
    assert!(
        events.is_err(),
        "started beside a push consumer on SG_EVENTS"
    );
    let raw = start_beside_a_push_consumer(RAW_STREAM, &format!("{durable}-raw")).await;
    assert!(raw.is_err(), "started beside a push consumer on SG_RAW");
}
