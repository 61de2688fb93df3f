//! `streamgate settings <channel>`: a chat's `/reasoning`, `/verbose` and the ACP dedupe
//! plan's knobs (delivery mode, repeat suppression, tag visibility, budgets) on a running
//! channel (its `ProjectorService.SetSettings`; every replica re-renders the chat's runs
//! in flight). Without flags it shows the chat's current settings.

use super::channel_client::ChannelFlags;
use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use streamgate_projection::{Delivery, Reasoning, Verbose};
use streamgate_proto::v1;

/// Flags of `streamgate settings`.
#[derive(Debug, Clone, clap::Args)]
pub struct SettingsArgs {
    /// Channel of the local instance (`web`, `webhook-1`, …).
    pub channel: String,
    /// The chat: a run's session key, unless the channel maps sessions to chats
    /// (runs without a session go to the chat `default`).
    #[arg(long, default_value = "default")]
    pub chat: String,
    /// The tenant whose chat it is (each tenant's chats have their own settings).
    #[arg(long, default_value = streamgate_grammar::ids::DEFAULT_TENANT)]
    pub tenant: String,
    /// `/reasoning`: off, on or stream.
    #[arg(long)]
    pub reasoning: Option<Reasoning>,
    /// `/verbose`: off, on or full.
    #[arg(long)]
    pub verbose: Option<Verbose>,
    /// Delivery mode: live or final_only.
    #[arg(long)]
    pub delivery_mode: Option<Delivery>,
    /// Repeat suppression: true or false.
    #[arg(long)]
    pub repeat_suppression: Option<bool>,
    /// Tag visibility `tag=show|hide|default` (repeatable / comma separated), e.g.
    /// `--tag plan=show,usage_update=show`; `default` drops the chat's override.
    #[arg(
        long = "tag",
        value_name = "TAG=show|hide|default",
        value_delimiter = ','
    )]
    pub tags: Vec<String>,
    /// The draft's budget for one turn (capped at the sink's message limit).
    #[arg(long)]
    pub max_turn_chars: Option<u32>,
    /// A tool row's detail budget under /verbose full.
    #[arg(long)]
    pub max_tool_summary_chars: Option<u32>,
    /// One status line's budget.
    #[arg(long)]
    pub max_status_chars: Option<u32>,
    /// Where the channel is.
    #[command(flatten)]
    pub at: ChannelFlags,
}

impl SettingsArgs {
    /// The request these flags make (nothing set: a request that only shows).
    fn request(&self) -> Result<v1::SetSettingsRequest> {
        let mut tags = HashMap::new();
        for t in self.tags.iter().filter(|t| !t.trim().is_empty()) {
            let Some((tag, v)) = t.split_once('=') else {
                bail!("--tag takes tag=show|hide|default, not `{t}`");
            };
            tags.insert(tag.trim().to_owned(), v.trim().to_owned());
        }
        Ok(v1::SetSettingsRequest {
            chat_id: self.chat.clone(),
            tenant: self.tenant.clone(),
            reasoning: self.reasoning.map(|r| r.to_string()).unwrap_or_default(),
            verbose: self.verbose.map(|v| v.to_string()).unwrap_or_default(),
            delivery_mode: self
                .delivery_mode
                .map(|d| d.to_string())
                .unwrap_or_default(),
            repeat_suppression: self.repeat_suppression,
            tag_visibility: tags,
            max_turn_chars: self.max_turn_chars,
            max_tool_summary_chars: self.max_tool_summary_chars,
            max_status_chars: self.max_status_chars,
        })
    }
}

/// Sets (or, without flags, shows) the chat's settings and prints the result.
pub async fn run(args: SettingsArgs) -> Result<()> {
    let target = args.at.target(Some(args.channel.clone()));
    let request = args.request()?;
    let changed = request
        != v1::SetSettingsRequest {
            chat_id: args.chat.clone(),
            tenant: args.tenant.clone(),
            ..Default::default()
        };
    let mut client = target.connect().await?;
    let reply = client
        .set_settings(request)
        .await
        .with_context(|| format!("channel {} refused the settings", args.channel))?
        .into_inner();
    println!(
        "{} chat {} (tenant {}): /reasoning {} /verbose {}{}",
        args.channel,
        args.chat,
        args.tenant,
        reply.reasoning,
        reply.verbose,
        if changed {
            format!(" ({} run(s) in flight re-rendered)", reply.rerendered)
        } else {
            String::new()
        }
    );
    println!("{}", knobs_line(&reply));
    Ok(())
}

/// `delivery live · repeats suppressed · max chars turn 2000, tool 120, status 120 ·
/// shown: … · hidden: …` (tags sorted; thought chunks may "follow /reasoning").
fn knobs_line(r: &v1::SetSettingsReply) -> String {
    let mut tags: Vec<(&String, &String)> = r.tag_visibility.iter().collect();
    tags.sort();
    let with = |v: &str| {
        tags.iter()
            .filter(|(_, s)| s.as_str() == v)
            .map(|(t, _)| t.as_str())
            .collect::<Vec<_>>()
            .join(",")
    };
    let mut line = format!(
        "  delivery {} · repeats {} · max chars turn {}, tool {}, status {} · shown: {} · hidden: {}",
        r.delivery_mode,
        if r.repeat_suppression {
            "suppressed"
        } else {
            "allowed"
        },
        r.max_turn_chars,
        r.max_tool_summary_chars,
        r.max_status_chars,
        with("show"),
        with("hide"),
    );
    let follows = with("reasoning");
    if !follows.is_empty() {
        line.push_str(&format!(" · follow /reasoning: {follows}"));
    }
    line
}
