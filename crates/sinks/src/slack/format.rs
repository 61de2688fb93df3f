//! Slack mrkdwn: `*bold*`, `_italic_`, `~strike~`, `` `code` ``, ```` ``` ```` blocks,
//! `<url|text>` links, `> ` quotes; `&`, `<`, `>` escaped everywhere (so model output
//! can never write `<!channel>` or a user mention). Headings are bold lines, list
//! items `• ` / `1. ` lines. Slack counts the escaped text.

use crate::format::{Frame, Style};

pub(crate) struct Slack;

impl Style for Slack {
    fn measure(&self, wire: &str) -> usize {
        wire.chars().count()
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
        Frame::new("*", "*")
    }

    fn emphasis(&self) -> Frame {
        Frame::new("_", "_")
    }

    fn strike(&self) -> Frame {
        Frame::new("~", "~")
    }

    fn heading(&self, _level: usize) -> Frame {
        Frame::new("*", "*")
    }

    fn inline_code(&self, _code: &str) -> Frame {
        Frame::new("`", "`")
    }

    fn code_block(&self, _lang: &str) -> Frame {
        // mrkdwn has no language tag.
        Frame {
            fence: true,
            ..Frame::new("```\n", "```")
        }
    }

    fn quote(&self) -> Frame {
        Frame {
            prefix: "> ",
            ..Frame::new("> ", "")
        }
    }

    fn link(&self, url: &str) -> Frame {
        let mut open = String::from("<");
        for c in url.chars() {
            match c {
                '&' => open.push_str("&amp;"),
                '<' => open.push_str("%3C"),
                '>' => open.push_str("%3E"),
                '|' => open.push_str("%7C"),
                _ => open.push(c),
            }
        }
        open.push('|');
        Frame::new(open, ">")
    }
}

#[cfg(test)]
mod tests {
    use crate::format::Target;

    fn sl(md: &str) -> String {
        Target::Slack.render(md)
    }

    #[test]
    fn headings_lists_and_emphasis() {
        assert_eq!(sl("## Plan\n\n- a\n- b"), "*Plan*\n\n• a\n• b");
        assert_eq!(sl("1. one\n2. two"), "1. one\n2. two");
        assert_eq!(sl("**bold _it_** ~~no~~ *em*"), "*bold _it_* ~no~ _em_");
    }

    #[test]
    fn code_and_links() {
        assert_eq!(sl("```py\nx = a<b\n```"), "```\nx = a&lt;b\n```");
        assert_eq!(sl("run `ls -l`"), "run `ls -l`");
        assert_eq!(
            sl("[docs](https://e.com/a?b=1&c=2|x)"),
            "<https://e.com/a?b=1&amp;c=2%7Cx|docs>"
        );
        assert_eq!(sl("p\n\n> q\n> r\n\nafter"), "p\n\n> q\n> r\n\nafter");
    }

    #[test]
    fn untrusted_input_is_text() {
        assert_eq!(
            sl("<!channel> & <@U123>"),
            "&lt;!channel&gt; &amp; &lt;@U123&gt;"
        );
        assert_eq!(sl("[x](javascript:alert(1))"), "x");
    }
}
