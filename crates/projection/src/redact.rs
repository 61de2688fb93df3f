//! The one redactor for every channel surface: secrets masked, and for `/verbose full`
//! item details also paths shortened, whitespace collapsed, length capped.
//!
//! A chat, a webhook, the web page and `streamgate tail` are a far wider audience than
//! the archive (spec §10 item 7 keeps the archive operator/audit-only; DESIGN §6: channel
//! surfaces are display-safe, raw events stay operator-only). So everything a channel
//! shows of a run's *progress* goes through [`redact`]: draft text (thinking, commentary,
//! tool rows, status lines), notices and settle lines, and the events `ProjectorService`
//! hands to channel token holders. It runs on the *accumulated* text (the fold's segment
//! text, or [`StreamRedactor`] for event streams), never on one delta alone, so a secret
//! streamed in pieces is still caught.
//!
//! **Final answers are not redacted.** The final is the model's answer to the user who
//! asked, and channels deliver it as produced: the spec requires it exactly once, on a
//! path that never drops (§5 item 5, §7.1, §8), and this project's webhook contract is
//! that a `final` op "carries the final answer exactly as the model produced it"
//! (README). Spec §10 has no rule that masks answers: its privacy items cover thinking
//! display (item 5: rendered only on explicit `/reasoning`) and the archive (item 7:
//! operator/audit-only). A secret the model chose to put in its answer *is* the answer;
//! masking it would silently change what the user asked for. Everything else —
//! reasoning, drafts, tool data, errors — is incidental material, and is masked.
//!
//! The rules are deliberately over-eager: a false positive costs a `***` in a progress
//! row, a false negative leaks a key into a chat history nobody can scrub. The catalogue
//! ([`RULES`]) is one [`RegexSet`] (a single pass tells which rules can match, so clean
//! text costs one scan) plus one [`Regex`] per rule, compiled once. Each rule masks only
//! its `s…` capture groups, keeping the context (`password=***`, `sk-ant-***`,
//! `postgres://u:***@h`): the masked text stays readable, masking is idempotent, and a
//! text that grows only grows its masked form (what [`StreamRedactor`] relies on).
//! Rules never cross a newline except the PEM rule.

use regex::{Regex, RegexSet};
use std::sync::LazyLock;

/// Replacement for a redacted secret value.
pub const MASK: &str = "***";

/// Key names whose `key=value` / `key: value` / `"key": "value"` value is always masked
/// (case-insensitively, as the end of the key, so `GITHUB_TOKEN`, `db_password` and
/// `AWS_SECRET_ACCESS_KEY` count; `pass` and `pwd` only as a whole word part, so
/// `db_pass` counts and `bypass` does not).
const SECRET_KEY: &str = r"(?:password|passwd|passphrase|secret|token|api[_-]?key|access[_-]?key|private[_-]?key|secret[_-]?key|signing[_-]?key|client[_-]?secret|credentials?|cookie|(?:\b|_)auth|(?:\b|_)pass|(?:\b|_)pwd)";

