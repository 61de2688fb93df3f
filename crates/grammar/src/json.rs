//! Provider objects carried verbatim inside events.
//!
//! Usage blocks, tool arguments and diagnostic details are the provider's own JSON: the
//! grammar passes them through unchanged (no re-typing, no float re-formatting). They are
//! kept as compact raw JSON text so they re-serialize byte-for-byte and travel on the bus
//! as plain strings.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::fmt;

/// A JSON value kept as compact text, exactly as the provider sent it (minus insignificant
/// whitespace, so every event fits on one JSONL line).
#[derive(Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Json(Box<RawValue>);

impl Json {
    /// Wraps raw JSON, compacting it when it contains whitespace outside strings.
    pub fn from_raw(raw: &RawValue) -> Json {
        let text = raw.get();
        if has_insignificant_whitespace(text) {
            Json::from_compact_unchecked(compact(text))
        } else {
            Json(raw.to_owned())
        }
    }

    /// Parses JSON text. Returns `None` when the text is not one valid JSON value.
    pub fn parse(text: &str) -> Option<Json> {
        let raw: &RawValue = serde_json::from_str(text).ok()?;
        Some(Json::from_raw(raw))
    }

    /// Serializes any value (a `serde_json::Value`, a map, a string, …).
    pub fn from_value<T: Serialize + ?Sized>(value: &T) -> Json {
        // Serializing plain data to a string cannot fail; fall back to null defensively.
        match serde_json::value::to_raw_value(value) {
            Ok(raw) => Json(raw),
            Err(_) => Json::null(),
        }
    }

    /// The JSON `null`.
    pub fn null() -> Json {
        Json::from_compact_unchecked("null".to_owned())
    }

    /// A JSON string value.
    pub fn string(s: &str) -> Json {
        Json::from_value(s)
    }

    /// The JSON text.
    pub fn get(&self) -> &str {
        self.0.get()
    }

    /// True for the JSON `null`.
    pub fn is_null(&self) -> bool {
        self.get() == "null"
    }

    /// Parses the text into a `serde_json::Value` (for inspection and comparisons).
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::from_str(self.get()).unwrap_or(serde_json::Value::Null)
    }

    fn from_compact_unchecked(text: String) -> Json {
        match RawValue::from_string(text) {
            Ok(raw) => Json(raw),
            Err(_) => Json(RawValue::from_string("null".to_owned()).expect("null is JSON")),
        }
    }
}

impl PartialEq for Json {
    fn eq(&self, other: &Json) -> bool {
        self.get() == other.get() || self.to_value() == other.to_value()
    }
}

impl fmt::Debug for Json {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.get())
    }
}

impl From<serde_json::Value> for Json {
    fn from(value: serde_json::Value) -> Json {
        Json::from_value(&value)
    }
}

fn has_insignificant_whitespace(text: &str) -> bool {
    let mut in_string = false;
    let mut escaped = false;
    for &b in text.as_bytes() {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else if b == b'"' {
            in_string = true;
        } else if matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            return true;
        }
    }
    false
}

/// Removes whitespace outside strings from (already valid) JSON text.
fn compact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_string = false;
    let mut escaped = false;
    for c in text.chars() {
        if in_string {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
            out.push(c);
        } else if c == '"' {
            in_string = true;
            out.push(c);
        } else if !matches!(c, ' ' | '\t' | '\n' | '\r') {
            out.push(c);
        }
    }
    out
}

/// Deserializes an optional provider object so that an explicit `null` stays `Some(null)`
/// (the provider said null; that differs from the field being absent).
pub fn deserialize_present<'de, D>(d: D) -> Result<Option<Json>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    Json::deserialize(d).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compacts_outside_strings_only() {
        let j = Json::parse("{ \"a b\": [1, 2],\n \"c\": \"x  y\" }").unwrap();
        assert_eq!(j.get(), r#"{"a b":[1,2],"c":"x  y"}"#);
    }

    #[test]
    fn keeps_numbers_verbatim() {
        let j = Json::parse(r#"{"cost":0.0026784,"n":1.0,"big":123456789012345678901234567890}"#)
            .unwrap();
        assert_eq!(
            j.get(),
            r#"{"cost":0.0026784,"n":1.0,"big":123456789012345678901234567890}"#
        );
    }

    #[test]
    fn rejects_invalid() {
        assert!(Json::parse("{").is_none());
        assert!(Json::parse("1 2").is_none());
    }
}
