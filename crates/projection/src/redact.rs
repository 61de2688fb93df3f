//! The one redactor for every channel surface: secrets masked, and for `/verbose full`
//! item details also paths shortened, whitespace collapsed, length capped.
//!
//! A chat, a webhook, the web page and `streamgate tail` are a far wider audience than
//! the archive (spec §10 item 7 keeps the archive operator/audit-only; docs/architecture.md §6:
//! channel surfaces are display-safe, raw events stay operator-only). So everything a channel
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
//!
//! Rules match twice where it matters: on the text as it is, and on a *view* of it in
//! which look-alikes read as the ASCII they imitate (Cyrillic `а` in `pаssword`, a
//! fullwidth `ｓｋ-`), invisible characters are gone (a zero-width space inside a key)
//! and JSON string escapes are decoded (`\nsk-ant-…` in a tool's argument text,
//! `{\"db_pass\": …}` nested in a string). What either finds is masked in the text as
//! it is (see [`View`]).

use regex::{Regex, RegexSet};
use std::sync::LazyLock;

/// Replacement for a redacted secret value.
pub const MASK: &str = "***";

/// Key names whose `key=value` / `key: value` / `"key": "value"` value is always masked
/// (case-insensitively, as the end of the key, so `GITHUB_TOKEN`, `db_password` and
/// `AWS_SECRET_ACCESS_KEY` count; `pass` and `pwd` only as a whole word part, so
/// `db_pass` counts and `bypass` does not).
const SECRET_KEY: &str = r"(?:password|passwd|passphrase|secret|token|api[_-]?key|access[_-]?key|account[_-]?key|private[_-]?key|secret[_-]?key|signing[_-]?key|client[_-]?secret|credentials?|cookie|(?:\b|_)auth|(?:\b|_)pass|(?:\b|_)pwd)";

