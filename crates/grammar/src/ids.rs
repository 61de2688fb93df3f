//! The one rule for identifiers at every front door (HTTP and gRPC ingest, raw NATS
//! messages, the CLI): tenant, run and session ids are UTF-8, 1–[`MAX_ID_BYTES`] bytes,
//! with no control characters, invisible format characters (bidi overrides, zero widths,
//! the BOM) or line/paragraph separators.
//!
//! Why: ids end up in NATS subjects, message ids, KV keys (escaped up to 3× their size)
//! and outbound headers (webhooks). A control character breaks a header line; an id of
//! kilobytes pushes a subject past the broker's control-line limit, which drops the
//! whole connection. 256 bytes keeps every derived key far inside NATS' limits.

/// Longest id, in UTF-8 bytes.
pub const MAX_ID_BYTES: usize = 256;

/// Which id a value is (named in errors).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IdKind {
    /// A tenant.
    Tenant,
    /// A run id.
    Run,
    /// A chat session key.
    Session,
}

impl IdKind {
    /// `tenant`, `run id` or `session`.
    pub fn name(self) -> &'static str {
        match self {
            IdKind::Tenant => "tenant",
            IdKind::Run => "run id",
            IdKind::Session => "session",
        }
    }
}

impl std::fmt::Display for IdKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An id that breaks the rule; the message names the id and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// Empty.
    #[error("{0}: must not be empty (1-256 bytes)")]
    Empty(IdKind),
    /// Longer than [`MAX_ID_BYTES`].
    #[error("{kind}: at most 256 bytes (got {len})")]
    TooLong {
        /// Which id.
        kind: IdKind,
        /// Its length in bytes.
        len: usize,
    },
    /// Holds a control character.
    #[error("{kind}: no control characters (found U+{code:04X} at byte {at})")]
    Control {
        /// Which id.
        kind: IdKind,
        /// The character's code point.
        code: u32,
        /// Its byte offset.
        at: usize,
    },
    /// Holds an invisible format character (Unicode category Cf: bidi overrides, zero
    /// widths, the BOM) or a line/paragraph separator (Zl, Zp): an id that displays as
    /// something it is not, or breaks a line where a header or log expects none.
    #[error("{kind}: no invisible format or separator characters such as bidi overrides (found U+{code:04X} at byte {at})")]
    Invisible {
        /// Which id.
        kind: IdKind,
        /// The character's code point.
        code: u32,
        /// Its byte offset.
        at: usize,
    },
}

/// True for the Unicode format characters (general category Cf, Unicode 15) and the
/// line and paragraph separators (Zl, Zp).
fn is_invisible(c: char) -> bool {
    matches!(
        u32::from(c),
        0xAD | 0x600..=0x605
            | 0x61C
            | 0x6DD
            | 0x70F
            | 0x890..=0x891
            | 0x8E2
            | 0x180E
            | 0x200B..=0x200F
            | 0x2028..=0x202E
            | 0x2060..=0x2064
            | 0x2066..=0x206F
            | 0xFEFF
            | 0xFFF9..=0xFFFB
            | 0x110BD
            | 0x110CD
            | 0x13430..=0x1343F
            | 0x1BCA0..=0x1BCA3
            | 0x1D173..=0x1D17A
            | 0xE0001
            | 0xE0020..=0xE007F
    )
}

/// Checks `value` against the rule.
pub fn check(kind: IdKind, value: &str) -> Result<(), IdError> {
    if value.is_empty() {
        return Err(IdError::Empty(kind));
    }
    if value.len() > MAX_ID_BYTES {
        return Err(IdError::TooLong {
            kind,
            len: value.len(),
        });
    }
    if let Some((at, c)) = value.char_indices().find(|(_, c)| c.is_control()) {
        return Err(IdError::Control {
            kind,
            code: u32::from(c),
            at,
        });
    }
    if let Some((at, c)) = value.char_indices().find(|(_, c)| is_invisible(*c)) {
        return Err(IdError::Invisible {
            kind,
            code: u32::from(c),
            at,
        });
    }
    Ok(())
}

/// The tenant of requests that name none (the CLI's `--tenant` default, an empty
/// `tenant` field of an archive request).
pub const DEFAULT_TENANT: &str = "default";

/// `tenant`, or [`DEFAULT_TENANT`] when it is empty.
pub fn tenant_or_default(tenant: &str) -> &str {
    if tenant.is_empty() {
        DEFAULT_TENANT
    } else {
        tenant
    }
}

/// Checks a tenant, a run id and an optional session against the rule.
pub fn check_run(tenant: &str, run_id: &str, session: Option<&str>) -> Result<(), IdError> {
    check(IdKind::Tenant, tenant)?;
    check(IdKind::Run, run_id)?;
    if let Some(s) = session {
        check(IdKind::Session, s)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule() {
        assert!(check(IdKind::Run, "r").is_ok());
        assert!(check(IdKind::Run, &"é".repeat(128)).is_ok());
        assert!(check(IdKind::Run, &"x".repeat(256)).is_ok());
        assert!(check(IdKind::Run, "run 1 / é 中 🦀").is_ok());
        assert_eq!(
            check(IdKind::Run, &"x".repeat(4100))
                .unwrap_err()
                .to_string(),
            "run id: at most 256 bytes (got 4100)"
        );
        assert_eq!(
            check(IdKind::Run, &"x".repeat(257)).unwrap_err(),
            IdError::TooLong {
                kind: IdKind::Run,
                len: 257
            }
        );
        assert_eq!(
            check(IdKind::Tenant, "").unwrap_err().to_string(),
            "tenant: must not be empty (1-256 bytes)"
        );
        assert_eq!(
            check(IdKind::Run, "a\nb").unwrap_err().to_string(),
            "run id: no control characters (found U+000A at byte 1)"
        );
        for bad in ["\0", "a\rb", "\u{7f}", "\u{85}x", "tab\t"] {
            assert!(check(IdKind::Session, bad).is_err(), "{bad:?}");
        }
        assert!(check_run("t", "r", Some("s\n")).is_err());
        // Invisible format characters and separators (bidi override, BOM, U+2028).
        for bad in [
            "a\u{202E}b",
            "\u{FEFF}r",
            "r\u{2028}",
            "r\u{2029}",
            "z\u{200B}w",
            "\u{2066}x",
        ] {
            let e = check(IdKind::Run, bad).unwrap_err();
            assert!(e.to_string().contains("bidi overrides"), "{bad:?}: {e}");
        }
        assert!(check(IdKind::Run, "café-日本-ok").is_ok());
        assert!(check_run("t", "r", None).is_ok());
    }
}
