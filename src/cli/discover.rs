//! How CLI clients find a local `streamgate up`: it writes `<data dir>/up.json` (mode
//! 0600: it holds the operator token) with every address it listens on, once everything
//! (projector channels included) is listening, and the local broker's credentials; tokens
//! sit beside it in files of mode 0600 (`ingest.token`, `channel-<name>.token`).

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use streamgate_runtime::serve::ClientTlsArgs;

/// Default data directory of a local instance.
pub const DEFAULT_DATA_DIR: &str = ".streamgate";

/// What a running `streamgate up` publishes about itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Instance {
    /// Process id of `streamgate up`.
    pub pid: u32,
    /// The broker.
    pub nats_url: String,
    /// The user the local broker requires (absent with `up --nats`: the deployment's
    /// own credentials are not copied here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nats_user: Option<String>,
    /// Its password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nats_password: Option<String>,
    /// gRPC IngestService (`https://host:port` when `up` serves TLS).
    pub ingest_grpc: String,
    /// HTTP ingest (`host:port`; `https` when `tls`).
    pub ingest_http: String,
    /// gRPC ArchiveService (`https://host:port` when `up` serves TLS).
    pub archive_grpc: String,
    /// Every server of `up` speaks TLS (`up --tls-cert/--tls-key`): clients connect
    /// with `--ca` (or `STREAMGATE_CA`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tls: bool,
    /// The servers require a client certificate (`up --tls-client-ca`): clients add
    /// `--client-cert/--client-key`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mtls: bool,
    /// Operator bearer token for the ArchiveService.
    pub operator_token: String,
    /// Partition count.
    pub partitions: u32,
    /// Projector channels, in the order `up` started them (their tokens are in
    /// `<data dir>/channel-<name>.token`, never here).
    #[serde(default)]
    pub channels: Vec<ChannelEntry>,
}

/// One projector channel of a running `streamgate up`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChannelEntry {
    /// Channel name (`web`, `webhook-1`, …).
    pub name: String,
    /// Sink kind (`web`, `webhook`, `telegram`, `plain`, …).
    pub kind: String,
    /// Its ProjectorService address (`https://host:port` when `up` serves TLS).
    pub grpc: String,
    /// Its web page address (`web` channels; `host:port`, served over `https` when the
    /// instance's `tls` is set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web: Option<String>,
}

/// Where `up` keeps channel `name`'s ProjectorService token.
pub fn channel_token_path(data_dir: &Path, name: &str) -> PathBuf {
    data_dir.join(format!("channel-{name}.token"))
}

/// Where `up` keeps its all-tenant ingest token.
pub fn ingest_token_path(data_dir: &Path) -> PathBuf {
    data_dir.join("ingest.token")
}

/// The local `up`'s ingest token.
pub fn read_ingest_token(data_dir: &Path) -> Result<String> {
    let p = ingest_token_path(data_dir);
    let t = std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display()))?;
    Ok(t.trim().to_owned())
}

fn path(data_dir: &Path) -> PathBuf {
    data_dir.join("up.json")
}

impl Instance {
    /// Writes `up.json` readable by the owner only.
    pub fn write(&self, data_dir: &Path) -> Result<()> {
        let p = path(data_dir);
        let text = serde_json::to_string_pretty(self)?;
        // Created 0600, and an existing file narrowed before it is rewritten.
        streamgate_bus::local::write_private(&p, &text)
            .with_context(|| format!("cannot write {}", p.display()))?;
        Ok(())
    }

    /// Reads the instance of `data_dir`.
    pub fn read(data_dir: &Path) -> Result<Instance> {
        let p = path(data_dir);
        let text = std::fs::read_to_string(&p).with_context(|| {
            format!(
                "no running `streamgate up` found ({} missing); start one, or pass the address and token",
                p.display()
            )
        })?;
        serde_json::from_str(&text).with_context(|| format!("{} is not valid", p.display()))
    }

    /// What a client connecting with `tls` lacks to reach this instance, if anything:
    /// a hint to add to its connection error.
    pub fn tls_hint(&self, tls: &ClientTlsArgs) -> Option<&'static str> {
        if self.tls && tls.ca.is_none() {
            Some(
                "the local streamgate up serves TLS: pass --ca <CA certificate> (or STREAMGATE_CA)",
            )
        } else if self.mtls && tls.client_cert.is_none() {
            Some("the local streamgate up requires client certificates: pass --client-cert and --client-key")
        } else {
            None
        }
    }

    /// Removes `up.json` (on shutdown).
    pub fn remove(data_dir: &Path) {
        let _ = std::fs::remove_file(path(data_dir));
    }
}

/// `msg`, followed by `hint` when there is one.
pub fn with_hint(msg: String, hint: Option<&str>) -> String {
    match hint {
        Some(h) => format!("{msg} ({h})"),
        None => msg,
    }
}
