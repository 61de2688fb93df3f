//! Bounded open runs (issue 17): an answer that never stops cannot grow an adapter's
//! memory without end. Past `FINAL_TEXT_CAP` the final answer keeps its head, says what
//! was cut, and a `final_answer_cut` diagnostic reports it; every delta still went out.

use streamgate_grammar::{AssistantPhase, EventData};
use streamgate_wire::families::final_text::FINAL_TEXT_CAP;
use streamgate_wire::{Close, FamilyChoice, Normalizer};

fn chat_chunk(content: &str) -> String {
    format!(
        "data: {}\n\n",
        serde_json::json!({"id":"c1","object":"chat.completion.chunk","model":"m",
            "choices":[{"index":0,"delta":{"content":content}}]})
    )
}

#[test]
fn a_never_ending_chat_answer_keeps_a_bounded_final_and_says_so() {
    let family: FamilyChoice = "f2".parse().unwrap_or_else(|e| panic!("{e}"));
    let mut n = Normalizer::new(family);
    let word = "lorem ipsum dolor sit amet ".repeat(38); // ~1 KB
    let deltas = FINAL_TEXT_CAP / word.len() + 100;
    let (mut delta_bytes, mut events) = (0usize, 0usize);
    for _ in 0..deltas {
        n.feed(chat_chunk(&word).as_bytes());
        for e in n.drain() {
            events += 1;
            if let EventData::Assistant(a) = &e.data {
                delta_bytes += a.delta.as_deref().map_or(0, str::len);
            }
        }
    }
    let finish = serde_json::json!({"id":"c1","object":"chat.completion.chunk","model":"m",
        "choices":[{"index":0,"delta":{},"finish_reason":"stop"}]});
    n.feed(format!("data: {finish}\n\ndata: [DONE]\n\n").as_bytes());
    n.close(Close::Normal);
    let tail: Vec<_> = n.drain().collect();
    assert!(
        events >= deltas,
        "every delta went out live: {events} events"
    );
    assert_eq!(delta_bytes, deltas * word.len(), "no delta was cut");
    let finals: Vec<&str> = tail
        .iter()
        .filter_map(|e| match &e.data {
            EventData::Assistant(a) if a.phase == Some(AssistantPhase::FinalAnswer) => {
                a.text.as_deref()
            }
            _ => None,
        })
        .collect();
    assert_eq!(finals.len(), 1);
    let text = finals[0];
    assert!(text.len() < FINAL_TEXT_CAP + 512, "{}", text.len());
    assert!(text.starts_with(&word), "the head is kept");
    assert!(
        text.ends_with("SG_RAW keeps the provider's bytes]"),
        "the cut says so"
    );
    assert!(
        tail.iter()
            .any(|e| e.diagnostic_code() == Some("final_answer_cut")),
        "a diagnostic reports the cut"
    );
    assert!(tail.last().is_some_and(|e| e.is_terminal()));
}
