//! Native streams in threads, against the local fake Slack server.

use super::{SlackConfig, SlackSink, Streaming};
use crate::fakes::{Behavior, FakeServer, Message};
use crate::testutil::{fast_engine, final_op, key, settle};
use crate::{ChatTarget, DeliveryState, Sink, SinkError};
use std::sync::Arc;
use std::time::Duration;
use streamgate_grammar::Event;
use streamgate_projection::{
    Live, LivePlan, LiveTask, LiveText, Op, Outcome, RunProjection, Settings, Tier,
};

const TOKEN: &str = "xoxb-test";
const DM_THREAD: &str = "D1/1700000000.000100";

fn sink(fake: &FakeServer, team: Option<&str>) -> Result<SlackSink, SinkError> {
    let mut c = SlackConfig::new("sl", TOKEN);
    c.base_url = fake.base_url.clone();
    c.team_id = team.map(str::to_owned);
    SlackSink::new(c)
}

fn live_draft(run: &str, seq: u64, live: Live) -> Op {
    Op::Draft {
        key: key(run),
        text: "(rendered draft)".into(),
        seq,
        live: Some(Box::new(live)),
    }
}

fn answer(segment: u64, text: &str) -> Option<LiveText> {
    Some(LiveText {
        segment,
        offset: 0,
        text: text.into(),
        broken: false,
    })
}

fn task(id: &str, outcome: Outcome) -> LiveTask {
    LiveTask {
        id: id.into(),
        title: "web_search".into(),
        outcome,
    }
}

fn calls_of(fake: &FakeServer, method: &str) -> usize {
    fake.calls()
        .iter()
        .filter(|c| c.api == method && c.status == 200)
        .count()
}

async fn run_ops(
    sink: &SlackSink,
    chat: &ChatTarget,
    ops: &[Op],
) -> Result<DeliveryState, SinkError> {
    let mut st = DeliveryState::default();
    for op in ops {
        sink.execute(chat, op, &mut st).await?;
    }
    Ok(st)
}

#[tokio::test]
async fn a_dm_thread_streams_thinking_tools_and_the_answer_into_one_message(
) -> Result<(), Box<dyn std::error::Error>> {
    let fake = FakeServer::slack(TOKEN, Behavior::default()).await?;
    let sl = sink(&fake, None)?;
    let chat = ChatTarget::new("", "sl", DM_THREAD);
    let thinking = Live {
        thinking: true,
        ..Live::default()
    };
    let tool = Live {
        tasks: vec![task("call_1", Outcome::Running)],
        ..Live::default()
    };
    let tool_done = Live {
        tasks: vec![task("call_1", Outcome::Done)],
        answer: answer(7, "The answer <!channel> is"),
        ..Live::default()
    };
    let more = Live {
        tasks: vec![task("call_1", Outcome::Done)],
        answer: answer(7, "The answer <!channel> is 42"),
        ..Live::default()
    };
    let st = run_ops(
        &sl,
        &chat,
        &[
            Op::Typing,
            live_draft("r", 1, thinking),
            live_draft("r", 3, tool),
            live_draft("r", 7, tool_done),
            live_draft("r", 8, more),
            final_op("r", "The answer <!channel> is 42, proven.", 9),
            settle("r", "🧠 1 segment · 1 tool", 10),
        ],
    )
    .await?;
    assert!(st.final_delivered && st.settled);
    let msgs = fake.live_messages();
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert_eq!(msgs[0].text, "The answer <!channel> is 42, proven.");
    assert!(
        !msgs[0].raw.contains("<!channel>"),
        "escaped: {}",
        msgs[0].raw
    );
    let streams = fake.streams();
    assert_eq!(streams.len(), 1);
    assert!(!streams[0].streaming, "stopped");
    assert_eq!(streams[0].thread_ts, "1700000000.000100");
    assert_eq!(
        streams[0].tasks.get("call_1"),
        Some(&("web_search".to_owned(), "complete".to_owned()))
    );
    assert_eq!(
        fake.statuses().len(),
        2,
        "typing and thinking before the stream"
    );
    assert_eq!(calls_of(&fake, "chat.startStream"), 1);
    assert_eq!(calls_of(&fake, "chat.appendStream"), 2);
    assert_eq!(calls_of(&fake, "chat.stopStream"), 1);
    assert_eq!(calls_of(&fake, "chat.postMessage"), 0);
    Ok(())
}

