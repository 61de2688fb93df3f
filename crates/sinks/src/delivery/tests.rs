//! Engine tests on paused tokio time with an in-process scripted sink (the HTTP paths
//! are covered per sink against the fakes).

use super::{BreakerState, Delivery, DeliveryConfig, DeliveryError, MemoryStore};
use crate::sink::{ChatTarget, DeliveryState, Pacing, Rate, Sink, SinkError};
use crate::testutil::{draft, final_op, key};
use futures::future::BoxFuture;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use streamgate_projection::{Op, Tier};
use tokio::time::{sleep, Instant};

#[derive(Debug, Clone, Copy)]
enum Step {
    Ok,
    RateLimited(Duration),
    Transient,
    Permanent,
    /// Apply the final (record it in the state, as a sink does once the API
    /// confirmed), then hang until the engine's attempt timeout cuts the call.
    ApplyThenHang,
    /// A slow API: the request takes this long, then the final is applied.
    Slow(Duration),
}

#[derive(Default)]
struct Script {
    steps: Mutex<VecDeque<Step>>,
    /// Every op for a chat of this tenant fails (5xx), whatever the steps say.
    failing_tenant: Mutex<Option<String>>,
    calls: Mutex<Vec<(Instant, Op)>>,
    finals_applied: Mutex<u32>,
}

struct ScriptSink(Arc<Script>, Pacing);

impl Script {
    fn new(steps: &[Step]) -> Arc<Script> {
        let s = Script::default();
        s.steps
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(steps);
        Arc::new(s)
    }
    fn calls(&self) -> Vec<(Instant, Op)> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
    fn finals(&self) -> u32 {
        *self
            .finals_applied
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }
}

impl Sink for ScriptSink {
    fn channel(&self) -> &str {
        "chan"
    }
    fn kind(&self) -> &'static str {
        "script"
    }
    fn tier(&self) -> Tier {
        Tier::T1
    }
    fn pacing(&self) -> Pacing {
        self.1
    }
    fn execute<'a>(
        &'a self,
        chat: &'a ChatTarget,
        op: &'a Op,
        state: &'a mut DeliveryState,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            let s = &self.0;
            s.calls
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((Instant::now(), op.clone()));
            let failing = s
                .failing_tenant
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_deref()
                == Some(chat.tenant.as_str());
            if failing {
                return Err(SinkError::Transient("HTTP 500".into()));
            }
            let step = s
                .steps
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop_front()
                .unwrap_or(Step::Ok);
            let apply = |state: &mut DeliveryState| {
                if matches!(op, Op::Final { .. }) && !state.final_delivered {
                    *s.finals_applied.lock().unwrap_or_else(|p| p.into_inner()) += 1;
                    state.final_delivered = true;
                }
            };
            match step {
                Step::Ok => {
                    apply(state);
                    Ok(())
                }
                Step::RateLimited(retry_after) => Err(SinkError::RateLimited { retry_after }),
                Step::Transient => Err(SinkError::Transient("boom".into())),
                Step::Permanent => Err(SinkError::Permanent("HTTP 400".into())),
                Step::ApplyThenHang => {
                    apply(state);
                    sleep(Duration::from_secs(3600)).await;
                    Ok(())
                }
                Step::Slow(took) => {
                    sleep(took).await;
                    apply(state);
                    Ok(())
                }
            }
        })
    }
}

fn engine(script: &Arc<Script>, config: DeliveryConfig) -> Delivery {
    paced_engine(script, config, Pacing::default())
}

fn paced_engine(script: &Arc<Script>, config: DeliveryConfig, pacing: Pacing) -> Delivery {
    let sink: Arc<dyn Sink> = Arc::new(ScriptSink(Arc::clone(script), pacing));
    Delivery::new(config, Arc::new(MemoryStore::new()), [sink])
}

fn chat() -> ChatTarget {
    ChatTarget::new("", "chan", "c1")
}

