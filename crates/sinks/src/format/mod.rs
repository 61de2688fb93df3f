//! Model markdown → each chat's wire format, split at the chat's size limit.
//!
//! One renderer walks [`pulldown_cmark`] events and emits a flat token stream
//! ([`Tok`]): frames (`<b>…</b>`, `*…*`, a code fence) that open and close, text to
//! escape, literal markup, line breaks and preferred break points. A target ([`Style`],
//! one module each, in the sink's folder: [`crate::telegram::format`],
//! [`crate::slack::format`], [`crate::discord::format`]) says what each construct looks
//! like and how long a piece of wire text counts. The packer then fills parts up to the
//! limit, always reserving room to close every open frame: a part that ends inside a
//! frame closes it, and the next part reopens it (a code block keeps its language), so
//! every part is well formed on its own. Breaks prefer a block boundary, then a line
//! break, then whitespace, in the second half of a part.
//!
//! Model output is untrusted: raw HTML in the markdown is text (escaped), and links
//! keep only `http`, `https` and `mailto` targets (anything else, `javascript:`
//! included, is dropped and its text kept).

use pulldown_cmark::{CodeBlockKind, Event, Options, Parser, Tag, TagEnd, TextMergeStream};
use std::borrow::Cow;

/// A construct that wraps content and must be closed (and reopened across a split).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Frame {
    /// Written where the construct starts, and again at the start of a continuation part.
    pub open: String,
    /// Written where it ends, and at the end of a part that splits it.
    pub close: String,
    /// Written after every line break inside it (e.g. `> ` for a quote).
    pub prefix: &'static str,
    /// The close goes on its own line (a code fence).
    pub fence: bool,
}

impl Frame {
    pub(crate) fn new(open: impl Into<String>, close: impl Into<String>) -> Frame {
        Frame {
            open: open.into(),
            close: close.into(),
            prefix: "",
            fence: false,
        }
    }
}

/// One token of rendered output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Tok {
    Open(Frame),
    Close,
    /// Text, escaped by the target.
    Text(String),
    /// Code, escaped by the target's code rules.
    Code(String),
    /// Literal wire text (list markers, heading marks), never split.
    Markup(String),
    /// A line break (plus the open frames' line prefixes); dropped at a part's start.
    Newline,
    /// A preferred split point between blocks.
    Break,
}

/// What a chat's format looks like.
pub(crate) trait Style {
    /// Length of wire text as the chat counts it against its limit.
    fn measure(&self, wire: &str) -> usize;
    /// Append `c` escaped; `code` inside code spans and blocks.
    fn escape(&self, c: char, code: bool, out: &mut String);
    /// Prepare text before escaping (e.g. neutralize mass mentions).
    fn text<'a>(&self, s: &'a str) -> Cow<'a, str> {
        Cow::Borrowed(s)
    }
    /// Prepare code (span or block content) before escaping.
    fn code<'a>(&self, s: &'a str) -> Cow<'a, str> {
        Cow::Borrowed(s)
    }
    fn strong(&self) -> Frame;
    fn emphasis(&self) -> Frame;
    fn strike(&self) -> Frame;
    fn heading(&self, level: usize) -> Frame;
    fn inline_code(&self, code: &str) -> Frame;
    fn code_block(&self, lang: &str) -> Frame;
    fn quote(&self) -> Frame;
    /// `url` is already checked by [`safe_url`].
    fn link(&self, url: &str) -> Frame;
    fn bullet(&self) -> &'static str {
        "• "
    }
    fn rule(&self) -> &'static str {
        "———"
    }
    /// A quote is a block element of its own (Telegram's `<blockquote>`): one line
    /// break before it, none after.
    fn quote_is_block(&self) -> bool {
        false
    }
}

/// A link target that may be shown: `http(s)` and `mailto` only.
pub(crate) fn safe_url(url: &str) -> Option<&str> {
    let u = url.trim();
    let lower = u.get(..8).unwrap_or(u).to_ascii_lowercase();
    let ok = lower.starts_with("http://")
        || lower.starts_with("https://")
        || lower.starts_with("mailto:");
    (ok && !u.chars().any(|c| c.is_control() || c.is_whitespace())).then_some(u)
}

