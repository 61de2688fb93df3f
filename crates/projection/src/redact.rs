//! Display-safe text for `/verbose full` item details: secrets redacted, paths shortened,
//! whitespace collapsed, length capped.
//!
//! Tool arguments and results are provider/tool data; a chat is a far wider audience than
//! the archive (spec §10.7 keeps the archive operator-only), so anything that looks like a
//! credential is masked before it can reach a channel. The rules are deliberately
//! over-eager: a false positive costs a `***` in a progress row, a false negative leaks a
//! key into a chat history nobody can scrub. Hand-rolled scanners (no regex dependency)
//! keep the crate small and make every rule's boundary explicit.

/// Replacement for a redacted secret value.
pub const MASK: &str = "***";

/// Key names whose `key=value` / `key: value` value is always masked (matched
/// case-insensitively as a suffix of the key, so `GITHUB_TOKEN` and `db_password` count).
const SECRET_KEYS: [&str; 10] = [
    "password",
    "passwd",
    "secret",
    "token",
    "api_key",
    "apikey",
    "api-key",
    "authorization",
    "private_key",
    "credentials",
];

/// Token prefixes of well-known API keys, with the minimum length of the rest: short
/// tails (`sk-learn`) are ordinary words, not keys.
const KEY_PREFIXES: [(&str, usize); 12] = [
    ("sk-ant-", 8),
    ("sk-proj-", 8),
    ("sk-", 16),
    ("ghp_", 16),
    ("gho_", 16),
    ("ghs_", 16),
    ("ghu_", 16),
    ("github_pat_", 16),
    ("xoxb-", 8),
    ("xoxp-", 8),
    ("xoxa-", 8),
    ("xoxr-", 8),
];

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

/// Masks credentials: PEM blocks, `Bearer` tokens, `key=value` secrets, well-known API-key
/// prefixes and Telegram bot tokens.
pub fn redact(text: &str) -> String {
    let s = redact_pem(text);
    let s = redact_bearer(&s);
    let s = redact_key_values(&s);
    redact_tokens(&s)
}

/// `-----BEGIN …-----` through the matching `-----END …-----` (or the end of the text
/// when the block is cut off: a half key is still a key).
fn redact_pem(text: &str) -> String {
    const BEGIN: &str = "-----BEGIN ";
    const END: &str = "-----END ";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(BEGIN) {
        out.push_str(&rest[..start]);
        out.push_str("[REDACTED PEM]");
        let after = &rest[start + BEGIN.len()..];
        rest = match after.find(END) {
            Some(end) => {
                let tail = &after[end + END.len()..];
                // Skip the label and its closing dashes.
                match tail.find("-----") {
                    Some(close) => &tail[close + 5..],
                    None => "",
                }
            }
            None => "",
        };
    }
    out.push_str(rest);
    out
}

fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '~' | '+' | '/' | '=')
}

