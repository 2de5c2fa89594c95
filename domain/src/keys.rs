//! The key layout of the state store. One ordered key space, a table byte first, integers
//! big-endian so that byte order is numeric order. Names never contain a NUL byte, so NUL
//! separates a name from what follows.

/// Table bytes.
pub mod table {
    /// Node-wide counters and the last stamp.
    pub const META: u8 = 0x01;
    /// Queue records by name.
    pub const QUEUE: u8 = 0x02;
    /// Partition id by (queue id, partition name).
    pub const PARTITION_NAME: u8 = 0x03;
    /// Partition record by id.
    pub const PARTITION: u8 = 0x04;
    /// Messages by (partition id, offset).
    pub const MESSAGE: u8 = 0x05;
    /// Dedup index of the first store format, by (partition id, transactionId text): read only
    /// by the store's migration to the compact index (`DEDUP_HASH`).
    pub const DEDUP_V1: u8 = 0x06;
    /// Consumer cursors by (partition id, group).
    pub const CURSOR: u8 = 0x07;
    /// Leases by id.
    pub const LEASE: u8 = 0x08;
    /// Lease expiry index by (expiry, lease id).
    pub const LEASE_EXPIRY: u8 = 0x09;
    /// Consumer group records by (queue id, group).
    pub const GROUP: u8 = 0x0A;
    /// Dead letters by (queue id, sequence).
    pub const DLQ: u8 = 0x0B;
    /// Partitions and queues of deleted queues, to collect in bounded steps.
    pub const GRAVE: u8 = 0x0C;
    /// Partitions of a queue in creation order by (queue id, partition id).
    pub const QUEUE_PARTITION: u8 = 0x0D;
    /// KV rows by (namespace, key).
    pub const KV: u8 = 0x0E;
    /// KV expiry index by (expiry, namespace, key).
    pub const KV_EXPIRY: u8 = 0x0F;
    /// Timers by (queue, timer key).
    pub const TIMER: u8 = 0x10;
    /// Timer due index by (deliver at, queue, timer key).
    pub const TIMER_DUE: u8 = 0x11;
    /// The stamp of the newest message retention deleted, by partition id.
    pub const PURGED: u8 = 0x12;
    /// Compact dedup index: (partition id, 16-byte hash of the transactionId) -> the offsets
    /// stored under that hash (one, unless two transactionIds of a partition collide).
    pub const DEDUP_HASH: u8 = 0x13;
    /// `pid | offset -> Option<group>`: a message deleted for every group (`None`) or kept
    /// for one group only (a retried dead letter's copy).
    pub const MARK: u8 = 0x14;
    /// The ready index (see `machine::ready`): `(queue id, group, since, partition id) -> ()`,
    /// the partitions a group may claim, oldest first.
    pub const READY: u8 = 0x15;
    /// `(partition id, group) -> since`: where a partition sits in its group's ready index.
    pub const READY_OF: u8 = 0x16;
    /// `(queue id, group) -> partition id`: how far a group's ready index has been filled from
    /// the queue's partitions (`u64::MAX` once every partition is covered).
    pub const READY_FILL: u8 = 0x17;
    /// `(queue id, group) -> flags`: a group's delivery policy, written by the pop that
    /// registers the group (see `machine::conflation`); no row is the default policy.
    pub const GROUP_POLICY: u8 = 0x18;
    /// Owned by the store adapter, never written by the domain: the sparse index of message
    /// records by (partition id, base offset).
    pub const SEGMENT_INDEX: u8 = 0x20;
    /// Owned by the store adapter: live records per segment file.
    pub const SEGMENT_FILE: u8 = 0x21;
    /// Owned by the store adapter: where the segment log ends.
    pub const SEGMENT_END: u8 = 0x22;
}

/// The stamp of the newest message retention deleted from a partition.
#[must_use]
pub fn purged(pid: u64) -> Vec<u8> {
    let mut k = vec![table::PURGED];
    k.extend_from_slice(&pid.to_be_bytes());
    k
}

/// A timer.
#[must_use]
pub fn timer(queue: &str, key: &str) -> Vec<u8> {
    let mut k = vec![table::TIMER];
    k.extend_from_slice(queue.as_bytes());
    k.push(0);
    k.extend_from_slice(key.as_bytes());
    k
}

/// The start of a queue's timers.
#[must_use]
pub fn timer_queue(queue: &str) -> Vec<u8> {
    let mut k = vec![table::TIMER];
    k.extend_from_slice(queue.as_bytes());
    k.push(0);
    k
}

