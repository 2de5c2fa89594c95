//! The replicated KV store's operations and answers (rules in `machine::kv`), and the lock
//! operations built on it (rules in `machine::locks`).

use serde::{Deserialize, Serialize};

use crate::time::Stamp;

/// The namespace lock permits live in.
pub const LOCKS_NS: &str = "queen-locks";
/// The KV namespace of traces (under each tenant's scope); `traces::NS`.
pub const TRACES_NS: &str = "queen-traces";
/// The KV namespace of streams (under each tenant's scope); `streams::NS`.
pub const STREAMS_NS: &str = "queen-streams";
/// The KV namespace (of the tenant) that holds the declared ephemeral queues' options, one row
/// per queue keyed by the queue's name: configuration is replicated, contents are not;
/// `ephemeral::CONFIG_NS`.
pub const EPHEMERAL_NS: &str = "queen-ephemeral";
/// The KV namespace of every sink document; `sink::documents::NS`.
pub const SINK_NS: &str = "queen-s3";
/// Most rows one `getPrefix` page returns.
pub const MAX_PREFIX_LIMIT: u32 = 1000;

/// Why a namespace or key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvNameError {
    /// The namespace breaks `^[a-z0-9][a-z0-9._-]{0,63}$`.
    #[error("must match ^[a-z0-9][a-z0-9._-]{{0,63}}$")]
    Namespace,
    /// The key is empty, too long (over 1024 bytes) or has a NUL byte.
    #[error("must be 1 to 1024 bytes without NUL")]
    Key,
}

/// Validate a namespace.
///
/// # Errors
/// When it breaks the namespace rule.
pub fn check_ns(ns: &str) -> Result<(), KvNameError> {
    let b = ns.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 64
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter().all(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'.' | b'_' | b'-')
        });
    if ok {
        Ok(())
    } else {
        Err(KvNameError::Namespace)
    }
}

/// The namespaces the node keeps its own records in (lock permits, traces, stream state,
/// ephemeral settings, the sink's documents): the generic KV routes refuse writes to them, so
/// a client cannot forge a lock or a stream's state through plain KV (reads and a lock
/// guard's `check` stay allowed). Named here, not by their owners, so this rule needs none of
/// the features that keep records in them.
pub const RESERVED_NAMESPACES: [&str; 5] = [LOCKS_NS, TRACES_NS, STREAMS_NS, EPHEMERAL_NS, SINK_NS];

/// Whether a namespace is one of [`RESERVED_NAMESPACES`].
#[must_use]
pub fn is_reserved_ns(ns: &str) -> bool {
    RESERVED_NAMESPACES.contains(&ns)
}

/// Validate a key.
///
/// # Errors
/// When it is empty, too long or has a NUL byte.
pub fn check_key(key: &str) -> Result<(), KvNameError> {
    if key.is_empty() || key.len() > 1024 || key.contains('\0') {
        Err(KvNameError::Key)
    } else {
        Ok(())
    }
}

/// A part of a composed key (`a/b/c`) with `%` and `/` escaped, so that a part holding `/`
/// never reads as a prefix of another's keys.
#[must_use]
pub fn escape_part(part: &str) -> String {
    let mut out = String::with_capacity(part.len());
    for c in part.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            c => out.push(c),
        }
    }
    out
}

/// How long a written row lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Expiry {
    /// This many seconds after the write.
    Ttl(u64),
    /// Until deleted.
    Forever,
}

/// A number for `incr`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Num {
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
}

impl Num {
    /// As a float.
    #[must_use]
    pub fn as_f64(self) -> f64 {
        match self {
            Num::Int(i) => i as f64,
            Num::Float(f) => f,
        }
    }
}

/// One KV operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum KvOp {
    /// Read one key.
    Get {
        /// Namespace.
        ns: String,
        /// Key.
        key: String,
    },
    /// Read several keys.
    GetMany {
        /// Namespace.
        ns: String,
        /// Keys.
        keys: Vec<String>,
    },
    /// Read a page of keys with a prefix.
    GetPrefix {
        /// Namespace.
        ns: String,
        /// Prefix (non-empty).
        prefix: String,
        /// Exclusive start key.
        after: Option<String>,
        /// Page size (clamped 1..=1000).
        limit: u32,
        /// Leave values out.
        keys_only: bool,
    },
    /// Write a value (compare-and-set with `expect`: 0 = must be absent).
    Put {
        /// Namespace.
        ns: String,
        /// Key.
        key: String,
        /// JSON text.
        value: Vec<u8>,
        /// Lifetime.
        expiry: Expiry,
        /// Version precondition.
        expect: Option<u64>,
        /// A lost precondition rolls the whole call back.
        required: bool,
    },
    /// Delete a key.
    Delete {
        /// Namespace.
        ns: String,
        /// Key.
        key: String,
        /// Version precondition.
        expect: Option<u64>,
        /// A lost precondition rolls the whole call back.
        required: bool,
    },
    /// Check a version without writing (0 = must be absent).
    Check {
        /// Namespace.
        ns: String,
        /// Key.
        key: String,
        /// Expected version.
        expect: u64,
        /// A lost precondition rolls the whole call back.
        required: bool,
    },
    /// Add to a number (absent or expired counts as 0). Integers add exactly in i64; a float
    /// is used only when the stored value or the delta has a fraction or exponent. A sum that
    /// does not fit (or is not finite) is not applied, reason `overflow`.
    Incr {
        /// Namespace.
        ns: String,
        /// Key.
        key: String,
        /// What to add.
        delta: Num,
        /// Lowest allowed result (integer sums are compared with it exactly).
        min: Option<f64>,
        /// Highest allowed result.
        max: Option<f64>,
        /// Lifetime when the row is created.
        expiry: Expiry,
        /// A refusal rolls the whole call back.
        required: bool,
    },
}

