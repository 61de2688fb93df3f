//! TLS from PEM files: server configs for the HTTP servers (rustls) and the gRPC servers
//! (tonic, also rustls), and the CLI clients' side ([`ClientTlsArgs`]: `--ca`,
//! `--client-cert`, `--client-key`). Crypto is rustls with the `ring` provider.

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// A server's certificate chain, key and (for mTLS) client CA, as PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// Certificate chain (PEM), leaf first.
    pub cert: PathBuf,
    /// Private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// CA certificate(s) client certificates must chain to; `Some` requires one.
    pub client_ca: Option<PathBuf>,
}

/// A TLS file or setting is unusable.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {what} {path}: {source}")]
    Read {
        /// Which file (`certificate`, `key`, `CA`).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file holds no usable PEM section of its kind.
    #[error("{path}: no PEM {what} in it ({reason})")]
    Pem {
        /// Which kind (`certificate`, `private key`).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The parser's words.
        reason: String,
    },
    /// rustls refused the configuration (a key not matching the certificate, …).
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    /// The client CA cannot verify anything.
    #[error("client CA {path}: {reason}")]
    ClientCa {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A client endpoint could not be made.
    #[error("{0}")]
    Endpoint(String),
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    })
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read("certificate", path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            what: "certificate",
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            what: "certificate",
            path: path.to_owned(),
            reason: "no CERTIFICATE section".into(),
        });
    }
    Ok(certs)
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    warn_if_readable(path);
    let pem = read("key", path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError::Pem {
        what: "private key",
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

/// A private key readable by group or others is a leak waiting to happen: say so
/// loudly (not refused: Kubernetes mounts secrets 0644 unless told otherwise).
fn warn_if_readable(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(m) = std::fs::metadata(path) {
            let mode = m.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                tracing::warn!(
                    path = %path.display(),
                    mode = format!("{mode:o}"),
                    "TLS private key is readable by group or others; make it 0600"
                );
            }
        }
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl TlsFiles {
    /// The rustls server config (ALPN `h2` and `http/1.1`), loading every file now so a
    /// bad one fails the start with its path named.
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let provider = provider();
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in certs(ca)? {
                    roots.add(c)?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()
                .map_err(|e| TlsError::ClientCa {
                    path: ca.clone(),
                    reason: e.to_string(),
                })?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut cfg = builder.with_single_cert(certs(&self.cert)?, key(&self.key)?)?;
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(cfg))
    }

    /// The tonic server config (validated through [`TlsFiles::server_config`] first, for
    /// its error messages); `handshake` bounds each TLS handshake.
    pub fn tonic_config(
        &self,
        handshake: Duration,
    ) -> Result<tonic::transport::ServerTlsConfig, TlsError> {
        self.server_config()?;
        let identity = tonic::transport::Identity::from_pem(
            read("certificate", &self.cert)?,
            read("key", &self.key)?,
        );
        let mut cfg = tonic::transport::ServerTlsConfig::new()
            .identity(identity)
            .timeout(handshake);
        if let Some(ca) = &self.client_ca {
            cfg = cfg.client_ca_root(tonic::transport::Certificate::from_pem(read("CA", ca)?));
        }
        Ok(cfg)
    }
}

/// TLS flags of the CLI clients (`ingest`, `runs`, `replay`, `tail`, `settings`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClientTlsArgs {
    /// CA certificate (PEM) that signed the server's certificate: connect with TLS
    /// (`https://` addresses without it use the system's roots).
    #[arg(long, env = "STREAMGATE_CA")]
    pub ca: Option<PathBuf>,
    /// Client certificate (PEM) for servers that require mTLS.
    #[arg(long, env = "STREAMGATE_CLIENT_CERT", requires = "client_key")]
    pub client_cert: Option<PathBuf>,
    /// Private key (PEM) of --client-cert.
    #[arg(long, env = "STREAMGATE_CLIENT_KEY", requires = "client_cert")]
    pub client_key: Option<PathBuf>,
}

impl ClientTlsArgs {
    /// True when connections use TLS: a CA or a client certificate was given.
    pub fn enabled(&self) -> bool {
        self.ca.is_some() || self.client_cert.is_some()
    }

    /// The gRPC endpoint of `addr` (`host:port` or a URL): `https://` when TLS is on or
    /// the URL says so, with the CA and client identity given.
    pub fn endpoint(&self, addr: &str) -> Result<tonic::transport::Endpoint, TlsError> {
        let bare = addr
            .strip_prefix("http://")
            .or_else(|| addr.strip_prefix("https://"))
            .unwrap_or(addr);
        let tls = self.enabled() || addr.starts_with("https://");
        let url = format!("{}://{bare}", if tls { "https" } else { "http" });
        let endpoint = tonic::transport::Endpoint::from_shared(url)
            .map_err(|e| TlsError::Endpoint(format!("bad address {addr:?}: {e}")))?;
        if !tls {
            return Ok(endpoint);
        }
        let mut cfg = tonic::transport::ClientTlsConfig::new();
        cfg = match &self.ca {
            Some(ca) => {
                cfg.ca_certificate(tonic::transport::Certificate::from_pem(read("CA", ca)?))
            }
            None => cfg.with_native_roots(),
        };
        if let (Some(cert), Some(key)) = (&self.client_cert, &self.client_key) {
            warn_if_readable(key);
            cfg = cfg.identity(tonic::transport::Identity::from_pem(
                read("certificate", cert)?,
                read("key", key)?,
            ));
        }
        endpoint
            .tls_config(cfg)
            .map_err(|e| TlsError::Endpoint(format!("TLS for {addr:?}: {e}")))
    }
}