/// A timer due index key.
#[must_use]
pub fn timer_due(at: u64, queue: &str, key: &str) -> Vec<u8> {
    let mut k = vec![table::TIMER_DUE];
    k.extend_from_slice(&at.to_be_bytes());
    k.extend_from_slice(queue.as_bytes());
    k.push(0);
    k.extend_from_slice(key.as_bytes());
    k
}

/// A KV row.
#[must_use]
pub fn kv(ns: &str, key: &str) -> Vec<u8> {
    let mut k = vec![table::KV];
    k.extend_from_slice(ns.as_bytes());
    k.push(0);
    k.extend_from_slice(key.as_bytes());
    k
}

/// The start of a namespace's KV rows.
#[must_use]
pub fn kv_ns(ns: &str) -> Vec<u8> {
    let mut k = vec![table::KV];
    k.extend_from_slice(ns.as_bytes());
    k.push(0);
    k
}

/// A KV expiry index key.
#[must_use]
pub fn kv_expiry(expires: u64, ns: &str, key: &str) -> Vec<u8> {
    let mut k = vec![table::KV_EXPIRY];
    k.extend_from_slice(&expires.to_be_bytes());
    k.extend_from_slice(ns.as_bytes());
    k.push(0);
    k.extend_from_slice(key.as_bytes());
    k
}

/// A meta key.
#[must_use]
pub fn meta(name: &str) -> Vec<u8> {
    let mut k = vec![table::META];
    k.extend_from_slice(name.as_bytes());
    k
}

/// The last applied stamp.
#[must_use]
pub fn meta_stamp() -> Vec<u8> {
    meta("stamp")
}

/// `[table]`: the start of a table.
#[must_use]
pub fn table_start(t: u8) -> Vec<u8> {
    vec![t]
}

/// The first key after a whole table.
#[must_use]
pub fn table_end(t: u8) -> Vec<u8> {
    vec![t + 1]
}

/// A queue's record.
#[must_use]
pub fn queue(name: &str) -> Vec<u8> {
    let mut k = vec![table::QUEUE];
    k.extend_from_slice(name.as_bytes());
    k
}

/// A partition's id by name.
#[must_use]
pub fn partition_name(qid: u64, name: &str) -> Vec<u8> {
    let mut k = vec![table::PARTITION_NAME];
    k.extend_from_slice(&qid.to_be_bytes());
    k.extend_from_slice(name.as_bytes());
    k
}

/// A partition's record.
#[must_use]
pub fn partition(pid: u64) -> Vec<u8> {
    let mut k = vec![table::PARTITION];
    k.extend_from_slice(&pid.to_be_bytes());
    k
}

/// The pid encoded in a `partition` key.
#[must_use]
pub fn pid_of_partition_key(key: &[u8]) -> Option<u64> {
    key.get(1..9)
        .map(|b| u64::from_be_bytes(b.try_into().unwrap_or([0; 8])))
}

/// One partition's message.
#[must_use]
pub fn message(pid: u64, offset: u64) -> Vec<u8> {
    let mut k = vec![table::MESSAGE];
    k.extend_from_slice(&pid.to_be_bytes());
    k.extend_from_slice(&offset.to_be_bytes());
    k
}

/// The (partition, offset) of a `message` key, or `None` for a key of another table.
#[must_use]
pub fn message_parts(key: &[u8]) -> Option<(u64, u64)> {
    if key.len() == 17 && key[0] == table::MESSAGE {
        Some((u64_at(key, 1)?, u64_at(key, 9)?))
    } else {
        None
    }
}

/// The offset encoded in a `message` key.
#[must_use]
pub fn offset_of_message_key(key: &[u8]) -> Option<u64> {
    key.get(9..17)
        .map(|b| u64::from_be_bytes(b.try_into().unwrap_or([0; 8])))
}

/// A per-partition key prefix of `t`.
#[must_use]
pub fn pid_prefix(t: u8, pid: u64) -> Vec<u8> {
    let mut k = vec![t];
    k.extend_from_slice(&pid.to_be_bytes());
    k
}

/// The first key after every key that starts with `prefix`.
#[must_use]
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xFF {
            end.push(last + 1);
            return end;
        }
    }
    vec![0xFF; prefix.len() + 1]
}

/// A dedup index key: the partition and the first 16 bytes of the SHA-256 of the
/// transactionId, so every row has the same small size whatever the id's length.
#[must_use]
pub fn dedup(pid: u64, transaction_id: &str) -> Vec<u8> {
    dedup_row(&dedup_key(pid, transaction_id))
}

