//! A final answer's markdown for a terminal: headings bold, code dimmed (blocks
//! indented), list items indented with a bullet or their number, quotes behind a bar,
//! links as `text (url)`, emphasis kept as text. Parsed with `pulldown-cmark`, the same
//! parser the web page's server renders with. Control characters of the model's text are
//! dropped: it must not drive the terminal.

use super::screen::Style;
use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

/// Model text without terminal control characters (newlines and tabs stay).
fn printable(s: &str) -> String {
    s.chars()
        .filter(|c| !c.is_control() || *c == '\n' || *c == '\t')
        .collect()
}

/// Renders `text` for a terminal, each line indented by `indent`.
pub fn render(text: &str, style: Style, indent: &str) -> String {
    let text = printable(text);
    let mut out = String::new();
    let mut line = String::new();
    // Open lists: the next number of an ordered one, `None` for bullets.
    let mut lists: Vec<Option<u64>> = Vec::new();
    let mut quote = 0usize;
    let mut heading = false;
    let mut code_block = false;
    let mut links: Vec<String> = Vec::new();
    let flush = |line: &mut String, out: &mut String, quote: usize| {
        let bar = "│ ".repeat(quote);
        out.push_str(indent);
        out.push_str(&style.dim(&bar));
        out.push_str(line.trim_end());
        out.push('\n');
        line.clear();
    };
    let opts = Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH;
    for ev in Parser::new_ext(&text, opts) {
        match ev {
            Event::Start(Tag::Heading { .. }) => heading = true,
            Event::End(TagEnd::Heading(_)) => {
                heading = false;
                flush(&mut line, &mut out, quote);
                out.push_str(indent);
                out.push('\n');
            }
            Event::Start(Tag::Paragraph) => {}
            Event::End(TagEnd::Paragraph) => {
                flush(&mut line, &mut out, quote);
                if lists.is_empty() {
                    out.push_str(indent);
                    out.push('\n');
                }
            }
            Event::Start(Tag::BlockQuote(_)) => quote += 1,
            Event::End(TagEnd::BlockQuote(_)) => quote = quote.saturating_sub(1),
            Event::Start(Tag::List(start)) => lists.push(start),
            Event::End(TagEnd::List(_)) => {
                lists.pop();
                if lists.is_empty() {
                    out.push_str(indent);
                    out.push('\n');
                }
            }
            Event::Start(Tag::Item) => {
                if !line.trim().is_empty() {
                    flush(&mut line, &mut out, quote);
                }
                let depth = lists.len().saturating_sub(1);
                let mark = match lists.last_mut() {
                    Some(Some(n)) => {
                        let m = format!("{n}.");
                        *n += 1;
                        m
                    }
                    _ => "•".to_owned(),
                };
                line.push_str(&format!("{}  {mark} ", "  ".repeat(depth)));
            }
            Event::End(TagEnd::Item) if !line.trim().is_empty() => {
                flush(&mut line, &mut out, quote);
            }
            Event::Start(Tag::CodeBlock(_)) => {
                if !line.trim().is_empty() {
                    flush(&mut line, &mut out, quote);
                }
                code_block = true;
            }
            Event::End(TagEnd::CodeBlock) => {
                code_block = false;
                out.push_str(indent);
                out.push('\n');
            }
            Event::Start(Tag::Link { dest_url, .. }) => links.push(dest_url.to_string()),
            Event::End(TagEnd::Link) => {
                if let Some(url) = links.pop() {
                    line.push_str(&style.dim(&format!(" ({url})")));
                }
            }
            Event::Text(t) if code_block => {
                for l in t.lines() {
                    out.push_str(indent);
                    out.push_str("    ");
                    out.push_str(&style.dim(l));
                    out.push('\n');
                }
            }
            Event::Text(t) => {
                if heading {
                    line.push_str(&style.bold(&t));
                } else {
                    line.push_str(&t);
                }
            }
            Event::Code(c) => line.push_str(&style.dim(&c)),
            Event::SoftBreak => line.push(' '),
            Event::HardBreak => flush(&mut line, &mut out, quote),
            Event::Rule => {
                out.push_str(indent);
                out.push_str(&style.dim("────────"));
                out.push('\n');
            }
            Event::Html(h) | Event::InlineHtml(h) => line.push_str(&h),
            Event::End(TagEnd::TableRow | TagEnd::TableHead) => {
                flush(&mut line, &mut out, quote);
            }
            Event::End(TagEnd::TableCell) => line.push_str("  "),
            _ => {}
        }
    }
    if !line.trim().is_empty() {
        flush(&mut line, &mut out, quote);
    }
    while out.ends_with(&format!("{indent}\n")) || out.ends_with("\n\n") {
        let cut = if out.ends_with(&format!("{indent}\n")) {
            indent.len() + 1
        } else {
            1
        };
        out.truncate(out.len() - cut);
    }
    out.trim_end_matches('\n').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAIN: Style = Style { color: false };

    #[test]
    fn headings_lists_quotes_and_code_for_a_terminal() {
        let t = render(
            "## Line counts\n\n> Counted with `wc`.\n\n- one\n- two\n\n1. first\n2. second\n\n```sh\nwc -l *.md\n```\n\nSee [docs](https://x.example).",
            PLAIN,
            "  ",
        );
        assert!(t.starts_with("  Line counts\n"), "{t}");
        assert!(!t.contains("##") && !t.contains("```"), "{t}");
        assert!(t.contains("  │ Counted with wc."), "{t}");
        assert!(t.contains("    • one\n    • two"), "{t}");
        assert!(t.contains("    1. first\n    2. second"), "{t}");
        assert!(t.contains("      wc -l *.md"), "{t}");
        assert!(t.contains("See docs (https://x.example)."), "{t}");
    }

    #[test]
    fn colour_makes_headings_bold_and_code_dim() {
        let t = render("# Hi\n\nuse `x`", Style { color: true }, "");
        assert!(t.contains("\x1b[1mHi\x1b[0m"), "{t:?}");
        assert!(t.contains("\x1b[2mx\x1b[0m"), "{t:?}");
    }

    #[test]
    fn model_text_cannot_drive_the_terminal() {
        let t = render("a\x1b[2Jb\x07", PLAIN, "");
        assert_eq!(t, "a[2Jb");
    }
}
