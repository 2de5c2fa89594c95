//! What the rings really cost in memory, so that the node's budget (`QUEEN_EPHEMERAL_MAX_BYTES`)
//! bounds what the process holds and not only the payloads. A queue, a partition's ring, a
//! consumer group and each lease cost their map entries, their names and their buffers; the
//! figures here are upper bounds of those, computed from the types' sizes:
//! - the allocator (jemalloc in the binary) rounds a request up to a size class, at most a
//!   quarter more, with no header;
//! - a `BTreeMap` holds its entries in nodes of 11 slots (plus 12 child pointers in an inner
//!   node); a map of up to 11 entries is one leaf, a larger one has nodes at least 5 full.
//!
//! `domain/tests/ephemeral_cost.rs` checks the sums against a counting allocator.

use std::mem::size_of;

use super::{Held, Lease, Position, QueueRings, Ring};

/// Bytes the allocator hands out for a request of `n` bytes: its size class (16-byte steps
/// up to 128, then four classes per doubling).
#[must_use]
pub(super) fn alloc(n: usize) -> u64 {
    if n == 0 {
        return 0;
    }
    let n = n as u64;
    if n <= 128 {
        return n.next_multiple_of(16);
    }
    let floor_log2 = 63 - u64::from((n - 1).leading_zeros());
    n.next_multiple_of(1 << (floor_log2 - 2))
}

/// Bytes of a `BTreeMap` of `entries` entries whose key and value take `entry` bytes.
#[must_use]
pub(super) fn btree(entries: usize, entry: usize) -> u64 {
    const SLOTS: usize = 11;
    const LEAST: usize = 5;
    if entries == 0 {
        return 0;
    }
    // A node's header (parent pointer, index, length), its slots, and its child pointers.
    let node = alloc(16 + SLOTS * entry + (SLOTS + 1) * size_of::<usize>());
    if entries <= SLOTS {
        return node;
    }
    let leaves = entries.div_ceil(LEAST);
    (leaves + leaves.div_ceil(LEAST)) as u64 * node
}

/// The slot of a map keyed by a name.
const fn keyed<V>() -> usize {
    size_of::<String>() + size_of::<V>()
}

/// One group's position in a ring: its name and its leases and redeliveries (the slot in the
/// ring's map of groups is counted with the map).
#[must_use]
pub(super) fn position(name: &str, p: &Position) -> u64 {
    alloc(name.len())
        + btree(p.leased.len(), size_of::<(u64, Lease)>())
        + btree(p.again.len(), size_of::<(u64, u32)>())
}

/// One ring without its messages' own cost (payload plus `MESSAGE_OVERHEAD`, counted apart):
/// its partition's name, its buffer of slots, and its groups.
#[must_use]
pub(super) fn ring(partition: &str, r: &Ring) -> u64 {
    alloc(partition.len())
        + alloc(r.held.capacity() * size_of::<Held>())
        + btree(r.groups.len(), keyed::<Position>())
        + r.groups
            .iter()
            .map(|(name, p)| position(name, p))
            .sum::<u64>()
}

/// A queue's own part: its name and its map of partitions (each ring is counted apart).
#[must_use]
pub(super) fn queue(name: &str, q: &QueueRings) -> u64 {
    alloc(name.len()) + btree(q.partitions.len(), keyed::<Ring>())
}

/// The node's map of queues and its count of queues per tenant.
#[must_use]
pub(super) fn node(queues: usize, tenants: usize) -> u64 {
    btree(queues, keyed::<QueueRings>()) + btree(tenants, keyed::<u64>())
}

/// What a new group costs at most in a ring that holds `groups` already, with one first lease:
/// the gate a pop passes before it creates one.
#[must_use]
pub(super) fn new_group(name: &str, groups: usize) -> u64 {
    let map = btree(groups + 1, keyed::<Position>()) - btree(groups, keyed::<Position>());
    map + alloc(name.len())
        + btree(1, size_of::<(u64, Lease)>())
        + btree(1, size_of::<(u64, u32)>())
}

/// What one more lease costs at most (a share of a node of the group's map of leases).
#[must_use]
pub(super) fn lease() -> u64 {
    btree(12, size_of::<(u64, Lease)>()).div_ceil(12) + 1
}

/// What a push of `count` messages adds beside its messages' own cost, at most: a new queue
/// (`queues`, `tenants`: the node's counts, when the queue is new), a new ring (`partitions`:
/// the queue's count, when the ring is new), and the growth of the ring's buffer.
#[must_use]
pub(super) fn push_growth(
    new_queue: Option<(&str, usize, usize)>,
    new_ring: Option<(&str, usize)>,
    ring: Option<&Ring>,
    count: usize,
) -> u64 {
    let mut grown = 0;
    if let Some((name, queues, tenants)) = new_queue {
        grown += node(queues + 1, tenants + 1) - node(queues, tenants) + alloc(name.len());
    }
    if let Some((partition, partitions)) = new_ring {
        grown += btree(partitions + 1, keyed::<Ring>()) - btree(partitions, keyed::<Ring>())
            + alloc(partition.len());
    }
    let (len, cap) = ring.map_or((0, 0), |r| (r.held.len(), r.held.capacity()));
    if len + count > cap {
        let to = (cap * 2).max(len + count).max(4);
        grown += alloc(to * size_of::<Held>()) - alloc(cap * size_of::<Held>());
    }
    grown
}
