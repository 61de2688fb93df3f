//! Telegram `parse_mode=HTML`: `<b>`, `<i>`, `<s>`, `<code>`, `<pre><code
//! class="language-x">`, `<a href>`, `<blockquote>`; everything else is escaped text.
//! Headings are bold lines, list items `• ` / `1. ` lines. Telegram counts the visible
//! text (after entity parsing) in UTF-16 units, so tags cost nothing.

use crate::format::{Frame, Style};

pub(crate) struct Telegram;

fn escape_into(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            _ => out.push(c),
        }
    }
}

/// Visible length of Telegram HTML (tags free, an entity one char), in UTF-16 units.
pub(crate) fn visible_len(wire: &str) -> usize {
    let mut n = 0;
    let mut rest = wire;
    while let Some(c) = rest.chars().next() {
        match c {
            '<' => match rest.find('>') {
                Some(end) => rest = &rest[end + 1..],
                None => {
                    n += 1;
                    rest = &rest[1..];
                }
            },
            '&' => match rest.find(';') {
                Some(end) if end <= 8 => {
                    n += 1;
                    rest = &rest[end + 1..];
                }
                _ => {
                    n += 1;
                    rest = &rest[1..];
                }
            },
            _ => {
                n += c.len_utf16();
                rest = &rest[c.len_utf8()..];
            }
        }
    }
    n
}

impl Style for Telegram {
    fn measure(&self, wire: &str) -> usize {
        visible_len(wire)
    }

    fn escape(&self, c: char, _code: bool, out: &mut String) {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            _ => out.push(c),
        }
    }

    fn strong(&self) -> Frame {
        Frame::new("<b>", "</b>")
    }

    fn emphasis(&self) -> Frame {
        Frame::new("<i>", "</i>")
    }

    fn strike(&self) -> Frame {
        Frame::new("<s>", "</s>")
    }

    fn heading(&self, _level: usize) -> Frame {
        Frame::new("<b>", "</b>")
    }

    fn inline_code(&self, _code: &str) -> Frame {
        Frame::new("<code>", "</code>")
    }

    fn code_block(&self, lang: &str) -> Frame {
        if lang.is_empty() {
            Frame::new("<pre>", "</pre>")
        } else {
            Frame::new(
                format!("<pre><code class=\"language-{lang}\">"),
                "</code></pre>",
            )
        }
    }

    fn quote(&self) -> Frame {
        Frame::new("<blockquote>", "</blockquote>")
    }

    fn link(&self, url: &str) -> Frame {
        let mut open = String::from("<a href=\"");
        escape_into(&mut open, url);
        open.push_str("\">");
        Frame::new(open, "</a>")
    }

    fn quote_is_block(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use crate::format::Target;

    fn tg(md: &str) -> String {
        Target::Telegram.render(md)
    }

    #[test]
    fn headings_are_bold_lines() {
        assert_eq!(tg("# Title\n\nbody"), "<b>Title</b>\n\nbody");
        assert_eq!(tg("### Deep *one*"), "<b>Deep <i>one</i></b>");
    }

    #[test]
    fn lists_become_marked_lines() {
        assert_eq!(tg("- a\n- b\n\nafter"), "• a\n• b\n\nafter");
        assert_eq!(tg("3. x\n4. y"), "3. x\n4. y");
        assert_eq!(tg("- a\n  - b\n- c"), "• a\n  • b\n• c");
        assert_eq!(tg("- [x] done\n- [ ] todo"), "• ☑ done\n• ☐ todo");
    }

    #[test]
    fn code_blocks_keep_language_and_escape() {
        assert_eq!(
            tg("```rust\nif a < b && c {}\n```"),
            "<pre><code class=\"language-rust\">if a &lt; b &amp;&amp; c {}</code></pre>"
        );
        assert_eq!(tg("```\nplain\n```"), "<pre>plain</pre>");
        assert_eq!(
            tg("```\" onclick=x\nq\n```"),
            "<pre>q</pre>",
            "odd info strings never reach the attribute"
        );
        assert_eq!(tg("use `a<b>` here"), "use <code>a&lt;b&gt;</code> here");
    }

    #[test]
    fn links_and_nested_emphasis() {
        assert_eq!(
            tg("[site](https://e.com/?a=1&b=\"2\")"),
            "<a href=\"https://e.com/?a=1&amp;b=&quot;2&quot;\">site</a>"
        );
        assert_eq!(
            tg("***both*** and **bold _it_ ~~gone~~**"),
            "<i><b>both</b></i> and <b>bold <i>it</i> <s>gone</s></b>"
        );
        assert_eq!(
            tg("> quoted\n\nafter"),
            "<blockquote>quoted</blockquote>after"
        );
        assert_eq!(
            tg("> outer\n>\n> > inner\n\nafter"),
            "<blockquote>outer\n\ninner</blockquote>after",
            "Telegram refuses nested blockquotes"
        );
    }

    #[test]
    fn untrusted_input_is_text() {
        assert_eq!(
            tg("<b onclick=x>hi</b> <script>alert(1)</script>"),
            "&lt;b onclick=x&gt;hi&lt;/b&gt; &lt;script&gt;alert(1)&lt;/script&gt;"
        );
        assert_eq!(
            tg("<div>\nblock\n</div>"),
            "&lt;div&gt;\nblock\n&lt;/div&gt;"
        );
        assert_eq!(tg("[click](javascript:alert(1))"), "click");
        assert_eq!(
            tg("[![img](https://e.com/i.png)](https://e.com)"),
            "<a href=\"https://e.com\">img</a>",
            "no link nested in a link"
        );
        assert_eq!(
            tg("go https://e.com/?a=1&b=2 now"),
            "go https://e.com/?a=1&amp;b=2 now"
        );
        assert_eq!(tg("[x](JavaScript:alert(1)) [y](data:text/html,hi)"), "x y");
        assert_eq!(tg("a & b"), "a &amp; b");
    }
}
