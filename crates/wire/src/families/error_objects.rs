//! Error objects of the JSON families (`{message, …}`: JSON-RPC errors in codex app-server
//! and ACP, codex exec's error items), read the same way everywhere.

use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;

/// The `message` of an error object, if it has one.
pub(crate) fn error_message(error: &RawValue) -> Option<String> {
    #[derive(Deserialize)]
    struct E<'a> {
        #[serde(borrow, default)]
        message: Option<Cow<'a, str>>,
    }
    serde_json::from_str::<E<'_>>(error.get())
        .ok()
        .and_then(|e| e.message)
        .map(Cow::into_owned)
}
