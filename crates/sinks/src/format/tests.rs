//! Splitting: parts stay well formed and within the limit, and lose no text.

use super::Target;
use crate::telegram::fake::parse_html;
use crate::text::{measure, utf16_unit};
use proptest::prelude::*;

fn visible(parts: &[String]) -> String {
    parts
        .iter()
        .map(|p| parse_html(p).unwrap_or_else(|e| panic!("invalid part {p:?}: {e}")))
        .collect()
}

/// Telegram's nesting rules: no blockquote in a blockquote, nothing inside code/pre
/// (except pre's own code).
fn telegram_nesting_ok(part: &str) -> bool {
    let mut stack: Vec<&str> = Vec::new();
    for tag in part.split('<').skip(1).filter_map(|t| t.split('>').next()) {
        if tag.starts_with('/') {
            stack.pop();
            continue;
        }
        let name = tag.split_whitespace().next().unwrap_or("");
        if name == "blockquote" && stack.contains(&"blockquote") {
            return false;
        }
        match stack.last() {
            Some(&"code") => return false,
            Some(&"pre") if name != "code" => return false,
            _ => {}
        }
        stack.push(name);
    }
    true
}

fn no_ws(s: &str) -> String {
    s.chars().filter(|c| !c.is_whitespace()).collect()
}

#[test]
fn telegram_split_inside_code_block_reopens_it() {
    let code: String = (0..200).map(|i| format!("let x{i} = a < b;\n")).collect();
    let md = format!("Intro paragraph.\n\n```rust\n{code}```\n\nOutro.");
    let parts = Target::Telegram.parts(&md, None, 1000);
    assert!(parts.len() >= 4, "{}", parts.len());
    for (n, p) in parts.iter().enumerate() {
        let text = parse_html(p).unwrap_or_else(|e| panic!("{e}: {p}"));
        assert!(measure(&text, utf16_unit) <= 1000);
        if n > 0 && n + 1 < parts.len() {
            assert!(p.starts_with("<pre><code class=\"language-rust\">"), "{p}");
            assert!(p.ends_with("</code></pre>"), "{p}");
            // Split at a line end: no code line is cut in two.
            assert!(
                p.contains(";</code></pre>") || p.ends_with("\n</code></pre>"),
                "{p}"
            );
        }
    }
    let whole = parse_html(&Target::Telegram.render(&md)).unwrap_or_default();
    assert_eq!(no_ws(&visible(&parts)), no_ws(&whole));
}

#[test]
fn discord_split_inside_fence_closes_and_reopens_with_language() {
    let code: String = (0..300).map(|i| format!("print({i})\n")).collect();
    let md = format!("```python\n{code}```");
    let parts = Target::Discord.parts(&md, None, 2000);
    assert!(parts.len() >= 2);
    for p in &parts {
        assert!(p.chars().count() <= 2000);
        assert!(p.starts_with("```python\n"), "{p}");
        assert!(p.ends_with("\n```"), "{p}");
        assert_eq!(p.matches("```").count(), 2);
    }
}

#[test]
fn slack_split_keeps_links_and_emphasis_whole() {
    let md = "**bold words that go on** and [a link](https://e.com/x) and more. ".repeat(40);
    let parts = Target::Slack.parts(&md, None, 300);
    assert!(parts.len() > 5);
    for p in &parts {
        assert!(p.chars().count() <= 300);
        assert_eq!(p.matches('*').count() % 2, 0, "{p}");
        assert_eq!(p.matches('<').count(), p.matches('>').count(), "{p}");
    }
}

#[test]
fn markdown_that_renders_to_nothing_is_shown_as_text() {
    assert_eq!(
        Target::Telegram.render("[a]: https://e.com"),
        "[a]: https://e.com"
    );
    assert_eq!(Target::Slack.render(""), "");
}

#[test]
fn suffix_stays_out_of_an_open_block() {
    let p = Target::Telegram.parts("```\nunclosed", Some("⚠️ truncated"), 4096);
    assert_eq!(p, vec!["<pre>unclosed</pre>\n⚠️ truncated".to_owned()]);
    let d = Target::Discord.parts("```\nunclosed", Some("⚠️ truncated"), 2000);
    assert_eq!(d, vec!["```\nunclosed\n```\n⚠️ truncated".to_owned()]);
}

#[test]
fn drafts_keep_thinking_apart_and_cut_with_ellipsis() {
    assert_eq!(
        Target::Telegram.draft("> 🧠 plan <x>\n🔧 search ⏳\n💻 bash ✅", 4096),
        "<blockquote>🧠 plan &lt;x&gt;</blockquote>🔧 search ⏳\n💻 bash ✅"
    );
    assert_eq!(
        Target::Slack.draft("> 🧠 hmm\n🔧 search ⏳", 100),
        "> 🧠 hmm\n🔧 search ⏳"
    );
    let cut = Target::Discord.draft(&"y".repeat(2500), 2000);
    assert_eq!(cut.chars().count(), 2000);
    assert!(cut.ends_with('…'));
    let tg = Target::Telegram.draft(&format!("**{}**", "z ".repeat(3000)), 4096);
    let text = parse_html(&tg).unwrap_or_else(|e| panic!("{e}"));
    assert!(measure(&text, utf16_unit) <= 4096 && text.ends_with('…'));
}

const PIECES: &[&str] = &[
    "# ",
    "## ",
    "- ",
    "1. ",
    "  - ",
    "> ",
    "```rust\n",
    "```\n",
    "`",
    "**",
    "*",
    "_",
    "~~",
    "[link](https://e.com/x?a=1&b=2)",
    "[bad](javascript:alert(1))",
    "<b>",
    "</i>",
    "<script>",
    "&",
    "<",
    ">",
    "\"",
    "\n",
    "\n\n",
    "word ",
    "ünïcödé ",
    "😀",
    "text here ",
    "  ",
    "@everyone ",
    "---\n",
    "\\*",
    "| a | b |\n",
];

fn markdown() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(PIECES), 0..300).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn telegram_parts_are_balanced_within_limit_and_lossless(
        md in markdown(),
        limit in 16usize..400,
    ) {
        let parts = Target::Telegram.parts(&md, None, limit);
        let mut seen = String::new();
        for p in &parts {
            let text = parse_html(p);
            prop_assert!(text.is_ok(), "unbalanced part {:?}: {:?}", p, text);
            prop_assert!(telegram_nesting_ok(p), "bad nesting: {:?}", p);
            let text = text.unwrap_or_default();
            prop_assert!(measure(&text, utf16_unit) <= limit, "{} > {}: {:?}", measure(&text, utf16_unit), limit, p);
            seen.push_str(&text);
        }
        let whole = parse_html(&Target::Telegram.render(&md));
        prop_assert!(whole.is_ok());
        prop_assert_eq!(no_ws(&seen), no_ws(&whole.unwrap_or_default()));
    }

    #[test]
    fn discord_and_slack_parts_within_limit(md in markdown(), limit in 64usize..400) {
        for target in [Target::Discord, Target::Slack] {
            let parts = target.parts(&md, None, limit);
            for p in &parts {
                prop_assert!(p.chars().count() <= limit, "{:?} {} > {}: {:?}", target, p.chars().count(), limit, p);
            }
        }
    }
}
