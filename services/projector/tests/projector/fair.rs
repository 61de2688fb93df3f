//! Fair delivery (issue 10), end to end: a real nats-server, the projector channel, and
//! the local fake webhook receiver (signature check, `Idempotency-Key` dedupe, refusal
//! behaviours). The webhook channel runs on its own pacing (none, only bounded
//! concurrency): no rate override here.
#![allow(missing_docs)]

use crate::common;

use common::{now_ms, poll_until, publish, TENANT};
use futures::future::join_all;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use streamgate_grammar::{Envelope, Event, RunEvent};
use streamgate_projector::{start, ChannelConfig, ChannelSink, Running};
use streamgate_sinks::fakes::{Behavior, FakeServer};
use streamgate_sinks::{webhook, SinkConfig};
use streamgate_testkit::NatsServer;
use tokio_util::sync::CancellationToken;

type R = Result<(), Box<dyn std::error::Error>>;

const SECRET: &str = "whsec-fair";

/// A short run: thinking, a tool, commentary, the final answer, the end.
fn run_events_json(answer: &str) -> Vec<String> {
    vec![
        r#"{"seq":1,"stream":"lifecycle","data":{"phase":"start","provider":"anthropic","model":"claude-test"}}"#.to_owned(),
        r#"{"seq":2,"stream":"thinking","data":{"variant":"raw","phase":"start","id":"th_1"}}"#.to_owned(),
        r#"{"seq":3,"stream":"thinking","data":{"variant":"raw","delta":"Look it up.","id":"th_1"}}"#.to_owned(),
        r#"{"seq":4,"stream":"thinking","data":{"variant":"raw","phase":"end","id":"th_1"}}"#.to_owned(),
        r#"{"seq":5,"stream":"item","data":{"phase":"start","id":"call_1","kind":"tool","name":"web_search","status":"in_progress","arguments":{"query":"q"}}}"#.to_owned(),
        r#"{"seq":6,"stream":"item","data":{"phase":"end","id":"call_1","kind":"tool","name":"web_search","status":"completed","arguments":{"query":"q"},"result":"r"}}"#.to_owned(),
        format!(r#"{{"seq":7,"stream":"assistant","data":{{"phase":"commentary","delta":"{answer}","id":"msg_1","status":"in_progress"}}}}"#),
        format!(r#"{{"seq":8,"stream":"assistant","data":{{"phase":"final_answer","text":"{answer}","id":"msg_1","status":"completed"}}}}"#),
        r#"{"seq":9,"stream":"lifecycle","data":{"phase":"end","reason":"completed","status":"completed"}}"#.to_owned(),
    ]
}

fn run(run_id: &str, chat: &str) -> Result<Vec<RunEvent>, Box<dyn std::error::Error>> {
    let t0 = now_ms();
    run_events_json(&format!(
        "answer of {}",
        run_id.replace(char::is_control, "?")
    ))
    .iter()
    .map(|l| {
        let event = Event::from_json(l)?;
        Ok(RunEvent {
            envelope: Envelope {
                tenant: TENANT.to_owned(),
                session_key: Some(chat.to_owned()),
                run_id: run_id.to_owned(),
                ts_ms: t0 + i64::try_from(event.seq).unwrap_or(0),
            },
            event,
        })
    })
    .collect()
}

/// Every run's events published at once (concurrently, like live turns).
async fn publish_all(js: &async_nats::jetstream::Context, runs: &[Vec<RunEvent>]) -> R {
    for r in join_all(runs.iter().map(|evs| publish(js, evs))).await {
        r?;
    }
    Ok(())
}

/// A webhook channel on the sink's own pacing, retrying fast.
fn hook_channel(fake: &FakeServer) -> ChannelConfig {
    let mut c = ChannelConfig::new(
        "hook",
        ChannelSink::Sink(SinkConfig::Webhook(webhook::WebhookConfig::new(
            "hook",
            fake.base_url.clone(),
            SECRET,
        ))),
    );
    c.delivery.retry_base = Duration::from_millis(50);
    c.delivery.retry_max = Duration::from_millis(500);
    c
}

async fn setup() -> Result<(NatsServer, async_nats::jetstream::Context), Box<dyn std::error::Error>>
{
    let (nats, js) = NatsServer::with_streams().await;
    Ok((nats, js))
}

/// Applied `final` ops per run id (the fake keeps each `Idempotency-Key` once).
fn finals(fake: &FakeServer) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for e in fake.events() {
        if e.get("op").and_then(|v| v.as_str()) == Some("final") {
            let run = e.get("run_id").and_then(|v| v.as_str()).unwrap_or("");
            *m.entry(run.to_owned()).or_default() += 1;
        }
    }
    m
}

/// Final requests the fake received for `chat`, whatever it answered.
fn final_calls(fake: &FakeServer, chat: &str) -> usize {
    fake.calls()
        .iter()
        .filter(|c| c.api == "final" && c.body.get("chat").and_then(|v| v.as_str()) == Some(chat))
        .count()
}

/// Cancels `shutdown` and waits for every task; returns how long that took.
async fn stop(mut running: Running, shutdown: &CancellationToken) -> Result<Duration, String> {
    let t = Instant::now();
    shutdown.cancel();
    let all = async {
        while let Some(r) = running.tasks.join_next().await {
            if let Ok(Err(e)) = r {
                tracing::warn!(error = %e, "task ended with an error");
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), all)
        .await
        .map_err(|_| "tasks still running 30 s after shutdown".to_owned())?;
    Ok(t.elapsed())
}

/// Acceptance 1: 200 runs at once in one chat, then one run in another chat. The quiet
/// chat's final arrives within 5 s; all 201 finals arrive exactly once within 120 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_chat_never_delays_a_quiet_one() -> R {
    let (nats, js) = setup().await?;
    let fake = FakeServer::webhook(SECRET, Behavior::default()).await?;
    let shutdown = CancellationToken::new();
    let running = start(
        nats.client().await,
        hook_channel(&fake),
        None,
        shutdown.clone(),
    )
    .await?;
    let busy: Vec<_> = (0..200)
        .map(|i| run(&format!("busy-{i:03}"), "busy"))
        .collect::<Result<_, _>>()?;
    let t0 = Instant::now();
    publish_all(&js, &busy).await?;
    publish(&js, &run("quiet-1", "quiet")?).await?;
    let t_quiet = Instant::now();
    assert!(
        poll_until(Duration::from_secs(5), || finals(&fake)
            .contains_key("quiet-1"))
        .await,
        "the quiet chat's final did not arrive within 5 s (busy finals so far: {})",
        finals(&fake).len()
    );
    let quiet_after = t_quiet.elapsed();
    assert!(
        poll_until(Duration::from_secs(120), || finals(&fake).len() == 201).await,
        "only {} of 201 finals within 120 s",
        finals(&fake).len()
    );
    let all_after = t0.elapsed();
    let f = finals(&fake);
    assert!(f.values().all(|n| *n == 1), "a final applied twice: {f:?}");
    assert_eq!(fake.duplicates(), 0, "a final was sent again");
    eprintln!("quiet final after {quiet_after:?}; all 201 finals after {all_after:?}");
    let took = stop(running, &shutdown).await?;
    assert!(took < Duration::from_secs(5), "shutdown took {took:?}");
    Ok(())
}

/// Acceptance 2: a receiver answering 400 forever for one chat gets a bounded number of
/// attempts per op; the other chats' finals keep flowing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_400_forever_is_bounded_and_other_chats_flow() -> R {
    let (nats, js) = setup().await?;
    let behavior = Behavior {
        refuse_status: Some(400),
        refuse_chats: vec!["refused".into()],
        ..Behavior::default()
    };
    let fake = FakeServer::webhook(SECRET, behavior).await?;
    let shutdown = CancellationToken::new();
    let cfg = hook_channel(&fake);
    let attempts = cfg.delivery.permanent_attempts as usize;
    let running = start(nats.client().await, cfg, None, shutdown.clone()).await?;
    let mut runs = vec![run("refused-1", "refused")?, run("refused-2", "refused")?];
    for i in 0..10 {
        runs.push(run(&format!("ok-{i}"), &format!("ok-{}", i % 3))?);
    }
    publish_all(&js, &runs).await?;
    assert!(
        poll_until(Duration::from_secs(20), || finals(&fake).len() == 10).await,
        "other chats' finals: {:?}",
        finals(&fake)
    );
    // Both refused finals were tried, and after a while still no more than allowed.
    assert!(
        poll_until(Duration::from_secs(10), || final_calls(&fake, "refused")
            == 2 * attempts)
        .await,
        "refused final calls: {}",
        final_calls(&fake, "refused")
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(final_calls(&fake, "refused"), 2 * attempts);
    let refused: Vec<_> = fake
        .calls()
        .into_iter()
        .filter(|c| c.body.get("chat").and_then(|v| v.as_str()) == Some("refused"))
        .collect();
    assert!(refused.iter().all(|c| c.status == 400));
    // Every op (its idempotency key: channel/run/op/seq) got at most that many.
    let mut per_op: HashMap<String, usize> = HashMap::new();
    for c in &refused {
        let key = c.body.get("key").and_then(|v| v.as_str()).unwrap_or("");
        *per_op.entry(key.to_owned()).or_default() += 1;
    }
    assert!(
        per_op.values().all(|n| *n <= attempts),
        "an op got more than {attempts} attempts: {per_op:?}"
    );
    let took = stop(running, &shutdown).await?;
    assert!(took < Duration::from_secs(5), "shutdown took {took:?}");
    Ok(())
}

/// Acceptance 3: a run id with a control character (only a producer writing to NATS
/// directly can make one; the front doors refuse it) still makes a valid
/// `Idempotency-Key`: header values are always percent-encoded, so its final goes out
/// with the key encoded, the same chat's next run is delivered, and shutdown is not held
/// up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_id_with_a_control_char_is_encoded_and_blocks_nothing() -> R {
    let (nats, js) = setup().await?;
    let fake = FakeServer::webhook(SECRET, Behavior::default()).await?;
    let shutdown = CancellationToken::new();
    let running = start(
        nats.client().await,
        hook_channel(&fake),
        None,
        shutdown.clone(),
    )
    .await?;
    publish(&js, &run("bad\u{7}run", "chat-c")?).await?;
    publish(&js, &run("good-run", "chat-c")?).await?;
    assert!(
        poll_until(Duration::from_secs(10), || finals(&fake)
            .contains_key("good-run"))
        .await,
        "the chat is blocked: {:?}",
        finals(&fake)
    );
    // The odd run's final went out too, its key percent-encoded (never raw bytes).
    assert!(
        poll_until(Duration::from_secs(10), || finals(&fake)
            .contains_key("bad\u{7}run"))
        .await
    );
    assert!(fake.calls().iter().all(|c| c
        .body
        .get("key")
        .and_then(|v| v.as_str())
        .is_none_or(|k| !k.contains('\u{7}'))));
    // Both runs are finished with: the bad run's ops were given up on (not left
    // retrying), so its active-run marker went like the good one's.
    let kv =
        streamgate_projector::kv::bucket(&js, streamgate_projector::kv::DELIVERY_BUCKET, 1).await?;
    let mut left = Vec::new();
    for _ in 0..100 {
        left = streamgate_projector::kv::list_active(&kv, "hook").await?;
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(left.is_empty(), "runs still pending: {left:?}");
    let took = stop(running, &shutdown).await?;
    assert!(took < Duration::from_secs(5), "shutdown took {took:?}");
    Ok(())
}

/// Acceptance 4: shutdown with a final still pending (a receiver that answers 500
/// forever) completes within a few seconds; the final stays tracked, so the next start
/// delivers it once the receiver is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_a_final_pending_is_prompt_and_the_final_survives() -> R {
    let (nats, js) = setup().await?;
    let down = Behavior {
        refuse_status: Some(500),
        ..Behavior::default()
    };
    let fake = FakeServer::webhook(SECRET, down).await?;
    let shutdown = CancellationToken::new();
    let running = start(
        nats.client().await,
        hook_channel(&fake),
        None,
        shutdown.clone(),
    )
    .await?;
    publish(&js, &run("pending-1", "chat-p")?).await?;
    assert!(
        poll_until(Duration::from_secs(10), || final_calls(&fake, "chat-p")
            >= 2)
        .await,
        "the final was not attempted"
    );
    let took = stop(running, &shutdown).await?;
    assert!(took < Duration::from_secs(5), "shutdown took {took:?}");

    // The receiver is back (a new one): the restarted channel delivers the final.
    let up = FakeServer::webhook(SECRET, Behavior::default()).await?;
    let shutdown = CancellationToken::new();
    let running = start(
        nats.client().await,
        hook_channel(&up),
        None,
        shutdown.clone(),
    )
    .await?;
    assert!(
        poll_until(Duration::from_secs(30), || finals(&up)
            .contains_key("pending-1"))
        .await,
        "the final was lost across the restart"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(finals(&up).get("pending-1"), Some(&1));
    let took = stop(running, &shutdown).await?;
    assert!(took < Duration::from_secs(5), "shutdown took {took:?}");
    Ok(())
}

/// Issue 17: a final the receiver fails (500) until its retries run out is parked — the
/// chat's next final is not held up — and listed; once the receiver is back, the
/// operator's resend (`streamgate parked <channel> --resend`) delivers it exactly once
/// and its run's marker goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_final_is_listed_and_a_resend_delivers_it_once() -> R {
    let (nats, js) = setup().await?;
    let down = Behavior {
        refuse_status: Some(500),
        refuse_chats: vec!["chat-stuck".into()],
        ..Behavior::default()
    };
    let fake = FakeServer::webhook(SECRET, down).await?;
    let shutdown = CancellationToken::new();
    let mut config = hook_channel(&fake);
    config.delivery.breaker_cooldown = Duration::from_millis(300);
    let running = start(nats.client().await, config, None, shutdown.clone()).await?;
    publish(&js, &run("stuck-1", "chat-stuck")?).await?;
    assert!(
        poll_until(Duration::from_secs(30), || !running
            .channel
            .parked()
            .is_empty())
        .await,
        "the final was never parked"
    );
    let parked = running.channel.parked();
    assert_eq!(parked.len(), 1);
    assert_eq!(
        (
            parked[0].run.run_id.as_str(),
            parked[0].chat.chat_id.as_str()
        ),
        ("stuck-1", "chat-stuck")
    );
    assert!(parked[0].error.contains("500"), "{}", parked[0].error);
    // The chat goes on: the next run's final (another chat here) arrives promptly.
    publish(&js, &run("next-1", "chat-ok")?).await?;
    assert!(
        poll_until(Duration::from_secs(5), || finals(&fake)
            .contains_key("next-1"))
        .await,
        "a parked final held up the next one"
    );
    // The receiver is back; the operator resends.
    fake.recover();
    assert_eq!(running.channel.resend_parked().await?, 1);
    assert!(
        poll_until(Duration::from_secs(10), || finals(&fake)
            .contains_key("stuck-1"))
        .await,
        "the resend did not deliver the parked final"
    );
    assert!(
        poll_until(Duration::from_secs(5), || running
            .channel
            .parked()
            .is_empty())
        .await,
        "still listed as parked after its delivery"
    );
    let kv = js
        .get_key_value(streamgate_projector::kv::DELIVERY_BUCKET)
        .await?;
    let marker_gone = || async {
        streamgate_projector::kv::list_active(&kv, "hook")
            .await
            .map(|m| m.iter().all(|m| m.run_id != "stuck-1"))
            .unwrap_or(false)
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while !marker_gone().await {
        assert!(Instant::now() < deadline, "the parked run's marker stayed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        finals(&fake).get("stuck-1"),
        Some(&1),
        "delivered exactly once"
    );
    assert_eq!(
        running.channel.resend_parked().await?,
        0,
        "nothing left to resend"
    );
    stop(running, &shutdown).await?;
    Ok(())
}
