//! How CLI commands reach a projector channel's `ProjectorService`: an explicit address
//! and token, or the local `streamgate up`'s channel found through `up.json` and
//! `channel-<name>.token` (looked up again on every connect: a restarted `up` listens
//! elsewhere with a new token).

use super::discover::{channel_token_path, with_hint, Instance};
use anyhow::{Context, Result};
use std::path::PathBuf;
use streamgate_proto::v1::projector_service_client::ProjectorServiceClient;
use streamgate_runtime::rpc::SendBearer;
use streamgate_runtime::serve::ClientTlsArgs;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// A channel's ProjectorService client with its bearer token.
pub type Client = ProjectorServiceClient<InterceptedService<Channel, SendBearer>>;

/// The flags every command that talks to a running channel shares (`tail`,
/// `settings`, `parked`).
#[derive(Debug, Clone, clap::Args)]
pub struct ChannelFlags {
    /// ProjectorService address of the channel (default: the local `streamgate up`'s).
    #[arg(long, env = "STREAMGATE_PROJECTOR_ADDR")]
    pub addr: Option<String>,
    /// The channel's bearer token (default: the local instance's token file).
    #[arg(long, env = "STREAMGATE_CHANNEL_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// TLS to the channel.
    #[command(flatten)]
    pub tls: ClientTlsArgs,
    /// Data dir of the local instance.
    #[arg(long, default_value = super::discover::DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
}

impl ChannelFlags {
    /// How to reach `channel` (`None`: the local instance's web channel, else its first).
    pub fn target(&self, channel: Option<String>) -> Target {
        Target {
            addr: self.addr.clone(),
            token: self.token.clone(),
            channel,
            data_dir: self.data_dir.clone(),
            tls: self.tls.clone(),
        }
    }
}

/// How to reach the channel, looked up again on every (re)connect.
#[derive(Debug, Clone)]
pub struct Target {
    /// ProjectorService address (`None`: the local `up`'s channel).
    pub addr: Option<String>,
    /// Bearer token (`None`: the local instance's token file).
    pub token: Option<String>,
    /// Channel name of the local instance (`None`: its web channel, else its first).
    pub channel: Option<String>,
    /// Data dir of the local instance.
    pub data_dir: PathBuf,
    /// TLS to the channel (`--ca`, client certificate).
    pub tls: ClientTlsArgs,
}

impl Target {
    /// The address and token to use now.
    pub fn resolve(&self) -> Result<(String, Option<String>)> {
        self.resolve_with_hint().map(|(a, t, _)| (a, t))
    }

    /// [`resolve`](Self::resolve), and what TLS flags the local instance needs that are
    /// missing.
    fn resolve_with_hint(&self) -> Result<(String, Option<String>, Option<&'static str>)> {
        if let Some(a) = &self.addr {
            return Ok((a.clone(), self.token.clone(), None));
        }
        let inst = Instance::read(&self.data_dir)?;
        let ch = match &self.channel {
            Some(name) => inst.channels.iter().find(|c| &c.name == name),
            None => inst
                .channels
                .iter()
                .find(|c| c.kind == "web")
                .or(inst.channels.first()),
        };
        let Some(ch) = ch else {
            let names: Vec<&str> = inst.channels.iter().map(|c| c.name.as_str()).collect();
            anyhow::bail!(
                "the local streamgate up has no channel {} (channels: {})",
                self.channel.as_deref().unwrap_or("at all"),
                if names.is_empty() {
                    "none".to_owned()
                } else {
                    names.join(", ")
                }
            );
        };
        let token = match &self.token {
            Some(t) => Some(t.clone()),
            None => {
                let path = channel_token_path(&self.data_dir, &ch.name);
                let t = std::fs::read_to_string(&path)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                Some(t.trim().to_owned())
            }
        };
        Ok((ch.grpc.clone(), token, inst.tls_hint(&self.tls)))
    }

    pub async fn connect(&self) -> Result<Client> {
        let (addr, token, hint) = self.resolve_with_hint()?;
        let channel = self
            .tls
            .endpoint(&addr)?
            .connect()
            .await
            .with_context(|| with_hint(format!("cannot reach the channel at {addr}"), hint))?;
        Ok(ProjectorServiceClient::with_interceptor(
            channel,
            SendBearer::new(token.as_deref()),
        ))
    }
}
