//! Large single-run captures for benchmarks and load tests, grown from a real capture.
//!
//! A capture is split into records (SSE events separated by blank lines, or JSONL lines);
//! the records that carry incremental text (deltas) are repeated in place until the
//! capture reaches the wanted size. Head and tail records (run start, usage, stop) stay
//! once, so the result is still one well-formed run of the same family.

/// Substrings that mark a record as an incremental-text delta, across families.
/// Tool-argument deltas are left out: repeated, they would make the arguments invalid JSON.
const DELTA_MARKERS: [&str; 10] = [
    "\"text_delta\"",
    "\"thinking_delta\"",
    "\"reasoning_content\":\"",
    "\"content\":\"",
    "\"reasoning\":\"",
    ".delta\"",
    "\"thinking\":\"",
    "\"text\":\"",
    // codex app-server notifications: `item/agentMessage/delta`, `…/textDelta`, ….
    "/delta\"",
    "Delta\"",
];

/// Records that look like deltas but end or summarize a segment, or carry a tool call's
/// arguments, and must stay once.
const NOT_DELTA_MARKERS: [&str; 16] = [
    // Responses opens a part with an empty `"text":""` (`response.content_part.added`)
    // and an item with `response.output_item.added`: starts, once per part.
    ".added\"",
    // Anthropic opens a block with an empty `"thinking":""` / `"text":""`: a start, not a
    // delta (repeated, it would reopen the block each time).
    "content_block_start",
    // claude-cli's snapshot of the message so far: once per block, not per delta.
    "\"type\":\"assistant\"",
    "finish_reason\":\"",
    "\"done\":true",
    "finishReason",
    "message_stop",
    "\"type\":\"result\"",
    "response.completed",
    ".done\"",
    "\"completed\"",
    // codex app-server item boundaries (`item/started`, `item/completed`, …).
    "/started\"",
    "/completed\"",
    "\"input_json_delta\"",
    "\"arguments\":\"",
    "function_call_arguments",
];

fn records(capture: &[u8]) -> Vec<&[u8]> {
    let sse = capture
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| *b != b'{');
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < capture.len() {
        if capture[i] == b'\n' {
            let boundary = if sse {
                // A blank line ends an SSE record: "\n\n" or "\n\r\n".
                capture.get(i + 1) == Some(&b'\n')
                    || (capture.get(i + 1) == Some(&b'\r') && capture.get(i + 2) == Some(&b'\n'))
            } else {
                true
            };
            if boundary {
                let end = if sse {
                    if capture.get(i + 1) == Some(&b'\r') {
                        i + 3
                    } else {
                        i + 2
                    }
                } else {
                    i + 1
                };
                let end = end.min(capture.len());
                out.push(&capture[start..end]);
                start = end;
                i = end;
                continue;
            }
        }
        i += 1;
    }
    if start < capture.len() {
        out.push(&capture[start..]);
    }
    out
}

fn is_delta(record: &[u8]) -> bool {
    let text = String::from_utf8_lossy(record);
    // Captures written by a pretty JSON encoder put a space after the colon.
    let has = |m: &&str| text.contains(*m) || text.contains(&m.replace("\":", "\": "));
    DELTA_MARKERS.iter().any(has) && !NOT_DELTA_MARKERS.iter().any(has)
}