/// The catalogue: (name, pattern). Every `s…` group of a match is masked.
pub const RULES: [(&str, &str); 17] = [
    // -----BEGIN … PRIVATE KEY----- … -----END … PRIVATE KEY----- (or the end of the
    // text: a half key is still a key). The header and footer stay.
    (
        "pem_private_key",
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----(?P<s>(?s:.*?))(?:-----END [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----|\z)",
    ),
    // Authorization: Bearer x / Basic x (the scheme is masked too, so the masked text is
    // the same however far the value has streamed), and a bare `Bearer <token>`.
    (
        "authorization_header",
        r#"(?i)\b(?:proxy-)?authorization["']?[ \t]*[:=][ \t]*["']?(?P<s>(?:bearer|basic|token|digest)[ \t]+[^\s"',;]*|[^\s"',;]+)"#,
    ),
    (
        "bearer",
        r"(?i)\bbearer[ \t]+(?P<s>[A-Za-z0-9._~+/-]{8,}=*)",
    ),
    // key=value, key: value, "key": "value" (JSON, YAML, env, CLI `--password=`).
    (
        "secret_key_value",
        r#"(?i)(?:\b|^)[A-Za-z0-9_.-]*SECRET_KEY["']?[ \t]*(?:=|:)[ \t]*(?:"(?P<s1>[^"\r\n]+)"?|'(?P<s2>[^'\r\n]+)'?|(?P<s3>[^\s"',;&)}\]]+))"#,
    ),
    // scheme://user:password@host
    (
        "url_credentials",
        r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:@/]*:(?P<s>[^\s@/]+)@",
    ),
    // curl -u user:pass, --user user:pass, --user=user:pass
    (
        "curl_user",
        r#"(?:^|\s)(?:-u|--user)(?:[ \t]+|=)?["']?[^\s:"']*:(?P<s>[^\s"']+)"#,
    ),
    // mysql -pSECRET (and mysqldump, mysqladmin, mariadb); `-p` alone prompts.
    (
        "mysql_password",
        r#"\b(?:mysql|mysqldump|mysqladmin|mariadb)\b[^\n|;&]*?[ \t]-p(?P<s>[^\s'"]+)"#,
    ),
    // sshpass -p SECRET
    (
        "sshpass",
        r"\bsshpass\b[^\n|;&]*?[ \t]-p[ \t]*(?P<s>[^\s]+)",
    ),
    // Anthropic, OpenAI (sk-, sk-proj-), with a tail long enough not to be a word.
    (
        "openai_anthropic_key",
        r"\bsk-(?:ant-|proj-)?(?P<s>[A-Za-z0-9_-]{16,})",
    ),
    // Stripe secret and restricted keys, webhook secrets.
    (
        "stripe_key",
        r"\b(?:(?:sk|rk)_(?:live|test)_|whsec_)(?P<s>[A-Za-z0-9]{10,})",
    ),
    // GitHub tokens (classic and fine-grained).
    (
        "github_token",
        r"\b(?:gh[pousr]_|github_pat_)(?P<s>[A-Za-z0-9_]{20,})",
    ),
    // GitLab personal access tokens.
    ("gitlab_token", r"\bglpat-(?P<s>[A-Za-z0-9_-]{16,})"),
    // Google API keys.
    ("google_api_key", r"\bAIza(?P<s>[0-9A-Za-z_-]{35})"),
    // Slack tokens.
    (
        "slack_token",
        r"\b(?:xox[baprs]|xapp)-(?P<s>[A-Za-z0-9-]{8,})",
    ),
    // AWS access key ids.
    ("aws_access_key_id", r"\b(?:AKIA|ASIA)(?P<s>[0-9A-Z]{16})\b"),
    // JSON Web Tokens: three base64url parts, the first two JSON objects.
    (
        "jwt",
        r"\beyJ(?P<s>[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*)",
    ),
    // Telegram bot tokens `123456:AA…` (35 chars), also glued to `bot` in API URLs; the
    // bot id before the colon is public and stays.
    (
        "telegram_bot_token",
        r"(?:^|[^A-Za-z0-9_]|bot)[0-9]{5,12}:(?P<s>[A-Za-z0-9_-]{35})(?:[^A-Za-z0-9_-]|\z)",
    ),
];

/// A key name whose value is a secret (the key part of the `secret_key_value` rule).
static SECRET_KEY_NAME: LazyLock<Regex> = LazyLock::new(|| {
    // A constant covered by tests: failing to compile is a bug.
    #[allow(clippy::expect_used)]
    Regex::new(&format!(
        r"(?i)^[A-Za-z0-9_.-]*{SECRET_KEY}$|(?i)^(?:proxy-)?authorization$"
    ))
    .expect("secret key rule compiles")
});

/// True when a key (a JSON member, an env name) names a secret: `password`,
/// `AWS_SECRET_ACCESS_KEY`, `db_pass`, `Authorization`, … (case-insensitive).
pub fn is_secret_key(name: &str) -> bool {
    SECRET_KEY_NAME.is_match(name)
}