/// The catalogue: (name, pattern). Every `s…` group of a match is masked.
pub const RULES: [(&str, &str); 26] = [
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
    // key=value, key: value, "key": "value" (JSON, YAML, env, CLI `--password=`); a
    // JSON value may hold escaped quotes (`"a\"b"`), and JSON nested in a JSON string
    // quotes with `\"` (`{\"db_pass\": \"x\"}`).
    (
        "secret_key_value",
        r#"(?i)(?:\b|^)[A-Za-z0-9_.-]*SECRET_KEY\\?["']?[ \t]*(?:=|:)[ \t]*(?:\\"(?P<s4>(?:[^"\\\r\n]|\\[^"])+)|"(?P<s1>(?:[^"\\\r\n]|\\.|\\\z)+)"?|'(?P<s2>[^'\r\n]+)'?|(?P<s3>[^\s"',;&)}\]\\][^\s"',;&)}\]]*))"#,
    ),
    // CLI flags with the value after a space: `--password X`, `--api-key X`, `-token X`.
    (
        "secret_flag",
        r#"(?i)(?:^|\s)--?(?:[A-Za-z0-9]+[_-])*SECRET_KEY[ \t]+["']?(?P<s>[^\s"']+)"#,
    ),
    // aws configure set aws_secret_access_key X (and any secret-named setting).
    (
        "configure_set",
        r"(?i)\bconfigure[ \t]+set[ \t]+[A-Za-z0-9_.-]*SECRET_KEY[ \t]+(?P<s>\S+)",
    ),
    // docker / podman / helm registry login -p X.
    (
        "login_password",
        r"\blogin\b[^\n|;&]*?[ \t]-p(?:[ \t]+|=)(?P<s>\S+)",
    ),
    // redis-cli -a X.
    (
        "redis_cli_password",
        r"\bredis-cli\b[^\n|;&]*?[ \t]-a[ \t]+(?P<s>\S+)",
    ),
    // scheme://user:password@host (the password may itself hold `@`: up to the last one
    // before the path).
    (
        "url_credentials",
        r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:@/]*:(?P<s>[^\s/]+)@",
    ),
    // Secret query parameters: API keys, signatures (S3, GCS, Azure SAS), OAuth codes.
    (
        "url_query_secret",
        r#"(?i)[?&;](?:key|sig|signature|x-amz-signature|x-amz-security-token|x-goog-signature|code|access_token|refresh_token|id_token|client_secret|apikey|api_key|token|password|pass|secret|auth)=(?P<s>[^&\s#"'<>]+)"#,
    ),
    // Slack and Discord webhook URLs: the path is the credential.
    (
        "slack_webhook",
        r"(?i)\bhooks\.slack\.com/(?:services|workflows|triggers)/(?P<s>[A-Za-z0-9/_-]+)",
    ),
    (
        "discord_webhook",
        r"(?i)\bdiscord(?:app)?\.com/api/webhooks/[0-9]+/(?P<s>[A-Za-z0-9_-]+)",
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
    // Hugging Face and npm access tokens.
    ("huggingface_token", r"\bhf_(?P<s>[A-Za-z0-9]{20,})"),
    ("npm_token", r"\bnpm_(?P<s>[A-Za-z0-9]{20,})"),
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

/// Masks every secret [`RULES`] find in `text`, or in its [`View`] (see the module
/// doc for what is and is not passed through here).
pub fn redact(text: &str) -> String {
    let mut spans = secret_spans(text);
    if let Some(view) = View::of(text) {
        spans.extend(
            secret_spans(&view.text)
                .into_iter()
                .map(|(start, end)| view.original(start, end)),
        );
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

/// Byte spans of `text` the rules mask (not yet masked ones).
fn secret_spans(text: &str) -> Vec<(usize, usize)> {
    let cat = &*CATALOGUE;
    // One plain search first: clean text (nearly all of it) never pays for the
    // overlapping search that tells which rules matched.
    if !cat.set.is_match(text) {
        return Vec::new();
    }
    let hits = cat.set.matches(text);
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
    spans
}

/// `text` as a secret scanner should read it: look-alike letters and digits as the ASCII
/// they imitate, invisible characters (zero-width, bidi controls, soft hyphen) dropped,
/// JSON string escapes (`\n`, `\"`, `\uXXXX`, …) decoded. Each byte of the view knows
/// the span of `text` it came from, so a secret found in the view is masked in `text`.
///
/// The look-alike table is hand-written on purpose: it maps one character to one ASCII
/// character (what keeps spans mappable), and covers the Cyrillic, Greek and fullwidth
/// forms of the letters key names and token prefixes use. UTS #39 skeletons (the
/// `unicode-security` crate) rewrite ASCII too (`0`→`O`, `rn`→`m`), which would break the
/// rules' own character classes.
struct View {
    text: String,
    /// For each byte of `text`: the span of the original it stands for.
    from: Vec<(usize, usize)>,
}

impl View {
    /// The view of `text`, or `None` when it would read the same (no backslash, no
    /// invisible character, no look-alike: the common case costs one scan).
    fn of(text: &str) -> Option<View> {
        // Plain ASCII (the common case) is checked at memory speed; only text with
        // non-ASCII characters is looked at character by character.
        let unusual = |c: char| !c.is_ascii() && (is_invisible(c) || look_alike(c).is_some());
        if !text.contains('\\') && (text.is_ascii() || !text.contains(unusual)) {
            return None;
        }
        let mut view = View {
            text: String::with_capacity(text.len()),
            from: Vec::with_capacity(text.len()),
        };
        let mut chars = text.char_indices();
        while let Some((at, c)) = chars.next() {
            let end = at + c.len_utf8();
            if c == '\\' {
                if let Some((decoded, len)) = json_escape(&text[end..]) {
                    for _ in 0..len {
                        chars.next();
                    }
                    view.push(decoded, at, end + len);
                    continue;
                }
            }
            if is_invisible(c) {
                continue;
            }
            view.push(look_alike(c).unwrap_or(c), at, end);
        }
        Some(view)
    }

    fn push(&mut self, c: char, start: usize, end: usize) {
        self.text.push(c);
        self.from
            .extend(std::iter::repeat_n((start, end), c.len_utf8()));
    }

    /// The span of the original text the view's `start..end` came from.
    fn original(&self, start: usize, end: usize) -> (usize, usize) {
        let first = self.from.get(start).map_or(0, |f| f.0);
        let last = end
            .checked_sub(1)
            .and_then(|i| self.from.get(i))
            .map_or(first, |f| f.1);
        (first, last.max(first))
    }
}

/// The character a JSON escape after a backslash stands for, and how many bytes of
/// `rest` (the text after the backslash) it takes. ASCII escapes only decode to
/// themselves or to ASCII; `\uXXXX` decodes any BMP character (surrogates excepted).
fn json_escape(rest: &str) -> Option<(char, usize)> {
    let c = match rest.as_bytes().first()? {
        b'n' => '\n',
        b't' => '\t',
        b'r' => '\r',
        b'"' => '"',
        b'\\' => '\\',
        b'/' => '/',
        b'u' => {
            let hex = rest.get(1..5)?;
            let code = u32::from_str_radix(hex, 16).ok()?;
            let c = char::from_u32(code)?;
            return Some((look_alike(c).unwrap_or(c), 5));
        }
        _ => return None,
    };
    Some((c, 1))
}

/// Characters with no glyph that can hide inside a key or a token.
fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{AD}'
            | '\u{180E}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{2069}'
            | '\u{FEFF}'
    )
}

/// The ASCII character `c` imitates, if it is a look-alike of one.
fn look_alike(c: char) -> Option<char> {
    let code = u32::from(c);
    // Fullwidth ASCII (U+FF01..U+FF5E) is ASCII shifted.
    if (0xFF01..=0xFF5E).contains(&code) {
        return char::from_u32(code - 0xFF01 + 0x21);
    }
    Some(match c {
        // Cyrillic
        'а' => 'a',
        'в' => 'b',
        'е' => 'e',
        'һ' => 'h',
        'і' => 'i',
        'ј' => 'j',
        'к' => 'k',
        'ӏ' => 'l',
        'м' => 'm',
        'о' => 'o',
        'р' => 'p',
        'ԛ' => 'q',
        'ѕ' => 's',
        'т' => 't',
        'у' => 'y',
        'ԝ' => 'w',
        'х' => 'x',
        'с' => 'c',
        'ԁ' => 'd',
        'А' => 'A',
        'В' => 'B',
        'Е' => 'E',
        'Н' => 'H',
        'І' => 'I',
        'Ј' => 'J',
        'К' => 'K',
        'М' => 'M',
        'О' => 'O',
        'Р' => 'P',
        'С' => 'C',
        'Ѕ' => 'S',
        'Т' => 'T',
        'Х' => 'X',
        'У' => 'Y',
        // Greek
        'α' => 'a',
        'ε' => 'e',
        'ι' => 'i',
        'κ' => 'k',
        'ν' => 'v',
        'ο' => 'o',
        'ρ' => 'p',
        'τ' => 't',
        'υ' => 'u',
        'χ' => 'x',
        'Α' => 'A',
        'Β' => 'B',
        'Ε' => 'E',
        'Ζ' => 'Z',
        'Η' => 'H',
        'Ι' => 'I',
        'Κ' => 'K',
        'Μ' => 'M',
        'Ν' => 'N',
        'Ο' => 'O',
        'Ρ' => 'P',
        'Τ' => 'T',
        'Υ' => 'Y',
        'Χ' => 'X',
        // Latin
        'ı' => 'i',
        'ℓ' => 'l',
        // Dashes that pass for `-` in a key prefix.
        '\u{2010}' | '\u{2011}' | '\u{2012}' | '\u{2013}' | '\u{2212}' => '-',
        _ => return None,
    })
}

/// The start of a secret still being streamed, as the last token of a text: a key
/// prefix whose tail is still too short for its rule, a token after `Bearer`/`-u`, a
/// URL's `user:pass` before its `@`, a bot token's `id:` (see [`redact_open`]).
static PARTIAL: LazyLock<Regex> = LazyLock::new(|| {
    // A constant covered by tests: failing to compile is a bug.
    #[allow(clippy::expect_used)]
    Regex::new(&ascii_boundaries(
        r"(?i)(?:^|\s)(?:\S*(?:sk-|sk_|rk_|whsec_|gh[pousr]_|github_pat_|glpat-|hf_|npm_|aiza|xox[baprs]|xapp-|akia|asia|eyj)\S*|[0-9]{5,12}:\S*)\z|\b(?:bearer|-u|--user)[ \t]+\S+\z",
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

/// A URL whose authority (`user:password@host`) is not complete yet: the password may
/// still grow, `@` included, so the token is held whatever was masked in it so far.
static PARTIAL_URL: LazyLock<Regex> = LazyLock::new(|| {
    // A constant covered by tests: failing to compile is a bug.
    #[allow(clippy::expect_used)]
    Regex::new(r"://[^\s/@]*:[^\s/]*\z").expect("partial-URL rule compiles")
});

/// Length in bytes of `text`'s last token when it may be the first part of a secret no
/// rule recognises yet ([`PARTIAL`], also read through its [`View`]), else 0. A masked
/// token is complete, except a URL still inside its authority ([`PARTIAL_URL`]).
fn partial_tail(text: &str) -> usize {
    let token_start = text.rfind(char::is_whitespace).map_or(0, |i| {
        i + text[i..].chars().next().map_or(1, char::len_utf8)
    });
    let token = &text[token_start..];
    if token.is_empty() {
        return 0;
    }
    if PARTIAL_URL.is_match(token) {
        return token.len();
    }
    // The last token and the word before it are all the rule looks at.
    let mut from = token_start.saturating_sub(16);
    while !text.is_char_boundary(from) {
        from -= 1;
    }
    let tail = &text[from..];
    let partial = PARTIAL.is_match(tail)
        || View::of(tail)
            .is_some_and(|v| PARTIAL.is_match(&v.text) || PARTIAL_URL.is_match(&v.text));
    if partial && !token.contains(MASK) {
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
    fn space_separated_flags_and_cli_passwords() {
        check("app --password hunter2 -v", "app --password *** -v");
        check(
            "x --api-key 'k1' --token=t2",
            "x --api-key '***' --token=***",
        );
        check(
            "aws configure set aws_secret_access_key wJalrXUtnFEMI",
            "aws configure set aws_secret_access_key ***",
        );
        check(
            "docker login -u bob -p S3cret reg.io",
            "docker login -u bob -p *** reg.io",
        );
        check(
            "redis-cli -h h -a S3cret ping",
            "redis-cli -h h -a *** ping",
        );
        keep("docker login --password-stdin reg.io");
        keep("aws configure set region eu-west-1");
        keep("redis-cli -h h ping");
        keep("git commit -a -m msg");
    }

    #[test]
    fn look_alikes_and_invisible_characters() {
        // Cyrillic а and о in the key name.
        check("pаsswоrd=hunter2", "pаsswоrd=***");
        // A zero-width space inside a provider key, a soft hyphen in a GitHub token.
        check(
            "key sk-ant-\u{200b}api03-Zq9Xw7Vk3Lm1Np5Rt end",
            "key sk-ant-\u{200b}*** end",
        );
        check("t ghp\u{ad}_Qw3Er5Ty7Ui9Op1As3Df5Gh", "t ghp\u{ad}_***");
        // Fullwidth letters.
        check("ｓｋ-ant-api03-Zq9Xw7Vk3Lm1Np5Rt", "ｓｋ-ant-***");
        keep("Привет, мир: a greeting");
    }

    #[test]
    fn url_parameters_webhooks_and_more_token_forms() {
        check(
            "GET https://api.x.io/v1?key=AbC123&q=1",
            "GET https://api.x.io/v1?key=***&q=1",
        );
        check(
            "https://b.blob.core.windows.net/c?sv=2022&sig=Zx%2Fq9&se=1",
            "https://b.blob.core.windows.net/c?sv=2022&sig=***&se=1",
        );
        check(
            "s3 ?X-Amz-Credential=AK&X-Amz-Signature=9f8e7d6c",
            "s3 ?X-Amz-Credential=***&X-Amz-Signature=***",
        );
        check("cb?code=4/0AbCdE&state=x", "cb?code=***&state=x");
        check(
            "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=Zm9v+YmFy/==;EndpointSuffix=x",
            "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=***;EndpointSuffix=x",
        );
        check("hf_AbCdEfGhIjKlMnOpQrStUvWxYz01", "hf_***");
        check("npm_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789", "npm_***");
        check(
            "post to https://hooks.slack.com/services/T0001/B0002/XyZ123abc now",
            "post to https://hooks.slack.com/services/*** now",
        );
        check(
            "https://discord.com/api/webhooks/123456/AbC-dEf_123",
            "https://discord.com/api/webhooks/123456/***",
        );
        check("postgres://u:p@ss@db:5432/x", "postgres://u:***@db:5432/x");
        keep("https://example.com/search?q=rust&page=2");
        keep("hf_hub is a module");
    }

    #[test]
    fn json_escapes_and_nested_json() {
        check(
            r#"{"password": "ab\"cd", "n": 1}"#,
            r#"{"password": "***", "n": 1}"#,
        );
        check(
            r#"{"input": "{\"db_pass\": \"hunter2\", \"n\": 1}"}"#,
            r#"{"input": "{\"db_pass\": \"***\", \"n\": 1}"}"#,
        );
        check(
            r#"{"command": "echo hi\nexport K=sk-ant-api03-Zq9Xw7Vk3Lm1Np5Rt"}"#,
            r#"{"command": "echo hi\nexport K=sk-ant-***"}"#,
        );
        check(
            r#"{"cmd": "a\tghp_Qw3Er5Ty7Ui9Op1As3Df5Gh\n"}"#,
            r#"{"cmd": "a\tghp_***\n"}"#,
        );
        keep(r#"{"path": "C:\\Users\\me\\notes.txt"}"#);
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
        // The password of a URL may hold `@`: held until the authority is complete.
        assert_eq!(redact_open("see postgres://u:p@ss"), "see ");
        assert_eq!(
            redact_open("see postgres://u:p@ss@db/x"),
            "see postgres://u:***@db/x"
        );
        // Look-alikes and invisible characters do not hide a prefix.
        assert_eq!(redact_open("key ѕk-ant-api03-Ab"), "key ");
        assert_eq!(redact_open("key s\u{200b}k-ant-api03-Ab"), "key ");
        assert_eq!(redact_open("tok hf_AbCd"), "tok ");
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
