//! Which member owns an ephemeral partition: the highest random weight (rendezvous hashing)
//! over the live members. Every node computes it the same way from the same member list,
//! without asking anyone, and a member leaving moves only the partitions it owned.

/// 64-bit FNV-1a over the parts, each followed by a separator byte no name contains.
fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.iter().chain(std::iter::once(&0x1f)) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// A finaliser that spreads FNV's low-entropy high bits (splitmix64's).
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The weight of `member` for the partition `(queue, partition)`; `queue` is the stored name,
/// so two tenants' queues of one name are placed independently.
#[must_use]
pub fn weight(queue: &str, partition: &str, member: u64) -> u64 {
    mix(fnv(&[
        b"eph",
        queue.as_bytes(),
        partition.as_bytes(),
        &member.to_be_bytes(),
    ]))
}

/// The owner of `(queue, partition)` among `members` (node ids): the highest weight, ties to
/// the larger id. `None` when there is no member.
#[must_use]
pub fn owner(queue: &str, partition: &str, members: &[u64]) -> Option<u64> {
    members
        .iter()
        .copied()
        .max_by_key(|m| (weight(queue, partition, *m), *m))
}