/// Redacts a JSON value in place: every string through [`redact`], and every scalar
/// under a secret key ([`is_secret_key`]) replaced by [`MASK`]. The result is still
/// valid JSON of the same shape.
pub fn redact_json(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::String(s) => {
            let r = redact(s);
            if r != *s {
                *s = r;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact_json),
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                let scalar = matches!(v, Value::String(_) | Value::Number(_) | Value::Bool(_));
                if scalar && is_secret_key(k) && v.as_str() != Some(MASK) {
                    *v = Value::String(MASK.to_owned());
                } else {
                    redact_json(v);
                }
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// Secrets are ASCII, so the rules' word boundaries are ASCII ones (`(?-u:\b)`): a
/// Unicode `\b` makes the regex engines fall back from their DFAs to the slow PikeVM on
/// any non-ASCII text (every draft has an emoji), which once cost ~300 µs per 2 KB draft.
fn ascii_boundaries(pattern: &str) -> String {
    pattern.replace(r"\b", r"(?-u:\b)")
}

struct Catalogue {
    set: RegexSet,
    rules: Vec<Regex>,
}

static CATALOGUE: LazyLock<Catalogue> = LazyLock::new(|| {
    let patterns: Vec<String> = RULES
        .iter()
        .map(|(_, p)| ascii_boundaries(&p.replace("SECRET_KEY", SECRET_KEY)))
        .collect();
    // The patterns are constants covered by tests: failing to compile is a bug.
    #[allow(clippy::expect_used)]
    Catalogue {
        set: RegexSet::new(&patterns).expect("redaction rules compile"),
        rules: patterns
            .iter()
            .map(|p| Regex::new(p).expect("redaction rule compiles"))
            .collect(),
    }
});

/// Applies every rule: redaction, then path shortening, then whitespace collapsing, then
/// the length cap (`max_chars`, counted in chars; `None` = no cap). Redaction runs first
/// so a secret cannot survive by being cut in half by the cap.
pub fn display_safe(text: &str, max_chars: Option<usize>) -> String {
    let redacted = redact(text);
    let short = shorten_paths(&redacted);
    let collapsed = collapse_whitespace(&short);
    match max_chars {
        Some(max) => truncate_chars(&collapsed, max),
        None => collapsed,
    }
}

/// Masks every secret [`RULES`] find in `text` (see the module doc for what is and is
/// not passed through here).
pub fn redact(text: &str) -> String {
    let cat = &*CATALOGUE;
    let hits = cat.set.matches(text);
    if !hits.matched_any() {
        return text.to_owned();
    }
    let mut spans: Vec<(usize, usize)> = Vec::new();
    for i in hits.iter() {
        let re = &cat.rules[i];
        for caps in re.captures_iter(text) {
            for (g, name) in re.capture_names().enumerate() {
                if !name.is_some_and(|n| n.starts_with('s')) {
                    continue;
                }
                if let Some(m) = caps.get(g) {
                    if m.as_str() != MASK {
                        spans.push((m.start(), m.end()));
                    }
                }
            }
        }
    }
    if spans.is_empty() {
        return text.to_owned();
    }
    spans.sort_unstable();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (start, end) in spans {
        if end <= at {
            continue; // inside a span already masked
        }
        if start >= at {
            out.push_str(&text[at..start]);
            out.push_str(MASK);
        }
        // else: overlaps the previous span, which already wrote the mask
        at = end;
    }
    out.push_str(&text[at..]);
    out
}

/// The start of a secret still being streamed, as the last token of a text: a key
/// prefix whose tail is still too short for its rule, a token after `Bearer`/`-u`, a
/// URL's `user:pass` before its `@`, a bot token's `id:` (see [`redact_open`]).
static PARTIAL: LazyLock<Regex> = LazyLock::new(|| {
    // A constant covered by tests: failing to compile is a bug.
    #[allow(clippy::expect_used)]
    Regex::new(&ascii_boundaries(
        r"(?i)(?:^|\s)(?:\S*(?:sk-|sk_|rk_|whsec_|gh[pousr]_|github_pat_|glpat-|aiza|xox[baprs]|xapp-|akia|asia|eyj)\S*|\S*://[^\s/@]*:[^\s/@]*|[0-9]{5,12}:\S*)\z|\b(?:bearer|-u|--user)[ \t]+\S+\z",
    ))
    .expect("partial-secret rule compiles")
});

/// [`redact`] for a text that is still growing (an open thinking segment, a commentary
/// segment, a tool's streaming arguments): also drops a last token that may be the
/// first part of a secret no rule recognises yet (`sk-ant-api0`, `postgres://u:pa`), so
/// no rendering of a half-streamed text shows part of a key. It reappears, masked or
/// not, once the token is complete (followed by whitespace or long enough to match).
pub fn redact_open(text: &str) -> String {
    let mut red = redact(text);
    let cut = partial_tail(&red);
    red.truncate(red.len() - cut);
    red
}

/// Length in bytes of `text`'s last token when it may be the first part of a secret no
/// rule recognises yet ([`PARTIAL`]), else 0. A masked token is complete.
fn partial_tail(text: &str) -> usize {
    let token_start = text.rfind(char::is_whitespace).map_or(0, |i| {
        i + text[i..].chars().next().map_or(1, char::len_utf8)
    });
    let token = &text[token_start..];
    // The last token and the word before it are all the rule looks at.
    let mut from = token_start.saturating_sub(16);
    while !text.is_char_boundary(from) {
        from -= 1;
    }
    if !token.is_empty() && !token.contains(MASK) && PARTIAL.is_match(&text[from..]) {
        token.len()
    } else {
        0
    }
}

/// [`display_safe`] for a text that is still growing (see [`redact_open`]).
pub fn display_safe_open(text: &str, max_chars: Option<usize>) -> String {
    let redacted = redact_open(text);
    let short = shorten_paths(&redacted);
    let collapsed = collapse_whitespace(&short);
    match max_chars {
        Some(max) => truncate_chars(&collapsed, max),
        None => collapsed,
    }
}

/// Display-safe text for a stream of deltas (`ProjectorService` events): each lane's
/// deltas are accumulated and the accumulated text redacted, so a secret split across
/// deltas is still caught. What goes out is the new part of the redacted text, except a
/// last token that may be a secret still being streamed (as in [`redact_open`]), held
/// back until it is complete or [`StreamRedactor::finish`]. Completed lines are dropped from the buffer
/// (rules other than PEM never cross a newline; an open PEM block keeps its lines), so a
/// long segment costs O(line) per delta, not O(segment).
#[derive(Debug, Default, Clone)]
pub struct StreamRedactor {
    /// Raw text since the last dropped line.
    raw: String,
    /// Redacted text of `raw` already sent.
    sent: String,
}

impl StreamRedactor {
    /// A lane with nothing seen.
    pub fn new() -> StreamRedactor {
        StreamRedactor::default()
    }

    /// Adds `delta`; returns the display-safe text to send now (possibly empty).
    pub fn push(&mut self, delta: &str) -> String {
        self.raw.push_str(delta);
        let upto = self.raw.len() - partial_tail(&self.raw);
        self.emit(upto)
    }

    /// The lane ended: sends whatever was held back (redacted; it is complete now).
    pub fn finish(&mut self) -> String {
        let out = self.emit(self.raw.len());
        self.raw.clear();
        self.sent.clear();
        out
    }

    fn emit(&mut self, upto: usize) -> String {
        let held = self.raw.len() - upto;
        let red = redact(&self.raw[..upto]);
        let out = if let Some(new) = red.strip_prefix(self.sent.as_str()) {
            let out = new.to_owned();
            self.sent = red;
            out
        } else if self.sent.starts_with(&red) {
            // The start of a token went out before it looked like a secret (`sk`); it is
            // held back now: nothing new to send.
            String::new()
        } else {
            // A rule re-read text already sent (rare: a quoted value with spaces): send
            // what differs from the common part, never raw text.
            let common = common_prefix(&red, &self.sent);
            let out = red[common..].to_owned();
            self.sent = red;
            out
        };
        // Drop completed lines unless a PEM block is open in them.
        if let Some(nl) = self.raw[..upto].rfind('\n') {
            // Only where no PEM block spans the newline (an open one keeps its lines).
            let in_pem = CATALOGUE.rules[0]
                .find_iter(&self.raw[..upto])
                .any(|m| m.start() <= nl && nl < m.end());
            if let (false, Some(snl)) = (in_pem, self.sent.rfind('\n')) {
                self.raw.drain(..=nl);
                self.sent.drain(..=snl);
            }
        }
        self.cut_long_line(self.raw.len() - held);
        out
    }

    /// A line that grows past [`LONG_LINE`] bytes (reasoning streamed without newlines)
    /// is cut at a whitespace [`CUT_CONTEXT`] bytes or more before its end, so a long
    /// line costs O([`LONG_LINE`]) per delta, not O(line). The cut is taken only where
    /// redacting the two sides apart gives exactly the text already sent — no secret
    /// crosses it and no rule needs what lies before it for what was seen so far —
    /// else the line is kept whole until a later delta offers a safe place.
    fn cut_long_line(&mut self, upto: usize) {
        if upto <= LONG_LINE {
            return;
        }
        let mut limit = upto - CUT_CONTEXT;
        while !self.raw.is_char_boundary(limit) {
            limit -= 1;
        }
        let Some(ws) = self.raw[..limit].rfind(char::is_whitespace) else {
            return;
        };
        let cut = ws + self.raw[ws..].chars().next().map_or(1, char::len_utf8);
        let head = redact(&self.raw[..cut]);
        let rest = redact(&self.raw[cut..upto]);
        if self.sent.len() == head.len() + rest.len()
            && self.sent.starts_with(&head)
            && self.sent.ends_with(&rest)
        {
            self.raw.drain(..cut);
            self.sent.drain(..head.len());
        }
    }
}

/// A line longer than this is cut by [`StreamRedactor`] at a safe whitespace.
const LONG_LINE: usize = 1024;
/// How much of a cut line's end [`StreamRedactor`] keeps as context for what follows.
const CUT_CONTEXT: usize = 256;

fn common_prefix(a: &str, b: &str) -> usize {
    a.char_indices()
        .zip(b.chars())
        .find(|((_, x), y)| x != y)
        .map_or(a.len().min(b.len()), |((i, _), _)| i)
}

/// Shortens file paths with three or more components to their last two: `…/a/b.rs`.
/// URLs (`scheme://…`) are left alone: the host is the useful part there.
pub fn shorten_paths(text: &str) -> String {
    let is_path_char =
        |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/' | '~');
    let mut out = String::with_capacity(text.len());
    let mut token = String::new();
    let flush = |token: &mut String, out: &mut String| {
        let is_url = out.ends_with(':') && token.starts_with("//");
        let parts: Vec<&str> = token.split('/').filter(|p| !p.is_empty()).collect();
        if !is_url && token.contains('/') && parts.len() >= 3 {
            out.push_str("…/");
            out.push_str(&parts[parts.len() - 2..].join("/"));
        } else {
            out.push_str(token);
        }
        token.clear();
    };
    for c in text.chars() {
        if is_path_char(c) {
            token.push(c);
        } else {
            flush(&mut token, &mut out);
            out.push(c);
        }
    }
    flush(&mut token, &mut out);
    out
}

/// Runs of whitespace (newlines included) become one space: a detail is one row.
pub fn collapse_whitespace(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Cuts to at most `max` chars, ending in `…` when something was cut.
pub fn truncate_chars(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    if max == 0 {
        return String::new();
    }
    let mut out: String = text.chars().take(max - 1).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `text` redacts to `want`, and redacting again changes nothing.
    fn check(text: &str, want: &str) {
        let got = redact(text);
        assert_eq!(got, want, "redact({text:?})");
        assert_eq!(redact(&got), got, "idempotent on {got:?}");
    }

    /// `text` is left alone.
    fn keep(text: &str) {
        assert_eq!(redact(text), text, "near-miss redacted");
    }

    #[test]
    fn pem_private_keys() {
        let pem = "a -----BEGIN RSA PRIVATE KEY-----\nMIIE\nabc\n-----END RSA PRIVATE KEY----- b";
        check(
            pem,
            "a -----BEGIN RSA PRIVATE KEY-----***-----END RSA PRIVATE KEY----- b",
        );
        check(
            "x -----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn (cut",
            "x -----BEGIN OPENSSH PRIVATE KEY-----***",
        );
        keep("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----");
        keep("-----BEGIN PUBLIC KEY-----\nMIIB");
    }

    #[test]
    fn bearer_and_authorization() {
        check("Bearer abcdefgh123", "Bearer ***");
        check(
            "curl -H 'Authorization: Bearer abc.def-ghi' url",
            "curl -H 'Authorization: ***' url",
        );
        check("authorization: Basic dXNlcjpwYXNz", "authorization: ***");
        check(
            r#"{"Authorization":"tok123"}"#,
            r#"{"Authorization":"***"}"#,
        );
        keep("the bearer of news");
        keep("Bearer ***");
        keep("unbearer abcdefghijk");
    }

    #[test]
    fn key_value_and_json_secret_keys() {
        check("password=hunter2 user=bob", "password=*** user=bob");
        check("GITHUB_TOKEN=abc123", "GITHUB_TOKEN=***");
        check("db_password: s3cr3t", "db_password: ***");
        check(
            "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG",
            "AWS_SECRET_ACCESS_KEY=***",
        );
        check(
            r#"{"api_key":"abc def","n":1}"#,
            r#"{"api_key":"***","n":1}"#,
        );
        check(r#"{"db_pass": "hunter2"}"#, r#"{"db_pass": "***"}"#);
        check(r#"{"Private_Key": "k"}"#, r#"{"Private_Key": "***"}"#);
        check("apikey='x y'", "apikey='***'");
        check("client_secret=zz&x=1", "client_secret=***&x=1");
        check("--password=pw1 --passwd=pw2", "--password=*** --passwd=***");
        check("PASSWD=a pass: b pwd=c", "PASSWD=*** pass: *** pwd=***");
        check("access_key: AK apiKey=x", "access_key: *** apiKey=***");
        check(r#""password": "unterminated"#, r#""password": "***"#);
        keep("the token is here");
        keep("max_tokens=5");
        keep("user=bob");
        keep("bypass=1 compass: north");
        keep("password=");
        keep("token_count: 42");
    }

    #[test]
    fn url_credentials() {
        check("postgres://u:p@h/db", "postgres://u:***@h/db");
        check(
            "see https://user:pa55@example.com/x",
            "see https://user:***@example.com/x",
        );
        check(
            "redis://:secret@localhost:6379",
            "redis://:***@localhost:6379",
        );
        keep("https://example.com:8443/a@b");
        keep("mailto:bob@example.com");
        keep("ssh git@github.com:org/repo");
    }

    #[test]
    fn curl_user() {
        check("curl -u user:pass https://x", "curl -u user:*** https://x");
        check("curl --user 'admin:s3cret' x", "curl --user 'admin:***' x");
        check("curl --user=admin:s3cret x", "curl --user=admin:*** x");
        keep("git push -u origin main");
        keep("ls -u");
    }

    #[test]
    fn mysql_and_sshpass() {
        check("mysql -u root -pSECRET db", "mysql -u root -p*** db");
        check("mysqldump -h h -pS3 x > f", "mysqldump -h h -p*** x > f");
        check("sshpass -p 'pw' ssh h", "sshpass -p *** ssh h");
        keep("mysql -u root -p db");
        keep("mkdir -pv /tmp/a");
    }

    #[test]
    fn provider_key_prefixes() {
        check("key sk-abcdefghijklmnop1234", "key sk-***");
        check("sk-ant-api03-abcdefgh_XYZ12345", "sk-ant-***");
        check("sk-proj-abcdefghijklmnopqrst", "sk-proj-***");
        check("sk_live_51Habcdefghijkl", "sk_live_***");
        check("rk_test_abcdefghijkl", "rk_test_***");
        check("glpat-abcdefghij0123456789", "glpat-***");
        check("ghp_ABCDEFGHIJKLMNOPQRSTuvwx", "ghp_***");
        check("github_pat_11ABCDEFG0123456789_abcdef", "github_pat_***");
        check("AIzaSyA1234567890abcdefghijklmnopqrstuv", "AIza***");
        check("xoxb-1234-5678-abcdef", "xoxb-***");
        check("xoxp-1234-5678-abcdef", "xoxp-***");
        check("AKIAIOSFODNN7EXAMPLE", "AKIA***");
        keep("pip install sk-learn");
        keep("sk-ant-x");
        keep("ghp_short");
        keep("AKIA is a prefix");
        keep("AIza is too short");
        keep("task-management skill");
    }

    #[test]
    fn jwts() {
        let jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U";
        check(&format!("token {jwt} end"), "token eyJ*** end");
        check(&format!("jwt={jwt}"), "jwt=eyJ***");
        keep("eyJhbGciOi is half a header");
    }

    #[test]
    fn telegram_bot_tokens() {
        let tok = format!("123456789:{}", "A".repeat(20) + &"b_-".repeat(5));
        assert_eq!(tok.len(), 10 + 35);
        check(&format!("token {tok} end"), "token 123456789:*** end");
        check(&format!("/bot{tok}/getMe"), "/bot123456789:***/getMe");
        keep("12:abc");
        keep("at 10:30 the build 2024:ok");
        keep(&format!("1:{}", "a".repeat(34)));
    }

    #[test]
    fn a_long_line_streams_in_bounded_memory_and_is_redacted_whole() {
        let mut r = StreamRedactor::new();
        let (mut text, mut out) = (String::new(), String::new());
        for i in 0..400 {
            let d = format!("word{i} password=hunter{i} key sk-ant-api03-{i:020} ");
            text.push_str(&d);
            for piece in d.as_bytes().chunks(13) {
                out.push_str(&r.push(std::str::from_utf8(piece).unwrap()));
                assert!(r.raw.len() <= LONG_LINE + 256, "{}", r.raw.len());
            }
        }
        out.push_str(&r.finish());
        assert!(!out.contains("hunter") && !out.contains("api03-0"));
        assert_eq!(out, redact(&text));
    }

    #[test]
    fn open_texts_hold_back_a_half_streamed_secret() {
        assert_eq!(redact_open("key sk-ant-api03-Ab"), "key ");
        assert_eq!(redact_open("see postgres://app:S3c"), "see ");
        assert_eq!(redact_open("Bearer tok_ab"), "Bearer ");
        assert_eq!(redact_open("mysql -u root -pSEC"), "mysql -u root -p***");
        assert_eq!(redact_open("mkdir -pv"), "mkdir -pv");
        assert_eq!(redact_open("bot 123456789:AAAA"), "bot ");
        assert_eq!(redact_open("jwt eyJhbGciOi"), "jwt ");
        // Complete secrets are masked, not dropped; ordinary last words stay.
        assert_eq!(
            redact_open("key sk-ant-api03-AbCdEfGhIjKlMnOp"),
            "key sk-ant-***"
        );
        assert_eq!(redact_open("password=hun"), "password=***");
        assert_eq!(
            redact_open("see https://example.com/a"),
            "see https://example.com/a"
        );
        assert_eq!(
            redact_open("see https://example.com:8443/"),
            "see https://example.com:8443/"
        );
        assert_eq!(redact_open("Let me check the fil"), "Let me check the fil");
        assert_eq!(redact_open("at 10:30"), "at 10:30");
    }

    #[test]
    fn ordinary_text_and_short_hex_survive() {
        keep("commit 9117334 and sha deadbeefcafe, uuid 123e4567-e89b-12d3-a456-426614174000");
        keep("The quick brown fox; a=1, b: two, tokenizer=bpe");
        keep("Use `cargo test -p x` then look at src/main.rs:42");
    }

    #[test]
    fn redaction_never_panics_on_odd_input() {
        for s in [
            "",
            "=",
            "password=",
            "password:",
            "Bearer",
            "Bearer ",
            "-----BEGIN ",
            "é:ü",
            "🔑password=🔑 x",
            "\"token\"",
            "token\":",
        ] {
            let _ = redact(s);
            let _ = display_safe(s, Some(3));
        }
        assert_eq!(redact("🔑password=🔑 x"), "🔑password=*** x");
    }

    #[test]
    fn paths_keep_their_last_two_components() {
        assert_eq!(
            shorten_paths("cat /home/u/src/app/main.rs"),
            "cat …/app/main.rs"
        );
        assert_eq!(shorten_paths("./src/lib.rs"), "…/src/lib.rs");
        assert_eq!(shorten_paths("src/lib.rs"), "src/lib.rs");
        assert_eq!(shorten_paths("/etc/hosts"), "/etc/hosts");
        assert_eq!(
            shorten_paths("see https://example.com/a/b/c now"),
            "see https://example.com/a/b/c now"
        );
        assert_eq!(shorten_paths("a=/x/y/z.txt,b"), "a=…/y/z.txt,b");
    }

    #[test]
    fn display_safe_redacts_before_truncating() {
        let s = display_safe(
            "export OPENAI_API_KEY=sk-abcdefghijklmnopqrstuv\n  ls /a/b/c/d",
            None,
        );
        assert_eq!(s, "export OPENAI_API_KEY=*** ls …/c/d");
        let cut = display_safe("password=hunter2hunter2hunter2", Some(12));
        assert!(!cut.contains("hunter"));
        assert!(cut.chars().count() <= 12);
        assert_eq!(truncate_chars("abcdef", 4), "abc…");
        assert_eq!(truncate_chars("abc", 4), "abc");
        assert_eq!(truncate_chars("abc", 0), "");
    }
}
