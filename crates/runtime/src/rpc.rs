//! gRPC plumbing shared by the services: bearer-token auth, health, reflection.

use std::sync::Arc;
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::{Request, Status};

/// Server-side interceptor: every call must carry `authorization: Bearer <token>`.
#[derive(Clone)]
pub struct RequireBearer {
    token: Option<Arc<str>>,
}

impl RequireBearer {
    /// Requires `token`.
    pub fn new(token: &str) -> RequireBearer {
        RequireBearer {
            token: Some(Arc::from(token)),
        }
    }

    /// Requires `token` when given; lets every call through otherwise (a front door
    /// deployed without a token, e.g. behind a mesh that authenticates).
    pub fn optional(token: Option<&str>) -> RequireBearer {
        RequireBearer {
            token: token.map(Arc::from),
        }
    }
}

impl Interceptor for RequireBearer {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let Some(token) = &self.token else {
            return Ok(req);
        };
        let presented = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        check_bearer(presented, token)
            .map(|()| req)
            .map_err(|e| Status::unauthenticated(e.to_string()))
    }
}

/// Why an `Authorization` value was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BearerError {
    /// No `Authorization` value, or not of the `Bearer` scheme.
    #[error("missing `authorization: Bearer <token>`")]
    Missing,
    /// A bearer token, but not the expected one.
    #[error("invalid bearer token")]
    Wrong,
}

/// The token of an `Authorization` value of the `Bearer` scheme. The scheme is matched
/// in any case (`bearer`, `BEARER`: RFC 9110 §11.1 makes auth schemes case-insensitive)
/// and may be followed by more than one space.
pub fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, rest) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("Bearer")
        .then(|| rest.trim_start_matches(' '))
        .filter(|t| !t.is_empty())
}

/// Checks an `Authorization` value (HTTP header or gRPC metadata) against `expected`,
/// in constant time over the token. Shared by every front door.
pub fn check_bearer(value: Option<&str>, expected: &str) -> Result<(), BearerError> {
    match value.and_then(bearer_token) {
        Some(t) if constant_time_eq(t.as_bytes(), expected.as_bytes()) => Ok(()),
        Some(_) => Err(BearerError::Wrong),
        None => Err(BearerError::Missing),
    }
}

/// Client-side interceptor adding `authorization: Bearer <token>` (or nothing).
#[derive(Clone)]
pub struct SendBearer {
    value: Option<MetadataValue<tonic::metadata::Ascii>>,
}

impl SendBearer {
    /// Sends `token` when given.
    pub fn new(token: Option<&str>) -> SendBearer {
        SendBearer {
            value: token.and_then(|t| format!("Bearer {t}").parse().ok()),
        }
    }
}

impl Interceptor for SendBearer {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        if let Some(v) = &self.value {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// Compares secrets without an early exit on the first differing byte.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Names a port always serves beside its service: health and reflection.
const STANDARD_SERVICES: [&str; 3] = [
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
];

/// A reflection builder that advertises `service` and the standard services only — what
/// the port answers — with every streamgate proto (and health's) to describe them.
fn reflection_builder(service: &str) -> tonic_reflection::server::Builder<'static> {
    STANDARD_SERVICES.iter().fold(
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(streamgate_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .with_service_name(service),
        |b, name| b.with_service_name(*name),
    )
}

/// The gRPC reflection service of a port serving `service` (its full name, e.g.
/// `streamgate.v1.ArchiveService`).
pub fn reflection(
    service: &str,
) -> Result<
    tonic_reflection::server::v1::ServerReflectionServer<
        impl tonic_reflection::server::v1::ServerReflection,
    >,
    tonic_reflection::server::Error,
> {
    reflection_builder(service).build_v1()
}

/// The gRPC reflection service, v1alpha (what older `grpcurl` and tools ask for).
pub fn reflection_v1alpha(
    service: &str,
) -> Result<
    tonic_reflection::server::v1alpha::ServerReflectionServer<
        impl tonic_reflection::server::v1alpha::ServerReflection,
    >,
    tonic_reflection::server::Error,
> {
    reflection_builder(service).build_v1alpha()
}

/// A random token for local instances (`streamgate up`): 32 bytes, hex.
pub fn random_token() -> String {
    (0..4)
        .map(|_| format!("{:016x}", rand::random::<u64>()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_is_checked() {
        let mut auth = RequireBearer::new("s3cret");
        let mut ok = Request::new(());
        ok.metadata_mut()
            .insert("authorization", "Bearer s3cret".parse().unwrap());
        assert!(auth.call(ok).is_ok());
        let mut bad = Request::new(());
        bad.metadata_mut()
            .insert("authorization", "Bearer nope".parse().unwrap());
        assert_eq!(
            auth.call(bad).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        assert_eq!(
            auth.call(Request::new(())).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        for scheme in ["bearer", "BEARER", "Bearer", "beArer"] {
            let mut ok = Request::new(());
            ok.metadata_mut()
                .insert("authorization", format!("{scheme} s3cret").parse().unwrap());
            assert!(auth.call(ok).is_ok(), "{scheme}");
        }
        assert_eq!(random_token().len(), 64);
    }

    #[test]
    fn bearer_values() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer  abc"), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Bearerabc"), None);
        assert_eq!(check_bearer(Some("bearer s"), "s"), Ok(()));
        assert_eq!(check_bearer(Some("bearer x"), "s"), Err(BearerError::Wrong));
        assert_eq!(check_bearer(None, "s"), Err(BearerError::Missing));
    }
}
