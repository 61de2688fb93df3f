//! Who may see the page: every surface that shows runs needs a credential, and a page
//! on loopback answers only to loopback host names (DNS rebinding: a site the user
//! visits resolving its own name to 127.0.0.1 must not read the runs).
//!
//! The credential is the channel's token, carried as `Authorization: Bearer <token>`
//! (scripts), or as an HttpOnly, SameSite=Strict cookie that `GET /?token=<token>` sets
//! before redirecting to the same page without the token in its address (a person
//! opening the URL `streamgate up` printed; `EventSource` cannot send headers).

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use std::net::SocketAddr;
use std::sync::Arc;

/// The cookie that carries the token.
const COOKIE: &str = "sg_channel";

/// What the page checks on every request.
#[derive(Debug, Clone)]
pub struct PageAccess {
    /// The channel token (`None`: an open page, for tests and trusted networks).
    pub token: Option<Arc<str>>,
    /// The address the page listens on: on loopback, only loopback host names pass.
    pub listen: SocketAddr,
}

impl PageAccess {
    /// `host`: the `Host` header, or HTTP/2's `:authority` (HTTP/2 has no `Host`).
    fn host_allowed(&self, host: Option<&str>) -> bool {
        if !self.listen.ip().is_loopback() {
            // Behind an ingress or on a trusted network: the host is the operator's.
            return true;
        }
        let Some(host) = host else {
            return false;
        };
        let name = match host.rsplit_once(':') {
            Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) => name,
            _ => host,
        };
        matches!(name, "localhost" | "[::1]")
            || name
                .parse::<std::net::Ipv4Addr>()
                .is_ok_and(|ip| ip.is_loopback())
    }

    fn presented<'a>(&self, req: &'a Request) -> Option<&'a str> {
        let headers = req.headers();
        if let Some(bearer) = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(streamgate_runtime::rpc::bearer_token)
        {
            return Some(bearer);
        }
        headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .find_map(|c| c.trim().strip_prefix(COOKIE)?.strip_prefix('='))
    }
}

fn same(a: &str, b: &str) -> bool {
    streamgate_runtime::rpc::constant_time_eq(a.as_bytes(), b.as_bytes())
}

/// The token from `?token=…`, and the query without it.
fn token_in_query(query: &str) -> Option<(String, String)> {
    let mut token = None;
    let rest: Vec<&str> = query
        .split('&')
        .filter(|kv| match kv.strip_prefix("token=") {
            Some(t) => {
                token = Some(t.to_owned());
                false
            }
            None => true,
        })
        .collect();
    Some((token?, rest.join("&")))
}

/// The middleware: host check, then the token (header, cookie, or `?token=` on a page
/// load, which sets the cookie and redirects).
pub async fn guard(State(access): State<PageAccess>, req: Request, next: Next) -> Response {
    let mut resp = check(&access, req, next).await;
    resp.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        header::HeaderValue::from_static(CSP),
    );
    resp
}

/// The page's Content-Security-Policy: its own script and styles only, images only from
/// itself or inline data (model output never makes the browser fetch anything), no
/// framing, no plugins, forms and `<base>` pinned.
const CSP: &str = "default-src 'self'; img-src 'self' data:; object-src 'none'; \
                   base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// The request's host: `Host`, else the URI's authority (HTTP/2 `:authority`).
fn request_host(req: &Request) -> Option<&str> {
    req.headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()))
}

/// `path` as a same-origin redirect target: `//host/…` or `/\\host/…` would leave the
/// site, so leading slashes and backslashes collapse to one `/`.
fn same_origin(path: &str) -> String {
    format!("/{}", path.trim_start_matches(['/', '\\']))
}

async fn check(access: &PageAccess, req: Request, next: Next) -> Response {
    if !access.host_allowed(request_host(&req)) {
        return (
            StatusCode::MISDIRECTED_REQUEST,
            "this page answers only to localhost names\n",
        )
            .into_response();
    }
    let Some(want) = access.token.as_deref() else {
        return next.run(req).await;
    };
    if let Some((given, rest)) = req.uri().query().and_then(token_in_query) {
        if !same(&given, want) {
            return unauthorized();
        }
        let path = same_origin(req.uri().path());
        let target = if rest.is_empty() {
            path
        } else {
            format!("{path}?{rest}")
        };
        let cookie = format!("{COOKIE}={given}; HttpOnly; SameSite=Strict; Path=/");
        return ([(header::SET_COOKIE, cookie)], Redirect::to(&target)).into_response();
    }
    let api = is_api(req.uri().path());
    match access.presented(&req) {
        Some(given) if same(given, want) => next.run(req).await,
        _ if api => unauthorized_json(),
        _ => unauthorized(),
    }
}

/// The page's JSON routes (the run stream, the run list): refusals there are JSON like
/// the routes' own errors.
fn is_api(path: &str) -> bool {
    path.starts_with("/v1/") || path == "/v1" || path.starts_with("/api/")
}

const NEEDS_TOKEN: &str = "this page needs the channel's token: open the address `streamgate up` \
     printed (…/?token=…), or send Authorization: Bearer <token>";

fn unauthorized() -> Response {
    (StatusCode::UNAUTHORIZED, format!("{NEEDS_TOKEN}\n")).into_response()
}

fn unauthorized_json() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        axum::Json(serde_json::json!({ "error": NEEDS_TOKEN, "code": "unauthorized" })),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_token_is_taken_out_of_the_address() {
        assert_eq!(
            token_in_query("token=abc&run=r1"),
            Some(("abc".into(), "run=r1".into()))
        );
        assert_eq!(
            token_in_query("token=abc"),
            Some(("abc".into(), String::new()))
        );
        assert_eq!(token_in_query("run=r1"), None);
    }

    #[test]
    fn loopback_pages_answer_only_to_loopback_names() {
        let access = PageAccess {
            token: None,
            listen: ([127, 0, 0, 1], 8080).into(),
        };
        let with = |host: &str| access.host_allowed(Some(host));
        assert!(with("127.0.0.1:8080"));
        assert!(with("localhost:8080"));
        assert!(with("[::1]:8080"));
        assert!(!with("evil.example:8080"));
        assert!(!with("127.0.0.1.evil.example"));
        let open = PageAccess {
            token: None,
            listen: ([0, 0, 0, 0], 8080).into(),
        };
        assert!(open.host_allowed(Some("streamgate.example.com")));
        assert!(!access.host_allowed(None));
    }

    #[test]
    fn redirects_stay_on_the_site() {
        assert_eq!(same_origin("//evil.example/x"), "/evil.example/x");
        assert_eq!(same_origin("/\\evil.example/x"), "/evil.example/x");
        assert_eq!(same_origin("/"), "/");
        assert_eq!(same_origin("/runs"), "/runs");
    }

    #[test]
    fn equal_tokens_only() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "abcd"));
    }
}
