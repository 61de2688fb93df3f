//! Ingest credentials scoped to tenants.
//!
//! A producer authenticates with `Authorization: Bearer <token>` (the scheme in any
//! case, [`streamgate_runtime::rpc::bearer_token`]); the token grants writing some
//! tenants' runs, or every tenant's. Credentials come from
//!
//! - `--ingest-token <token>` (env `STREAMGATE_INGEST_TOKEN`): one token for every tenant;
//! - `--ingest-tokens <file>` (env `STREAMGATE_INGEST_TOKENS`): a token file, one
//!   credential per line:
//!
//! ```text
//! # streamgate ingest tokens: `<token> <tenants>`; tenants comma-separated, `*` = all
//! 7d9f0c5e2b1a4c8e9f7a6b5c4d3e2f10  acme,globex
//! 0a1b2c3d4e5f60718293a4b5c6d7e8f9  *
//! ```
//!
//! Blank lines and lines starting with `#` are ignored; a token is at least 16
//! characters without whitespace, each tenant passes the id rule. The file must be
//! readable by its owner only (mode 0600 or stricter): a group- or world-readable file
//! is refused at start.
//!
//! With neither, the front doors are open (every tenant; a deployment behind a mesh
//! that authenticates). Refusals: no or unknown token → HTTP 401 / gRPC
//! `UNAUTHENTICATED`; a valid token for another tenant → HTTP 403 / gRPC
//! `PERMISSION_DENIED`. Tokens are compared in constant time against every credential
//! (no early exit) and never logged.

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use streamgate_grammar::ids;
use streamgate_runtime::rpc::{bearer_token, constant_time_eq};
use tonic::service::Interceptor;
use tonic::Status;

/// The shortest token a token file may hold.
pub const MIN_TOKEN_LEN: usize = 16;

/// Which tenants a credential may write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tenants {
    /// Every tenant (`*`).
    All,
    /// These tenants only.
    Only(BTreeSet<String>),
}

impl Tenants {
    fn allows(&self, tenant: &str) -> bool {
        match self {
            Tenants::All => true,
            Tenants::Only(set) => set.contains(tenant),
        }
    }
}

/// What an authenticated producer may write; carried in the gRPC request's extensions
/// by [`IngestInterceptor`] and checked by the handlers per tenant.
#[derive(Debug, Clone)]
pub struct Grant {
    tenants: Arc<Tenants>,
}

impl Grant {
    /// A grant for every tenant.
    pub fn all() -> Grant {
        Grant {
            tenants: Arc::new(Tenants::All),
        }
    }

    /// Ok when the grant covers `tenant`.
    pub fn check(&self, tenant: &str) -> Result<(), AuthError> {
        if self.tenants.allows(tenant) {
            Ok(())
        } else {
            Err(AuthError::Forbidden(tenant.to_owned()))
        }
    }
}

/// Why a producer was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `Authorization: Bearer <token>` value.
    #[error("ingest requires `Authorization: Bearer <token>` with an ingest token")]
    Missing,
    /// A bearer token no credential has.
    #[error("invalid ingest token")]
    Invalid,
    /// A valid token that does not cover this tenant.
    #[error("this ingest token may not write tenant {0:?}")]
    Forbidden(String),
}

impl AuthError {
    /// The HTTP status: 401 for missing/invalid, 403 for another tenant.
    pub fn http_status(&self) -> StatusCode {
        match self {
            AuthError::Missing | AuthError::Invalid => StatusCode::UNAUTHORIZED,
            AuthError::Forbidden(_) => StatusCode::FORBIDDEN,
        }
    }

    /// The gRPC status: `UNAUTHENTICATED` or `PERMISSION_DENIED`.
    pub fn status(&self) -> Status {
        match self {
            AuthError::Missing | AuthError::Invalid => Status::unauthenticated(self.to_string()),
            AuthError::Forbidden(_) => Status::permission_denied(self.to_string()),
        }
    }
}

impl IntoResponse for AuthError {
    fn into_response(self) -> Response {
        let body = axum::Json(serde_json::json!({ "error": self.to_string() }));
        match self.http_status() {
            StatusCode::UNAUTHORIZED => (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                body,
            )
                .into_response(),
            code => (code, body).into_response(),
        }
    }
}

