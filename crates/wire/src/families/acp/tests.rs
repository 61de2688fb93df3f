use crate::adapter::{Family, FamilyChoice};
use crate::detect::sniff;
use crate::framing::Frame;
use crate::normalizer::normalize_bytes;
use serde_json::Value;

fn run(lines: &[&str]) -> Vec<Value> {
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let n = normalize_bytes(Family::Acp.into(), text.as_bytes(), 0);
    assert_eq!(
        streamgate_grammar::check(&n.events, &[], Some(n.account)),
        vec![]
    );
    n.events
        .iter()
        .map(|e| serde_json::from_str(&e.to_json()).unwrap())
        .collect()
}

fn sniff_line(line: &str) -> Option<Family> {
    sniff(&Frame {
        event: None,
        data: line,
    })
}

const UPDATE_TEXT: &str = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"Hi"}}}}"#;

#[test]
fn auto_detects_acp_from_its_first_frames() {
    for line in [
        r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}"#,
        r#"{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1,"agentCapabilities":{}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w","mcpServers":[]}}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":{"sessionId":"s"}}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":"s","prompt":[]}}"#,
        UPDATE_TEXT,
        r#"{"jsonrpc":"2.0","id":2,"result":{"stopReason":"end_turn"}}"#,
    ] {
        assert_eq!(sniff_line(line), Some(Family::Acp), "{line}");
    }
    let text = format!(
        "{UPDATE_TEXT}\n{}\n",
        r#"{"jsonrpc":"2.0","id":2,"result":{"stopReason":"end_turn"}}"#
    );
    let auto = normalize_bytes(FamilyChoice::Auto, text.as_bytes(), 0);
    let known = normalize_bytes(Family::Acp.into(), text.as_bytes(), 0);
    assert_eq!(auto.family, Some(Family::Acp));
    assert_eq!(auto.events, known.events);
}

#[test]
fn codex_appserver_json_rpc_is_not_acp() {
    for line in [
        r#"{"id":1,"result":{"userAgent":"x"}}"#,
        r#"{"method":"remoteControl/status/changed","params":{"status":"disabled"}}"#,
        r#"{"id":2,"result":{"thread":{"id":"thr_1","sessionId":"s"},"model":"m"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"clientInfo":{"name":"c"}}}"#,
        r#"{"method":"thread/started","params":{"thread":{"id":"thr_1"}}}"#,
    ] {
        assert_eq!(sniff_line(line), Some(Family::CodexAppServer), "{line}");
    }
}

#[test]
fn tool_updates_merge_into_one_item() {
    let ev = run(&[
        r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c1","title":"Read a.rs","kind":"read","status":"pending","rawInput":{"path":"a.rs"}}}}"#,
        r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c1","status":"in_progress"}}}"#,
        r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c1","status":"completed","rawOutput":{"bytes":3}}}}"#,
        r#"{"jsonrpc":"2.0","id":2,"result":{"stopReason":"end_turn"}}"#,
    ]);
    let items: Vec<&Value> = ev.iter().filter(|e| e["stream"] == "item").collect();
    assert_eq!(items.len(), 3);
    let end = &items[2]["data"];
    assert_eq!(end["phase"], "end");
    assert_eq!(end["kind"], "read");
    assert_eq!(end["name"], "Read a.rs");
    assert_eq!(end["input"]["path"], "a.rs");
    assert_eq!(end["result"]["bytes"], 3);
    assert_eq!(items[1]["data"]["name"], "Read a.rs");
}

#[test]
fn a_permission_reply_with_the_prompt_id_is_not_the_turn_end() {
    let ev = run(&[
        r#"{"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":"s","prompt":[]}}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"session/request_permission","params":{"sessionId":"s","toolCall":{"toolCallId":"c"},"options":[]}}"#,
        r#"{"jsonrpc":"2.0","id":2,"result":{"outcome":{"outcome":"selected","optionId":"allow"}}}"#,
        UPDATE_TEXT,
        r#"{"jsonrpc":"2.0","id":2,"result":{"stopReason":"end_turn"}}"#,
    ]);
    let last = ev.last().unwrap();
    assert_eq!(last["data"]["phase"], "end");
    assert!(ev.iter().any(|e| e["data"]["phase"] == "final_answer"));
}

#[test]
fn garbage_never_panics_and_still_ends_once() {
    let ev = run(&[
        "[]",
        r#"{"jsonrpc":"2.0","method":"session/update","params":{"update":{"sessionUpdate":"tool_call_update"}}}"#,
        r#"{"jsonrpc":"2.0","method":"session/update","params":{"update":{"sessionUpdate":"agent_message_chunk","content":5}}}"#,
        r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}"#,
    ]);
    assert_eq!(ev.last().unwrap()["data"]["reason"], "stream_closed");
}

fn end_of(stop_line: &str) -> Value {
    let ev = run(&[UPDATE_TEXT, stop_line]);
    ev.last().unwrap()["data"].clone()
}

#[test]
fn an_unknown_stop_reason_ends_incomplete_without_an_answer() {
    let end = end_of(r#"{"jsonrpc":"2.0","id":2,"result":{"stopReason":"nap_time"}}"#);
    assert_eq!(end["phase"], "end");
    assert_eq!(end["status"], "incomplete");
    assert_eq!(end["diagnostic"]["code"], "stop_reason");
    assert_eq!(end["diagnostic"]["detail"], "nap_time");
    let end = end_of(r#"{"jsonrpc":"2.0","id":2,"result":{"stopReason":"error"}}"#);
    assert_eq!(end["phase"], "error");
}

#[test]
fn the_prompt_response_usage_is_the_latest() {
    let ev = run(&[
        r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"usage_update","used":10,"size":100}}}"#,
        UPDATE_TEXT,
        r#"{"jsonrpc":"2.0","id":2,"result":{"stopReason":"end_turn","usage":{"inputTokens":7,"outputTokens":3,"totalTokens":10}}}"#,
    ]);
    let end = &ev.last().unwrap()["data"];
    assert_eq!(end["usage"]["totalTokens"], 10);
    assert_eq!(ev[1]["data"]["usage"]["used"], 10);
}

