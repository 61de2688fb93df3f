//! `streamgate parked <channel>`: the finals a running channel parked (the chat API
//! failed them until their retries ran out, so the chat went on without them), and
//! `--resend` to send them again now instead of at the channel's next start
//! (`ProjectorService.ListParked` / `ResendParked`).

use super::channel_client::ChannelFlags;
use anyhow::{Context, Result};
use streamgate_proto::v1;

/// Flags of `streamgate parked`.
#[derive(Debug, Clone, clap::Args)]
pub struct ParkedArgs {
    /// Channel of the local instance (`webhook-1`, `telegram-1`, …).
    pub channel: String,
    /// Send the parked finals again now.
    #[arg(long)]
    pub resend: bool,
    /// Where the channel is.
    #[command(flatten)]
    pub at: ChannelFlags,
}

/// Lists (and with `--resend`, sends again) the channel's parked finals.
pub async fn run(args: ParkedArgs) -> Result<()> {
    let target = args.at.target(Some(args.channel.clone()));
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