/// A token file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    /// The file could not be read.
    #[error("cannot read ingest token file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Group or others may read it.
    #[error("ingest token file {path} is readable by group or others (mode {mode:o}); it holds credentials: chmod 600 it")]
    Permissions {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A line is not `<token> <tenants>`.
    #[error("ingest token file {path}, line {line}: {reason}")]
    Line {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong (never the token itself).
        reason: String,
    },
}

struct Credential {
    token: Box<[u8]>,
    tenants: Arc<Tenants>,
}

/// The ingest credentials of a normalizer.
#[derive(Clone, Default)]
pub struct IngestAuth {
    /// Empty: open front doors.
    credentials: Arc<Vec<Credential>>,
}

impl std::fmt::Debug for IngestAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the tokens.
        f.debug_struct("IngestAuth")
            .field("credentials", &self.credentials.len())
            .finish()
    }
}

impl IngestAuth {
    /// Open front doors: no token needed, every tenant.
    pub fn open() -> IngestAuth {
        IngestAuth::default()
    }

    /// `--ingest-token` and `--ingest-tokens` together: the single token writes every
    /// tenant, the file's tokens their tenants. Neither: open.
    pub fn load(token: Option<&str>, file: Option<&Path>) -> Result<IngestAuth, TokenFileError> {
        let mut creds = Vec::new();
        if let Some(t) = token.filter(|t| !t.is_empty()) {
            creds.push(Credential {
                token: t.as_bytes().into(),
                tenants: Arc::new(Tenants::All),
            });
        }
        if let Some(path) = file {
            creds.extend(read_file(path)?);
        }
        Ok(IngestAuth {
            credentials: Arc::new(creds),
        })
    }

    /// True when no token is required.
    pub fn is_open(&self) -> bool {
        self.credentials.is_empty()
    }

    /// The grant of an `Authorization` value.
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<Grant, AuthError> {
        if self.is_open() {
            return Ok(Grant::all());
        }
        let Some(presented) = authorization.and_then(bearer_token) else {
            return Err(AuthError::Missing);
        };
        // Every credential is compared, whichever matches: the time taken does not
        // tell which (or whether an early) credential matched.
        let mut found: Option<&Arc<Tenants>> = None;
        for c in self.credentials.iter() {
            if constant_time_eq(presented.as_bytes(), &c.token) && found.is_none() {
                found = Some(&c.tenants);
            }
        }
        found
            .map(|t| Grant { tenants: t.clone() })
            .ok_or(AuthError::Invalid)
    }

    /// The HTTP check: the header's token must grant `tenant`.
    pub fn check_http(&self, headers: &HeaderMap, tenant: &str) -> Result<(), AuthError> {
        let value = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let r = self.authenticate(value).and_then(|g| g.check(tenant));
        if let Err(e) = &r {
            tracing::debug!(tenant, refused = %e, "ingest request refused");
        }
        r
    }
}

/// Reads a token file (see the module docs for the format).
fn read_file(path: &Path) -> Result<Vec<Credential>, TokenFileError> {
    let read_err = |source| TokenFileError::Read {
        path: path.to_owned(),
        source,
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path)
            .map_err(read_err)?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(TokenFileError::Permissions {
                path: path.to_owned(),
                mode: mode & 0o777,
            });
        }
    }
    let text = std::fs::read_to_string(path).map_err(read_err)?;
    parse(&text).map_err(|(line, reason)| TokenFileError::Line {
        path: path.to_owned(),
        line,
        reason,
    })
}

/// Parses token file text; errors name the line, never the token.
fn parse(text: &str) -> Result<Vec<Credential>, (usize, String)> {
    let mut out: Vec<Credential> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.split_whitespace();
        let (Some(token), Some(tenants), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err((
                n,
                "expected `<token> <tenant>[,<tenant>…]` or `<token> *` (tenants without spaces)"
                    .into(),
            ));
        };
        if token.len() < MIN_TOKEN_LEN {
            return Err((
                n,
                format!("the token is shorter than {MIN_TOKEN_LEN} characters"),
            ));
        }
        let tenants = if tenants == "*" {
            Tenants::All
        } else {
            let mut set = BTreeSet::new();
            for t in tenants.split(',').filter(|t| !t.is_empty()) {
                if t == "*" {
                    return Err((n, "`*` stands alone: it means every tenant".into()));
                }
                let t = ids::TenantId::new(t).map_err(|e| (n, e.to_string()))?;
                set.insert(t.into_string());
            }
            if set.is_empty() {
                return Err((n, "no tenant".into()));
            }
            Tenants::Only(set)
        };
        if out
            .iter()
            .any(|c| constant_time_eq(&c.token, token.as_bytes()))
        {
            return Err((n, "this token is already on an earlier line".into()));
        }
        out.push(Credential {
            token: token.as_bytes().into(),
            tenants: Arc::new(tenants),
        });
    }
    Ok(out)
}

