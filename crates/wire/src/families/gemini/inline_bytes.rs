//! Inline media bytes kept out of diagnostics.
//!
//! A `Blob` (`inlineData` on a part, and inside a multimodal `functionResponse.parts[]`)
//! carries its content as base64 `data` beside its `mimeType`. Diagnostics are small,
//! readable lifecycle metadata that reach every channel; an image or an audio clip would
//! turn one into megabytes of base64 (the bytes stay archived in `SG_RAW`). So a reported
//! part keeps the blob's other fields and says how big the data is instead.

use serde_json::{Map, Value};

/// The key that replaces `data`: the decoded size of the blob's content, in bytes.
const SIZE_KEY: &str = "bytes";

/// Replaces, anywhere inside `value`, every blob's base64 `data` string (an object that
/// also has a `mimeType`) by its decoded length under [`SIZE_KEY`], at the same position.
pub(super) fn elide(value: &mut Value) {
    match value {
        Value::Array(items) => items.iter_mut().for_each(elide),
        Value::Object(map) => {
            if is_blob(map) {
                *map = std::mem::take(map)
                    .into_iter()
                    .map(|(key, v)| match (key.as_str(), &v) {
                        ("data", Value::String(b64)) => {
                            (SIZE_KEY.to_owned(), Value::from(decoded_len(b64)))
                        }
                        _ => (key, v),
                    })
                    .collect();
            }
            map.values_mut().for_each(elide);
        }
        _ => {}
    }
}

/// A `Blob`: base64 `data` with the `mimeType` that says what it is.
fn is_blob(map: &Map<String, Value>) -> bool {
    map.contains_key("mimeType") && map.get("data").is_some_and(Value::is_string)
}

/// The number of bytes `b64` decodes to (standard or URL-safe alphabet, padded or not),
/// counted without decoding: every four symbols carry three bytes.
fn decoded_len(b64: &str) -> usize {
    let symbols = b64
        .trim_end_matches('=')
        .bytes()
        .filter(|b| !b.is_ascii_whitespace())
        .count();
    symbols * 3 / 4
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn blob_data_becomes_its_decoded_size_in_place() {
        // "iVBORw0KGgo=" is the 8-byte PNG signature.
        let mut v = json!({"mimeType":"image/png","data":"iVBORw0KGgo=","displayName":"x"});
        elide(&mut v);
        assert_eq!(
            v.to_string(),
            r#"{"mimeType":"image/png","bytes":8,"displayName":"x"}"#
        );
    }

    #[test]
    fn nested_blobs_are_found_and_other_data_is_left_alone() {
        let mut v = json!({
            "name": "render",
            "response": {"data": "not a blob"},
            "parts": [{"inlineData": {"mimeType": "image/jpeg", "data": "QUJD"}}]
        });
        elide(&mut v);
        assert_eq!(v["response"]["data"], "not a blob");
        assert_eq!(
            v["parts"][0]["inlineData"],
            json!({"mimeType":"image/jpeg","bytes":3})
        );
    }

    #[test]
    fn sizes_follow_the_padding() {
        assert_eq!(decoded_len(""), 0);
        assert_eq!(decoded_len("QQ=="), 1);
        assert_eq!(decoded_len("QUI="), 2);
        assert_eq!(decoded_len("QUJD"), 3);
        assert_eq!(decoded_len("QUJDRA"), 4);
    }
}
