//! The NATS front door of `deploy/nats/accounts.conf` on a real nats-server
//! (`$STREAMGATE_NATS_SERVER`): a producer user scoped to tenant `acme` stores its raw
//! chunks, and its publish to another tenant's raw subject is refused by the server and
//! stored nowhere.

use bytes::Bytes;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use streamgate_bus::raw::{publish_raw_with, RawChunk};
use streamgate_bus::subject::RunAddr;
use streamgate_bus::{StreamSettings, DEFAULT_PARTITIONS, RAW_STREAM};

const SERVICES_PASSWORD: &str = "services-test-password";
const ACME_PASSWORD: &str = "acme-test-password";

/// The spawned server, killed on drop.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn chunk(tenant: &str, run: &str) -> RawChunk {
    RawChunk {
        addr: RunAddr::parse(tenant, run, DEFAULT_PARTITIONS).unwrap(),
        session_key: None,
        family: "f1".into(),
        dialect: None,
        chunk: 0,
        ingest_ts_ms: 0,
        close: None,
        body: Bytes::from_static(b"data: {}\n\n"),
    }
}

async fn stored(js: &async_nats::jetstream::Context, addr: &RunAddr) -> usize {
    streamgate_bus::consume::read_subject(js, RAW_STREAM, &addr.raw_subject())
        .await
        .expect("read subject")
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_publishes_only_its_own_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::copy(
        root.join("deploy/nats/accounts.conf"),
        dir.path().join("accounts.conf"),
    )
    .unwrap();
    let port = streamgate_bus::local::free_port().unwrap();
    let conf = dir.path().join("server.conf");
    std::fs::write(
        &conf,
        format!(
            "listen: \"127.0.0.1:{port}\"\njetstream: {{ store_dir: {:?} }}\ninclude ./accounts.conf\n",
            dir.path().join("js").display().to_string()
        ),
    )
    .unwrap();
    let _server = Server(
        Command::new(streamgate_testkit::nats_server_binary().unwrap_or_else(|e| panic!("{e}")))
            .arg("-c")
            .arg(&conf)
            .env("SG_NATS_SERVICES_PASSWORD", SERVICES_PASSWORD)
            .env("SG_NATS_PRODUCER_ACME_PASSWORD", ACME_PASSWORD)
            .env("SG_NATS_SYS_PASSWORD", "sys-test-password")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nats-server"),
    );
    let url = format!("nats://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let services = loop {
        match async_nats::ConnectOptions::new()
            .user_and_password("streamgate".into(), SERVICES_PASSWORD.into())
            .connect(&url)
            .await
        {
            Ok(c) => break c,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("nats-server with accounts.conf did not come up: {e}"),
        }
    };
    let sjs = async_nats::jetstream::new(services);
    streamgate_bus::ensure_streams(&sjs, &StreamSettings::default())
        .await
        .expect("streams as the services user");

    let (violations_tx, mut violations) = tokio::sync::mpsc::unbounded_channel();
    let producer = async_nats::ConnectOptions::new()
        .user_and_password("producer-acme".into(), ACME_PASSWORD.into())
        .custom_inbox_prefix("_INBOX_acme")
        .event_callback(move |e| {
            let tx = violations_tx.clone();
            async move {
                if let async_nats::Event::ServerError(e) = e {
                    let _ = tx.send(e.to_string());
                }
            }
        })
        .connect(&url)
        .await
        .expect("producer connects");
    let mut pjs = async_nats::jetstream::new(producer);
    pjs.set_timeout(Duration::from_secs(2));

    let own = chunk("acme", "run-1");
    publish_raw_with(&pjs, &own, None)
        .await
        .expect("acme's producer stores acme's chunk");
    assert_eq!(stored(&sjs, &own.addr).await, 1);

    let other = chunk("globex", "run-1");
    assert!(
        publish_raw_with(&pjs, &other, None).await.is_err(),
        "a publish to another tenant's subject was acknowledged"
    );
    let violation = tokio::time::timeout(Duration::from_secs(5), violations.recv())
        .await
        .expect("the server reports the violation")
        .unwrap();
    assert!(
        violation.to_lowercase().contains("permissions violation")
            && violation.contains("sg.raw.globex"),
        "{violation}"
    );
    assert_eq!(stored(&sjs, &other.addr).await, 0);
    // Nor can it write events directly.
    let evt = other.addr.events_subject();
    assert!(pjs.publish(evt, Bytes::new()).await.map(|_| ()).is_ok());
    let violation = tokio::time::timeout(Duration::from_secs(5), violations.recv())
        .await
        .expect("the server reports the violation")
        .unwrap();
    assert!(violation.contains("sg.evt.globex"), "{violation}");
}