/// A dedup row's key without its table byte: the partition (big-endian) and the first 16
/// bytes of the transactionId's SHA-256.
#[must_use]
pub fn dedup_key(pid: u64, transaction_id: &str) -> DedupKey {
    use sha2::{Digest, Sha256};
    let hash = Sha256::digest(transaction_id.as_bytes());
    let mut k = [0u8; 24];
    k[..8].copy_from_slice(&pid.to_be_bytes());
    k[8..].copy_from_slice(&hash[..16]);
    k
}

/// A dedup row's key without its table byte (see [`dedup_key`]).
pub type DedupKey = [u8; 24];

/// Hashes [`DedupKey`]s for hash maps: the key is mostly SHA-256 output already, so two
/// folded multiplies of its words with seeds drawn once per map replace SipHash (which was
/// 2-3% of a follower's CPU under batch pushes, `perf`: a map of a batch's dedup rows hashes
/// each key on every read and write). The seeds are random, so ids ground to collide in some
/// bits of the SHA-256 do not collide in the map; no map keyed this way is iterated in an order
/// that reaches a replicated outcome.
#[derive(Clone, Debug)]
pub struct DedupKeyState {
    seeds: [u64; 2],
}

impl Default for DedupKeyState {
    fn default() -> Self {
        use std::hash::BuildHasher;
        let r = std::collections::hash_map::RandomState::new();
        Self {
            seeds: [r.hash_one(0u8), r.hash_one(1u8) | 1],
        }
    }
}

impl std::hash::BuildHasher for DedupKeyState {
    type Hasher = DedupKeyHasher;

    fn build_hasher(&self) -> DedupKeyHasher {
        DedupKeyHasher {
            seeds: self.seeds,
            acc: self.seeds[0],
        }
    }
}

/// The hasher of [`DedupKeyState`].
#[derive(Debug)]
pub struct DedupKeyHasher {
    seeds: [u64; 2],
    acc: u64,
}

/// The high and low halves of a full product, xored: every input bit reaches every output bit.
fn fold_mul(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

impl std::hash::Hasher for DedupKeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.acc = fold_mul(self.acc ^ u64::from_le_bytes(w), self.seeds[1]);
        }
    }

    fn write_usize(&mut self, n: usize) {
        // The length an array writes before its bytes: the same for every key.
        self.acc ^= n as u64;
    }

    fn finish(&self) -> u64 {
        fold_mul(self.acc ^ self.seeds[0], self.seeds[1])
    }
}

/// The [`DedupKey`] of a dedup row's key, or `None` for a key of another table.
#[must_use]
pub fn as_dedup_key(key: &[u8]) -> Option<DedupKey> {
    if key.len() == 25 && key[0] == table::DEDUP_HASH {
        key[1..].try_into().ok()
    } else {
        None
    }
}

/// The dedup row's key of a [`DedupKey`].
#[must_use]
pub fn dedup_row(key: &DedupKey) -> Vec<u8> {
    let mut k = Vec::with_capacity(25);
    k.push(table::DEDUP_HASH);
    k.extend_from_slice(key);
    k
}

/// A dedup key of the first store format (the transactionId's text), for the migration.
#[must_use]
pub fn dedup_v1(pid: u64, transaction_id: &str) -> Vec<u8> {
    let mut k = pid_prefix(table::DEDUP_V1, pid);
    k.extend_from_slice(transaction_id.as_bytes());
    k
}

/// A cursor key.
#[must_use]
pub fn cursor(pid: u64, group: &str) -> Vec<u8> {
    let mut k = pid_prefix(table::CURSOR, pid);
    k.extend_from_slice(group.as_bytes());
    k
}

/// A lease key.
#[must_use]
pub fn lease(id: &str) -> Vec<u8> {
    let mut k = vec![table::LEASE];
    k.extend_from_slice(id.as_bytes());
    k
}

/// A lease expiry index key.
#[must_use]
pub fn lease_expiry(expires: u64, id: &str) -> Vec<u8> {
    let mut k = vec![table::LEASE_EXPIRY];
    k.extend_from_slice(&expires.to_be_bytes());
    k.extend_from_slice(id.as_bytes());
    k
}

/// A consumer group record.
#[must_use]
pub fn group(qid: u64, group: &str) -> Vec<u8> {
    let mut k = pid_prefix(table::GROUP, qid);
    k.extend_from_slice(group.as_bytes());
    k
}

/// The prefix of one group's ready rows on a queue (see [`table::READY`]).
#[must_use]
pub fn ready_prefix(qid: u64, group: &str) -> Vec<u8> {
    let mut k = pid_prefix(table::READY, qid);
    // Group names are at most a few hundred bytes; the length keeps one group's rows apart
    // from a longer name's that starts the same.
    let len = u16::try_from(group.len()).unwrap_or(u16::MAX);
    k.extend_from_slice(&len.to_be_bytes());
    k.extend_from_slice(group.as_bytes());
    k
}

