//! Ephemeral queues: messages held in one node's memory, never in the log.
//!
//! The rules live here without I/O or clock (every call is given `now` in milliseconds):
//! - [`options`]: what `configure` accepts, the node's ceilings and the effective bounds;
//! - [`Rings`]: the rings of the partitions a node owns, with each group's position, leases,
//!   redeliveries, budgets and drops;
//! - [`owner`]: which member owns a partition (highest random weight over the live members);
//! - [`MessageId`]: the opaque id a pop hands out, which names the incarnation that made it.
//!
//! Each (queue, partition) ring is FIFO. Every consumer group has its own position over the one
//! ring (a group is the whole of the consumption semantics: same group = competing consumers,
//! own group = fan-out, no group = queue mode). A message leaves the ring when every group that
//! consumes the partition has passed it, or when a bound, its age or its retry limit drops it.

mod engine;
pub mod options;
pub mod owner;

pub use engine::{
    AckOutcome, AckStatus, Delivered, Drops, GroupExport, GroupView, PartitionView, PushRefusal,
    QueueView, RingExport, Rings, Take, Totals,
};
pub use options::{Declared, Limits, Options, Policy, Window};

use serde::{Deserialize, Serialize};

pub use crate::kv::EPHEMERAL_NS as CONFIG_NS;

/// The most bytes an ephemeral queue, partition or group name may have.
pub const MAX_NAME_BYTES: usize = 255;

/// The group of a pop or ack that names none (queue mode).
pub const QUEUE_MODE_GROUP: &str = crate::names::QUEUE_MODE_GROUP;

/// The partition of a push that names none.
pub const DEFAULT_PARTITION: &str = crate::names::DEFAULT_PARTITION;

/// Memory counted per held message beside its payload (the ring slot, the stamp, the deque).
pub const MESSAGE_OVERHEAD: u64 = 48;

/// Whether `name` may name an ephemeral queue, partition or group: 1 to 255 bytes and no
/// control character (routes carry it percent-encoded, so `/` is allowed).
///
/// # Errors
/// A sentence saying what is wrong.
pub fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("must not be empty");
    }
    if name.len() > MAX_NAME_BYTES {
        return Err("must be at most 255 bytes");
    }
    if name.chars().any(char::is_control) {
        return Err("must not contain control characters");
    }
    Ok(())
}

/// The id of a delivered message: `e:<epoch, 16 hex digits>:<seq>:<partition>`. The epoch is
/// drawn at random when a node's rings start, so an ack after a restart or an ownership move
/// is recognised as stale and never acks another message. The partition comes last, so it may
/// hold `:`; a node that does not own it reads it to forward the ack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageId {
    /// The incarnation of the rings that delivered it.
    pub epoch: u64,
    /// Its position in its partition's ring.
    pub seq: u64,
    /// Its partition.
    pub partition: String,
}

impl MessageId {
    /// Read an id; `None` when it is not one this broker makes.
    #[must_use]
    pub fn parse(text: &str) -> Option<Self> {
        let rest = text.strip_prefix("e:")?;
        let (epoch, rest) = rest.split_once(':')?;
        let (seq, partition) = rest.split_once(':')?;
        if epoch.len() != 16 || partition.is_empty() {
            return None;
        }
        Some(Self {
            epoch: u64::from_str_radix(epoch, 16).ok()?,
            seq: seq.parse().ok()?,
            partition: partition.to_owned(),
        })
    }
}

impl std::fmt::Display for MessageId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "e:{:016x}:{}:{}", self.epoch, self.seq, self.partition)
    }
}

/// The KV namespace and key of a queue's declared options: the namespace of the queue's
/// tenant, the key the name the tenant uses.
#[must_use]
pub fn config_row(queue: &str) -> (String, String) {
    match crate::tenant::split(queue) {
        (Some(id), local) => {
            let ns = crate::tenant::Tenant::any(id)
                .map_or_else(|_| CONFIG_NS.to_owned(), |t| t.name(CONFIG_NS));
            (ns, local.to_owned())
        }
        (None, local) => (CONFIG_NS.to_owned(), local.to_owned()),
    }
}

/// A queue's declared options, when it was configured.
///
/// # Errors
/// A failed read. A row that does not parse reads as undeclared (it is replaced by the next
/// `configure`).
pub fn declared(
    s: &dyn crate::store::StateRead,
    queue: &str,
    now: crate::time::Stamp,
) -> Result<Option<Declared>, crate::store::StoreError> {
    let (ns, key) = config_row(queue);
    Ok(crate::machine::kv::live_row(s, &ns, &key, now)?
        .and_then(|row| serde_json::from_slice(&row.value).ok()))
}

/// The declared queues of `tenant` in name order, after the name `after` (a name the tenant
/// uses) when given: `(stored name, options)`, at most `limit`.
///
/// # Errors
/// A failed read.
pub fn declared_queues(
    s: &dyn crate::store::StateRead,
    tenant: &crate::tenant::Tenant,
    now: crate::time::Stamp,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<(String, Declared)>, crate::store::StoreError> {
    let ns = tenant.name(CONFIG_NS);
    let prefix = crate::keys::kv_ns(&ns);
    let mut end = prefix.clone();
    if let Some(last) = end.last_mut() {
        *last = 1;
    }
    // The first key after `after`: names hold no control character, so none sorts between.
    let mut start = prefix.clone();
    if let Some(a) = after {
        start.extend_from_slice(a.as_bytes());
        start.push(0);
    }
    let mut keys = Vec::new();
    s.scan(&start, &end, &mut |k, _| {
        if let Ok(key) = std::str::from_utf8(&k[prefix.len()..]) {
            keys.push(key.to_owned());
        }
        keys.len() < limit
    })?;
    let mut out = Vec::with_capacity(keys.len());
    for key in keys {
        if let Some(row) = crate::machine::kv::live_row(s, &ns, &key, now)?
            && let Ok(d) = serde_json::from_slice::<Declared>(&row.value)
        {
            out.push((tenant.name(&key), d));
        }
    }
    Ok(out)
}
