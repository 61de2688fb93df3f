//! `streamgate settings <channel>`: a chat's `/reasoning` and `/verbose` on a running
//! channel (its `ProjectorService.SetSettings`; every replica re-renders the chat's runs
//! in flight). Without flags it shows the chat's current settings.

use super::channel_client::Target;
use super::discover::DEFAULT_DATA_DIR;
use anyhow::{Context, Result};
use std::path::PathBuf;
use streamgate_projection::{Reasoning, Verbose};
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
    /// `/reasoning`: off, on or stream.
    #[arg(long)]
    pub reasoning: Option<Reasoning>,
    /// `/verbose`: off, on or full.
    #[arg(long)]
    pub verbose: Option<Verbose>,
    /// ProjectorService address (default: the local `streamgate up`'s channel).
    #[arg(long, env = "STREAMGATE_PROJECTOR_ADDR")]
    pub addr: Option<String>,
    /// The channel's bearer token (default: the local instance's token file).
    #[arg(long, env = "STREAMGATE_CHANNEL_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// TLS to the channel.
    #[command(flatten)]
    pub tls: streamgate_runtime::serve::ClientTlsArgs,
    /// Data dir of the local instance.
    #[arg(long, default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
}

/// Sets (or, without flags, shows) the chat's settings and prints the result.
pub async fn run(args: SettingsArgs) -> Result<()> {
    let target = Target {
        addr: args.addr.clone(),
        token: args.token.clone(),
        channel: Some(args.channel.clone()),
        data_dir: args.data_dir.clone(),
        tls: args.tls.clone(),
    };
    let mut client = target.connect().await?;
    let reply = client
        .set_settings(v1::SetSettingsRequest {
            chat_id: args.chat.clone(),
            reasoning: args.reasoning.map(|r| r.to_string()).unwrap_or_default(),
            verbose: args.verbose.map(|v| v.to_string()).unwrap_or_default(),
        })
        .await
        .with_context(|| format!("channel {} refused the settings", args.channel))?
        .into_inner();
    let changed = args.reasoning.is_some() || args.verbose.is_some();
    println!(
        "{} chat {}: /reasoning {} /verbose {}{}",
        args.channel,
        args.chat,
        reply.reasoning,
        reply.verbose,
        if changed {
            format!(" ({} run(s) in flight re-rendered)", reply.rerendered)
        } else {
            String::new()
        }
    );
    Ok(())
}
