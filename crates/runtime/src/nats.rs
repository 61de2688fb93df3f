//! NATS connection flags for every binary, and connecting with them.
//!
//! [`NatsArgs`] is the one set of bus flags every service and CLI command that talks to
//! NATS flattens in: `--nats`, one server URL or a comma-separated list of a cluster's
//! servers (`nats://10.0.0.1:4222,nats://10.0.0.2:4222`) — the client connects to one of
//! them and, when that node goes away, reconnects to another (and to the servers the
//! cluster gossips), so a cluster stays reachable while any of the listed nodes is up —
//! and the cluster's credentials: `--nats-creds <file>` (a NATS `.creds` file: JWT and
//! NKey seed), `--nats-user` with `--nats-password`, or `--nats-token`. Each has a
//! `STREAMGATE_NATS_…` environment variable; prefer those (or a `--config` file) to flags
//! for secrets, which `ps` shows. [`NatsArgs::connect`] applies them. Credentials never
//! appear in `Debug` output or logs.
use async_nats::ServerAddr;
use std::path::PathBuf;

/// Where a binary connects when `--nats` is not given.
pub const DEFAULT_NATS_URL: &str = "nats://127.0.0.1:4222";

/// The bus flags shared by every binary that connects to NATS (flatten it with
/// `#[command(flatten)]`).
#[derive(Clone, Default, clap::Args)]
pub struct NatsArgs {
    /// NATS server URL, or a cluster's servers comma-separated (default
    /// nats://127.0.0.1:4222).
    #[arg(long = "nats", env = "STREAMGATE_NATS_URL", value_name = "URL[,URL…]")]
    pub nats: Option<String>,
    /// NATS credentials file (`.creds`: a user JWT and NKey seed).
    #[arg(
        long,
        env = "STREAMGATE_NATS_CREDS",
        value_name = "FILE",
        conflicts_with_all = ["nats_user", "nats_token"]
    )]
    pub nats_creds: Option<PathBuf>,
    /// NATS user name (with --nats-password).
    #[arg(
        long,
        env = "STREAMGATE_NATS_USER",
        requires = "nats_password",
        conflicts_with = "nats_token"
    )]
    pub nats_user: Option<String>,
    /// NATS password (with --nats-user). Prefer the environment variable: `ps` shows
    /// flags.
    #[arg(
        long,
        env = "STREAMGATE_NATS_PASSWORD",
        hide_env_values = true,
        requires = "nats_user"
    )]
    pub nats_password: Option<String>,
    /// NATS authentication token. Prefer the environment variable: `ps` shows flags.
    #[arg(long, env = "STREAMGATE_NATS_TOKEN", hide_env_values = true)]
    pub nats_token: Option<String>,
}

impl std::fmt::Debug for NatsArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsArgs")
            .field("nats", &self.nats)
            .field("auth", &self.auth())
            .finish()
    }
}

impl NatsArgs {
    /// The servers to connect to: `--nats`, else [`DEFAULT_NATS_URL`].
    pub fn servers(&self) -> &str {
        self.nats.as_deref().unwrap_or(DEFAULT_NATS_URL)
    }

    /// The credentials these flags give.
    pub fn auth(&self) -> NatsAuth {
        if let Some(path) = &self.nats_creds {
            return NatsAuth::CredsFile(path.clone());
        }
        if let (Some(user), Some(password)) = (&self.nats_user, &self.nats_password) {
            return NatsAuth::UserPassword {
                user: user.clone(),
                password: password.clone(),
            };
        }
        match &self.nats_token {
            Some(token) => NatsAuth::Token(token.clone()),
            None => NatsAuth::None,
        }
    }

    /// Connects to [`servers`](NatsArgs::servers) with [`auth`](NatsArgs::auth).
    pub async fn connect(&self) -> anyhow::Result<async_nats::Client> {
        connect_auth(self.servers(), &self.auth()).await
    }
}

/// How a client authenticates to NATS. `Debug` never shows a secret.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum NatsAuth {
    /// No credentials.
    #[default]
    None,
    /// A `.creds` file (user JWT and NKey seed).
    CredsFile(PathBuf),
    /// User name and password.
    UserPassword {
        /// The user.
        user: String,
        /// The password.
        password: String,
    },
    /// A token.
    Token(String),
}

impl std::fmt::Debug for NatsAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NatsAuth::None => f.write_str("None"),
            NatsAuth::CredsFile(p) => f.debug_tuple("CredsFile").field(p).finish(),
            NatsAuth::UserPassword { user, .. } => f
                .debug_struct("UserPassword")
                .field("user", user)
                .field("password", &"<redacted>")
                .finish(),
            NatsAuth::Token(_) => f.write_str("Token(<redacted>)"),
        }
    }
}

