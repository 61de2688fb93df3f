//! Header access shared by the raw and event formats.

use async_nats::header::{HeaderName, IntoHeaderValue};
use async_nats::HeaderMap;

use crate::subject::{decode_token, encode_token};
use crate::BusError;

/// The value of `name`: exact match first (our own publishes), then case-insensitive,
/// because some clients canonicalize header names (Go's `Header.Set` turns
/// `traceparent` into `Traceparent`).
pub(crate) fn get<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    let [value] = find(headers, [name]);
    value
}

/// The values of `names` ([`get`]'s rule for each), found in one pass over the headers:
/// a raw chunk reads nine, and a lookup per name — a hash, then a scan of every header
/// for each absent one — was a tenth of the normalizer's own time per chunk.
pub(crate) fn find<'a, const N: usize>(
    headers: &'a HeaderMap,
    names: [&str; N],
) -> [Option<&'a str>; N] {
    let mut found = [None; N];
    let mut exact = [false; N];
    for (name, values) in headers.iter() {
        let Some(value) = values.first() else {
            continue;
        };
        let name: &[u8] = name.as_ref();
        for (i, wanted) in names.iter().enumerate() {
            let wanted = wanted.as_bytes();
            if exact[i] || name.len() != wanted.len() {
                continue;
            }
            if name == wanted {
                (found[i], exact[i]) = (Some(value.as_str()), true);
            } else if found[i].is_none() && name.eq_ignore_ascii_case(wanted) {
                found[i] = Some(value.as_str());
            }
        }
    }
    found
}

/// The value `v` of the token-encoded text header `name`, decoded.
pub(crate) fn decode_text(name: &'static str, v: &str) -> Result<String, BusError> {
    decode_token(v.trim()).map_err(|_| BusError::InvalidHeader {
        name,
        value: v.to_owned(),
    })
}

/// A decimal header.
pub(crate) fn number<T: std::str::FromStr>(
    headers: &HeaderMap,
    name: &'static str,
) -> Result<Option<T>, BusError> {
    get(headers, name)
        .map(|v| parse_number(name, v))
        .transpose()
}

/// The value `v` of the decimal header `name`, parsed.
pub(crate) fn parse_number<T: std::str::FromStr>(
    name: &'static str,
    v: &str,
) -> Result<T, BusError> {
    v.trim().parse().map_err(|_| BusError::InvalidHeader {
        name,
        value: v.to_owned(),
    })
}

/// Sets header `name` (one of this crate's constant names) to `value`, which the caller
/// knows holds no CR or LF. The name is taken as static: no check and no copy per message,
/// where a `&str` name is validated and copied on every insert.
pub(crate) fn put(headers: &mut HeaderMap, name: &'static str, value: impl IntoHeaderValue) {
    headers.insert(HeaderName::from_static(name), value);
}

/// Sets a text header, token-encoded: the encoded form never holds CR or LF, so building
/// the header can never panic whatever the value is.
pub(crate) fn put_text(headers: &mut HeaderMap, name: &'static str, value: &str) {
    put(headers, name, encode_token(value).as_ref());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{HDR_ADAPTER, HDR_BATCH, HDR_GRAMMAR, HDR_STREAM};
    use crate::raw::{
        HDR_CHUNK, HDR_CLOSE, HDR_DIALECT, HDR_FAMILY, HDR_INGEST_TS, HDR_MSG_ID, HDR_RUN,
        HDR_SESSION, HDR_TENANT,
    };
    use crate::trace::{HDR_TRACEPARENT, HDR_TRACESTATE};

    /// [`put`] skips the name check `HeaderName::from_str` makes, so every name it is
    /// given must pass that check.
    #[test]
    fn every_name_put_takes_is_a_valid_header_name() {
        for name in [
            HDR_ADAPTER,
            HDR_BATCH,
            HDR_GRAMMAR,
            HDR_STREAM,
            HDR_CHUNK,
            HDR_CLOSE,
            HDR_DIALECT,
            HDR_FAMILY,
            HDR_INGEST_TS,
            HDR_MSG_ID,
            HDR_RUN,
            HDR_SESSION,
            HDR_TENANT,
            HDR_TRACEPARENT,
            HDR_TRACESTATE,
        ] {
            let parsed: HeaderName = name.parse().unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(parsed, HeaderName::from_static(name), "{name}");
        }
    }
}
