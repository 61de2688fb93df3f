//! The ACP dedupe plan's knobs through `SetSettings` on a real projector (real
//! nats-server, the Telegram fake as the sink): a chat enables status tags mid-turn and
//! its draft re-renders with them, the reply echoes the resulting settings (the draft
//! budget clamped to Telegram's limit), a tag goes back to its default, bad values are
//! refused, and the overrides persist for the chat.
#![allow(missing_docs)]

use crate::common::start_with_grpc;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use streamgate_bus::subject::RunAddr;
use streamgate_grammar::{Envelope, Event, RunEvent};
use streamgate_projection::Delivery;
use streamgate_projector::{ChannelConfig, ChannelSink};
use streamgate_proto::v1;
use streamgate_sinks::fakes::{Behavior, FakeServer};
use streamgate_sinks::{telegram, SinkConfig};
use streamgate_testkit::NatsServer;

type R = Result<(), Box<dyn std::error::Error>>;
type Client = v1::projector_service_client::ProjectorServiceClient<
    tonic::service::interceptor::InterceptedService<
        tonic::transport::Channel,
        streamgate_runtime::rpc::SendBearer,
    >,
>;

const TOKEN: &str = "123:TESTTOKEN";
const CHAT: &str = "chat-knobs";
const RUN: &str = "run-knobs";

fn events() -> Vec<RunEvent> {
    let lines = [
        r#"{"seq":1,"stream":"lifecycle","data":{"phase":"start","provider":"acp"}}"#,
        r#"{"seq":2,"stream":"lifecycle","data":{"phase":"update","diagnostic":{"code":"plan","detail":{"sessionUpdate":"plan","entries":[{"content":"Read code","status":"completed","priority":"high"},{"content":"Fix bug","status":"in_progress","priority":"high"},{"content":"Run tests","status":"pending","priority":"low"}]}}}}"#,
        r#"{"seq":3,"stream":"lifecycle","data":{"phase":"update","usage":{"used":1200,"size":200000},"diagnostic":{"code":"usage_update","detail":{"sessionUpdate":"usage_update","used":1200,"size":200000}}}}"#,
        r#"{"seq":4,"stream":"lifecycle","data":{"phase":"update","diagnostic":{"code":"available_commands_update","detail":{"availableCommands":[{"name":"web"}]}}}}"#,
        r#"{"seq":5,"stream":"assistant","data":{"id":"m1","phase":"commentary","delta":"Looking at the code."}}"#,
    ];
    lines
        .iter()
        .map(|l| RunEvent {
            envelope: Envelope {
                tenant: "acme".into(),
                session_key: Some(CHAT.into()),
                run_id: RUN.into(),
                ts_ms: 1_700_000_000_000,
            },
            event: Event::from_json(l).unwrap_or_else(|e| panic!("{l}: {e}")),
        })
        .collect()
}

async fn client(addr: std::net::SocketAddr) -> Result<Client, Box<dyn std::error::Error>> {
    let ch = tonic::transport::Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    Ok(
        v1::projector_service_client::ProjectorServiceClient::with_interceptor(
            ch,
            streamgate_runtime::rpc::SendBearer::new(Some("chan-token")),
        ),
    )
}

