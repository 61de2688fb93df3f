//! Function-call arguments that Vertex AI streams over several chunks
//! (`functionCallingConfig.streamFunctionCallArguments`).
//!
//! The first `functionCall` part names the call and says `willContinue: true`; later parts
//! of the same call carry `partialArgs`, each one value addressed by a JSON path (RFC 9535,
//! e.g. `$.location` or `$.stops[1].city`). A string value may be split over several
//! partial args of one path: while a piece says `willContinue: true` the next piece of
//! that path extends it. The part without `willContinue` ends the call.
//!
//! Hand-written rather than a JSONPath crate: a partial arg names one concrete location
//! (member names and indexes only, no filters or wildcards), and what is needed is to
//! *write* there, which query libraries do not do.

use serde::Deserialize;
use serde_json::{Map, Number, Value};
use std::borrow::Cow;
use streamgate_grammar::Json;

/// One `PartialArg` of a `functionCall` part.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct PartialArg<'a> {
    #[serde(borrow)]
    json_path: Option<Cow<'a, str>>,
    #[serde(borrow)]
    string_value: Option<Cow<'a, str>>,
    number_value: Option<Number>,
    bool_value: Option<bool>,
    // `nullValue: "NULL_VALUE"` needs no field: a piece without another value is null.
    will_continue: Option<bool>,
}

/// The arguments of one streamed call, assembled so far.
#[derive(Debug, Default)]
pub(super) struct StreamedArgs {
    root: Map<String, Value>,
    /// The path whose string value the next piece of that path extends.
    continuing: Option<String>,
    /// Something arrived since the arguments last went out.
    changed: bool,
    /// The arguments went out at least once.
    sent: bool,
}

/// A path step: an object member or an array position.
enum Step {
    Member(String),
    Index(usize),
}

impl StreamedArgs {
    /// Applies one partial arg. `Err` carries the offending path when it is missing, not
    /// a plain member/index path, or collides with a value of another shape; the caller
    /// reports it and the arguments keep what they had.
    pub(super) fn apply(&mut self, arg: &PartialArg<'_>) -> Result<(), String> {
        let path = arg.json_path.as_deref().unwrap_or_default();
        let steps = parse_path(path).ok_or_else(|| path.to_owned())?;
        self.changed = true;
        let extends = self.continuing.as_deref() == Some(path);
        self.continuing = arg.will_continue.unwrap_or(false).then(|| path.to_owned());
        let value = match (&arg.string_value, &arg.number_value, arg.bool_value) {
            (Some(s), _, _) => Value::String(s.clone().into_owned()),
            (None, Some(n), _) => Value::Number(n.clone()),
            (None, None, Some(b)) => Value::Bool(b),
            // `nullValue`, or a piece with no value at all (a path announced before its
            // value): null until a value arrives.
            (None, None, None) => Value::Null,
        };
        let slot = slot(&mut self.root, &steps).ok_or_else(|| path.to_owned())?;
        match (slot, value) {
            (Value::String(have), Value::String(piece)) if extends => have.push_str(&piece),
            (slot, value) => *slot = value,
        }
        Ok(())
    }

    /// Replaces everything with a whole `args` object (a part that sends them complete).
    pub(super) fn replace(&mut self, args: Map<String, Value>) {
        self.root = args;
        self.continuing = None;
        self.changed = true;
    }

    /// The arguments, when something arrived since they last went out and they are at
    /// most `limit` bytes of JSON (bigger ones wait for [`Self::finished`]).
    pub(super) fn snapshot(&mut self, limit: usize) -> Option<Json> {
        if !self.changed {
            return None;
        }
        let json = self.json();
        if json.get().len() > limit {
            return None;
        }
        self.changed = false;
        self.sent = true;
        Some(json)
    }

    /// The finished arguments, unless the last snapshot already was them.
    pub(super) fn finished(&self) -> Option<Json> {
        (self.changed || !self.sent).then(|| self.json())
    }

    /// The arguments as a JSON object, serialized once from the assembled map.
    fn json(&self) -> Json {
        Json::from_value(&self.root)
    }
}

