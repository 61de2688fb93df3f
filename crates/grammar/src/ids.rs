//! The one rule for identifiers at every front door (HTTP and gRPC ingest, raw NATS
//! messages, the CLI): tenant, run and session ids are UTF-8, 1–[`MAX_ID_BYTES`] bytes,
//! with no control characters, invisible format characters (bidi overrides, zero widths,
//! the BOM) or line/paragraph separators.
//!
//! Why: ids end up in NATS subjects, message ids, KV keys (escaped up to 3× their size)
//! and outbound headers (webhooks). A control character breaks a header line; an id of
//! kilobytes pushes a subject past the broker's control-line limit, which drops the
//! whole connection. 256 bytes keeps every derived key far inside NATS' limits.
//!
//! [`TenantId`], [`RunId`], [`SessionId`] and [`RunRef`] hold ids that passed the rule:
//! a front door parses into them once (the normalizer's `RunSpec`, the bus's `RunAddr`
//! as it parses a subject, the run stream's routes), and what takes them never checks
//! again.

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

/// Defines an id type whose only constructor checks [`check`]: a value of it has passed
/// the rule, so code that holds one never checks again.
macro_rules! typed_id {
    ($(#[$doc:meta])* $name:ident, $kind:expr) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Checks `value` against the id rule.
            pub fn new(value: impl Into<String>) -> Result<$name, IdError> {
                let value = value.into();
                check($kind, &value)?;
                Ok($name(value))
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The id's text, owned.
            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                std::fmt::Debug::fmt(&self.0, f)
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<$name> for String {
            fn eq(&self, other: &$name) -> bool {
                *self == other.0
            }
        }

        impl PartialEq<$name> for str {
            fn eq(&self, other: &$name) -> bool {
                *self == other.0
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl std::str::FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<$name, IdError> {
                $name::new(s)
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<$name, D::Error> {
                let s = String::deserialize(d)?;
                $name::new(s).map_err(serde::de::Error::custom)
            }
        }
    };
}

typed_id!(
    /// A tenant, checked against the id rule.
    TenantId,
    IdKind::Tenant
);
typed_id!(
    /// A run id, checked against the id rule.
    RunId,
    IdKind::Run
);
typed_id!(
    /// A chat session key, checked against the id rule.
    SessionId,
    IdKind::Session
);

/// One run: its tenant and its id, both checked. Runs are only ever named by this pair —
/// the same run id under two tenants is two runs.
#[derive(
    Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, serde::Serialize, serde::Deserialize,
)]
pub struct RunRef {
    /// The tenant that owns the run.
    pub tenant: TenantId,
    /// The run's id.
    pub run: RunId,
}

impl RunRef {
    /// Checks both ids; the error names the one that breaks the rule.
    pub fn new(tenant: &str, run: &str) -> Result<RunRef, IdError> {
        Ok(RunRef {
            tenant: TenantId::new(tenant)?,
            run: RunId::new(run)?,
        })
    }
}

impl std::fmt::Display for RunRef {
    /// `<tenant>/<run>`, for logs and messages (not a key: a `/` may be in either id).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.tenant, self.run)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_ids_hold_only_what_passes_the_rule() {
        let run = RunRef::new("acme", "run 1").unwrap();
        assert_eq!(run.tenant, "acme");
        assert_eq!(&*run.run, "run 1");
        assert_eq!(run.to_string(), "acme/run 1");
        assert_eq!(
            RunRef::new("acme", "a\nb").unwrap_err().to_string(),
            "run id: no control characters (found U+000A at byte 1)"
        );
        assert_eq!(
            RunRef::new("", "r").unwrap_err(),
            IdError::Empty(IdKind::Tenant)
        );
        assert!("x".repeat(257).parse::<SessionId>().is_err());
        // Serde: plain strings on the wire, and the rule on the way in.
        let json = serde_json::to_string(&run).unwrap();
        assert_eq!(json, r#"{"tenant":"acme","run":"run 1"}"#);
        assert_eq!(serde_json::from_str::<RunRef>(&json).unwrap(), run);
        let bad = serde_json::from_str::<RunId>("\"r\\u202e\"").unwrap_err();
        assert!(bad.to_string().contains("bidi"), "{bad}");
    }

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
        assert!(SessionId::new("s\n").is_err());
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
        assert!(RunRef::new("t", "r").is_ok());
    }
}