/// A ready row: partition `pid` ready for `group` since `since` (µs).
#[must_use]
pub fn ready(qid: u64, group: &str, since: u64, pid: u64) -> Vec<u8> {
    let mut k = ready_prefix(qid, group);
    k.extend_from_slice(&since.to_be_bytes());
    k.extend_from_slice(&pid.to_be_bytes());
    k
}

/// The group a ready row's key is of (see [`ready`]).
#[must_use]
pub fn group_of_ready_key(key: &[u8]) -> Option<&[u8]> {
    let len = usize::from(u16::from_be_bytes(key.get(9..11)?.try_into().ok()?));
    key.get(11..11 + len)
}

/// The partition id at the end of a ready row's key.
#[must_use]
pub fn pid_of_ready_key(key: &[u8]) -> Option<u64> {
    u64_at(key, key.len().checked_sub(8)?)
}

/// Where partition `pid` sits in `group`'s ready index (see [`table::READY_OF`]).
#[must_use]
pub fn ready_of(pid: u64, group: &str) -> Vec<u8> {
    let mut k = pid_prefix(table::READY_OF, pid);
    k.extend_from_slice(group.as_bytes());
    k
}

/// How far `group`'s ready index on queue `qid` is filled (see [`table::READY_FILL`]).
#[must_use]
pub fn ready_fill(qid: u64, group: &str) -> Vec<u8> {
    let mut k = pid_prefix(table::READY_FILL, qid);
    k.extend_from_slice(group.as_bytes());
    k
}

/// A group's delivery policy on queue `qid` (see [`table::GROUP_POLICY`]).
#[must_use]
pub fn group_policy(qid: u64, group: &str) -> Vec<u8> {
    let mut k = pid_prefix(table::GROUP_POLICY, qid);
    k.extend_from_slice(group.as_bytes());
    k
}

/// A message's mark (see [`table::MARK`]).
#[must_use]
pub fn mark(pid: u64, offset: u64) -> Vec<u8> {
    let mut k = pid_prefix(table::MARK, pid);
    k.extend_from_slice(&offset.to_be_bytes());
    k
}

/// A dead letter.
#[must_use]
pub fn dlq(qid: u64, seq: u64) -> Vec<u8> {
    let mut k = pid_prefix(table::DLQ, qid);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// A grave entry: kind 0 = partition, 1 = queue-level rows.
#[must_use]
pub fn grave(kind: u8, id: u64) -> Vec<u8> {
    let mut k = vec![table::GRAVE, kind];
    k.extend_from_slice(&id.to_be_bytes());
    k
}

/// A queue's partition in creation order.
#[must_use]
pub fn queue_partition(qid: u64, pid: u64) -> Vec<u8> {
    let mut k = pid_prefix(table::QUEUE_PARTITION, qid);
    k.extend_from_slice(&pid.to_be_bytes());
    k
}

/// Read a big-endian u64 at `at`.
#[must_use]
pub fn u64_at(key: &[u8], at: usize) -> Option<u64> {
    key.get(at..at + 8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numeric_order_is_byte_order() {
        assert!(message(1, 255) < message(1, 256));
        assert!(message(1, u64::MAX) < message(2, 0));
        assert_eq!(offset_of_message_key(&message(7, 42)), Some(42));
        assert_eq!(prefix_end(&[1, 0xFF]), vec![2]);
    }

    /// Keys that agree in all but a few bits (as ids ground against the SHA-256 would) spread
    /// over a map's buckets, and a key always hashes the same within one map.
    #[test]
    fn dedup_keys_spread_in_maps() {
        use std::hash::BuildHasher;
        let state = DedupKeyState::default();
        let mut buckets = std::collections::HashSet::new();
        for i in 0..4096u64 {
            let mut k = dedup_key(7, "same");
            k[8..16].copy_from_slice(&(i << 40).to_be_bytes());
            assert_eq!(state.hash_one(k), state.hash_one(k));
            buckets.insert(state.hash_one(k) & 0xFFF);
        }
        assert!(
            buckets.len() > 2400,
            "{} of 4096 buckets used",
            buckets.len()
        );
        let mut rows: crate::DedupRows = crate::DedupRows::default();
        rows.insert(dedup_key(1, "a"), Some(vec![3]));
        assert_eq!(rows.get(&dedup_key(1, "a")), Some(&Some(vec![3])));
        assert_eq!(rows.get(&dedup_key(2, "a")), None);
    }
}
