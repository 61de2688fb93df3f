//! Discord markdown: mostly the model's own markdown, re-emitted from the parse so it
//! can be split safely: `#`/`##`/`###` headings (deeper ones as bold lines), `- ` /
//! `1. ` lists, fences with their language, `[text](url)` links, `> ` quotes. Text is
//! escaped where it would otherwise format, and mass mentions (`@everyone`, `@here`)
//! get a zero-width space so they never ping (the sink also sends
//! `allowed_mentions: {parse: []}`). Discord counts chars.

use crate::format::{Frame, Style};
use std::borrow::Cow;

pub(crate) struct Discord;

impl Style for Discord {
    fn measure(&self, wire: &str) -> usize {
        wire.chars().count()
    }

    fn escape(&self, c: char, code: bool, out: &mut String) {
        if !code && matches!(c, '\\' | '*' | '_' | '~' | '`' | '|' | '[' | ']') {
            out.push('\\');
        }
        out.push(c);
    }

    fn code<'a>(&self, s: &'a str) -> Cow<'a, str> {
        // Three backticks in a row would end the fence early: break each run with a
        // zero-width space.
        if !s.contains("```") {
            return Cow::Borrowed(s);
        }
        let mut out = s.to_owned();
        while out.contains("```") {
            out = out.replace("```", "``\u{200B}`");
        }
        Cow::Owned(out)
    }

    fn text<'a>(&self, s: &'a str) -> Cow<'a, str> {
        neutralize_mentions(s)
    }

    fn strong(&self) -> Frame {
        Frame::new("**", "**")
    }

    fn emphasis(&self) -> Frame {
        Frame::new("*", "*")
    }

    fn strike(&self) -> Frame {
        Frame::new("~~", "~~")
    }

    fn heading(&self, level: usize) -> Frame {
        match level {
            1 => Frame::new("# ", ""),
            2 => Frame::new("## ", ""),
            3 => Frame::new("### ", ""),
            _ => Frame::new("**", "**"),
        }
    }

    fn inline_code(&self, code: &str) -> Frame {
        if code.contains('`') {
            Frame::new("`` ", " ``")
        } else {
            Frame::new("`", "`")
        }
    }

    fn code_block(&self, lang: &str) -> Frame {
        Frame {
            fence: true,
            ..Frame::new(format!("```{lang}\n"), "```")
        }
    }

    fn quote(&self) -> Frame {
        Frame {
            prefix: "> ",
            ..Frame::new("> ", "")
        }
    }

    fn link(&self, url: &str) -> Frame {
        let mut close = String::from("](");
        for c in url.chars() {
            match c {
                '(' => close.push_str("%28"),
                ')' => close.push_str("%29"),
                _ => close.push(c),
            }
        }
        close.push(')');
        Frame::new("[", close)
    }

    fn bullet(&self) -> &'static str {
        "- "
    }
}

/// `@everyone` / `@here` → `@\u{200B}everyone` / `@\u{200B}here`.
pub(crate) fn neutralize_mentions(s: &str) -> Cow<'_, str> {
    if !s.contains("@everyone") && !s.contains("@here") {
        return Cow::Borrowed(s);
    }
    Cow::Owned(
        s.replace("@everyone", "@\u{200B}everyone")
            .replace("@here", "@\u{200B}here"),
    )
}

#[cfg(test)]
mod tests {
    use crate::format::Target;

    fn dc(md: &str) -> String {
        Target::Discord.render(md)
    }

    #[test]
    fn headings_lists_code() {
        assert_eq!(dc("# Top\n\n#### Deep"), "# Top\n\n**Deep**");
        assert_eq!(dc("* a\n* b\n\n1. x"), "- a\n- b\n\n1. x");
        assert_eq!(dc("- a\n  1. b"), "- a\n  1. b");
        assert_eq!(dc("```rust\nfn f() {}\n```"), "```rust\nfn f() {}\n```");
        assert_eq!(dc("a `x*y` b"), "a `x*y` b");
        assert_eq!(dc("a ``x`y`` b"), "a `` x`y `` b");
        assert_eq!(
            dc("````md\n```\ninner\n```\n````"),
            "```md\n``\u{200B}`\ninner\n``\u{200B}`\n```"
        );
        assert_eq!(
            dc("see https://e.com/a_b*c and a_b"),
            "see https://e.com/a_b*c and a\\_b",
            "bare URLs are not escaped"
        );
    }

    #[test]
    fn emphasis_and_links() {
        assert_eq!(dc("**b *i* ~~s~~**"), "**b *i* ~~s~~**");
        assert_eq!(dc(r"\*not em\*"), r"\*not em\*");
        assert_eq!(
            dc("[t](https://e.com/a_(b))"),
            "[t](https://e.com/a_%28b%29)"
        );
        assert_eq!(dc("> q\n\nafter"), "> q\n\nafter");
    }

    #[test]
    fn untrusted_input_is_neutralized() {
        assert_eq!(
            dc("hey @everyone and @here"),
            "hey @\u{200B}everyone and @\u{200B}here"
        );
        assert_eq!(dc("[x](javascript:alert(1))"), "x");
        assert_eq!(dc("<script>x</script>"), "<script>x</script>");
    }
}