/// Byte offset of the first `http://` / `https://` in `s`.
fn find_url(s: &str) -> Option<usize> {
    let a = s.find("http://");
    let b = s.find("https://");
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A code block's language tag, if it is a plain identifier.
pub(crate) fn lang_tag(info: &str) -> &str {
    let lang = info.split_whitespace().next().unwrap_or("");
    if lang.len() <= 32
        && lang
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '+' | '#' | '.'))
    {
        lang
    } else {
        ""
    }
}

struct List {
    next: Option<u64>,
    width: usize,
}

/// Events → tokens.
struct Render<'s> {
    style: &'s dyn Style,
    toks: Vec<Tok>,
    started: bool,
    /// A block ended and the next content needs `pending` line breaks first.
    boundary: bool,
    pending: usize,
    lists: Vec<List>,
    /// Inside a code block (language, text so far) or an HTML block (text so far).
    code: Option<(String, String)>,
    html: Option<String>,
    links: Vec<bool>,
    quotes: usize,
    /// Drafts: thinking quotes sit between rows without blank lines.
    compact: bool,
}

impl<'s> Render<'s> {
    fn new(style: &'s dyn Style, compact: bool) -> Render<'s> {
        Render {
            style,
            toks: Vec::new(),
            started: false,
            boundary: false,
            pending: 0,
            lists: Vec::new(),
            code: None,
            html: None,
            links: Vec::new(),
            quotes: 0,
            compact,
        }
    }

    fn push(&mut self, t: Tok) {
        if !matches!(t, Tok::Newline | Tok::Break | Tok::Close) {
            self.started = true;
        }
        self.toks.push(t);
    }

    fn newlines(&mut self, n: usize) {
        if self.started {
            self.toks.push(Tok::Break);
            for _ in 0..n {
                self.toks.push(Tok::Newline);
            }
        }
        self.boundary = false;
        self.pending = 0;
    }

    /// Before content or a block: the separator a finished block asked for.
    fn sep(&mut self) {
        if self.boundary {
            let n = self.pending;
            self.newlines(n);
        }
    }

    fn end_block(&mut self, n: usize) {
        self.boundary = true;
        self.pending = self.pending.max(n);
    }

    fn text(&mut self, s: &str) {
        if let Some((_, buf)) = self.code.as_mut() {
            buf.push_str(s);
            return;
        }
        if let Some(buf) = self.html.as_mut() {
            buf.push_str(s);
            return;
        }
        self.sep();
        // Bare URLs go out verbatim (as code is): escaping them for a markdown chat
        // would put backslashes into the link the chat detects.
        let mut rest = s;
        while let Some(at) = find_url(rest) {
            let end = rest[at..]
                .find(|c: char| c.is_whitespace() || c == '<' || c == '>' || c == '"')
                .map_or(rest.len(), |n| at + n);
            if at > 0 {
                let t = self.style.text(&rest[..at]).into_owned();
                self.push(Tok::Text(t));
            }
            self.push(Tok::Code(rest[at..end].to_owned()));
            rest = &rest[end..];
        }
        if !rest.is_empty() {
            let t = self.style.text(rest).into_owned();
            self.push(Tok::Text(t));
        }
    }

    fn event(&mut self, ev: Event<'_>) {
        match ev {
            Event::Start(tag) => self.start(tag),
            Event::End(tag) => self.end(tag),
            Event::Text(s) | Event::Html(s) | Event::InlineHtml(s) => self.text(&s),
            Event::Code(s) | Event::InlineMath(s) | Event::DisplayMath(s) => {
                self.sep();
                let f = self.style.inline_code(&s);
                self.push(Tok::Open(f));
                let code = self.style.code(&s).into_owned();
                self.push(Tok::Code(code));
                self.push(Tok::Close);
            }
            Event::FootnoteReference(s) => self.text(&format!("[{s}]")),
            Event::SoftBreak | Event::HardBreak => {
                if let Some((_, buf)) = self.code.as_mut() {
                    buf.push('\n');
                } else {
                    self.push(Tok::Newline);
                }
            }
            Event::Rule => {
                self.sep();
                self.push(Tok::Markup(self.style.rule().to_owned()));
                self.end_block(2);
            }
            Event::TaskListMarker(done) => {
                self.push(Tok::Markup(if done { "☑ " } else { "☐ " }.to_owned()));
            }
        }
    }

    fn start(&mut self, tag: Tag<'_>) {
        match tag {
            Tag::Paragraph => self.sep(),
            Tag::Heading { level, .. } => {
                self.sep();
                let f = self.style.heading(level as usize);
                self.push(Tok::Open(f));
            }
            Tag::BlockQuote(_) => {
                // Telegram refuses nested blockquotes (and the others show one level):
                // an inner quote is just more of the outer one.
                self.quotes += 1;
                if self.quotes == 1 {
                    let n = if self.compact || self.style.quote_is_block() || !self.boundary {
                        1
                    } else {
                        self.pending.max(1)
                    };
                    self.newlines(n);
                    let f = self.style.quote();
                    self.push(Tok::Open(f));
                } else {
                    self.sep();
                }
            }
            Tag::CodeBlock(kind) => {
                self.sep();
                let lang = match kind {
                    CodeBlockKind::Fenced(info) => lang_tag(&info).to_owned(),
                    CodeBlockKind::Indented => String::new(),
                };
                self.code = Some((lang, String::new()));
            }
            Tag::HtmlBlock => {
                self.sep();
                self.html = Some(String::new());
            }
            Tag::List(start) => {
                // Each item starts its own line (after the separator a block asked for).
                self.lists.push(List {
                    next: start,
                    width: 0,
                });
            }
            Tag::Item => {
                let n = self.pending.max(1);
                self.newlines(n);
                let indent: usize = self.lists.iter().rev().skip(1).map(|l| l.width).sum();
                let bullet = self.style.bullet();
                let marker = match self.lists.last_mut() {
                    Some(l) => {
                        let m = match l.next.as_mut() {
                            Some(n) => {
                                let m = format!("{n}. ");
                                *n += 1;
                                m
                            }
                            None => bullet.to_owned(),
                        };
                        l.width = m.chars().count();
                        m
                    }
                    None => bullet.to_owned(),
                };
                self.push(Tok::Markup(format!("{}{marker}", " ".repeat(indent))));
            }
            Tag::Emphasis => {
                self.sep();
                let f = self.style.emphasis();
                self.push(Tok::Open(f));
            }
            Tag::Strong => {
                self.sep();
                let f = self.style.strong();
                self.push(Tok::Open(f));
            }
            Tag::Strikethrough => {
                self.sep();
                let f = self.style.strike();
                self.push(Tok::Open(f));
            }
            Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. } => {
                self.sep();
                // No link inside a link (an image in a link): the outer one wins.
                let inside = self.links.contains(&true);
                match safe_url(&dest_url).filter(|_| !inside) {
                    Some(u) => {
                        let f = self.style.link(u);
                        self.push(Tok::Open(f));
                        self.links.push(true);
                    }
                    None => self.links.push(false),
                }
            }
            _ => self.sep(),
        }
    }