/// Grows `capture` to about `target_bytes` by repeating its delta records in place.
/// Returns the capture unchanged when it has no delta records.
pub fn inflate(capture: &[u8], target_bytes: usize) -> Vec<u8> {
    let recs = records(capture);
    let delta_bytes: usize = recs.iter().filter(|r| is_delta(r)).map(|r| r.len()).sum();
    if delta_bytes == 0 || capture.len() >= target_bytes {
        return capture.to_vec();
    }
    let fixed = capture.len() - delta_bytes;
    let repeat = (target_bytes.saturating_sub(fixed))
        .div_ceil(delta_bytes)
        .max(1);
    let mut out = Vec::with_capacity(fixed + delta_bytes * repeat);
    // Keep each run of consecutive delta records together and repeat the run, so the
    // stream keeps its shape (thinking deltas stay before text deltas).
    let mut run: Vec<&[u8]> = Vec::new();
    let flush = |run: &mut Vec<&[u8]>, out: &mut Vec<u8>| {
        for _ in 0..repeat {
            for r in run.iter() {
                out.extend_from_slice(r);
            }
        }
        run.clear();
    };
    for r in recs {
        if is_delta(r) {
            run.push(r);
        } else {
            flush(&mut run, &mut out);
            out.extend_from_slice(r);
        }
    }
    flush(&mut run, &mut out);
    renumber_seqs(out)
}

/// Numbers the records' top-level `"seq"` again, in order from the first one's, when every
/// record of the grown capture is a JSON object with one (OpenClaw's agent events): a
/// repeated record keeps its original seq, which the adapter rightly reports as stale and
/// drops, so the run would be a storm of `stale_seq` diagnostics rather than a long run.
/// The records are read and written by serde_json (key order kept); any other capture is
/// returned as it is.
fn renumber_seqs(capture: Vec<u8>) -> Vec<u8> {
    let mut out = Vec::with_capacity(capture.len() + capture.len() / 16);
    let mut next = None;
    for record in records(&capture) {
        let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(record) else {
            return capture;
        };
        let Some(seq) = value.get("seq").and_then(serde_json::Value::as_u64) else {
            return capture;
        };
        let seq = *next.get_or_insert(seq);
        value["seq"] = seq.into();
        next = Some(seq + 1);
        if serde_json::to_writer(&mut out, &value).is_err() {
            return capture;
        }
        out.push(b'\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_only_deltas() {
        let cap = b"data: {\"start\":1}\n\ndata: {\"delta\":{\"content\":\"a\"}}\n\ndata: {\"finish_reason\":\"stop\"}\n\n";
        let big = inflate(cap, 400);
        let text = String::from_utf8(big).unwrap();
        assert!(text.len() >= 400);
        assert_eq!(text.matches("start").count(), 1);
        assert_eq!(text.matches("finish_reason").count(), 1);
        assert!(text.matches("\"content\":\"a\"").count() > 5);
    }

    #[test]
    fn repeated_records_are_numbered_again_where_every_record_has_a_seq() {
        let cap = b"{\"runId\":\"r\",\"seq\":7,\"stream\":\"lifecycle\",\"data\":{\"phase\":\"start\"}}\n{\"runId\":\"r\",\"seq\":8,\"stream\":\"assistant\",\"data\":{\"text\":\"a\",\"delta\":\"a\"}}\n{\"runId\":\"r\",\"seq\":9,\"stream\":\"lifecycle\",\"data\":{\"phase\":\"end\"}}\n";
        let text = String::from_utf8(inflate(cap, 2000)).unwrap();
        let seqs: Vec<u64> = text
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["seq"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert!(seqs.len() > 10);
        assert_eq!(seqs, (7..7 + seqs.len() as u64).collect::<Vec<_>>());
    }

    #[test]
    fn a_block_start_stays_once() {
        let cap = b"data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}}\n\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"x\"}}\n\n";
        let text = String::from_utf8(inflate(cap, 2000)).unwrap();
        assert_eq!(text.matches("content_block_start").count(), 1);
        assert!(text.matches("thinking_delta").count() > 10);
    }

    #[test]
    fn a_responses_part_start_stays_once() {
        let cap = b"event: response.content_part.added\ndata: {\"type\":\"response.content_part.added\",\"part\":{\"type\":\"output_text\",\"text\":\"\"}}\n\nevent: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"x\"}\n\n";
        let text = String::from_utf8(inflate(cap, 2000)).unwrap();
        assert_eq!(
            text.matches("data: {\"type\":\"response.content_part.added")
                .count(),
            1
        );
        assert!(text.matches("output_text.delta").count() > 10);
    }
}