fn draft_texts(calls: &[(Instant, Op)]) -> Vec<String> {
    calls
        .iter()
        .filter_map(|(_, op)| match op {
            Op::Draft { text, .. } => Some(text.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn drafts_coalesce_latest_wins() -> Result<(), DeliveryError> {
    let script = Script::new(&[]);
    let config = DeliveryConfig {
        chat_rate: Some(Rate::new(1.0, 1)),
        ..DeliveryConfig::default()
    };
    let d = engine(&script, config);
    for i in 1..=50u64 {
        d.submit(chat(), draft("r", &format!("draft {i}"), i))
            .await?;
        sleep(Duration::from_millis(20)).await;
    }
    d.flush().await;
    let sent = draft_texts(&script.calls());
    assert!(
        sent.len() <= 3,
        "50 drafts in 1 s at 1/s → a few sends: {sent:?}"
    );
    assert_eq!(sent.last().map(String::as_str), Some("draft 50"));
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn coalescing_never_jumps_a_queued_final() -> Result<(), DeliveryError> {
    let script = Script::new(&[]);
    let config = DeliveryConfig {
        chat_rate: Some(Rate::new(1.0, 1)),
        ..DeliveryConfig::default()
    };
    let d = engine(&script, config);
    d.submit(chat(), draft("r", "a", 1)).await?;
    d.submit(chat(), draft("r", "b", 2)).await?;
    d.submit(chat(), final_op("r", "answer", 3)).await?;
    d.submit(chat(), draft("r2", "other run", 1)).await?;
    d.flush().await;
    // "a" was replaced by "b" before the lane ran; the final stays after the run's
    // draft, and the other run's draft does not merge into it.
    let calls = script.calls();
    let names: Vec<_> = calls.iter().map(|(_, op)| op.name()).collect();
    assert_eq!(names, ["draft", "final", "draft"]);
    assert_eq!(draft_texts(&calls), ["b", "other run"]);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn retry_after_pauses_the_lane() -> Result<(), DeliveryError> {
    let script = Script::new(&[Step::RateLimited(Duration::from_secs(5))]);
    let d = engine(&script, DeliveryConfig::default());
    let t0 = Instant::now();
    d.submit(chat(), draft("r", "a", 1)).await?;
    d.submit(chat(), final_op("r", "answer", 2)).await?;
    d.flush().await;
    let calls = script.calls();
    assert_eq!(calls.len(), 3, "draft (429), draft again, final");
    assert!(calls[0].0 - t0 < Duration::from_millis(10));
    assert!(
        calls[1].0 - calls[0].0 >= Duration::from_secs(5),
        "no request before retry_after expired"
    );
    assert_eq!(script.finals(), 1);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn breaker_opens_then_half_opens_with_one_probe() -> Result<(), DeliveryError> {
    use Step::{Ok as Good, Transient as Bad};
    let script = Script::new(&[Bad, Bad, Bad, Bad, Good]);
    let config = DeliveryConfig {
        breaker_threshold: 3,
        breaker_cooldown: Duration::from_secs(10),
        retry_base: Duration::from_millis(100),
        retry_max: Duration::from_secs(1),
        ..DeliveryConfig::default()
    };
    let d = engine(&script, config);
    d.submit(chat(), final_op("r", "answer", 1)).await?;
    sleep(Duration::from_secs(2)).await;
    assert_eq!(script.calls().len(), 3);
    assert_eq!(d.breaker_state("chan", ""), Some(BreakerState::Open));
    d.flush().await;
    let at: Vec<Instant> = script.calls().iter().map(|c| c.0).collect();
    assert_eq!(at.len(), 5);
    assert!(
        at[3] - at[2] >= Duration::from_secs(10),
        "cooldown before the probe"
    );
    assert!(
        at[4] - at[3] >= Duration::from_secs(10),
        "failed probe reopens"
    );
    assert_eq!(d.breaker_state("chan", ""), Some(BreakerState::Closed));
    assert_eq!(script.finals(), 1);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn final_exactly_once_on_double_submit_and_timeout_after_apply() -> Result<(), DeliveryError>
{
    let script = Script::new(&[Step::ApplyThenHang]);
    let config = DeliveryConfig {
        attempt_timeout: Duration::from_secs(2),
        ..DeliveryConfig::default()
    };
    let d = engine(&script, config);
    d.submit(chat(), final_op("r", "answer", 7)).await?;
    d.submit(chat(), final_op("r", "answer", 7)).await?;
    d.flush().await;
    assert_eq!(script.finals(), 1);
    assert_eq!(
        script.calls().len(),
        1,
        "the retry and the second submission saw final_delivered in the state"
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_final_outlasts_the_draft_retries() -> Result<(), DeliveryError> {
    use Step::Transient as Bad;
    let script = Script::new(&[Bad, Bad, Bad, Bad, Bad, Bad, Bad, Bad]);
    let config = DeliveryConfig {
        max_attempts: 2,
        final_attempts: 10,
        breaker_threshold: 100,
        retry_base: Duration::from_millis(100),
        ..DeliveryConfig::default()
    };
    let d = engine(&script, config);
    d.submit(chat(), draft("r", "a", 1)).await?;
    d.submit(chat(), final_op("r", "answer", 2)).await?;
    d.flush().await;
    let names: Vec<_> = script.calls().iter().map(|(_, op)| op.name()).collect();
    assert_eq!(names.iter().filter(|n| **n == "draft").count(), 2);
    assert_eq!(names.iter().filter(|n| **n == "final").count(), 7);
    assert_eq!(script.finals(), 1);
    Ok(())
}

/// A final the receiver fails forever (5xx) is parked after `final_attempts`: the chat's
/// next run's final goes out within 5 s of that (at the default breaker too: a parked
/// final ends the cooldown, the next op is the probe), and the parked one is known as
/// parked (its owner keeps the run's marker, so the next start sends it again).
#[tokio::test(start_paused = true)]
async fn a_final_failing_forever_is_parked_and_the_chat_goes_on() -> Result<(), DeliveryError> {
    let script = Script::new(&[]);
    *script
        .failing_tenant
        .lock()
        .unwrap_or_else(|p| p.into_inner()) = Some("acme".into());
    let d = engine(&script, DeliveryConfig::default());
    let acme = ChatTarget::new("acme", "chan", "c1");
    d.submit(acme.clone(), final_op("stuck", "answer", 2))
        .await?;
    d.submit(acme.clone(), final_op("next", "answer 2", 2))
        .await?;
    assert!(d.flush_run(&acme, &key("stuck")).await);
    assert!(d.is_parked(&acme, &key("stuck")));
    // The receiver recovers for the next run.
    *script
        .failing_tenant
        .lock()
        .unwrap_or_else(|p| p.into_inner()) = None;
    assert!(d.flush_run(&acme, &key("next")).await);
    assert!(!d.is_parked(&acme, &key("next")));
    let calls = script.calls();
    let at_of = |run: &str| -> Vec<Instant> {
        calls
            .iter()
            .filter(|(_, op)| matches!(op, Op::Final { key, .. } if key.run_id == run))
            .map(|(at, _)| *at)
            .collect()
    };
    let stuck = at_of("stuck");
    let next = at_of("next");
    assert_eq!(stuck.len(), 6, "final_attempts tries, then parked");
    let (Some(parked_at), Some(sent_at)) = (stuck.last(), next.first()) else {
        panic!("both finals were tried: {calls:?}");
    };
    assert!(
        *sent_at - *parked_at <= Duration::from_secs(5),
        "the next final waited {:?} after the parked one",
        *sent_at - *parked_at
    );
    assert_eq!(script.finals(), 1, "only the next run's final applied");
    Ok(())
}

/// Two tenants with a chat of the same name are two chats: acme's final failing
/// forever (its lane retrying, its breaker open) never delays globex's final.
#[tokio::test(start_paused = true)]
async fn acmes_failing_final_never_delays_globexs_chat_of_the_same_name(
) -> Result<(), DeliveryError> {
    let script = Script::new(&[]);
    *script
        .failing_tenant
        .lock()
        .unwrap_or_else(|p| p.into_inner()) = Some("acme".into());
    let d = engine(&script, DeliveryConfig::default());
    let acme = ChatTarget::new("acme", "chan", "room");
    let globex = ChatTarget::new("globex", "chan", "room");
    d.submit(acme.clone(), final_op("a1", "acme's", 2)).await?;
    // Long enough for acme's breaker to open.
    sleep(Duration::from_secs(20)).await;
    assert_eq!(d.breaker_state("chan", "acme"), Some(BreakerState::Open));
    assert_eq!(
        d.breaker_state("chan", "globex"),
        Some(BreakerState::Closed)
    );
    let t0 = Instant::now();
    d.submit(globex.clone(), final_op("g1", "globex's", 2))
        .await?;
    assert!(d.flush_run(&globex, &key("g1")).await);
    let calls = script.calls();
    let (sent_at, _) = calls
        .iter()
        .find(|(_, op)| matches!(op, Op::Final { key, .. } if key.run_id == "g1"))
        .expect("globex's final was sent");
    assert!(
        *sent_at - t0 < Duration::from_secs(1),
        "globex waited {:?}",
        *sent_at - t0
    );
    assert_eq!(script.finals(), 1, "globex's final applied, acme's not");
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn typing_is_throttled_per_chat() -> Result<(), DeliveryError> {
    let script = Script::new(&[]);
    let d = engine(&script, DeliveryConfig::default());
    for _ in 0..10 {
        d.submit(chat(), Op::Typing).await?;
        d.submit(ChatTarget::new("", "chan", "c2"), Op::Typing)
            .await?;
        sleep(Duration::from_secs(1)).await;
    }
    d.flush().await;
    let n = script.calls().len();
    // 10 s at one per 4 s, two chats: 3 each.
    assert_eq!(n, 6, "{n} typing calls");
    Ok(())
}

#[tokio::test]
async fn unknown_channel_is_refused() {
    let script = Script::new(&[]);
    let d = engine(&script, DeliveryConfig::default());
    let r = d.submit(ChatTarget::new("", "nope", "x"), Op::Typing).await;
    assert_eq!(r, Err(DeliveryError::UnknownChannel("nope".into())));
}

fn final_chats(calls: &[(Instant, Op)]) -> Vec<String> {
    calls
        .iter()
        .filter_map(|(_, op)| match op {
            Op::Final { key, .. } => Some(key.run_id.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_backlog_in_one_chat_never_delays_another() -> Result<(), DeliveryError> {
    // Telegram-like pacing: 1/s per chat. 100 finals queued in one chat would take
    // ~100 s; the other chat's final goes at once and submit never waits.
    let script = Script::new(&[]);
    let pacing = Pacing {
        per_chat: Some(Rate::new(1.0, 1)),
        per_sink: Some(Rate::new(30.0, 30)),
        concurrency: 4,
    };
    let d = paced_engine(&script, DeliveryConfig::default(), pacing);
    let t0 = Instant::now();
    for i in 0..100u64 {
        d.submit(chat(), final_op(&format!("busy-{i}"), "x", 1))
            .await?;
    }
    d.submit(
        ChatTarget::new("", "chan", "quiet"),
        final_op("quiet", "y", 1),
    )
    .await?;
    assert!(
        Instant::now() - t0 < Duration::from_millis(1),
        "submit waited"
    );
    sleep(Duration::from_millis(1500)).await;
    let finals = final_chats(&script.calls());
    assert!(finals.iter().any(|r| r == "quiet"), "{finals:?}");
    assert!(finals.len() <= 3, "the busy chat is paced: {finals:?}");
    d.flush().await;
    assert_eq!(script.finals(), 101);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn an_unpaced_sink_is_only_bounded() -> Result<(), DeliveryError> {
    let script = Script::new(&[]);
    let d = paced_engine(&script, DeliveryConfig::default(), Pacing::unpaced(4));
    for i in 0..200u64 {
        d.submit(chat(), final_op(&format!("r{i}"), "x", 1)).await?;
    }
    let t0 = Instant::now();
    d.flush().await;
    assert_eq!(script.finals(), 200);
    assert!(Instant::now() - t0 < Duration::from_millis(1), "no pace");
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_permanent_refusal_is_bounded_and_the_chat_goes_on() -> Result<(), DeliveryError> {
    use Step::Permanent as No;
    let script = Script::new(&[No, No, No, No]);
    let d = engine(&script, DeliveryConfig::default());
    d.submit(chat(), final_op("refused", "x", 1)).await?;
    d.submit(chat(), final_op("next", "y", 1)).await?;
    assert!(d.flush().await);
    let finals = final_chats(&script.calls());
    assert_eq!(finals, ["refused", "refused", "next", "next"]);
    // The next final ate the two refusals left in the script, then was dropped too:
    // every op gets `permanent_attempts` and no more.
    assert_eq!(script.finals(), 0);
    d.submit(chat(), final_op("third", "z", 1)).await?;
    assert!(d.flush().await);
    assert_eq!(script.finals(), 1);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn shutdown_is_prompt_with_a_final_retrying() -> Result<(), DeliveryError> {
    let script = Script::new(&[Step::Transient; 1000]);
    let config = DeliveryConfig {
        breaker_threshold: 10_000,
        ..DeliveryConfig::default()
    };
    let d = engine(&script, config);
    d.submit(chat(), final_op("stuck", "x", 1)).await?;
    d.submit(chat(), draft("stuck2", "d", 1)).await?;
    sleep(Duration::from_secs(5)).await;
    let t0 = Instant::now();
    let waiter = {
        let d = d.clone();
        tokio::spawn(async move { d.flush_run(&chat(), &key("stuck")).await })
    };
    d.shutdown().await;
    assert!(Instant::now() - t0 <= Duration::from_secs(2));
    assert!(d.is_closed());
    assert_eq!(
        waiter.await.ok(),
        Some(false),
        "the final is not reported done"
    );
    assert!(!d.flush().await);
    assert_eq!(
        d.submit(chat(), final_op("late", "x", 1)).await,
        Err(DeliveryError::Closed)
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn shutdown_lets_the_attempt_in_flight_finish_and_record_it() -> Result<(), DeliveryError> {
    // A final whose request takes 5 s is in flight when the 2 s grace runs out: the
    // engine closes (nothing new starts) but waits for that request and saves its
    // outcome, so the next owner of the run — another engine on the same store — does
    // not send it again.
    let script = Script::new(&[Step::Slow(Duration::from_secs(5))]);
    let store = Arc::new(MemoryStore::new());
    let sink: Arc<dyn Sink> = Arc::new(ScriptSink(Arc::clone(&script), Pacing::default()));
    let d = Delivery::new(DeliveryConfig::default(), store.clone(), [sink]);
    d.submit(chat(), final_op("r", "answer", 7)).await?;
    d.submit(chat(), draft("queued", "never sent", 1)).await?;
    sleep(Duration::from_millis(10)).await;
    let t0 = Instant::now();
    d.shutdown().await;
    let took = Instant::now() - t0;
    assert!(
        took >= Duration::from_secs(4),
        "shutdown cut the attempt: {took:?}"
    );
    assert_eq!(script.finals(), 1);
    assert_eq!(script.calls().len(), 1, "the queued draft was not started");

    let sink: Arc<dyn Sink> = Arc::new(ScriptSink(Arc::clone(&script), Pacing::default()));
    let next = Delivery::new(DeliveryConfig::default(), store, [sink]);
    next.submit(chat(), final_op("r", "answer", 7)).await?;
    assert!(next.flush().await);
    assert_eq!(script.finals(), 1, "the next owner sent the final again");
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn flush_run_waits_for_its_run_only() -> Result<(), DeliveryError> {
    let script = Script::new(&[]);
    let config = DeliveryConfig {
        chat_rate: Some(Rate::new(1.0, 1)),
        ..DeliveryConfig::default()
    };
    let d = engine(&script, config);
    d.submit(chat(), final_op("a", "x", 1)).await?;
    d.submit(chat(), final_op("b", "x", 1)).await?;
    for i in 0..20u64 {
        d.submit(
            ChatTarget::new("", "chan", "other"),
            final_op(&format!("o{i}"), "x", 1),
        )
        .await?;
    }
    let t0 = Instant::now();
    assert!(d.flush_run(&chat(), &key("b")).await);
    let waited = Instant::now() - t0;
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    assert!(d.flush_run(&chat(), &key("never-submitted")).await);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn idle_lanes_go_and_come_back() -> Result<(), DeliveryError> {
    let script = Script::new(&[]);
    let d = engine(&script, DeliveryConfig::default());
    for i in 0..50u64 {
        d.submit(
            ChatTarget::new("", "chan", format!("c{i}")),
            final_op("r", "x", 1),
        )
        .await?;
    }
    assert!(d.flush().await);
    assert_eq!(d.lane_count(), 50);
    sleep(Duration::from_secs(61)).await;
    assert_eq!(d.lane_count(), 0, "idle lanes retired");
    d.submit(ChatTarget::new("", "chan", "c1"), final_op("r2", "y", 1))
        .await?;
    assert!(d.flush().await);
    assert_eq!(script.finals(), 51);
    Ok(())
}

/// An engine whose chat has run `r`'s draft in flight (a two-second attempt) and `r`'s
/// final and run `r2`'s final queued behind it.
async fn run_r_in_flight_behind_r2() -> Result<(Arc<Script>, Delivery), DeliveryError> {
    let script = Script::new(&[Step::Slow(Duration::from_secs(2))]);
    let d = engine(&script, DeliveryConfig::default());
    d.submit(chat(), draft("r", "working", 1)).await?;
    d.submit(chat(), final_op("r", "answer", 2)).await?;
    d.submit(chat(), final_op("r2", "other answer", 1)).await?;
    sleep(Duration::from_millis(100)).await;
    Ok((script, d))
}

/// A partition moving to another replica: the handed-over run's queued ops go, its
/// attempt in flight is waited for, the chat's other run goes on, and the run's flush
/// says it was not delivered here — until it is submitted here again.
#[tokio::test(start_paused = true)]
async fn hand_over_drops_queued_ops_and_waits_for_the_attempt_in_flight(
) -> Result<(), DeliveryError> {
    let (script, d) = run_r_in_flight_behind_r2().await?;
    let t0 = Instant::now();
    d.hand_over(|_, run| run.run_id == "r").await;
    assert!(
        t0.elapsed() >= Duration::from_millis(1800),
        "returned before the attempt in flight ended: {:?}",
        t0.elapsed()
    );
    assert!(
        !d.flush_run(&chat(), &key("r")).await,
        "a handed-over run is not delivered here"
    );
    assert!(d.flush().await);
    let names: Vec<_> = script.calls().iter().map(|(_, op)| op.name()).collect();
    assert_eq!(
        names,
        ["draft", "final"],
        "r's final was handed over, r2's sent"
    );
    assert_eq!(script.finals(), 1);
    // The run comes back (the partition returned): it is this engine's again.
    d.submit(chat(), final_op("r", "answer", 2)).await?;
    assert!(d.flush_run(&chat(), &key("r")).await);
    assert_eq!(script.finals(), 2);
    Ok(())
}

/// A lost partition's runs (`give_up`, no waiting): their queued ops are dropped at once
/// while the attempt in flight ends on its own, and another run of the chat goes on.
#[tokio::test(start_paused = true)]
async fn give_up_drops_queued_ops_without_waiting() -> Result<(), DeliveryError> {
    let (script, d) = run_r_in_flight_behind_r2().await?;
    assert_eq!(d.give_up(|_, run| run.run_id == "r"), 1);
    assert!(d.flush().await);
    let names: Vec<_> = script.calls().iter().map(|(_, op)| op.name()).collect();
    assert_eq!(names, ["draft", "final"], "r's final dropped, r2's sent");
    assert_eq!(script.finals(), 1);
    assert_eq!(
        d.give_up(|_, run| run.run_id == "r"),
        0,
        "nothing left of r"
    );
    Ok(())
}

/// An op of a handed-over run waiting out a long `retry_after` gives up at once instead
/// of trying again after the next owner took the run.
#[tokio::test(start_paused = true)]
async fn hand_over_ends_a_retry_wait_without_another_attempt() -> Result<(), DeliveryError> {
    let script = Script::new(&[Step::RateLimited(Duration::from_secs(600))]);
    let d = engine(&script, DeliveryConfig::default());
    d.submit(chat(), final_op("r", "answer", 1)).await?;
    sleep(Duration::from_millis(100)).await;
    let t0 = Instant::now();
    d.hand_over(|_, run| run.run_id == "r").await;
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    sleep(Duration::from_secs(700)).await;
    assert_eq!(script.calls().len(), 1, "no attempt after the handover");
    assert_eq!(script.finals(), 0);
    Ok(())
}

/// An op its lane runs before `submit` has returned still leaves nothing to flush. The
/// count was once taken after the op was on its lane: a lane quick enough uncounted it
/// first, and `queued` stayed at one for good — a `flush` that never returned (seen as a
/// rare 300 s timeout of the sinks conformance test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_op_done_before_submit_returns_leaves_nothing_to_flush() -> Result<(), DeliveryError> {
    let script = Script::new(&[]);
    let d = engine(&script, DeliveryConfig::default());
    // The lane runs on a worker while the submitting thread stalls.
    d.pause_after_queueing(Duration::from_millis(200));
    for i in 1..=3 {
        d.submit(chat(), final_op(&format!("r{i}"), "done", 1))
            .await?;
        let flushed = tokio::time::timeout(Duration::from_secs(5), d.flush()).await;
        assert_eq!(flushed.ok(), Some(true), "nothing is left queued");
    }
    assert_eq!(script.finals(), 3);
    Ok(())
}