/// `Bearer <token>` (any case) → `Bearer ***`.
fn redact_bearer(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while let Some(pos) = lower[i..].find("bearer") {
        let at = i + pos;
        let word_start = at == 0 || !text[..at].chars().next_back().is_some_and(is_ident_char);
        let after = at + "bearer".len();
        let ws_len = text[after..]
            .chars()
            .take_while(|c| *c == ' ' || *c == '\t')
            .map(char::len_utf8)
            .sum::<usize>();
        let tok_start = after + ws_len;
        let tok_len = text[tok_start..]
            .chars()
            .take_while(|c| is_token_char(*c))
            .map(char::len_utf8)
            .sum::<usize>();
        if word_start && ws_len > 0 && tok_len > 0 && &text[tok_start..tok_start + tok_len] != MASK
        {
            out.push_str(&text[i..tok_start]);
            out.push_str(MASK);
            i = tok_start + tok_len;
        } else {
            out.push_str(&text[i..after]);
            i = after;
        }
    }
    out.push_str(&text[i..]);
    out
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// `password=x`, `API_KEY: "x"`, `{"token":"x"}` → the value becomes `***`.
fn redact_key_values(text: &str) -> String {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let (_, c) = chars[i];
        let starts_ident = is_ident_char(c) && (i == 0 || !is_ident_char(chars[i - 1].1));
        if !starts_ident {
            out.push(c);
            i += 1;
            continue;
        }
        let mut j = i;
        while j < chars.len() && is_ident_char(chars[j].1) {
            j += 1;
        }
        let ident: String = chars[i..j].iter().map(|(_, c)| *c).collect();
        let lower = ident.to_ascii_lowercase();
        let secret = SECRET_KEYS.iter().any(|k| lower.ends_with(k));
        // Look for: optional closing quote, spaces, `=` or `:`, spaces, optional opening quote.
        let mut k = j;
        if k < chars.len() && matches!(chars[k].1, '"' | '\'') {
            k += 1;
        }
        while k < chars.len() && chars[k].1 == ' ' {
            k += 1;
        }
        let has_sep = k < chars.len() && matches!(chars[k].1, '=' | ':');
        if !secret || !has_sep {
            out.push_str(&ident);
            i = j;
            continue;
        }
        k += 1;
        while k < chars.len() && chars[k].1 == ' ' {
            k += 1;
        }
        let quote = match chars.get(k) {
            Some((_, q @ ('"' | '\''))) => {
                k += 1;
                Some(*q)
            }
            _ => None,
        };
        // `authorization: Bearer x` has a space inside its value: run to the line end.
        let to_eol = lower.ends_with("authorization") && quote.is_none();
        let mut v = k;
        while v < chars.len() {
            let ch = chars[v].1;
            let stop = match quote {
                Some(q) => ch == q,
                None if to_eol => ch == '\n' || ch == ',' || ch == ';',
                None => ch.is_whitespace() || matches!(ch, ',' | ';' | '&' | '}' | ']' | ')'),
            };
            if stop {
                break;
            }
            v += 1;
        }
        let byte = |idx: usize| chars.get(idx).map_or(text.len(), |(b, _)| *b);
        out.push_str(&text[byte(i)..byte(k)]);
        if v > k {
            out.push_str(MASK);
        }
        i = v;
    }
    out
}