    fn end(&mut self, tag: TagEnd) {
        match tag {
            TagEnd::Paragraph => self.end_block(2),
            TagEnd::Heading(_) => {
                self.push(Tok::Close);
                self.end_block(2);
            }
            TagEnd::BlockQuote(_) => {
                self.quotes = self.quotes.saturating_sub(1);
                if self.quotes == 0 {
                    self.push(Tok::Close);
                    self.boundary = true;
                    self.pending = if self.style.quote_is_block() {
                        0
                    } else if self.compact {
                        1
                    } else {
                        2
                    };
                } else {
                    self.end_block(2);
                }
            }
            TagEnd::CodeBlock => {
                if let Some((lang, mut code)) = self.code.take() {
                    if code.ends_with('\n') {
                        code.pop();
                    }
                    let f = self.style.code_block(&lang);
                    self.push(Tok::Open(f));
                    let code = self.style.code(&code).into_owned();
                    self.push(Tok::Code(code));
                    self.push(Tok::Close);
                }
                self.end_block(2);
            }
            TagEnd::HtmlBlock => {
                if let Some(h) = self.html.take() {
                    let t = self.style.text(h.trim_end()).into_owned();
                    self.push(Tok::Text(t));
                }
                self.end_block(2);
            }
            TagEnd::List(_) => {
                self.lists.pop();
                self.end_block(if self.lists.is_empty() { 2 } else { 1 });
            }
            TagEnd::Item => self.end_block(1),
            TagEnd::Emphasis | TagEnd::Strong | TagEnd::Strikethrough => self.push(Tok::Close),
            TagEnd::Link | TagEnd::Image => {
                if self.links.pop() == Some(true) {
                    self.push(Tok::Close);
                }
            }
            _ => self.end_block(2),
        }
    }
}

