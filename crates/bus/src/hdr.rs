//! Header access shared by the raw and event formats.

use async_nats::HeaderMap;

use crate::subject::{decode_token, encode_token};
use crate::BusError;

/// The value of `name`: exact match first (our own publishes), then case-insensitive,
/// because some clients canonicalize header names (Go's `Header.Set` turns
/// `traceparent` into `Traceparent`).
pub(crate) fn get<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    if let Some(v) = headers.get(name) {
        return Some(v.as_str());
    }
    headers
        .iter()
        .find(|(k, _)| AsRef::<[u8]>::as_ref(k).eq_ignore_ascii_case(name.as_bytes()))
        .and_then(|(_, vs)| vs.first())
        .map(|v| v.as_str())
}

/// A token-encoded text header, decoded.
pub(crate) fn text(headers: &HeaderMap, name: &'static str) -> Result<Option<String>, BusError> {
    get(headers, name)
        .map(|v| {
            decode_token(v.trim()).map_err(|_| BusError::InvalidHeader {
                name,
                value: v.to_owned(),
            })
        })
        .transpose()
}

/// A decimal header.
pub(crate) fn number<T: std::str::FromStr>(
    headers: &HeaderMap,
    name: &'static str,
) -> Result<Option<T>, BusError> {
    get(headers, name)
        .map(|v| {
            v.trim().parse().map_err(|_| BusError::InvalidHeader {
                name,
                value: v.to_owned(),
            })
        })
        .transpose()
}

/// Sets a text header, token-encoded: the encoded form never holds CR or LF, so building
/// the header can never panic whatever the value is.
pub(crate) fn put_text(headers: &mut HeaderMap, name: &'static str, value: &str) {
    headers.insert(name, encode_token(value).as_ref());
}
