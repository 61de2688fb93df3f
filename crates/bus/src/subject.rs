//! Subjects (docs/architecture.md §3): `sg.raw.<tenant>.<part>.<run>` and
//! `sg.evt.<tenant>.<part>.<run>`.
//!
//! Tenant and run ids are arbitrary strings, but a NATS subject token may not contain
//! `.`, `*`, `>` or whitespace and may not be empty. [`encode_token`] maps any string to a
//! safe token and [`decode_token`] maps it back; the encoding is canonical (exactly one
//! token per string), so one run always has exactly one subject.

use std::borrow::Cow;
use std::fmt::Write as _;
use streamgate_grammar::ids::{IdError, RunId, RunRef, TenantId};

/// A subject or token that does not follow the streamgate scheme.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubjectError {
    /// The subject is not `sg.raw|evt.<tenant>.<part>.<run>`.
    #[error("not a streamgate run subject: {0:?}")]
    Malformed(String),
    /// A token holds a byte outside the safe set, a broken or non-canonical `%XX` escape.
    #[error("bad token encoding {token:?}: {reason}")]
    BadToken {
        /// The offending token.
        token: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The partition token is not a canonical decimal number.
    #[error("bad partition token {0:?}")]
    BadPartition(String),
    /// A decoded tenant or run id breaks the id rule.
    #[error(transparent)]
    InvalidId(#[from] IdError),
    /// The partition in the subject is not the one the run id hashes to.
    #[error(
        "run {run_id:?} belongs to partition {expected} of {partitions}, subject says {found}"
    )]
    WrongPartition {
        /// The run id.
        run_id: String,
        /// Partition computed with [`partition_of`].
        expected: u32,
        /// Partition found in the subject.
        found: u32,
        /// Partition count used for the check.
        partitions: u32,
    },
}

/// The token that stands for the empty string. A lone `%` can never come out of encoding a
/// non-empty string (there every `%` is followed by two hex digits), so it is unambiguous.
pub const EMPTY_TOKEN: &str = "%";

/// Bytes that pass through unescaped: they are safe in every NATS client and in file
/// names, and exclude the subject metacharacters `.`, `*`, `>`.
fn is_safe(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

/// Reversible encoding of a token into a NATS-subject-safe token.
///
/// Bytes (of the UTF-8 form) outside `[A-Za-z0-9_-]`, including `%` itself, become `%XX`
/// with uppercase hex. The empty string becomes [`EMPTY_TOKEN`] (`"%"`). Strings made only
/// of safe bytes are returned borrowed, so the common case does not allocate.
pub fn encode_token(s: &str) -> Cow<'_, str> {
    escape(s, '%')
}

/// `s` with every byte outside `[A-Za-z0-9_-]` as `<esc>XX` (uppercase hex) and the empty
/// string as `<esc>` alone; borrowed when nothing needs escaping. Subject tokens escape
/// with `%`, KV key levels with `=` (`%` is not allowed in KV keys).
pub(crate) fn escape(s: &str, esc: char) -> Cow<'_, str> {
    if s.is_empty() {
        return Cow::Owned(esc.to_string());
    }
    if s.bytes().all(is_safe) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for b in s.bytes() {
        if is_safe(b) {
            out.push(b as char);
        } else {
            // Writing to a String cannot fail.
            let _ = write!(out, "{esc}{b:02X}");
        }
    }
    Cow::Owned(out)
}

/// Inverse of [`encode_token`].
///
/// Only canonical encodings are accepted (uppercase hex, no escaped safe bytes, no raw
/// unsafe bytes), so `encode_token(&decode_token(t)?) == t` for every accepted `t`.
pub fn decode_token(s: &str) -> Result<String, SubjectError> {
    let bad = |reason| SubjectError::BadToken {
        token: s.to_owned(),
        reason,
    };
    if s == EMPTY_TOKEN {
        return Ok(String::new());
    }
    if s.is_empty() {
        return Err(bad("empty token"));
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .ok_or_else(|| bad("truncated %XX"))?;
            let v = (hex_val(hex[0]).ok_or_else(|| bad("escape is not uppercase hex"))? << 4)
                | hex_val(hex[1]).ok_or_else(|| bad("escape is not uppercase hex"))?;
            if is_safe(v) {
                return Err(bad("escaped a byte that must stay literal"));
            }
            out.push(v);
            i += 3;
        } else if is_safe(b) {
            out.push(b);
            i += 1;
        } else {
            return Err(bad("byte outside [A-Za-z0-9_-] must be escaped"));
        }
    }
    String::from_utf8(out).map_err(|_| bad("decoded bytes are not UTF-8"))
}