#[tokio::test]
async fn a_plan_is_a_plan_title_and_task_cards() -> Result<(), Box<dyn std::error::Error>> {
    let fake = FakeServer::slack(TOKEN, Behavior::default()).await?;
    let sl = sink(&fake, None)?;
    let chat = ChatTarget::new("", "sl", DM_THREAD);
    let plan = |title: &str, second: Outcome| Live {
        plan: Some(LivePlan {
            title: title.into(),
            steps: vec![
                LiveTask {
                    id: "plan-0".into(),
                    title: "Read code".into(),
                    outcome: Outcome::Done,
                },
                LiveTask {
                    id: "plan-1".into(),
                    title: "Fix bug".into(),
                    outcome: second,
                },
            ],
        }),
        ..Live::default()
    };
    run_ops(
        &sl,
        &chat,
        &[
            live_draft(
                "r",
                2,
                plan("📋 plan: 1/2 done · Fix bug", Outcome::Pending),
            ),
            live_draft(
                "r",
                3,
                plan("📋 plan: 1/2 done · Fix bug", Outcome::Running),
            ),
            live_draft("r", 4, plan("📋 plan: 2/2 done", Outcome::Done)),
            final_op("r", "Fixed.", 5),
        ],
    )
    .await?;
    let streams = fake.streams();
    assert_eq!(streams.len(), 1);
    assert_eq!(streams[0].plan.as_deref(), Some("📋 plan: 2/2 done"));
    let status = |id: &str| streams[0].tasks.get(id).map(|t| t.1.clone());
    assert_eq!(status("plan-0").as_deref(), Some("complete"));
    assert_eq!(status("plan-1").as_deref(), Some("complete"));
    assert_eq!(fake.live_messages().len(), 1);
    assert_eq!(fake.live_messages()[0].text, "Fixed.");
    // Each change went out once: start, two appends with what changed, the stop.
    assert_eq!(calls_of(&fake, "chat.appendStream"), 2);
    Ok(())
}

#[tokio::test]
async fn an_answer_without_the_streamed_trailing_newline_is_not_repeated(
) -> Result<(), Box<dyn std::error::Error>> {
    let fake = FakeServer::slack(TOKEN, Behavior::default()).await?;
    let sl = sink(&fake, None)?;
    let chat = ChatTarget::new("", "sl", DM_THREAD);
    let streamed = Live {
        answer: answer(2, "The answer is 42.\n\n"),
        ..Live::default()
    };
    run_ops(
        &sl,
        &chat,
        &[
            live_draft("r", 2, streamed),
            final_op("r", "The answer is 42.", 3),
        ],
    )
    .await?;
    let msgs = fake.live_messages();
    assert_eq!(msgs.len(), 1);
    assert_eq!(msgs[0].text.trim_end(), "The answer is 42.");
    Ok(())
}

#[tokio::test]
async fn an_answer_that_does_not_continue_the_stream_follows_as_a_paragraph(
) -> Result<(), Box<dyn std::error::Error>> {
    let fake = FakeServer::slack(TOKEN, Behavior::default()).await?;
    let sl = sink(&fake, Some("T1"))?;
    let chat = ChatTarget::new("", "sl", "C1/1700000000.000100/U1");
    let commentary = Live {
        answer: answer(2, "Let me check."),
        ..Live::default()
    };
    run_ops(
        &sl,
        &chat,
        &[
            live_draft("r", 2, commentary),
            final_op("r", "It is 42.", 5),
        ],
    )
    .await?;
    let msgs = fake.live_messages();
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert_eq!(msgs[0].text, "Let me check.\n\nIt is 42.");
    let start = fake
        .calls()
        .into_iter()
        .find(|c| c.api == "chat.startStream")
        .map(|c| c.body);
    let start = start.ok_or("no startStream")?;
    assert_eq!(start["recipient_user_id"], "U1");
    assert_eq!(start["recipient_team_id"], "T1");
    Ok(())
}