/// `$` followed by `.name`, `['name']`, `["name"]` or `[N]` steps; `None` for anything
/// else (filters, wildcards, slices, an empty path).
fn parse_path(path: &str) -> Option<Vec<Step>> {
    let mut rest = path.strip_prefix('$')?;
    let mut steps = Vec::new();
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('.') {
            let end = after.find(['.', '[']).unwrap_or(after.len());
            let name = &after[..end];
            if name.is_empty() || name == "*" {
                return None;
            }
            steps.push(Step::Member(name.to_owned()));
            rest = &after[end..];
        } else if let Some(after) = rest.strip_prefix('[') {
            let end = after.find(']')?;
            let inner = &after[..end];
            let quoted = inner
                .strip_prefix('\'')
                .and_then(|s| s.strip_suffix('\''))
                .or_else(|| inner.strip_prefix('"').and_then(|s| s.strip_suffix('"')));
            match quoted {
                Some(name) => steps.push(Step::Member(name.to_owned())),
                None => steps.push(Step::Index(inner.parse().ok()?)),
            }
            rest = &after[end + 1..];
        } else {
            return None;
        }
    }
    (!steps.is_empty()).then_some(steps)
}

/// The value at `steps` under `root`, creating objects, arrays (padded with nulls) and
/// members on the way; `None` when an existing value has another shape.
fn slot<'v>(root: &'v mut Map<String, Value>, steps: &[Step]) -> Option<&'v mut Value> {
    let (first, rest) = steps.split_first()?;
    let Step::Member(name) = first else {
        return None; // the arguments are an object: the first step names a member
    };
    let mut at = root.entry(name.clone()).or_insert(Value::Null);
    for step in rest {
        at = match step {
            Step::Member(name) => {
                if at.is_null() {
                    *at = Value::Object(Map::new());
                }
                at.as_object_mut()?
                    .entry(name.clone())
                    .or_insert(Value::Null)
            }
            Step::Index(i) => {
                if at.is_null() {
                    *at = Value::Array(Vec::new());
                }
                let items = at.as_array_mut()?;
                if items.len() <= *i {
                    // Bounded: an index far beyond what arrived is not padded out.
                    if *i > items.len() + 1024 {
                        return None;
                    }
                    items.resize(i + 1, Value::Null);
                }
                &mut items[*i]
            }
        };
    }
    Some(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arg(json: &str) -> PartialArg<'_> {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn pieces_of_one_path_join_and_paths_nest() {
        let mut a = StreamedArgs::default();
        for piece in [
            r#"{"jsonPath":"$.city","stringValue":"San Fr","willContinue":true}"#,
            r#"{"jsonPath":"$.city","stringValue":"ancisco"}"#,
            r#"{"jsonPath":"$.days","numberValue":3}"#,
            r#"{"jsonPath":"$.stops[1]['name']","stringValue":"Muir"}"#,
            r#"{"jsonPath":"$.metric","boolValue":true}"#,
            r#"{"jsonPath":"$.note","nullValue":"NULL_VALUE"}"#,
        ] {
            a.apply(&arg(piece)).unwrap();
        }
        assert_eq!(
            a.json().get(),
            r#"{"city":"San Francisco","days":3,"stops":[null,{"name":"Muir"}],"metric":true,"note":null}"#
        );
    }

    #[test]
    fn a_finished_string_is_replaced_not_extended() {
        let mut a = StreamedArgs::default();
        a.apply(&arg(r#"{"jsonPath":"$.q","stringValue":"a"}"#))
            .unwrap();
        a.apply(&arg(r#"{"jsonPath":"$.q","stringValue":"b"}"#))
            .unwrap();
        assert_eq!(a.json().get(), r#"{"q":"b"}"#);
    }

    #[test]
    fn paths_outside_the_supported_form_are_refused() {
        let mut a = StreamedArgs::default();
        for bad in [
            "",
            "city",
            "$",
            "$..x",
            "$.*",
            "$[0]",
            "$.a[?(@.b)]",
            "$.a[99999]",
        ] {
            let piece = format!(r#"{{"jsonPath":"{bad}","stringValue":"x"}}"#);
            assert!(a.apply(&arg(&piece)).is_err(), "{bad}");
        }
        a.apply(&arg(r#"{"jsonPath":"$.n","numberValue":1}"#))
            .unwrap();
        // `$.n` is a number: it cannot hold a member.
        assert!(a
            .apply(&arg(r#"{"jsonPath":"$.n.x","numberValue":1}"#))
            .is_err());
    }
}