/// True when `s` decodes to itself: non-empty and made only of `[A-Za-z0-9_-]`.
pub(crate) fn is_literal_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(is_safe)
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// A partition number zero-padded to the width of the deployment's largest (at least two
/// digits), for names and keys that should list in partition order: `07` of 32.
pub fn partition_label(partitions: u32, partition: u32) -> String {
    let width = partitions.saturating_sub(1).max(10).to_string().len();
    format!("{partition:0width$}")
}

/// The durable consumer of one partition of a lease group: `<prefix>-pNN`
/// ([`partition_label`], so consumer listings sort by partition).
pub fn partition_durable(prefix: &str, partitions: u32, partition: u32) -> String {
    format!("{prefix}-p{}", partition_label(partitions, partition))
}

/// FNV-1a 64 of `bytes`.
pub(crate) fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .into_iter()
        .fold(OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME))
}

/// Stable partition: FNV-1a 64 of the run id's bytes, mod `partitions`.
///
/// FNV-1a is specified byte for byte, so every language computes the same partition
/// (producers outside Rust can route correctly). `partitions == 0` is treated as 1.
pub fn partition_of(run_id: &str, partitions: u32) -> u32 {
    let h = fnv1a(run_id.bytes());
    // The remainder is < partitions <= u32::MAX, so the cast is lossless.
    (h % u64::from(partitions.max(1))) as u32
}

/// Which stream a run subject belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SubjectKind {
    /// `sg.raw.…` in `SG_RAW`.
    Raw,
    /// `sg.evt.…` in `SG_EVENTS`.
    Events,
}

impl SubjectKind {
    /// The second subject token: `raw` or `evt`.
    pub fn token(self) -> &'static str {
        match self {
            SubjectKind::Raw => "raw",
            SubjectKind::Events => "evt",
        }
    }
}

/// Who a run is: tenant, run id (both checked against the id rule) and the partition the
/// run id hashes to. It owns the run's subject encoding.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RunAddr {
    /// Tenant that owns the run (decoded, as the producer named it).
    pub tenant: TenantId,
    /// The run id (decoded).
    pub run_id: RunId,
    /// `partition_of(run_id, P)` for the deployment's partition count P.
    pub partition: u32,
}

impl RunAddr {
    /// Addresses a run, computing its partition with [`partition_of`].
    pub fn new(run: &RunRef, partitions: u32) -> RunAddr {
        RunAddr {
            tenant: run.tenant.clone(),
            run_id: run.run.clone(),
            partition: partition_of(&run.run, partitions),
        }
    }

    /// Addresses a run named by plain strings, checking both against the id rule.
    pub fn parse(tenant: &str, run_id: &str, partitions: u32) -> Result<RunAddr, IdError> {
        Ok(RunAddr::new(&RunRef::new(tenant, run_id)?, partitions))
    }

    /// The run this address names.
    pub fn run(&self) -> RunRef {
        RunRef {
            tenant: self.tenant.clone(),
            run: self.run_id.clone(),
        }
    }

    /// The subject of this run in the given stream.
    pub fn subject(&self, kind: SubjectKind) -> String {
        format!(
            "sg.{}.{}.{}.{}",
            kind.token(),
            encode_token(&self.tenant),
            self.partition,
            encode_token(&self.run_id)
        )
    }

    /// `sg.raw.<enc tenant>.<part>.<enc run>`.
    pub fn raw_subject(&self) -> String {
        self.subject(SubjectKind::Raw)
    }

    /// `sg.evt.<enc tenant>.<part>.<enc run>`.
    pub fn events_subject(&self) -> String {
        self.subject(SubjectKind::Events)
    }

    /// Parses either kind of run subject. The partition is taken from the subject; use
    /// [`RunAddr::check_partition`] to verify it against the deployment's count.
    pub fn parse_subject(subject: &str) -> Result<RunAddr, SubjectError> {
        Self::parse_subject_kind(subject).map(|(addr, _)| addr)
    }