#[tokio::test]
async fn an_expired_stream_becomes_the_answer_never_a_second_copy(
) -> Result<(), Box<dyn std::error::Error>> {
    let behavior = Behavior {
        slack_stream_ttl: Some(Duration::from_millis(200)),
        ..Behavior::default()
    };
    let fake = FakeServer::slack(TOKEN, behavior).await?;
    let sl = sink(&fake, None)?;
    let chat = ChatTarget::new("", "sl", DM_THREAD);
    let mut st = DeliveryState::default();
    let partial = Live {
        answer: answer(4, "The answer is"),
        ..Live::default()
    };
    sl.execute(&chat, &live_draft("r", 4, partial), &mut st)
        .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Progress after expiry goes to an edited message; the final replaces the stream.
    let later = Live {
        answer: answer(4, "The answer is 4"),
        ..Live::default()
    };
    sl.execute(&chat, &live_draft("r", 6, later), &mut st)
        .await?;
    sl.execute(&chat, &final_op("r", "The answer is 42.", 7), &mut st)
        .await?;
    sl.execute(&chat, &settle("r", "🧠 0 segments · 0 tools", 8), &mut st)
        .await?;
    let answers: Vec<Message> = fake
        .live_messages()
        .into_iter()
        .filter(|m| m.text.contains("The answer is"))
        .collect();
    assert_eq!(answers.len(), 1, "{:?}", fake.live_messages());
    assert_eq!(answers[0].text, "The answer is 42.");
    assert!(fake.streams().iter().all(|s| !s.streaming));
    Ok(())
}

#[tokio::test]
async fn a_refused_stream_posts_and_updates_instead() -> Result<(), Box<dyn std::error::Error>> {
    let behavior = Behavior {
        slack_refuse_streams: Some("missing_scope".into()),
        ..Behavior::default()
    };
    let fake = FakeServer::slack(TOKEN, behavior).await?;
    let sl = sink(&fake, None)?;
    let chat = ChatTarget::new("", "sl", DM_THREAD);
    let first = Live {
        answer: answer(2, "Work"),
        ..Live::default()
    };
    run_ops(
        &sl,
        &chat,
        &[live_draft("r", 2, first), final_op("r", "Done.", 3)],
    )
    .await?;
    let msgs = fake.live_messages();
    assert_eq!(
        msgs.iter().map(|m| m.text.as_str()).collect::<Vec<_>>(),
        ["(rendered draft)", "Done."]
    );
    let posts: Vec<_> = fake
        .calls()
        .into_iter()
        .filter(|c| c.api == "chat.postMessage")
        .collect();
    assert!(posts
        .iter()
        .all(|c| c.body["thread_ts"] == "1700000000.000100"));
    Ok(())
}

#[tokio::test]
async fn streaming_off_or_no_thread_posts_and_updates() -> Result<(), Box<dyn std::error::Error>> {
    let fake = FakeServer::slack(TOKEN, Behavior::default()).await?;
    let mut c = SlackConfig::new("sl", TOKEN);
    c.base_url = fake.base_url.clone();
    c.streaming = Streaming::Off;
    let off = SlackSink::new(c)?;
    let on = sink(&fake, Some("T1"))?;
    let live = || Live {
        answer: answer(2, "Work"),
        ..Live::default()
    };
    let ops = [live_draft("r", 2, live()), final_op("r", "Done.", 3)];
    run_ops(&off, &ChatTarget::new("", "sl", DM_THREAD), &ops).await?;
    run_ops(&on, &ChatTarget::new("", "sl", "C1"), &ops).await?;
    // A channel thread without the user it answers cannot stream either.
    run_ops(
        &on,
        &ChatTarget::new("", "sl", "C1/1700000000.000100"),
        &ops,
    )
    .await?;
    assert_eq!(calls_of(&fake, "chat.startStream"), 0);
    assert_eq!(fake.live_messages().len(), 6);
    Ok(())
}

