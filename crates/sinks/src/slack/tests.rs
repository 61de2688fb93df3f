//! Tests against the local fake Slack server.

use super::{SlackConfig, SlackSink};
use crate::fakes::{Behavior, FakeServer};
use crate::testutil::{draft, fast_engine, final_op, settle};
use crate::{ChatTarget, DeliveryState, Sink, SinkError, StateKey};
use std::sync::Arc;
use std::time::Duration;
use streamgate_projection::Op;

const TOKEN: &str = "xoxb-test";

fn sink(fake: &FakeServer) -> Result<SlackSink, SinkError> {
    let mut c = SlackConfig::new("sl", TOKEN);
    c.base_url = fake.base_url.clone();
    SlackSink::new(c)
}

#[tokio::test]
async fn happy_path_with_mrkdwn_escaping() -> Result<(), Box<dyn std::error::Error>> {
    let fake = FakeServer::slack(TOKEN, Behavior::default()).await?;
    let sl = sink(&fake)?;
    let chat = ChatTarget::new("", "sl", "C123");
    let mut st = DeliveryState::default();
    let answer = "<!channel> a & b > c";
    for op in [
        Op::Typing,
        draft("r", "> 🧠 hmm", 1),
        settle("r", "🧠 done", 2),
        final_op("r", answer, 3),
    ] {
        sl.execute(&chat, &op, &mut st).await?;
    }
    let msgs = fake.live_messages();
    assert_eq!(msgs.len(), 2);
    assert_eq!(msgs[0].text, "🧠 done");
    assert_eq!(
        msgs[1].raw, "&lt;!channel&gt; a &amp; b &gt; c",
        "no mass mention"
    );
    assert_eq!(msgs[1].text, answer);
    let first = fake.calls().first().map(|c| c.body.clone());
    assert_eq!(
        first.and_then(|b| b.get("text").and_then(|t| t.as_str()).map(str::to_owned)),
        Some("> 🧠 hmm".to_owned()),
        "blockquote marker stays literal"
    );
    Ok(())
}

#[tokio::test]
async fn ratelimited_is_honoured() -> Result<(), Box<dyn std::error::Error>> {
    let behavior = Behavior {
        rate_limit_every: Some(2),
        retry_after_secs: 1.0,
        ..Behavior::default()
    };
    let fake = FakeServer::slack(TOKEN, behavior).await?;
    let (delivery, store) = fast_engine(Arc::new(sink(&fake)?));
    let chat = ChatTarget::new("", "sl", "C9");
    delivery
        .submit(chat.clone(), draft("r", "working", 1))
        .await?;
    delivery
        .submit(chat.clone(), final_op("r", "the answer", 2))
        .await?;
    tokio::time::timeout(Duration::from_secs(20), delivery.flush()).await?;
    let calls = fake.calls();
    let limited = calls.iter().position(|c| c.status == 429);
    let Some(i) = limited else {
        panic!("no 429 seen: {calls:?}");
    };
    let next = calls.get(i + 1).map(|c| c.at.duration_since(calls[i].at));
    assert!(
        next.is_some_and(|d| d >= Duration::from_millis(990)),
        "{next:?}"
    );
    assert_eq!(fake.early_calls(), 0);
    let finals: Vec<_> = fake
        .live_messages()
        .into_iter()
        .filter(|m| m.text == "the answer")
        .collect();
    assert_eq!(finals.len(), 1);
    let st = store.get(&StateKey::new(&chat, "r")).unwrap_or_default();
    assert!(st.final_delivered);
    Ok(())
}

/// Slack's limits hold per method and workspace (`chat.postMessage` per channel too): a
/// 429 holds that scope for every chat of the token, with no request sent until it
/// ends, while other scopes go on.
#[tokio::test]
async fn a_429_holds_its_method_for_every_chat_and_only_that_method(
) -> Result<(), Box<dyn std::error::Error>> {
    let behavior = Behavior {
        rate_limit_burst: Some((1, 1)),
        retry_after_secs: 30.0,
        ..Behavior::default()
    };
    let fake = FakeServer::slack(TOKEN, behavior).await?;
    let sl = sink(&fake)?;
    let post = |channel: &str| serde_json::json!({"channel": channel, "text": "hi"});
    let first = sl
        .call("chat.update", post("C1"))
        .await
        .map_err(super::runtime::plain);
    assert!(
        matches!(first, Err(SinkError::RateLimited { .. })),
        "{first:?}"
    );
    let held = sl
        .call("chat.update", post("C2"))
        .await
        .map_err(super::runtime::plain);
    match held {
        Err(SinkError::RateLimited { retry_after }) => {
            assert!(retry_after > Duration::from_secs(25), "{retry_after:?}")
        }
        other => panic!("not held: {other:?}"),
    }
    assert_eq!(fake.calls().len(), 1, "the held call was not sent");
    sl.call("chat.postMessage", post("C2"))
        .await
        .map_err(super::runtime::plain)?;
    assert_eq!(fake.live_messages().len(), 1, "another method goes on");
    Ok(())
}