    /// Like [`RunAddr::parse_subject`], also saying which stream the subject is in.
    pub fn parse_subject_kind(subject: &str) -> Result<(RunAddr, SubjectKind), SubjectError> {
        let malformed = || SubjectError::Malformed(subject.to_owned());
        let mut it = subject.split('.');
        let (Some("sg"), Some(kind), Some(tenant), Some(part), Some(run), None) = (
            it.next(),
            it.next(),
            it.next(),
            it.next(),
            it.next(),
            it.next(),
        ) else {
            return Err(malformed());
        };
        let kind = match kind {
            "raw" => SubjectKind::Raw,
            "evt" => SubjectKind::Events,
            _ => return Err(malformed()),
        };
        // Canonical decimal only (digits, no leading zero, no sign), so one run never has
        // two spellings of its subject.
        let canonical =
            part.bytes().all(|b| b.is_ascii_digit()) && (part.len() == 1 || !part.starts_with('0'));
        let partition: u32 = part
            .parse()
            .ok()
            .filter(|_| canonical)
            .ok_or_else(|| SubjectError::BadPartition(part.to_owned()))?;
        Ok((
            RunAddr {
                tenant: TenantId::new(decode_token(tenant)?)?,
                run_id: RunId::new(decode_token(run)?)?,
                partition,
            },
            kind,
        ))
    }

    /// Errors when `partition` is not what [`partition_of`] gives for `partitions`: such a
    /// message was routed by a producer with a different partition count and would be
    /// consumed by the wrong worker.
    pub fn check_partition(&self, partitions: u32) -> Result<(), SubjectError> {
        let expected = partition_of(&self.run_id, partitions);
        if expected == self.partition {
            Ok(())
        } else {
            Err(SubjectError::WrongPartition {
                run_id: self.run_id.to_string(),
                expected,
                found: self.partition,
                partitions,
            })
        }
    }
}

/// A run's subject under any tenant, `sg.<kind>.*.<part>.<enc run>`: for operators and
/// replays that know the run id but not its tenant.
pub fn run_filter(kind: SubjectKind, run_id: &str, partitions: u32) -> String {
    format!(
        "sg.{}.*.{}.{}",
        kind.token(),
        partition_of(run_id, partitions),
        encode_token(run_id)
    )
}

/// Filter subject for one partition of `SG_RAW`: `sg.raw.*.<part>.*`.
pub fn raw_partition_filter(part: u32) -> String {
    format!("sg.raw.*.{part}.*")
}

/// Filter subject for one partition of `SG_EVENTS`: `sg.evt.*.<part>.*`.
pub fn events_partition_filter(part: u32) -> String {
    format!("sg.evt.*.{part}.*")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_tokens_are_borrowed() {
        assert!(matches!(encode_token("run-1_A"), Cow::Borrowed("run-1_A")));
        assert_eq!(encode_token(""), "%");
        assert_eq!(encode_token("a.b c%"), "a%2Eb%20c%25");
        assert_eq!(encode_token("é"), "%C3%A9");
    }

    #[test]
    fn non_canonical_tokens_are_rejected() {
        for t in ["", "%2e", "%41", "a.b", "a%2", "%C3", "a b", "*", ">"] {
            assert!(decode_token(t).is_err(), "{t:?} should not decode");
        }
    }

    #[test]
    fn subjects_round_trip() {
        let a = RunAddr::parse("acme corp", "run.7", 32).unwrap();
        assert_eq!(
            a.raw_subject(),
            format!("sg.raw.acme%20corp.{}.run%2E7", a.partition)
        );
        assert_eq!(RunAddr::parse_subject(&a.raw_subject()).unwrap(), a);
        let (b, k) = RunAddr::parse_subject_kind(&a.events_subject()).unwrap();
        assert_eq!((b, k), (a.clone(), SubjectKind::Events));
        a.check_partition(32).unwrap();
        for bad in [
            "sg.raw.t.1",
            "sg.raw.t.01.r",
            "sg.raw.t.+1.r",
            "sg.raw.t.00.r",
            "sg.raw.t..r",
            "sg.xxx.t.1.r",
            "x.raw.t.1.r",
            "sg.raw.t.1.r.x",
        ] {
            assert!(RunAddr::parse_subject(bad).is_err(), "{bad}");
        }
        for (good, partition) in [("sg.raw.t.0.r", 0), ("sg.raw.t.10.r", 10)] {
            assert_eq!(RunAddr::parse_subject(good).unwrap().partition, partition);
        }
    }
}