#[test]
fn an_elicitation_is_a_diagnostic_with_its_params() {
    let ev = run(&[
        UPDATE_TEXT,
        r#"{"jsonrpc":"2.0","id":9,"method":"elicitation/create","params":{"sessionId":"s","mode":"form","message":"Which?","requestedSchema":{"type":"object"}}}"#,
        r#"{"jsonrpc":"2.0","id":9,"result":{"action":"decline"}}"#,
        r#"{"jsonrpc":"2.0","id":2,"result":{"stopReason":"end_turn"}}"#,
    ]);
    assert_eq!(ev[2]["data"]["diagnostic"]["code"], "elicitation");
    assert_eq!(ev[2]["data"]["diagnostic"]["detail"]["message"], "Which?");
    assert_eq!(ev.last().unwrap()["data"]["phase"], "end");
}

fn idle(stop: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"s","update":{{"sessionUpdate":"state_update","state":"idle","stopReason":{stop}}}}}}}"#
    )
}

#[test]
fn an_object_stop_reason_is_a_failure_not_a_malformed_frame() {
    let end = end_of(&idle(r#"{"code":-32000,"message":"quota"}"#));
    assert_eq!(end["phase"], "error");
    assert_eq!(end["diagnostic"]["code"], "stop_reason_error");
    assert_eq!(end["diagnostic"]["message"], "quota");
    assert_eq!(end["diagnostic"]["detail"]["code"], -32000);
    // `null` is no stop reason: a status update, the turn goes on.
    let ev = run(&[UPDATE_TEXT, &idle("null")]);
    assert_eq!(ev[2]["data"]["diagnostic"]["code"], "state_update");
    assert_eq!(ev.last().unwrap()["data"]["reason"], "stream_closed");
}

/// The template and one-pass readings of message and thought chunks (the fast paths)
/// give, frame by frame, the events and the frame accounting that the generic reading
/// gives — for plain, padded and escaped chunks and for every shape that must not be
/// read as one (a request id, a foreign session, a field of the wrong type, a missing or
/// `null` update, params that are not an object, other update kinds).
#[test]
fn chunks_read_in_one_pass_give_what_the_generic_reading_gives() {
    use super::AcpAdapter;
    use crate::adapter::Adapter as _;
    use crate::emitter::Emitter;
    let chunk = |session: &str, kind: &str, rest: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"{session}","update":{{"sessionUpdate":"{kind}"{rest}}}}}}}"#
        )
    };
    let text = |t: &str| format!(r#","content":{{"type":"text","text":"{t}"}}"#);
    let lines = [
        chunk("s", "agent_thought_chunk", &text("Let me think")),
        chunk("s", "agent_thought_chunk", &text(r#" — \"quoted\",\n\u00e9\ud83d\ude00"#)),
        UPDATE_TEXT.to_owned(),
        chunk("s", "agent_message_chunk", &format!(r#","messageId":"m2"{}"#, text(" more"))),
        chunk("other", "agent_message_chunk", &text("not ours")),
        chunk("s", "agent_message_chunk", r#","content":{"type":"image","data":"AAAA"}"#),
        chunk("s", "agent_message_chunk", &text("")),
        chunk("s", "agent_message_chunk", ""),
        chunk("s", "agent_message_chunk", &format!(r#","state":5{}"#, text("x"))),
        chunk("s", "agent_message_chunk", &format!(r#","messageId":7{}"#, text("x"))),
        chunk("s", "plan", r#","entries":[]"#),
        r#"{"jsonrpc":"2.0","id":9,"method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"req"}}}}"#.to_owned(),
        r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":null}}"#.to_owned(),
        r#"{"jsonrpc":"2.0","method":"session/update","params":["s"]}"#.to_owned(),
        r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":5,"update":{"sessionUpdate":"agent_message_chunk"}}}"#.to_owned(),
        r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"t1","title":"ls","status":"pending"}}}"#.to_owned(),
        chunk("s", "agent_message_chunk", &text(" after the tool")),
        format!("{} \r", chunk("s", "agent_thought_chunk", &text("padded"))),
        chunk("s", "agent_thought_chunk", r#","content":{"type":"text","text":"\u0001"}"#),
        chunk("s", "agent_thought_chunk", r#","content":{"type":"text","text":null}"#),
        chunk("s", "agent_thought_chunk", r#","content":{"text":"untyped"}"#),
        chunk("s", "agent_thought_chunk", r#","content":{"type":"text","text":"x","annotations":{}}"#),
        r#"{"jsonrpc":"2.0","id":2,"result":{"stopReason":"end_turn"}}"#.to_owned(),
        UPDATE_TEXT.to_owned(),
    ];
    let (mut fast, mut generic) = (AcpAdapter::default(), AcpAdapter::default());
    let (mut a, mut b) = (Emitter::new(), Emitter::new());
    for line in &lines {
        fast.frame(
            Frame {
                event: None,
                data: line,
            },
            &mut a,
        );
        if generic.terminated {
            b.consumed();
        } else {
            generic.any_frame(line, &mut b);
        }
        let (ea, eb): (Vec<_>, Vec<_>) = (a.drain().collect(), b.drain().collect());
        assert_eq!(ea, eb, "{line}");
        assert_eq!(a.account(), b.account(), "{line}");
    }
}