/// Credentials that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum NatsAuthError {
    /// The `.creds` file could not be read or parsed.
    #[error("cannot use NATS credentials file {path}: {source}")]
    CredsFile {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

impl NatsAuth {
    /// `options` with these credentials.
    pub async fn apply(
        &self,
        options: async_nats::ConnectOptions,
    ) -> Result<async_nats::ConnectOptions, NatsAuthError> {
        Ok(match self {
            NatsAuth::None => options,
            NatsAuth::CredsFile(path) => {
                options
                    .credentials_file(path)
                    .await
                    .map_err(|source| NatsAuthError::CredsFile {
                        path: path.display().to_string(),
                        source,
                    })?
            }
            NatsAuth::UserPassword { user, password } => {
                options.user_and_password(user.clone(), password.clone())
            }
            NatsAuth::Token(token) => options.token(token.clone()),
        })
    }
}

/// A `--nats` value that is not a list of server URLs.
#[derive(Debug, thiserror::Error)]
pub enum NatsAddrError {
    /// The list has no server at all.
    #[error("no NATS server given (expected nats://host:port[,nats://host:port…])")]
    Empty,
    /// One entry is not a server URL.
    #[error("bad NATS server {entry:?}: {reason}")]
    Bad {
        /// The entry as given.
        entry: String,
        /// Why it does not parse.
        reason: String,
    },
}

/// Parses `url[,url…]` (blank entries and surrounding spaces ignored; `host:port`
/// without a scheme means `nats://host:port`).
pub fn parse_servers(list: &str) -> Result<Vec<ServerAddr>, NatsAddrError> {
    let mut out = Vec::new();
    for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let addr: ServerAddr = entry
            .parse()
            .map_err(|e: std::io::Error| NatsAddrError::Bad {
                entry: entry.to_owned(),
                reason: e.to_string(),
            })?;
        out.push(addr);
    }
    if out.is_empty() {
        return Err(NatsAddrError::Empty);
    }
    Ok(out)
}

/// Connects to the servers of a `--nats` value (see [`parse_servers`]) without
/// credentials.
pub async fn connect(list: &str) -> anyhow::Result<async_nats::Client> {
    connect_with(list, async_nats::ConnectOptions::new()).await
}

/// Connects to the servers of a `--nats` value with these credentials.
pub async fn connect_auth(list: &str, auth: &NatsAuth) -> anyhow::Result<async_nats::Client> {
    let options = auth.apply(async_nats::ConnectOptions::new()).await?;
    connect_with(list, options).await
}

/// [`connect`] with these options.
pub async fn connect_with(
    list: &str,
    options: async_nats::ConnectOptions,
) -> anyhow::Result<async_nats::Client> {
    let servers = parse_servers(list)?;
    options
        .connect(servers)
        .await
        .map_err(|e| anyhow::anyhow!("cannot connect to NATS at {}: {e}", redact_servers(list)))
}

/// A `--nats` value fit to show: the user and password of `nats://user:pass@host`
/// entries replaced by `***`.
pub fn redact_servers(list: &str) -> String {
    list.split(',')
        .map(|entry| {
            let (scheme, rest) = match entry.split_once("://") {
                Some((s, r)) => (Some(s), r),
                None => (None, entry),
            };
            let authority_end = rest.find('/').unwrap_or(rest.len());
            let redacted = match rest[..authority_end].rfind('@') {
                Some(at) => format!("***{}", &rest[at..]),
                None => rest.to_owned(),
            };
            match scheme {
                Some(s) => format!("{s}://{redacted}"),
                None => redacted,
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        nats: NatsArgs,
    }

    #[test]
    fn flags_pick_one_kind_of_credentials_and_debug_hides_secrets() {
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert_eq!(cli.nats.servers(), DEFAULT_NATS_URL);
        assert_eq!(cli.nats.auth(), NatsAuth::None);
        let cli = Cli::try_parse_from([
            "x",
            "--nats",
            "nats://a:1,nats://b:2",
            "--nats-user",
            "svc",
            "--nats-password",
            "hunter2",
        ])
        .unwrap();
        assert_eq!(cli.nats.servers(), "nats://a:1,nats://b:2");
        assert_eq!(
            cli.nats.auth(),
            NatsAuth::UserPassword {
                user: "svc".into(),
                password: "hunter2".into()
            }
        );
        let shown = format!("{cli:?}");
        assert!(
            shown.contains("svc") && !shown.contains("hunter2"),
            "{shown}"
        );
        let cli = Cli::try_parse_from(["x", "--nats-token", "s3cret"]).unwrap();
        assert_eq!(cli.nats.auth(), NatsAuth::Token("s3cret".into()));
        assert!(!format!("{cli:?}").contains("s3cret"));
        let cli = Cli::try_parse_from(["x", "--nats-creds", "/etc/nats/svc.creds"]).unwrap();
        assert_eq!(
            cli.nats.auth(),
            NatsAuth::CredsFile("/etc/nats/svc.creds".into())
        );
        // A user without a password, or two kinds at once, is refused.
        assert!(Cli::try_parse_from(["x", "--nats-user", "svc"]).is_err());
        assert!(Cli::try_parse_from(["x", "--nats-token", "t", "--nats-creds", "f"]).is_err());
        assert!(Cli::try_parse_from([
            "x",
            "--nats-token",
            "t",
            "--nats-user",
            "u",
            "--nats-password",
            "p"
        ])
        .is_err());
    }

    #[test]
    fn one_server_or_a_list() {
        let one = parse_servers("nats://127.0.0.1:4222").unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].host(), "127.0.0.1");
        assert_eq!(one[0].port(), 4222);
        let three = parse_servers(" nats://127.0.0.1:1, 127.0.0.1:2 ,nats://127.0.0.1:3,").unwrap();
        let ports: Vec<u16> = three.iter().map(ServerAddr::port).collect();
        assert_eq!(ports, [1, 2, 3]);
    }

    #[test]
    fn urls_are_shown_without_their_credentials() {
        assert_eq!(
            redact_servers("nats://u:secret@a:1, b:2,tls://tok@c:3"),
            "nats://***@a:1, b:2,tls://***@c:3"
        );
        assert_eq!(redact_servers("nats://a:4222"), "nats://a:4222");
    }

    #[test]
    fn empty_and_garbage_are_refused() {
        assert!(matches!(parse_servers(""), Err(NatsAddrError::Empty)));
        assert!(matches!(parse_servers(" , "), Err(NatsAddrError::Empty)));
        assert!(matches!(
            parse_servers("nats://127.0.0.1:1,http://x:2"),
            Err(NatsAddrError::Bad { .. })
        ));
    }
}