/// Markdown → tokens for `style`. Markdown that renders to nothing visible (only link
/// reference definitions, say) is shown as its source text: an answer is never empty.
pub(crate) fn tokens(style: &dyn Style, markdown: &str, compact: bool) -> Vec<Tok> {
    let opts = Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TASKLISTS;
    let mut r = Render::new(style, compact);
    // Merged text: a bare URL split at a would-be delimiter (`*`, `_`) stays whole.
    for ev in TextMergeStream::new(Parser::new_ext(markdown, opts)) {
        r.event(ev);
    }
    let visible = r.toks.iter().any(|t| match t {
        Tok::Text(s) | Tok::Code(s) | Tok::Markup(s) => !s.trim().is_empty(),
        _ => false,
    });
    if !visible && !markdown.trim().is_empty() {
        return vec![Tok::Text(style.text(markdown.trim()).into_owned())];
    }
    r.toks
}

#[derive(Clone)]
struct Cand {
    i: usize,
    off: usize,
    len: usize,
    used: usize,
    stack: Vec<(usize, usize)>,
}

fn frame(toks: &[Tok], i: usize) -> Option<&Frame> {
    match toks.get(i) {
        Some(Tok::Open(f)) => Some(f),
        _ => None,
    }
}

/// The packer's state while filling one part.
struct Packer<'a> {
    style: &'a dyn Style,
    toks: &'a [Tok],
    limit: usize,
    parts: Vec<String>,
    buf: String,
    used: usize,
    /// `used` right after the reopened frames at the start of this part.
    base: usize,
    /// Cost of closing every open frame.
    reserve: usize,
    /// Open frames: (token index, buffer length right after its open).
    stack: Vec<(usize, usize)>,
    /// Nothing but reopened frames in this part yet.
    fresh: bool,
    block: Option<Cand>,
    line: Option<Cand>,
    space: Option<Cand>,
}

