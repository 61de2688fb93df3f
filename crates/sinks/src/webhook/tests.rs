//! Tests against the local fake webhook receiver.

use super::{idempotency_key, sign, verify, WebhookConfig, WebhookSink};
use crate::fakes::{Behavior, FakeServer};
use crate::testutil::{draft, fast_engine, final_op};
use crate::{ChatTarget, DeliveryState, Sink, SinkError};
use std::sync::Arc;
use std::time::Duration;
use streamgate_projection::{DraftKey, Op};

const SECRET: &str = "hook-secret";

fn sink(fake: &FakeServer, secret: &str, timeout_secs: f64) -> Result<WebhookSink, SinkError> {
    let mut c = WebhookConfig::new("hook", fake.base_url.clone(), secret);
    c.timeout_secs = timeout_secs;
    WebhookSink::new(c)
}

#[test]
fn signature_round_trips() {
    let body = br#"{"op":"final"}"#;
    let sig = sign(SECRET.as_bytes(), body);
    assert!(sig.starts_with("sha256=") && sig.len() == 7 + 64);
    assert!(verify(SECRET.as_bytes(), body, &sig));
    assert!(!verify(b"other", body, &sig));
    assert!(!verify(SECRET.as_bytes(), b"{}", &sig));
}

#[test]
fn idempotency_key_is_stable() {
    let op = final_op("run-1", "x", 42);
    assert_eq!(idempotency_key("hook", &op), "hook/run-1/final/42");
    assert_eq!(idempotency_key("hook", &op), idempotency_key("hook", &op));
    let dismiss = Op::Dismiss {
        key: DraftKey {
            run_id: "run-1".into(),
            tenant: String::new(),
        },
    };
    assert_eq!(idempotency_key("hook", &dismiss), "hook/run-1/dismiss/0");
}

#[test]
fn idempotency_keys_are_always_valid_header_values() {
    let op = final_op("café 100%", "x", 7);
    let key = idempotency_key("hook", &op);
    assert_eq!(key, "hook/caf%C3%A9 100%25/final/7");
    assert!(reqwest::header::HeaderValue::from_str(&key).is_ok());
}

#[test]
fn the_tenant_is_part_of_the_key_and_the_payload() {
    let op = |tenant: &str| Op::Final {
        key: DraftKey {
            run_id: "r1".into(),
            tenant: tenant.into(),
        },
        text: "x".into(),
        truncated: false,
        suffix: None,
        seq: 3,
    };
    // The same run id under two tenants: two runs, two keys (the receiver must not
    // dedupe one against the other).
    assert_eq!(idempotency_key("hook", &op("acme")), "hook/acme/r1/final/3");
    assert_eq!(
        idempotency_key("hook", &op("globex")),
        "hook/globex/r1/final/3"
    );
    let chat = ChatTarget::new("", "hook", "room");
    let p = super::payload("hook", &chat, &op("acme"), "k");
    assert_eq!((&p["tenant"], &p["run_id"]), (&"acme".into(), &"r1".into()));
    assert!(super::payload("hook", &chat, &op(""), "k")
        .get("tenant")
        .is_none());
}

#[tokio::test]
async fn happy_path_signed_and_deduped() -> Result<(), Box<dyn std::error::Error>> {
    let fake = FakeServer::webhook(SECRET, Behavior::default()).await?;
    let hook = sink(&fake, SECRET, 5.0)?;
    let chat = ChatTarget::new("", "hook", "room");
    let answer = "exact <answer> & \"quotes\"\n";
    let fin = Op::Final {
        key: DraftKey {
            run_id: "r".into(),
            tenant: String::new(),
        },
        text: answer.into(),
        truncated: true,
        suffix: Some("⚠️ truncated (token limit)".into()),
        seq: 9,
    };
    let mut st = DeliveryState::default();
    hook.execute(&chat, &Op::Typing, &mut st).await?;
    hook.execute(&chat, &draft("r", "d", 1), &mut st).await?;
    hook.execute(&chat, &fin, &mut st).await?;
    // A second process without our state sends the same op: the receiver dedupes.
    hook.execute(&chat, &fin, &mut DeliveryState::default())
        .await?;
    let events = fake.events();
    assert_eq!(events.len(), 3);
    assert_eq!(fake.duplicates(), 1);
    let f = &events[2];
    assert_eq!(f["op"], "final");
    assert_eq!(f["text"], answer, "final text exactly as the event had it");
    assert_eq!(f["truncated"], true);
    assert_eq!(f["key"], "hook/r/final/9");
    assert_eq!(f["run_id"], "r");
    assert_eq!(f["seq"], 9);
    assert_eq!(f["channel"], "hook");
    Ok(())
}

