//! Text measuring, splitting and per-channel escaping. Pure functions, shared by sinks
//! and fakes so both sides count a message's length the same way.

/// How one char counts toward a channel's length limit.
pub type Unit = fn(char) -> usize;

/// Telegram counts message length in UTF-16 code units (its entity offsets do too).
pub fn utf16_unit(c: char) -> usize {
    c.len_utf16()
}

/// Discord counts characters.
pub fn char_unit(_c: char) -> usize {
    1
}

/// Slack's limit applies to the escaped text: count each control char at its escaped
/// width, so the split is conservative.
pub fn slack_unit(c: char) -> usize {
    match c {
        '&' => 5,
        '<' | '>' => 4,
        _ => 1,
    }
}

/// Length of `text` in `unit`s.
pub fn measure(text: &str, unit: Unit) -> usize {
    text.chars().map(unit).sum()
}

/// Split `text` into parts of at most `limit` units each. Parts concatenate back to
/// `text` exactly (nothing is dropped or added). Breaks prefer a newline, then
/// whitespace, in the second half of the window; otherwise cut at a char boundary.
pub fn split(text: &str, limit: usize, unit: Unit) -> Vec<String> {
    let limit = limit.max(1);
    let mut parts = Vec::new();
    let mut rest = text;
    while measure(rest, unit) > limit {
        let mut used = 0usize;
        let mut cut = 0usize;
        for (i, c) in rest.char_indices() {
            let w = unit(c);
            if used + w > limit {
                break;
            }
            used += w;
            cut = i + c.len_utf8();
        }
        if cut == 0 {
            // A single char wider than the limit: send it alone rather than loop forever.
            cut = rest
                .chars()
                .next()
                .map(char::len_utf8)
                .unwrap_or(rest.len());
        }
        let window = &rest[..cut];
        let half = cut / 2;
        let brk = window
            .rfind('\n')
            .filter(|&i| i >= half)
            .map(|i| i + 1)
            .or_else(|| {
                window
                    .char_indices()
                    .rev()
                    .find(|&(i, c)| c.is_whitespace() && i >= half)
                    .map(|(i, c)| i + c.len_utf8())
            })
            .unwrap_or(cut);
        parts.push(rest[..brk].to_owned());
        rest = &rest[brk..];
    }
    if !rest.is_empty() || parts.is_empty() {
        parts.push(rest.to_owned());
    }
    parts
}

/// Cut `text` to at most `limit` units, ending with `…` when cut. Used only as a last
/// guard for drafts (already budgeted by the projection, never split).
pub fn truncate(text: &str, limit: usize, unit: Unit) -> String {
    if measure(text, unit) <= limit {
        return text.to_owned();
    }
    let budget = limit.saturating_sub(unit('…'));
    let mut used = 0usize;
    let mut out = String::new();
    for c in text.chars() {
        let w = unit(c);
        if used + w > budget {
            break;
        }
        used += w;
        out.push(c);
    }
    out.push('…');
    out
}

fn escape_html_into(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            _ => out.push(c),
        }
    }
}

/// Escape `&`, `<`, `>` for Telegram's `parse_mode=HTML`.
pub fn escape_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    escape_html_into(&mut out, s);
    out
}

/// Render projection text (plain text with `> ` blockquote lines, as the 🧠 thinking
/// rendering uses) as Telegram HTML: quoted runs become one `<blockquote>`, everything
/// else is escaped. The visible length never exceeds the input's.
pub fn telegram_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 32);
    let mut in_quote = false;
    let mut first = true;
    for line in text.split('\n') {
        let quoted = line.strip_prefix("> ").or_else(|| line.strip_prefix('>'));
        match (quoted, in_quote) {
            (Some(q), true) => {
                out.push('\n');
                escape_html_into(&mut out, q);
            }
            (Some(q), false) => {
                if !first {
                    out.push('\n');
                }
                out.push_str("<blockquote>");
                escape_html_into(&mut out, q);
                in_quote = true;
            }
            (None, true) => {
                // The newline that ended the quote is implied by the block element.
                out.push_str("</blockquote>");
                escape_html_into(&mut out, line);
                in_quote = false;
            }
            (None, false) => {
                if !first {
                    out.push('\n');
                }
                escape_html_into(&mut out, line);
            }
        }
        first = false;
    }
    if in_quote {
        out.push_str("</blockquote>");
    }
    out
}

/// Escape text for Slack mrkdwn: `&`, `<`, `>` become entities, except a line-leading
/// `>` which Slack needs literal to render a blockquote.
pub fn slack_mrkdwn(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let body = match line.strip_prefix('>') {
            Some(rest) => {
                out.push('>');
                rest
            }
            None => line,
        };
        escape_html_into(&mut out, body);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_concatenates_back_and_respects_limit() {
        let text = "alpha beta\ngamma delta epsilon\n".repeat(50);
        for limit in [7, 16, 64, 100] {
            let parts = split(&text, limit, char_unit);
            assert_eq!(parts.concat(), text);
            assert!(parts.iter().all(|p| measure(p, char_unit) <= limit));
        }
        assert_eq!(split("short", 10, char_unit), vec!["short".to_owned()]);
        assert_eq!(split("", 10, char_unit), vec![String::new()]);
    }

    #[test]
    fn split_counts_utf16_for_telegram() {
        let text = "😀".repeat(10); // 2 UTF-16 units each
        let parts = split(&text, 5, utf16_unit);
        assert!(parts.iter().all(|p| measure(p, utf16_unit) <= 5));
        assert_eq!(parts.concat(), text);
    }

    #[test]
    fn html_escapes_and_quotes() {
        assert_eq!(
            telegram_html("a<b & c>d\n> 🧠 think <x>\n> more\nafter"),
            "a&lt;b &amp; c&gt;d\n<blockquote>🧠 think &lt;x&gt;\nmore</blockquote>after"
        );
        assert_eq!(telegram_html("> only"), "<blockquote>only</blockquote>");
    }

    #[test]
    fn slack_keeps_quote_marker() {
        assert_eq!(slack_mrkdwn("> q <@U1>\na&b"), "> q &lt;@U1&gt;\na&amp;b");
    }

    #[test]
    fn truncate_stays_within_limit() {
        let t = truncate(&"x".repeat(50), 10, char_unit);
        assert_eq!(measure(&t, char_unit), 10);
        assert!(t.ends_with('…'));
    }
}