/// gRPC interceptor: authenticates the call and puts its [`Grant`] in the request's
/// extensions (the handlers check it per tenant and refuse a call without one).
#[derive(Clone, Debug)]
pub struct IngestInterceptor {
    auth: IngestAuth,
}

impl IngestInterceptor {
    /// Authenticates with `auth`.
    pub fn new(auth: IngestAuth) -> IngestInterceptor {
        IngestInterceptor { auth }
    }
}

impl Interceptor for IngestInterceptor {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        let value = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        match self.auth.authenticate(value) {
            Ok(grant) => {
                req.extensions_mut().insert(grant);
                Ok(req)
            }
            Err(e) => {
                tracing::debug!(refused = %e, "ingest call refused");
                Err(e.status())
            }
        }
    }
}

/// The grant of a gRPC request (put there by [`IngestInterceptor`]); none means the
/// service was mounted without it, and is refused.
pub fn grant_of<T>(req: &tonic::Request<T>) -> Result<Grant, Status> {
    req.extensions()
        .get::<Grant>()
        .cloned()
        .ok_or_else(|| Status::permission_denied("no ingest grant on this call"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(text: &str) -> IngestAuth {
        IngestAuth {
            credentials: Arc::new(parse(text).unwrap()),
        }
    }

    #[test]
    fn tokens_grant_their_tenants() {
        let a = auth("# comment\n\naaaaaaaaaaaaaaaa acme,globex\nbbbbbbbbbbbbbbbb *\n");
        let acme = a.authenticate(Some("Bearer aaaaaaaaaaaaaaaa")).unwrap();
        assert!(acme.check("acme").is_ok());
        assert!(acme.check("globex").is_ok());
        assert_eq!(
            acme.check("other"),
            Err(AuthError::Forbidden("other".into()))
        );
        let all = a.authenticate(Some("bearer bbbbbbbbbbbbbbbb")).unwrap();
        assert!(all.check("anything").is_ok());
        assert_eq!(
            a.authenticate(Some("Bearer cccccccccccccccc")).unwrap_err(),
            AuthError::Invalid
        );
        assert_eq!(a.authenticate(None).unwrap_err(), AuthError::Missing);
        assert_eq!(
            a.authenticate(Some("Basic aaaaaaaaaaaaaaaa")).unwrap_err(),
            AuthError::Missing
        );
        assert!(IngestAuth::open()
            .authenticate(None)
            .unwrap()
            .check("x")
            .is_ok());
    }

    #[test]
    fn bad_lines_are_refused_without_the_token() {
        for (text, want) in [
            ("short acme", "shorter"),
            ("aaaaaaaaaaaaaaaa", "expected"),
            ("aaaaaaaaaaaaaaaa acme extra", "expected"),
            ("aaaaaaaaaaaaaaaa acme,*", "stands alone"),
            ("aaaaaaaaaaaaaaaa ,", "no tenant"),
            (
                "aaaaaaaaaaaaaaaa a\nbbbbbbbbbbbbbbbb b\naaaaaaaaaaaaaaaa c",
                "earlier line",
            ),
        ] {
            let Err((_, reason)) = parse(text) else {
                panic!("{text:?} accepted");
            };
            assert!(reason.contains(want), "{text:?}: {reason}");
            assert!(!reason.contains("aaaa"), "{reason}");
        }
        assert_eq!(
            parse("x\naaaaaaaaaaaaaaaa a\nshort a").err().map(|e| e.0),
            Some(1)
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_readable_token_file_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("sg-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokens");
        std::fs::write(&path, "aaaaaaaaaaaaaaaa acme\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = IngestAuth::load(None, Some(&path)).unwrap_err();
        assert!(
            matches!(err, TokenFileError::Permissions { mode: 0o644, .. }),
            "{err}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let a = IngestAuth::load(Some("single-token-for-all"), Some(&path)).unwrap();
        assert!(a
            .authenticate(Some("Bearer single-token-for-all"))
            .unwrap()
            .check("zzz")
            .is_ok());
        assert!(format!("{a:?}").contains("credentials: 2"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
