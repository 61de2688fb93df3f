//! `streamgate parked <channel>`: the finals a running channel parked (the chat API
//! failed them until their retries ran out, so the chat went on without them), and
//! `--resend` to send them again now instead of at the channel's next start
//! (`ProjectorService.ListParked` / `ResendParked`).

use super::channel_client::Target;
use super::discover::DEFAULT_DATA_DIR;
use anyhow::{Context, Result};
use std::path::PathBuf;
use streamgate_proto::v1;

/// Flags of `streamgate parked`.
#[derive(Debug, Clone, clap::Args)]
pub struct ParkedArgs {
    /// Channel of the local instance (`webhook-1`, `telegram-1`, …).
    pub channel: String,
    /// Send the parked finals again now.
    #[arg(long)]
    pub resend: bool,
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

/// Lists (and with `--resend`, sends again) the channel's parked finals.
pub async fn run(args: ParkedArgs) -> Result<()> {
    let target = Target {
        addr: args.addr.clone(),
        token: args.token.clone(),
        channel: Some(args.channel.clone()),
        data_dir: args.data_dir.clone(),
        tls: args.tls.clone(),
    };
    let mut client = target.connect().await?;
    let finals = client
        .list_parked(v1::ListParkedRequest {})
        .await
        .with_context(|| format!("channel {} did not list its parked finals", args.channel))?
        .into_inner()
        .finals;
    if finals.is_empty() {
        println!("{}: no parked finals", args.channel);
        return Ok(());
    }
    println!("{}: {} parked final(s)", args.channel, finals.len());
    for f in &finals {
        println!(
            "  tenant {} run {} chat {}: {}",
            f.tenant.escape_debug(),
            f.run_id.escape_debug(),
            f.chat_id.escape_debug(),
            f.error.escape_debug()
        );
    }
    if args.resend {
        let n = client
            .resend_parked(v1::ResendParkedRequest {})
            .await
            .with_context(|| format!("channel {} refused to resend", args.channel))?
            .into_inner()
            .resent;
        println!("{}: {n} sent again", args.channel);
    } else {
        println!(
            "send them again now: streamgate parked {} --resend",
            args.channel
        );
    }
    Ok(())
}
