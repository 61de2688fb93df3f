//! The live form of a run and its batch form (spec §3.2).
//!
//! Events go out as soon as their frame is read; nothing waits for a later frame. The
//! thinking-token count of a segment comes from a usage frame that usually arrives after
//! the segment ended (F1 `message_delta`, F3 `response.completed`, F2 a trailing usage
//! chunk), so a live run emits the segment's `end` marker without `tokens` and, when
//! usage arrives, ONE tokens-only update `{"id","variant","tokens"}` (no `phase`, no
//! text; [`Thinking::tokens_update`]). The batch form — what the golden files show —
//! has the count back-filled on the `end` marker instead.
//!
//! The spec allows both ("the adapter back-fills `tokens` on the segment's `phase:"end"`
//! marker …; the adapter MAY emit one summary marker update"), and they are equivalent:
//! [`fold_token_updates`] turns the live form into the batch form by moving each update's
//! `tokens` onto its `end` marker, dropping the update and renumbering `seq` 1..n. Every
//! comparison with a golden file goes through it; the run-state fold
//! ([`crate::RunState`]) applies an update straight to its segment, so both forms fold to
//! the same state.
//!
//! An update belongs to the latest earlier `end` marker with the same `variant` and `id`
//! that has no `tokens` yet (F2 segments have no id, and all of a turn's segments get the
//! same count, so which of several id-less markers takes which update does not matter).

use crate::event::{Event, EventData, SegmentPhase, Thinking};

/// For every tokens-only update (by index), the index of the `end` marker it belongs to,
/// or `None` when there is none (no such marker before it, or all of them already have
/// `tokens`).
pub fn token_update_targets(events: &[Event]) -> Vec<(usize, Option<usize>)> {
    // `end` markers still without tokens: (index, event).
    let mut open: Vec<(usize, &Thinking)> = Vec::new();
    let mut out = Vec::new();
    for (i, ev) in events.iter().enumerate() {
        let EventData::Thinking(t) = &ev.data else {
            continue;
        };
        if t.is_tokens_update() {
            let target = open
                .iter()
                .rposition(|(_, m)| m.variant == t.variant && m.id == t.id);
            out.push((i, target.map(|k| open.remove(k).0)));
        } else if t.phase == Some(SegmentPhase::End) && t.tokens.is_none() {
            open.push((i, t));
        }
    }
    out
}

/// The batch form of a live run: each tokens-only update's `tokens` moved onto the `end`
/// marker it belongs to ([`token_update_targets`]), the update dropped, `seq` renumbered
/// from 1. An update that belongs to no marker is kept as it is (so a comparison shows
/// it). Events without updates come back unchanged.
pub fn fold_token_updates(events: &[Event]) -> Vec<Event> {
    let targets = token_update_targets(events);
    let mut out: Vec<Event> = events.to_vec();
    let mut drop = vec![false; events.len()];
    for (update, target) in targets {
        let (Some(marker), EventData::Thinking(u)) = (target, &events[update].data) else {
            continue;
        };
        if let EventData::Thinking(m) = &mut out[marker].data {
            m.tokens = u.tokens;
            drop[update] = true;
        }
    }
    let mut seq = 0;
    out.into_iter()
        .zip(drop)
        .filter(|(_, d)| !d)
        .map(|(mut ev, _)| {
            seq += 1;
            ev.seq = seq;
            ev
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(lines: &[&str]) -> Vec<Event> {
        lines.iter().map(|l| Event::from_json(l).unwrap()).collect()
    }

    fn lines(events: &[Event]) -> Vec<String> {
        events.iter().map(Event::to_json).collect()
    }

    #[test]
    fn the_update_lands_on_its_end_marker_and_seqs_close_up() {
        let live = parse(&[
            r#"{"seq":1,"stream":"thinking","data":{"id":"0","variant":"raw","phase":"start"}}"#,
            r#"{"seq":2,"stream":"thinking","data":{"id":"0","variant":"raw","phase":"end"}}"#,
            r#"{"seq":3,"stream":"thinking","data":{"id":"1","variant":"summary","phase":"start"}}"#,
            r#"{"seq":4,"stream":"thinking","data":{"id":"1","variant":"summary","phase":"end"}}"#,
            r#"{"seq":5,"stream":"assistant","data":{"phase":"commentary","delta":"a"}}"#,
            r#"{"seq":6,"stream":"thinking","data":{"id":"0","variant":"raw","tokens":7}}"#,
            r#"{"seq":7,"stream":"lifecycle","data":{"phase":"end","reason":"completed","status":"completed"}}"#,
        ]);
        let batch = parse(&[
            r#"{"seq":1,"stream":"thinking","data":{"id":"0","variant":"raw","phase":"start"}}"#,
            r#"{"seq":2,"stream":"thinking","data":{"id":"0","variant":"raw","phase":"end","tokens":7}}"#,
            r#"{"seq":3,"stream":"thinking","data":{"id":"1","variant":"summary","phase":"start"}}"#,
            r#"{"seq":4,"stream":"thinking","data":{"id":"1","variant":"summary","phase":"end"}}"#,
            r#"{"seq":5,"stream":"assistant","data":{"phase":"commentary","delta":"a"}}"#,
            r#"{"seq":6,"stream":"lifecycle","data":{"phase":"end","reason":"completed","status":"completed"}}"#,
        ]);
        assert_eq!(lines(&fold_token_updates(&live)), lines(&batch));
        // The batch form is a fixed point.
        assert_eq!(lines(&fold_token_updates(&batch)), lines(&batch));
    }

    #[test]
    fn updates_without_a_marker_are_kept() {
        let live = parse(&[
            r#"{"seq":1,"stream":"thinking","data":{"id":"0","variant":"raw","phase":"end","tokens":3}}"#,
            r#"{"seq":2,"stream":"thinking","data":{"id":"0","variant":"raw","tokens":7}}"#,
            r#"{"seq":3,"stream":"thinking","data":{"id":"9","variant":"raw","tokens":7}}"#,
        ]);
        assert_eq!(
            token_update_targets(&live),
            vec![(1, None), (2, None)],
            "a marker with tokens and a missing marker take no update"
        );
        assert_eq!(lines(&fold_token_updates(&live)), lines(&live));
    }

    #[test]
    fn id_less_markers_take_one_update_each() {
        let live = parse(&[
            r#"{"seq":1,"stream":"thinking","data":{"variant":"raw","phase":"end"}}"#,
            r#"{"seq":2,"stream":"thinking","data":{"variant":"raw","phase":"end"}}"#,
            r#"{"seq":3,"stream":"thinking","data":{"variant":"raw","tokens":4}}"#,
            r#"{"seq":4,"stream":"thinking","data":{"variant":"raw","tokens":4}}"#,
        ]);
        let folded = fold_token_updates(&live);
        assert_eq!(folded.len(), 2);
        assert!(folded
            .iter()
            .all(|e| matches!(&e.data, EventData::Thinking(t) if t.tokens == Some(4))));
    }
}