impl Packer<'_> {
    fn close_cost(&self, f: &Frame) -> usize {
        self.style.measure(&f.close) + usize::from(f.fence)
    }

    fn here(&self, i: usize, off: usize) -> Cand {
        Cand {
            i,
            off,
            len: self.buf.len(),
            used: self.used,
            stack: self.stack.clone(),
        }
    }

    /// `None`: `cost` more fits (or must be written anyway); else where to split.
    fn overflow(&mut self, cost: usize, i: usize, off: usize) -> Option<Cand> {
        if self.used + cost + self.reserve <= self.limit {
            return None;
        }
        let half = self.base + self.limit.saturating_sub(self.base) / 2;
        let pick = [&self.block, &self.line, &self.space]
            .into_iter()
            .flatten()
            .find(|c| c.used >= half && c.used > self.base)
            .cloned();
        match pick {
            Some(c) => Some(c),
            None if self.used > self.base => Some(self.here(i, off)),
            // Nothing fits even in an empty part: write it anyway (progress).
            None => None,
        }
    }

    /// End this part at `c`: close what is open there, reopen it in the next part.
    fn split(&mut self, c: Cand) -> (usize, usize) {
        self.buf.truncate(c.len);
        self.used = c.used;
        for &(fi, at) in c.stack.iter().rev() {
            if let Some(f) = frame(self.toks, fi) {
                close_into(self.style, f, at, &mut self.buf, &mut self.used);
            }
        }
        self.parts.push(std::mem::take(&mut self.buf));
        self.used = 0;
        self.reserve = 0;
        self.stack.clear();
        for &(fi, _) in &c.stack {
            if let Some(f) = frame(self.toks, fi) {
                self.buf.push_str(&f.open);
                self.used += self.style.measure(&f.open);
                self.reserve += self.close_cost(f);
                self.stack.push((fi, self.buf.len()));
            }
        }
        self.base = self.used;
        self.fresh = true;
        (self.block, self.line, self.space) = (None, None, None);
        (c.i, c.off)
    }

    /// Process token `i` from char `off`; returns where to continue.
    fn step(&mut self, i: usize, off: usize) -> (usize, usize) {
        let toks = self.toks;
        match &toks[i] {
            Tok::Break => {
                if !self.fresh {
                    self.block = Some(self.here(i + 1, 0));
                }
                (i + 1, 0)
            }
            Tok::Newline => {
                if self.fresh {
                    return (i + 1, 0);
                }
                let mut s = String::from("\n");
                for &(fi, _) in &self.stack {
                    if let Some(f) = frame(toks, fi) {
                        s.push_str(f.prefix);
                    }
                }
                let cost = self.style.measure(&s);
                if let Some(c) = self.overflow(cost, i, 0) {
                    return self.split(c);
                }
                self.buf.push_str(&s);
                self.used += cost;
                self.line = Some(self.here(i + 1, 0));
                (i + 1, 0)
            }
            Tok::Open(f) => {
                let open = self.style.measure(&f.open);
                let close = self.close_cost(f);
                if let Some(c) = self.overflow(open + close, i, 0) {
                    return self.split(c);
                }
                self.buf.push_str(&f.open);
                self.used += open;
                self.reserve += close;
                self.stack.push((i, self.buf.len()));
                self.fresh = false;
                (i + 1, 0)
            }
            Tok::Close => {
                if let Some((fi, at)) = self.stack.pop() {
                    if let Some(f) = frame(toks, fi) {
                        self.reserve -= self.close_cost(f);
                        close_into(self.style, f, at, &mut self.buf, &mut self.used);
                    }
                }
                (i + 1, 0)
            }
            Tok::Markup(s) => {
                let cost = self.style.measure(s);
                if let Some(c) = self.overflow(cost, i, 0) {
                    return self.split(c);
                }
                self.buf.push_str(s);
                self.used += cost;
                self.fresh = false;
                (i + 1, 0)
            }
            Tok::Text(s) | Tok::Code(s) => {
                let code = matches!(toks[i], Tok::Code(_));
                let mut esc = String::new();
                for (j, ch) in s[off..].char_indices() {
                    esc.clear();
                    self.style.escape(ch, code, &mut esc);
                    let cost = self.style.measure(&esc);
                    if let Some(c) = self.overflow(cost, i, off + j) {
                        return self.split(c);
                    }
                    self.buf.push_str(&esc);
                    self.used += cost;
                    self.fresh = false;
                    let next = off + j + ch.len_utf8();
                    if ch == '\n' {
                        self.line = Some(self.here(i, next));
                    } else if ch.is_whitespace() {
                        self.space = Some(self.here(i, next));
                    }
                }
                (i + 1, 0)
            }
        }
    }
}

