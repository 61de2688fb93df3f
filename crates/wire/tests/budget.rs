//! The process-wide budget of final-answer candidates (issue 17): however many runs stay
//! open, together they hold at most the budget; each run past it keeps what it has and
//! says its final was cut. (A binary of its own: the budget is process-wide.)

use streamgate_wire::families::final_text::{configure, held_bytes, FinalText};

#[test]
fn open_runs_together_hold_at_most_the_budget_and_give_it_back() {
    configure(1 << 20, 2 << 20);
    let piece = "a".repeat(64 << 10);
    let mut runs: Vec<FinalText> = (0..3).map(|_| FinalText::default()).collect();
    for _ in 0..24 {
        for r in &mut runs {
            r.push_str(&piece);
        }
    }
    assert!(held_bytes() <= 2 << 20, "{}", held_bytes());
    assert!(
        runs.iter().all(|r| r.head().len() <= 1 << 20),
        "the per-run cap holds"
    );
    assert!(
        runs.iter().all(|r| r.len() == 24 * piece.len()),
        "every byte is counted"
    );
    assert!(
        runs.iter().all(|r| r.text().contains("bytes cut")),
        "each says so"
    );
    let text = runs[0].take();
    assert!(text.starts_with(&piece));
    drop(runs);
    assert_eq!(held_bytes(), 0, "closed runs give their bytes back");
}