#[tokio::test]
async fn wrong_secret_is_rejected() -> Result<(), Box<dyn std::error::Error>> {
    let fake = FakeServer::webhook(SECRET, Behavior::default()).await?;
    let hook = sink(&fake, "not-the-secret", 5.0)?;
    let r = hook
        .execute(
            &ChatTarget::new("", "hook", "room"),
            &final_op("r", "a", 1),
            &mut DeliveryState::default(),
        )
        .await;
    assert!(matches!(r, Err(SinkError::Permanent(_))), "{r:?}");
    assert!(fake.events().is_empty());
    Ok(())
}

#[tokio::test]
async fn final_exactly_once_when_first_attempt_times_out_after_apply(
) -> Result<(), Box<dyn std::error::Error>> {
    // The receiver applies the first final, then answers too late: the client times
    // out, the engine retries with the same Idempotency-Key, the receiver dedupes.
    let behavior = Behavior {
        delay_first: 1,
        delay: Duration::from_millis(1500),
        ..Behavior::default()
    };
    let fake = FakeServer::webhook(SECRET, behavior).await?;
    let (delivery, _) = fast_engine(Arc::new(sink(&fake, SECRET, 0.3)?));
    let chat = ChatTarget::new("", "hook", "room");
    delivery
        .submit(chat.clone(), final_op("r", "once", 3))
        .await?;
    delivery
        .submit(chat.clone(), final_op("r", "once", 3))
        .await?;
    tokio::time::timeout(Duration::from_secs(20), delivery.flush()).await?;
    let finals = fake
        .events()
        .into_iter()
        .filter(|e| e["op"] == "final")
        .count();
    assert_eq!(finals, 1);
    assert!(fake.duplicates() >= 1, "the retry reached the receiver");
    Ok(())
}

/// A run id with a control character (only a producer writing to NATS directly can make
/// one) still makes a valid header: the key is percent-encoded, the final delivered.
#[tokio::test]
async fn run_id_with_a_control_char_is_encoded_in_the_header(
) -> Result<(), Box<dyn std::error::Error>> {
    let fake = FakeServer::webhook(SECRET, Behavior::default()).await?;
    let hook = sink(&fake, SECRET, 5.0)?;
    let chat = ChatTarget::new("", "hook", "room");
    let mut state = DeliveryState::default();
    let r = hook
        .execute(&chat, &final_op("bad\u{1}run", "answer", 3), &mut state)
        .await;
    assert!(r.is_ok(), "{r:?}");
    assert!(state.final_delivered);
    let calls = fake.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0].body.get("key").and_then(|k| k.as_str()),
        Some("hook/bad%01run/final/3")
    );
    Ok(())
}

#[tokio::test]
async fn a_400_forever_is_permanent() -> Result<(), Box<dyn std::error::Error>> {
    let behavior = Behavior {
        refuse_status: Some(400),
        ..Behavior::default()
    };
    let fake = FakeServer::webhook(SECRET, behavior).await?;
    let hook = sink(&fake, SECRET, 5.0)?;
    let mut state = DeliveryState::default();
    let r = hook
        .execute(
            &ChatTarget::new("", "hook", "room"),
            &final_op("r", "answer", 3),
            &mut state,
        )
        .await;
    assert!(matches!(r, Err(SinkError::Permanent(_))), "{r:?}");
    Ok(())
}

#[test]
fn requests_in_flight_are_configured_and_at_least_one() -> Result<(), Box<dyn std::error::Error>> {
    // A config written before the field existed gets the default bound.
    let c: WebhookConfig =
        serde_json::from_str(r#"{"name":"hook","url":"http://127.0.0.1:9/hook","secret":"s"}"#)?;
    assert_eq!(c.max_in_flight, super::DEFAULT_MAX_IN_FLIGHT);
    let wide = WebhookConfig {
        max_in_flight: 200,
        ..c.clone()
    };
    assert_eq!(WebhookSink::new(wide)?.pacing().concurrency, 200);
    let zero = WebhookConfig {
        max_in_flight: 0,
        ..c
    };
    match WebhookSink::new(zero) {
        Err(SinkError::Permanent(why)) => assert!(why.contains("max_in_flight"), "{why}"),
        other => panic!("expected a refusal naming max_in_flight, got {other:?}"),
    }
    Ok(())
}