#[tokio::test]
async fn a_long_answer_is_the_stream_plus_replies_in_order(
) -> Result<(), Box<dyn std::error::Error>> {
    let fake = FakeServer::slack(TOKEN, Behavior::default()).await?;
    let sl = sink(&fake, None)?;
    let chat = ChatTarget::new("", "sl", DM_THREAD);
    let para = "word ".repeat(2000);
    let long: String = (0..10).map(|i| format!("{i}: {para}\n\n")).collect();
    let start = Live {
        answer: answer(2, &long[..100]),
        ..Live::default()
    };
    run_ops(
        &sl,
        &chat,
        &[live_draft("r", 2, start), final_op("r", &long, 3)],
    )
    .await?;
    let msgs = fake.live_messages();
    assert!(msgs.len() >= 3, "{}", msgs.len());
    let joined: String = msgs
        .iter()
        .map(|m| m.text.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    for i in 0..10 {
        assert_eq!(joined.matches(&format!("{i}: word")).count(), 1, "part {i}");
    }
    assert!(fake.streams().iter().all(|s| !s.streaming));
    Ok(())
}

/// More streams than Slack's Tier 2 allows in a window: the surplus is answered 429 with
/// the time left, honoured per chat, and every stream still ends as its answer.
#[tokio::test]
async fn tier_limits_are_honoured_and_every_stream_ends() -> Result<(), Box<dyn std::error::Error>>
{
    let behavior = Behavior {
        slack_tier_window: Some(Duration::from_secs(1)),
        ..Behavior::default()
    };
    let fake = FakeServer::slack(TOKEN, behavior).await?;
    let (delivery, _store) = fast_engine(Arc::new(sink(&fake, None)?));
    for n in 0..30 {
        let chat = ChatTarget::new("", "sl", format!("D{n}/1700000000.{n:06}"));
        let live = Live {
            answer: answer(2, "Working on it"),
            ..Live::default()
        };
        delivery
            .submit(chat.clone(), live_draft(&format!("r{n}"), 2, live))
            .await?;
        delivery
            .submit(chat, final_op(&format!("r{n}"), "Working on it: done.", 3))
            .await?;
    }
    tokio::time::timeout(Duration::from_secs(30), delivery.flush()).await?;
    let limited = fake.calls().iter().filter(|c| c.status == 429).count();
    assert!(limited > 0, "Tier 2 never refused");
    let msgs = fake.live_messages();
    assert_eq!(msgs.len(), 30);
    assert!(
        msgs.iter().all(|m| m.text == "Working on it: done."),
        "{msgs:#?}"
    );
    assert!(fake.streams().iter().all(|s| !s.streaming));
    Ok(())
}

/// Every fixture run, projected as a channel sees it and delivered through the engine
/// into its own DM thread while the API answers every 10th call with a 429 (a hold of one
/// second on that method for every chat, as Slack's limits are per method and
/// workspace): each run with an answer ends with exactly one message holding it, and no
/// stream is left open.
#[tokio::test]
async fn every_fixture_run_streams_to_exactly_one_answer_under_429s(
) -> Result<(), Box<dyn std::error::Error>> {
    let behavior = Behavior {
        rate_limit_every: Some(10),
        retry_after_secs: 1.0,
        ..Behavior::default()
    };
    let fake = FakeServer::slack(TOKEN, behavior).await?;
    let (delivery, _store) = fast_engine(Arc::new(sink(&fake, None)?));
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
    let mut expected = Vec::new();
    let mut families: Vec<_> = std::fs::read_dir(&root)?.collect::<Result<_, _>>()?;
    families.sort_by_key(|e| e.path());
    let mut n = 0u64;
    for family in families {
        let mut files: Vec<_> = std::fs::read_dir(family.path())?.collect::<Result<_, _>>()?;
        files.sort_by_key(|e| e.path());
        for file in files {
            let path = file.path();
            if !path.to_string_lossy().ends_with(".expected.jsonl") {
                continue;
            }
            n += 1;
            let chat = ChatTarget::new("", "sl", format!("D{n}/1700000000.{n:06}"));
            let mut proj = RunProjection::new(format!("r{n}"));
            let settings = Settings::default();
            let mut final_text = None;
            for line in std::fs::read_to_string(&path)?.lines() {
                let Ok(ev) = Event::from_json(line) else {
                    continue;
                };
                for op in proj.apply(&ev, &settings, Tier::T1) {
                    if let Op::Final { text, .. } = &op {
                        final_text = Some(text.clone());
                    }
                    delivery.submit(chat.clone(), op).await?;
                }
            }
            expected.push((chat, path, final_text));
        }
    }
    tokio::time::timeout(Duration::from_secs(120), delivery.flush()).await?;
    assert!(n > 50, "fixtures found: {n}");
    let msgs = fake.live_messages();
    let mut finals = 0;
    for (chat, path, final_text) in expected {
        let Some(final_text) = final_text else {
            continue;
        };
        finals += 1;
        let channel = chat.chat_id.split('/').next().unwrap_or("");
        let head: String = final_text.trim().chars().take(40).collect();
        let holding: Vec<_> = msgs
            .iter()
            .filter(|m| m.chat == channel && m.text.contains(head.trim()))
            .collect();
        assert_eq!(holding.len(), 1, "{}: {holding:?}", path.display());
    }
    eprintln!(
        "runs {n}, finals {finals}, streams {}, posts {}, 429s {}",
        fake.streams().len(),
        calls_of(&fake, "chat.postMessage"),
        fake.calls().iter().filter(|c| c.status == 429).count()
    );
    let open: Vec<_> = fake.streams().into_iter().filter(|s| s.streaming).collect();
    assert!(open.is_empty(), "{open:?}");
    Ok(())
}
