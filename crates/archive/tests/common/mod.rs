//! Test and bench support: event builders and a throwaway PostgreSQL database.
//!
//! The PostgreSQL helper is local because `streamgate-testkit` (which will own
//! `PgDatabase`) is written in parallel; it is deliberately tiny.
#![allow(dead_code, missing_docs)]

use std::sync::atomic::{AtomicU64, Ordering};
use streamgate_archive::ArchivedEvent;
use streamgate_grammar::{
    Assistant, AssistantPhase, Envelope, Event, EventData, Json, Lifecycle, LifecyclePhase,
    RunEvent, StopReason,
};

/// Server URL for test databases: `$STREAMGATE_PG_URL` or the local trust-auth server.
pub fn pg_admin_url() -> String {
    std::env::var("STREAMGATE_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// A fresh database, dropped `WITH (FORCE)` on drop.
pub struct PgDb {
    name: String,
    url: String,
}

impl PgDb {
    pub async fn create() -> PgDb {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!(
            "sg_archive_test_{}_{}_{}",
            std::process::id(),
            nanos,
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let admin = pg_admin_url();
        let (client, conn) = tokio_postgres::connect(&admin, tokio_postgres::NoTls)
            .await
            .expect("connect to PostgreSQL (is it running on 127.0.0.1:5432?)");
        tokio::spawn(conn);
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create test database");
        let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b);
        let url = format!("{base}/{name}");
        PgDb { name, url }
    }

    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for PgDb {
    fn drop(&mut self) {
        // Drop runs outside any async context guarantee, so use a private runtime on a
        // private thread rather than blocking the test's runtime.
        let name = self.name.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                if let Ok((client, conn)) =
                    tokio_postgres::connect(&pg_admin_url(), tokio_postgres::NoTls).await
                {
                    tokio::spawn(conn);
                    let _ = client
                        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .await;
                }
            });
        })
        .join();
    }
}

pub fn env(tenant: &str, session: Option<&str>, run: &str, ts_ms: i64) -> Envelope {
    Envelope {
        tenant: tenant.to_owned(),
        session_key: session.map(str::to_owned),
        run_id: run.to_owned(),
        ts_ms,
    }
}

pub fn archived(envelope: Envelope, seq: u64, data: EventData, journal_seq: u64) -> ArchivedEvent {
    ArchivedEvent {
        event: RunEvent {
            envelope,
            event: Event { seq, data },
        },
        journal_seq,
    }
}

pub fn start(provider: &str, model: &str) -> EventData {
    EventData::from(Lifecycle {
        provider: Some(provider.to_owned()),
        model: Some(model.to_owned()),
        ..Lifecycle::new(LifecyclePhase::Start)
    })
}

pub fn delta(text: &str) -> EventData {
    EventData::Assistant(Assistant {
        phase: Some(AssistantPhase::Commentary),
        delta: Some(text.to_owned()),
        ..Assistant::default()
    })
}

pub fn end(reason: StopReason, usage: Option<&str>) -> EventData {
    EventData::from(Lifecycle {
        reason: Some(reason),
        usage: usage.map(|u| Json::parse(u).expect("usage json")),
        ..Lifecycle::new(LifecyclePhase::End)
    })
}

pub fn error(reason: StopReason) -> EventData {
    EventData::from(Lifecycle {
        reason: Some(reason),
        ..Lifecycle::new(LifecyclePhase::Error)
    })
}

/// A whole run: start, `deltas` assistant deltas, end with usage. Journal sequences
/// start at `journal_start`; ts advances by 1 ms per event from `ts0`.
pub fn whole_run(
    tenant: &str,
    run: &str,
    ts0: i64,
    deltas: u64,
    journal_start: u64,
) -> Vec<ArchivedEvent> {
    let mut out = Vec::new();
    let e = |seq: u64| env(tenant, Some("chat-1"), run, ts0 + seq as i64);
    out.push(archived(
        e(1),
        1,
        start("anthropic", "claude-x"),
        journal_start,
    ));
    for i in 0..deltas {
        let seq = i + 2;
        out.push(archived(
            e(seq),
            seq,
            delta(&format!("token {i} of a streamed reply; ")),
            journal_start + seq - 1,
        ));
    }
    let seq = deltas + 2;
    out.push(archived(
        e(seq),
        seq,
        end(
            StopReason::Completed,
            Some(r#"{"input_tokens":12,"output_tokens":345,"cost":0.0026784}"#),
        ),
        journal_start + seq - 1,
    ));
    out
}