/// Tokens → wire parts of at most `limit` (as `style` measures), each well formed.
pub(crate) fn pack(style: &dyn Style, toks: &[Tok], limit: usize) -> Vec<String> {
    let mut p = Packer {
        style,
        toks,
        limit,
        parts: Vec::new(),
        buf: String::new(),
        used: 0,
        base: 0,
        reserve: 0,
        stack: Vec::new(),
        fresh: true,
        block: None,
        line: None,
        space: None,
    };
    let (mut i, mut off) = (0usize, 0usize);
    while i < toks.len() {
        (i, off) = p.step(i, off);
    }
    if !p.buf.is_empty() || p.parts.is_empty() {
        p.parts.push(p.buf);
    }
    p.parts
}

/// Close `f`, opened at buffer length `at`; an empty frame is removed instead.
fn close_into(style: &dyn Style, f: &Frame, at: usize, buf: &mut String, used: &mut usize) {
    if buf.len() == at && buf.ends_with(&f.open) {
        buf.truncate(at - f.open.len());
        *used = used.saturating_sub(style.measure(&f.open));
        return;
    }
    if f.fence && !buf.ends_with('\n') {
        buf.push('\n');
        *used += 1;
    }
    buf.push_str(&f.close);
    *used += style.measure(&f.close);
}

/// A chat's wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Telegram `parse_mode=HTML`; limit in UTF-16 units of the visible text.
    Telegram,
    /// Slack mrkdwn; limit in chars of the escaped text.
    Slack,
    /// Discord markdown; limit in chars.
    Discord,
}

impl Target {
    fn style(self) -> &'static dyn Style {
        match self {
            Target::Telegram => &crate::telegram::format::Telegram,
            Target::Slack => &crate::slack::format::Slack,
            Target::Discord => &crate::discord::format::Discord,
        }
    }

    /// Render model markdown as one message, whatever its length.
    pub fn render(self, markdown: &str) -> String {
        self.parts(markdown, None, usize::MAX).concat()
    }

    /// Render model markdown (plus an optional plain `suffix` line, kept out of any
    /// open block) as messages of at most `limit` each.
    pub fn parts(self, markdown: &str, suffix: Option<&str>, limit: usize) -> Vec<String> {
        let style = self.style();
        let mut toks = tokens(style, markdown, false);
        if let Some(s) = suffix.filter(|s| !s.is_empty()) {
            if !toks.is_empty() {
                toks.push(Tok::Break);
                toks.push(Tok::Newline);
            }
            toks.push(Tok::Text(style.text(s).into_owned()));
        }
        pack(style, &toks, limit)
    }

    /// Render a draft (projection text: model markdown with `> ` thinking lines and
    /// tool rows) as one message of at most `limit`, cut with `…` as a last guard.
    pub fn draft(self, text: &str, limit: usize) -> String {
        let style = self.style();
        let md = draft_markdown(text);
        let toks = tokens(style, &md, true);
        let whole = pack(style, &toks, usize::MAX).concat();
        if style.measure(&whole) <= limit {
            return whole;
        }
        let ell = style.measure("…");
        let mut parts = pack(style, &toks, limit.saturating_sub(ell)).into_iter();
        let mut first = parts.next().unwrap_or_default();
        first.push('…');
        first
    }
}

/// A quoted (thinking) run in a draft ends at the first unquoted line: keep the tool
/// row or commentary after it out of the quote (markdown would continue it lazily).
fn draft_markdown(text: &str) -> Cow<'_, str> {
    let mut out = String::with_capacity(text.len() + 8);
    let mut prev_quoted = false;
    let mut changed = false;
    for (n, line) in text.split('\n').enumerate() {
        if n > 0 {
            out.push('\n');
        }
        let quoted = line.starts_with('>');
        if prev_quoted && !quoted && !line.trim().is_empty() {
            out.push('\n');
            changed = true;
        }
        out.push_str(line);
        prev_quoted = quoted;
    }
    if changed {
        Cow::Owned(out)
    } else {
        Cow::Borrowed(text)
    }
}

#[cfg(test)]
mod tests;
