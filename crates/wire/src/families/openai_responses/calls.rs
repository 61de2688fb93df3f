//! Output items that are calls other than `function_call`, and how each becomes a tool
//! item.
//!
//! - Client-executed calls — `computer_call`, `local_shell_call`, `apply_patch_call`, and
//!   a `tool_search_call` with `execution: "client"` — are what `function_call` is: the
//!   response ends, the client runs the call and sends its output in the next request. So
//!   they open a tool item named after the item type whose input is the call's action
//!   (`action` or batched `actions`, `operation`, `arguments`), and a response that ends
//!   on one yields (`tool_use`, no final answer).
//! - A server-executed `tool_search_call` (the default) is answered within the same
//!   response by a `tool_search_output`, whose loaded tools become the item's `result`.
//! - An `mcp_approval_request` is a call the user must approve before the server runs
//!   it: the response ends waiting for that approval (sent as `mcp_approval_response` in
//!   the next request), which is the agent loop's shape of a function call, not a
//!   finished reply. It becomes a tool item named after the MCP tool (title
//!   `server_label/name`) that ends `awaiting_approval`, and the turn yields.
//!
//! `tool_search_call` sends its `arguments` as an object where every other item sends a
//! string, so items are read with [`parse_item`], which accepts both.

use super::ItemKind;
use crate::families::response_items::RawItem;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;

/// Item status of an MCP approval request once it is fully known.
pub(super) const AWAITING_APPROVAL: &str = "awaiting_approval";

/// The fields of call items that [`RawItem`] does not read.
#[derive(Deserialize, Default)]
pub(super) struct CallFields<'a> {
    /// `computer_call` (one action), `local_shell_call` (`exec`).
    #[serde(borrow, default)]
    action: Option<&'a RawValue>,
    /// `computer_call` batched actions.
    #[serde(borrow, default)]
    actions: Option<&'a RawValue>,
    /// `apply_patch_call`: create, update or delete a file.
    #[serde(borrow, default)]
    operation: Option<&'a RawValue>,
    /// `tool_search_call`: an object; the string form of other items is read by
    /// [`RawItem`].
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
    /// `tool_search_call` / `tool_search_output`: `server` (the default) or `client`.
    #[serde(borrow, default)]
    execution: Option<Cow<'a, str>>,
    /// `tool_search_output`: the loaded tool definitions.
    #[serde(borrow, default)]
    pub tools: Option<&'a RawValue>,
    /// `mcp_approval_request`: the MCP server.
    #[serde(borrow, default)]
    server_label: Option<Cow<'a, str>>,
}

impl<'a> CallFields<'a> {
    /// The call fields of an item object (none when it has another shape).
    pub(super) fn parse(raw: &'a RawValue) -> CallFields<'a> {
        serde_json::from_str(raw.get()).unwrap_or_default()
    }

    /// The call's input as JSON text: its action, batched actions, patch operation or
    /// object arguments, whichever it carries.
    fn input(&self) -> Option<&'a str> {
        [self.action, self.actions, self.operation, self.arguments]
            .into_iter()
            .flatten()
            .map(RawValue::get)
            .find(|text| *text != "null")
    }
}

/// Reads an output item; `arguments` may be a string or, for `tool_search_call`, an
/// object (then [`RawItem::arguments`] is absent and [`CallFields`] carries it).
pub(super) fn parse_item(raw: &RawValue) -> Option<RawItem<'_>> {
    RawItem::parse(raw).or_else(|| parse_without_arguments(raw))
}

fn parse_without_arguments(raw: &RawValue) -> Option<RawItem<'_>> {
    /// [`RawItem`] without `arguments`.
    #[derive(Deserialize)]
    struct Loose<'a> {
        #[serde(borrow, rename = "type", default)]
        ty: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        id: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        call_id: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        name: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        role: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        status: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        encrypted_content: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        summary: Option<&'a RawValue>,
        #[serde(borrow, default)]
        content: Option<&'a RawValue>,
    }
    let l: Loose<'_> = serde_json::from_str(raw.get()).ok()?;
    Some(RawItem {
        ty: l.ty,
        id: l.id,
        call_id: l.call_id,
        name: l.name,
        arguments: None,
        role: l.role,
        status: l.status,
        encrypted_content: l.encrypted_content,
        summary: l.summary,
        content: l.content,
    })
}

