//! The OpenClaw gateway's WebSocket protocol, as much of it as a follower needs.
//!
//! Frames are JSON text messages (OpenClaw gateway protocol v3, `docs.openclaw.ai`
//! "Gateway protocol"): requests `{type:"req", id, method, params}`, responses
//! `{type:"res", id, ok, payload|error}`, events `{type:"event", event, payload, seq?}`.
//! The first client frame must be the `connect` request; the gateway may send a
//! `connect.challenge` event (a nonce for device signatures) before it, which a
//! token-authenticated client does not need and ignores. The answer to `connect` is a
//! `res` whose payload is `hello-ok`.
//!
//! Assumptions (from the public protocol docs, not a live gateway): the client declares
//! itself as `gateway-client` in `backend` mode with the `operator` role and the
//! `operator.read` scope, and asks for tool events with the `tool-events` capability.
//! Agent events arrive as `event:"agent"` with the `AgentEventPayload`
//! `{runId, seq, stream, ts, data, sessionKey?}`.

use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;

/// The protocol version spoken (min and max of the `connect` request).
pub const PROTOCOL: u32 = 3;
/// The capability that makes the gateway send `stream:"tool"` agent events.
pub const TOOL_EVENTS_CAP: &str = "tool-events";
/// The request id of the `connect` request (one per connection).
pub const CONNECT_ID: &str = "streamgate-connect";

/// The `connect` request frame, with `token` as `auth.token` when given.
pub fn connect_frame(token: Option<&str>) -> String {
    let mut params = serde_json::json!({
        "minProtocol": PROTOCOL,
        "maxProtocol": PROTOCOL,
        "client": {
            "id": "gateway-client",
            "displayName": "streamgate follow-gateway",
            "version": env!("CARGO_PKG_VERSION"),
            "platform": std::env::consts::OS,
            "mode": "backend",
        },
        "role": "operator",
        "scopes": ["operator.read"],
        "caps": [TOOL_EVENTS_CAP],
    });
    if let Some(t) = token {
        params["auth"] = serde_json::json!({ "token": t });
    }
    serde_json::json!({
        "type": "req",
        "id": CONNECT_ID,
        "method": "connect",
        "params": params,
    })
    .to_string()
}

/// One frame from the gateway, classified.
#[derive(Debug)]
pub enum Incoming<'a> {
    /// The answer to `connect`: accepted.
    Hello,
    /// The answer to `connect`: refused, with the gateway's error.
    Refused(String),
    /// An `agent` event's payload, as sent.
    Agent(&'a RawValue),
    /// Any other event (tick, presence, chat, health, …), by name.
    OtherEvent(Cow<'a, str>),
    /// Any other frame (a response to something else, an unknown type).
    Other,
    /// Not a JSON object frame of the protocol.
    Malformed(String),
}

#[derive(Deserialize)]
struct Frame<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(default)]
    ok: Option<bool>,
    #[serde(borrow, default)]
    event: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    payload: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

/// Classifies a text frame.
pub fn parse(text: &str) -> Incoming<'_> {
    let frame = match serde_json::from_str::<Frame<'_>>(text) {
        Ok(f) => f,
        Err(e) => return Incoming::Malformed(e.to_string()),
    };
    match frame.kind.as_ref() {
        "res" if frame.id.as_deref() == Some(CONNECT_ID) => {
            if frame.ok == Some(true) {
                Incoming::Hello
            } else {
                Incoming::Refused(
                    frame
                        .error
                        .map_or_else(|| "no error given".to_owned(), |e| e.get().to_owned()),
                )
            }
        }
        // Older gateways spelled events `evt`.
        "event" | "evt" => match (frame.event, frame.payload) {
            (Some(name), Some(payload)) if name == "agent" => Incoming::Agent(payload),
            (Some(name), _) => Incoming::OtherEvent(name),
            (None, _) => Incoming::Malformed("an event frame without `event`".to_owned()),
        },
        _ => Incoming::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_announces_tool_events_and_carries_the_token() {
        let v: serde_json::Value = serde_json::from_str(&connect_frame(Some("s3cret"))).unwrap();
        assert_eq!(v["type"], "req");
        assert_eq!(v["method"], "connect");
        assert_eq!(v["params"]["caps"][0], TOOL_EVENTS_CAP);
        assert_eq!(v["params"]["auth"]["token"], "s3cret");
        assert_eq!(v["params"]["minProtocol"], PROTOCOL);
        let v: serde_json::Value = serde_json::from_str(&connect_frame(None)).unwrap();
        assert!(v["params"].get("auth").is_none());
    }

    #[test]
    fn frames_are_classified() {
        let hello =
            r#"{"type":"res","id":"streamgate-connect","ok":true,"payload":{"type":"hello-ok"}}"#;
        assert!(matches!(parse(hello), Incoming::Hello));
        let refused = r#"{"type":"res","id":"streamgate-connect","ok":false,"error":{"code":"UNAUTHORIZED"}}"#;
        assert!(matches!(parse(refused), Incoming::Refused(e) if e.contains("UNAUTHORIZED")));
        let agent = r#"{"type":"event","event":"agent","payload":{"runId":"r","seq":1}}"#;
        assert!(matches!(parse(agent), Incoming::Agent(p) if p.get().contains("\"runId\"")));
        let tick = r#"{"type":"event","event":"tick","payload":{"ts":1}}"#;
        assert!(matches!(parse(tick), Incoming::OtherEvent(n) if n == "tick"));
        assert!(matches!(parse("not json"), Incoming::Malformed(_)));
        assert!(matches!(parse("[1,2]"), Incoming::Malformed(_)));
        assert!(matches!(
            parse(r#"{"type":"res","id":"x","ok":true}"#),
            Incoming::Other
        ));
    }
}
