//! Tests against the local fake Discord server.

use super::{DiscordConfig, DiscordSink};
use crate::fakes::{Behavior, FakeServer};
use crate::testutil::{draft, fast_engine, final_op, settle};
use crate::{ChatTarget, DeliveryState, Sink, SinkError};
use std::sync::Arc;
use std::time::Duration;
use streamgate_projection::{DraftKey, Op};

fn sink(fake: &FakeServer, token: &str) -> Result<DiscordSink, SinkError> {
    let mut c = DiscordConfig::new("dc", "1234", token);
    c.base_url = fake.base_url.clone();
    DiscordSink::new(c)
}

#[tokio::test]
async fn happy_path_and_2000_limit() -> Result<(), Box<dyn std::error::Error>> {
    let fake = FakeServer::discord("1234", "tok", Behavior::default()).await?;
    let dc = sink(&fake, "tok")?;
    let chat = ChatTarget::new("", "dc", "");
    let mut st = DeliveryState::default();
    let answer = "word ".repeat(900); // 4500 chars: 3 messages
    let over_budget_draft = "y".repeat(2500);
    for op in [
        Op::Typing,
        draft("r", "> 🧠 thinking", 1),
        draft("r", &over_budget_draft, 2),
        settle("r", "🧠 1 segment · 2 s", 3),
        final_op("r", &answer, 4),
    ] {
        dc.execute(&chat, &op, &mut st).await?;
    }
    let msgs = fake.live_messages();
    assert_eq!(msgs.len(), 4, "draft + 3 final parts: {msgs:?}");
    assert!(msgs.iter().all(|m| m.text.chars().count() <= 2000));
    assert_eq!(msgs[0].text, "🧠 1 segment · 2 s");
    assert_eq!(
        msgs[1..]
            .iter()
            .map(|m| m.text.as_str())
            .collect::<String>(),
        answer.trim_end(),
        "markdown drops the trailing space"
    );
    assert!(fake.calls().iter().all(|c| c.status < 300));
    // The over-budget draft was cut to the limit, not split.
    let cut = fake
        .calls()
        .iter()
        .filter(|c| c.api == "edit")
        .filter_map(|c| {
            c.body
                .get("content")
                .and_then(|v| v.as_str())
                .map(str::to_owned)
        })
        .find(|t| t.starts_with('y'))
        .unwrap_or_default();
    assert_eq!(cut.chars().count(), 2000);
    assert!(cut.ends_with('…'));
    // Retract withdraws the delivered answer: one placeholder remains.
    let placeholder = "⛔ response withdrawn (provider safety stop)";
    let retract = Op::Retract {
        key: DraftKey {
            run_id: "r".into(),
            tenant: String::new(),
        },
        placeholder: placeholder.into(),
        seq: 5,
    };
    dc.execute(&chat, &retract, &mut st).await?;
    let msgs = fake.live_messages();
    assert_eq!(msgs.len(), 2);
    assert_eq!(msgs[1].text, placeholder);
    Ok(())
}

#[tokio::test]
async fn bad_token_is_permanent_and_never_printed() -> Result<(), Box<dyn std::error::Error>> {
    let fake = FakeServer::discord("1234", "tok", Behavior::default()).await?;
    let dc = sink(&fake, "WRONG-SECRET")?;
    let mut st = DeliveryState::default();
    let err = dc
        .execute(
            &ChatTarget::new("", "dc", ""),
            &final_op("r", "hi", 1),
            &mut st,
        )
        .await;
    let Err(e) = err else {
        panic!("expected an error");
    };
    assert!(matches!(e, SinkError::Permanent(_)), "{e:?}");
    assert!(!e.to_string().contains("WRONG-SECRET"));
    assert!(!format!("{dc:?}").contains("WRONG-SECRET"));
    Ok(())
}

#[tokio::test]
async fn rate_limit_float_retry_after_is_honoured() -> Result<(), Box<dyn std::error::Error>> {
    let behavior = Behavior {
        rate_limit_every: Some(2),
        retry_after_secs: 0.3,
        ..Behavior::default()
    };
    let fake = FakeServer::discord("1234", "tok", behavior).await?;
    let (delivery, _) = fast_engine(Arc::new(sink(&fake, "tok")?));
    let chat = ChatTarget::new("", "dc", "thread-9");
    for i in 1..=4u64 {
        delivery
            .submit(chat.clone(), draft("r", &format!("step {i}"), i))
            .await?;
    }
    delivery
        .submit(chat.clone(), final_op("r", "answer", 5))
        .await?;
    tokio::time::timeout(Duration::from_secs(20), delivery.flush()).await?;
    assert!(fake.calls().iter().any(|c| c.status == 429));
    assert_eq!(fake.early_calls(), 0);
    let finals = fake
        .live_messages()
        .into_iter()
        .filter(|m| m.text == "answer" && m.chat == "thread-9")
        .count();
    assert_eq!(finals, 1);
    Ok(())
}

#[tokio::test]
async fn the_rate_limit_headers_pace_a_long_final_without_a_429(
) -> Result<(), Box<dyn std::error::Error>> {
    // A bucket of 5 requests per 2 s: the sink learns it from the first answer and
    // holds the sixth part until the reset instead of being refused.
    let behavior = Behavior {
        discord_bucket: Some((5, Duration::from_secs(2))),
        ..Behavior::default()
    };
    let fake = FakeServer::discord("1234", "tok", behavior).await?;
    let (delivery, _) = fast_engine(Arc::new(sink(&fake, "tok")?));
    let chat = ChatTarget::new("", "dc", "");
    let answer = "word ".repeat(4_000); // 20,000 chars: 10+ parts
    delivery
        .submit(chat.clone(), final_op("r", &answer, 1))
        .await?;
    tokio::time::timeout(Duration::from_secs(30), delivery.flush()).await?;
    let calls = fake.calls();
    assert!(calls.len() >= 10, "{} calls", calls.len());
    assert!(
        calls.iter().all(|c| c.status != 429),
        "a request went to an exhausted bucket"
    );
    let first = calls.first().map(|c| c.at);
    let last = calls.last().map(|c| c.at);
    if let (Some(a), Some(b)) = (first, last) {
        assert!(
            b - a >= Duration::from_millis(1900),
            "no pause at the bucket's end"
        );
    }
    assert_eq!(
        fake.live_messages()
            .iter()
            .map(|m| m.text.as_str())
            .collect::<String>(),
        answer.trim_end()
    );
    Ok(())
}

#[tokio::test]
async fn invalid_requests_stop_at_the_budget_well_before_the_ban(
) -> Result<(), Box<dyn std::error::Error>> {
    let fake = FakeServer::discord("1234", "tok", Behavior::default()).await?;
    let mut c = DiscordConfig::new("dc", "1234", "WRONG");
    c.base_url = fake.base_url.clone();
    c.invalid_request_budget = 3;
    let dc = DiscordSink::new(c)?;
    let chat = ChatTarget::new("", "dc", "");
    let mut errors = Vec::new();
    for i in 1..=6u64 {
        let mut st = DeliveryState::default();
        if let Err(e) = dc.execute(&chat, &final_op("r", "hi", i), &mut st).await {
            errors.push(e);
        }
    }
    assert_eq!(fake.calls().len(), 3, "requests sent past the budget");
    assert!(
        matches!(errors[0], SinkError::Permanent(_)),
        "{:?}",
        errors[0]
    );
    assert!(
        matches!(&errors[5], SinkError::Transient(m) if m.contains("invalid requests")),
        "{:?}",
        errors[5]
    );
    Ok(())
}