/// The adapter's view of the call item types this module knows.
pub(super) fn classify_call(kind: &str, raw: &RawValue) -> Option<ItemKind> {
    Some(match kind {
        "computer_call" | "local_shell_call" | "apply_patch_call" => ItemKind::ClientCall,
        "tool_search_call" => {
            if CallFields::parse(raw).execution.as_deref() == Some("client") {
                ItemKind::ClientCall
            } else {
                ItemKind::ServerSearch
            }
        }
        "tool_search_output" => ItemKind::SearchOutput,
        "mcp_approval_request" => ItemKind::Approval,
        _ => return None,
    })
}

/// What the tool item of a call item shows.
pub(super) struct ToolShape {
    /// Item kind (`tool`, `search`, `command`).
    pub kind: &'static str,
    pub name: Option<String>,
    pub title: Option<String>,
    /// The call's input as text (JSON for everything but a bare string argument).
    pub input: Option<String>,
}

/// The tool item shape of an item of `kind`.
pub(super) fn tool_shape(kind: ItemKind, item: &RawItem<'_>, raw: &RawValue) -> ToolShape {
    let arguments = item.arguments.as_deref().map(str::to_owned);
    match kind {
        ItemKind::Builtin(k) => ToolShape {
            kind: k,
            name: Some(item.kind().to_owned()),
            title: None,
            input: arguments,
        },
        ItemKind::ClientCall | ItemKind::ServerSearch => ToolShape {
            kind: "tool",
            name: Some(item.kind().to_owned()),
            title: None,
            input: arguments.or_else(|| CallFields::parse(raw).input().map(str::to_owned)),
        },
        ItemKind::Approval => {
            let name = item.name.as_deref();
            // `server/tool`, as the codex envelopes title their MCP calls.
            let title = CallFields::parse(raw)
                .server_label
                .map(|label| format!("{label}/{}", name.unwrap_or("")));
            ToolShape {
                kind: "tool",
                name: name.map(str::to_owned),
                title,
                input: arguments,
            }
        }
        _ => ToolShape {
            kind: "tool",
            name: item.name.as_deref().map(str::to_owned),
            title: None,
            input: arguments,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(json: &str) -> Box<RawValue> {
        RawValue::from_string(json.to_owned()).unwrap()
    }

    #[test]
    fn object_arguments_parse_and_become_the_input() {
        let r = raw(
            r#"{"type":"tool_search_call","id":"ts","arguments":{"query":"crm"},"execution":"server"}"#,
        );
        let item = parse_item(&r).unwrap();
        assert_eq!(item.kind(), "tool_search_call");
        let kind = classify_call(item.kind(), &r).unwrap();
        assert_eq!(kind, ItemKind::ServerSearch);
        let shape = tool_shape(kind, &item, &r);
        assert_eq!(shape.input.as_deref(), Some(r#"{"query":"crm"}"#));
    }

    #[test]
    fn a_client_search_and_the_client_calls_wait_for_the_client() {
        for json in [
            r#"{"type":"tool_search_call","arguments":{},"execution":"client"}"#,
            r#"{"type":"computer_call","action":{"type":"screenshot"}}"#,
            r#"{"type":"local_shell_call","action":{"type":"exec","command":["ls"]}}"#,
            r#"{"type":"apply_patch_call","operation":{"type":"delete_file","path":"a"}}"#,
            r#"{"type":"mcp_approval_request","name":"t","arguments":"{}"}"#,
        ] {
            let r = raw(json);
            let item = parse_item(&r).unwrap();
            let kind = classify_call(item.kind(), &r).unwrap();
            assert!(kind.awaits_client(), "{json}");
        }
    }
}