/// Polls `GetDraft` until `want` holds (or 10 s pass); returns the last text.
async fn draft_until(c: &mut Client, want: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = c
            .get_draft(v1::GetDraftRequest {
                run_id: RUN.into(),
                tenant: String::new(),
            })
            .await
            .map(|r| r.into_inner().text)
            .unwrap_or_default();
        if want(&text) || Instant::now() > deadline {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn tags(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_settings_turns_status_tags_on_and_off_mid_turn() -> R {
    let (nats, js) = NatsServer::with_streams().await;
    let fake = FakeServer::telegram(TOKEN, Behavior::default()).await?;
    let mut tg = telegram::TelegramConfig::new("tg", TOKEN);
    tg.base_url = fake.base_url.clone();
    let mut cfg = ChannelConfig::new("tg", ChannelSink::Sink(SinkConfig::Telegram(tg)));
    cfg.token = Some("chan-token".into());
    let running = start_with_grpc(&nats, cfg).await?;
    let mut c = client(running.grpc.ok_or("no grpc")?).await?;
    let evs = events();
    let addr = RunAddr::parse("acme", RUN, streamgate_bus::DEFAULT_PARTITIONS).unwrap();
    streamgate_bus::events::publish_events(&js, &addr, &evs).await?;

    // Channel defaults: the status updates are hidden.
    let d = draft_until(&mut c, |t| t.contains("Looking at the code.")).await;
    assert_eq!(d, "Looking at the code.");

    // Plan and usage on, repeats allowed, budgets set (the turn's above Telegram's limit).
    let reply = c
        .set_settings(v1::SetSettingsRequest {
            chat_id: CHAT.into(),
            tenant: "acme".into(),
            tag_visibility: tags(&[("plan", "show"), ("usage_update", "on")]),
            repeat_suppression: Some(false),
            max_turn_chars: Some(100_000),
            max_status_chars: Some(60),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(reply.rerendered, 1);
    assert_eq!(
        (reply.reasoning.as_str(), reply.verbose.as_str()),
        ("off", "on")
    );
    assert_eq!(reply.delivery_mode, "live");
    assert!(!reply.repeat_suppression);
    assert_eq!(reply.max_turn_chars, 4096, "clamped to the sink's limit");
    assert_eq!(reply.max_status_chars, 60);
    assert_eq!(reply.max_tool_summary_chars, 120);
    let vis = |r: &v1::SetSettingsReply, t: &str| r.tag_visibility.get(t).cloned();
    assert_eq!(vis(&reply, "plan").as_deref(), Some("show"));
    assert_eq!(vis(&reply, "usage_update").as_deref(), Some("show"));
    assert_eq!(
        vis(&reply, "available_commands_update").as_deref(),
        Some("hide")
    );
    assert_eq!(vis(&reply, "agent_message_chunk").as_deref(), Some("show"));
    assert_eq!(
        vis(&reply, "agent_thought_chunk").as_deref(),
        Some("reasoning")
    );
    let want = "Looking at the code.\n📋 plan: 1/3 done · Fix bug\n📊 1200/200000 tokens";
    let d = draft_until(&mut c, |t| t == want).await;
    assert_eq!(d, want);
    // The Telegram draft follows.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !fake
        .live_messages()
        .iter()
        .any(|m| m.text.contains("📋 plan"))
    {
        assert!(Instant::now() < deadline, "{:#?}", fake.messages());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Plan back to its default (hidden); the other overrides stay.
    let reply = c
        .set_settings(v1::SetSettingsRequest {
            chat_id: CHAT.into(),
            tenant: "acme".into(),
            tag_visibility: tags(&[("plan", "default")]),
            delivery_mode: "final_only".into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(vis(&reply, "plan").as_deref(), Some("hide"));
    assert_eq!(vis(&reply, "usage_update").as_deref(), Some("show"));
    assert_eq!(reply.delivery_mode, "final_only");
    assert_eq!(reply.max_status_chars, 60);
    let s = running.channel.settings_for("acme", CHAT).await?;
    assert_eq!(s.delivery, Delivery::FinalOnly);
    assert!(!s.suppress_repeats && s.tag_visibility.shown("usage_update"));
    assert!(!s.tag_visibility.shown("plan"));

    // An empty request changes nothing and shows the settings.
    let shown = c
        .set_settings(v1::SetSettingsRequest {
            chat_id: CHAT.into(),
            tenant: "acme".into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(shown.tag_visibility, reply.tag_visibility);
    assert_eq!(shown.delivery_mode, "final_only");

    // Bad values are refused, and change nothing.
    for bad in [
        v1::SetSettingsRequest {
            chat_id: CHAT.into(),
            tenant: "acme".into(),
            tag_visibility: tags(&[("plan", "maybe")]),
            ..Default::default()
        },
        v1::SetSettingsRequest {
            chat_id: CHAT.into(),
            tenant: "acme".into(),
            max_turn_chars: Some(0),
            ..Default::default()
        },
        v1::SetSettingsRequest {
            chat_id: CHAT.into(),
            tenant: "acme".into(),
            delivery_mode: "later".into(),
            ..Default::default()
        },
    ] {
        let code = c.set_settings(bad).await.err().map(|s| s.code());
        assert_eq!(code, Some(tonic::Code::InvalidArgument));
    }
    assert_eq!(running.channel.settings_for("acme", CHAT).await?, s);

    // Tenants: another tenant's chat of the same name has its own settings, both ways.
    let globex = c
        .set_settings(v1::SetSettingsRequest {
            chat_id: CHAT.into(),
            tenant: "globex".into(),
            reasoning: "off".into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(globex.reasoning, "off");
    assert_eq!(
        globex.delivery_mode, "live",
        "globex starts from the defaults"
    );
    assert_eq!(running.channel.settings_for("acme", CHAT).await?, s);
    assert_eq!(
        running.channel.settings_for("", CHAT).await?,
        running.channel.settings_for("default", CHAT).await?,
        "no tenant is the default tenant"
    );
    assert_eq!(
        running
            .channel
            .settings_for("default", CHAT)
            .await?
            .delivery,
        Delivery::Live,
        "the default tenant's chat of that name is untouched too"
    );
    assert_eq!(
        running.channel.settings_for("globex", CHAT).await?.delivery,
        Delivery::Live
    );
    let bad_tenant = v1::SetSettingsRequest {
        chat_id: CHAT.into(),
        tenant: "acme\u{202e}".into(),
        ..Default::default()
    };
    let code = c.set_settings(bad_tenant).await.err().map(|s| s.code());
    assert_eq!(code, Some(tonic::Code::InvalidArgument));
    Ok(())
}