/// API-key prefixes, AWS access key ids and Telegram bot tokens, matched per token.
fn redact_tokens(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        out.push_str(&mask_token(word));
        word.clear();
    };
    for c in text.chars() {
        if is_ident_char(c) || c == ':' {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

/// One token (ident chars plus `:`, so `123:abc` bot tokens stay whole).
fn mask_token(word: &str) -> String {
    if word.is_empty() {
        return String::new();
    }
    // A `:` joins pieces that are judged separately (`key:sk-…`), except for bot tokens.
    if word.contains(':') {
        if is_telegram_bot_token(word) {
            return MASK.to_owned();
        }
        // Bot API URLs glue the token to `bot`: `/bot123:AAA…/getMe`.
        if let Some(rest) = word.strip_prefix("bot") {
            if is_telegram_bot_token(rest) {
                return format!("bot{MASK}");
            }
        }
        return word
            .split(':')
            .map(mask_token)
            .collect::<Vec<_>>()
            .join(":");
    }
    for (prefix, min_rest) in KEY_PREFIXES {
        if let Some(rest) = word.strip_prefix(prefix) {
            if rest.chars().count() >= min_rest {
                return format!("{prefix}{MASK}");
            }
            // A longer prefix that did not qualify must not fall through to `sk-`.
            if prefix.starts_with("sk-") && prefix != "sk-" {
                return word.to_owned();
            }
        }
    }
    if is_aws_key_id(word) {
        return format!("AKIA{MASK}");
    }
    word.to_owned()
}

/// `AKIA` + 16 upper-case letters or digits.
fn is_aws_key_id(word: &str) -> bool {
    word.len() == 20
        && word.starts_with("AKIA")
        && word[4..]
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
}

/// `\d+:[A-Za-z0-9_-]{35}` (the whole token).
fn is_telegram_bot_token(word: &str) -> bool {
    let Some((id, secret)) = word.split_once(':') else {
        return false;
    };
    !id.is_empty()
        && id.chars().all(|c| c.is_ascii_digit())
        && secret.chars().count() == 35
        && secret.chars().all(is_ident_char)
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

    #[test]
    fn bearer_tokens_are_masked() {
        assert_eq!(redact("Bearer xyz"), "Bearer ***");
        assert_eq!(
            redact("curl -H 'X: bearer abc.def-ghi' url"),
            "curl -H 'X: bearer ***' url"
        );
        assert_eq!(redact("the bearer of news"), "the bearer *** news");
        // Not a word start: left alone.
        assert_eq!(redact("unbearer x"), "unbearer x");
        assert_eq!(redact("Bearer ***"), "Bearer ***");
    }

    #[test]
    fn api_key_prefixes_are_masked() {
        assert_eq!(redact("key sk-abcdefghijklmnop1234"), "key sk-***");
        assert_eq!(redact("sk-ant-api03-abcdefgh_XYZ"), "sk-ant-***");
        assert_eq!(redact("ghp_ABCDEFGHIJKLMNOPQRSTuvwx"), "ghp_***");
        assert_eq!(redact("xoxb-1234-5678-abcdef"), "xoxb-***");
        assert_eq!(redact("xoxp-1234-5678-abcdef"), "xoxp-***");
        assert_eq!(redact("AKIAIOSFODNN7EXAMPLE"), "AKIA***");
        // Ordinary words that merely share a prefix survive.
        assert_eq!(redact("pip install sk-learn"), "pip install sk-learn");
        assert_eq!(redact("sk-ant-x"), "sk-ant-x");
        assert_eq!(redact("AKIA is a prefix"), "AKIA is a prefix");
    }

    #[test]
    fn key_value_secrets_are_masked() {
        assert_eq!(redact("password=hunter2 user=bob"), "password=*** user=bob");
        assert_eq!(redact("GITHUB_TOKEN=abc123"), "GITHUB_TOKEN=***");
        assert_eq!(redact("db_password: s3cr3t"), "db_password: ***");
        assert_eq!(
            redact(r#"{"api_key":"abc def","n":1}"#),
            r#"{"api_key":"***","n":1}"#
        );
        assert_eq!(redact("apikey='x y'"), "apikey='***'");
        assert_eq!(redact("client_secret=zz&x=1"), "client_secret=***&x=1");
        assert_eq!(
            redact("Authorization: Bearer abc.def\nnext"),
            "Authorization: ***\nnext"
        );
        // No separator, or a non-secret key: untouched.
        assert_eq!(redact("the token is here"), "the token is here");
        assert_eq!(redact("max_tokens=5"), "max_tokens=5");
        assert_eq!(redact("user=bob"), "user=bob");
    }

    #[test]
    fn pem_blocks_are_masked() {
        let pem = "a -----BEGIN RSA PRIVATE KEY-----\nMIIE\nabc\n-----END RSA PRIVATE KEY----- b";
        assert_eq!(redact(pem), "a [REDACTED PEM] b");
        assert_eq!(
            redact("x -----BEGIN PRIVATE KEY-----\nMIIE (cut"),
            "x [REDACTED PEM]"
        );
    }

    #[test]
    fn telegram_bot_tokens_are_masked() {
        let tok = format!("123456789:{}", "A".repeat(20) + &"b_-".repeat(5));
        assert_eq!(tok.len(), 10 + 35);
        assert_eq!(redact(&format!("token {tok} end")), "token *** end");
        assert_eq!(redact(&format!("/bot{tok}/getMe")), "/bot***/getMe");
        // 34 chars after the colon is not a bot token.
        assert_eq!(redact("12:abc"), "12:abc");
        let short = format!("1:{}", "a".repeat(34));
        assert_eq!(redact(&short), short);
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
        assert_eq!(redact("password="), "password=");
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