/// A row as answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvRowView {
    /// The key.
    pub key: String,
    /// JSON text (empty when keys only).
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    /// Version (the log index of its last write).
    pub version: u64,
    /// Expiry, if any.
    pub expires: Option<Stamp>,
    /// Last write.
    pub updated: Stamp,
    /// First write of this incarnation.
    pub created: Stamp,
}

/// One operation's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvResult {
    /// `get`.
    Get(Option<KvRowView>),
    /// `getMany`.
    Many {
        /// Found rows.
        rows: Vec<KvRowView>,
        /// Absent keys.
        missing: Vec<String>,
    },
    /// `getPrefix`.
    Prefix {
        /// The page.
        rows: Vec<KvRowView>,
        /// Whether more rows follow.
        truncated: bool,
        /// Where the next page starts (exclusive).
        next_after: Option<String>,
        /// Values were left out.
        keys_only: bool,
    },
    /// Writes and `check`.
    Write {
        /// Whether it took effect.
        applied: bool,
        /// Why not: version, absent, exists, limit, type, overflow (an `incr` whose exact sum
        /// is outside i64, or whose float sum is not finite), rolled_back.
        reason: Option<String>,
        /// The row now (the winner's when not applied).
        current: Option<KvRowView>,
    },
}

/// A KV call's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvOutcome {
    /// Index-aligned with the operations.
    pub results: Vec<KvResult>,
    /// The first required operation that failed (everything was rolled back).
    pub failed: Option<usize>,
}

/// A lock operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LockOp {
    /// Take a permit.
    Acquire {
        /// Lock name.
        name: String,
        /// Permit lifetime.
        ttl: u64,
        /// Who holds it.
        owner: String,
        /// Permits (1 = a mutex).
        limit: u32,
    },
    /// Prolong a permit; its token changes.
    Renew {
        /// Lock name.
        name: String,
        /// Current token.
        token: u64,
        /// New lifetime.
        ttl: u64,
        /// Permit slot.
        slot: u32,
    },
    /// Give a permit back.
    Release {
        /// Lock name.
        name: String,
        /// Current token.
        token: u64,
        /// Permit slot.
        slot: u32,
    },
    /// Who holds the lock.
    Get {
        /// Lock name.
        name: String,
    },
}

/// A permit holder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// Slot.
    pub slot: u32,
    /// Owner.
    pub owner: String,
    /// Token (the row's version).
    pub token: u64,
    /// Held since.
    pub since: Stamp,
    /// Expires.
    pub expires: Option<Stamp>,
    /// Last renewal.
    pub renewed: Stamp,
}

/// A lock operation's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LockResult {
    /// `acquire` won (or `already` held by the same owner).
    Acquired {
        /// Slot.
        slot: u32,
        /// Token.
        token: u64,
        /// Owner.
        owner: String,
        /// The same owner already held it.
        already: bool,
    },
    /// `acquire` lost.
    NotAcquired {
        /// held (mutex) or contended (semaphore).
        reason: String,
        /// Current holders.
        holders: Vec<Holder>,
    },
    /// `renew` worked.
    Renewed {
        /// Slot.
        slot: u32,
        /// New token.
        token: u64,
    },
    /// `renew` found the permit gone.
    Lost {
        /// Current holders.
        holders: Vec<Holder>,
    },
    /// `release`.
    Released(bool),
    /// `get`.
    Held(Vec<Holder>),
}

impl KvOp {
    /// Whether the operation changes a row (a reserved namespace refuses it from clients).
    #[must_use]
    pub fn writes(&self) -> bool {
        matches!(
            self,
            KvOp::Put { .. } | KvOp::Delete { .. } | KvOp::Incr { .. }
        )
    }

    /// The namespace the operation works in.
    #[must_use]
    pub fn ns(&self) -> &str {
        match self {
            KvOp::Get { ns, .. }
            | KvOp::GetMany { ns, .. }
            | KvOp::GetPrefix { ns, .. }
            | KvOp::Put { ns, .. }
            | KvOp::Delete { ns, .. }
            | KvOp::Check { ns, .. }
            | KvOp::Incr { ns, .. } => ns,
        }
    }

    /// The namespace the operation works in (a tenant's scope is put in front of it).
    pub fn ns_mut(&mut self) -> &mut String {
        match self {
            KvOp::Get { ns, .. }
            | KvOp::GetMany { ns, .. }
            | KvOp::GetPrefix { ns, .. }
            | KvOp::Put { ns, .. }
            | KvOp::Delete { ns, .. }
            | KvOp::Check { ns, .. }
            | KvOp::Incr { ns, .. } => ns,
        }
    }
}

impl LockOp {
    /// The lock the operation works on (a tenant's scope is put in front of it).
    pub fn name_mut(&mut self) -> &mut String {
        match self {
            LockOp::Acquire { name, .. }
            | LockOp::Renew { name, .. }
            | LockOp::Release { name, .. }
            | LockOp::Get { name } => name,
        }
    }
}

/// The key of a permit row.
#[must_use]
pub fn permit_key(name: &str, slot: u32) -> String {
    format!("{name}#{slot}")
}
