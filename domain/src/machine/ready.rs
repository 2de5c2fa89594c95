//! The ready index: for each (queue, group), the partitions a pop that names no partition may
//! claim, in the order they became ready, so that a pop finds its partitions in a few row reads
//! whatever the number of partitions in the queue.
//!
//! A partition is *wanted* in a group's index when the group holds no lease on it and it has
//! offsets beyond the group's position (`wanted`). Every command that moves a cursor, a lease or
//! a partition's end keeps the index in step (`sync`, `pushed`, `release_expired`); retention
//! and message deletions may leave an entry whose partition has nothing left, which the next pop
//! that meets it removes. So the index always holds every wanted partition, and a stale entry
//! costs one look. Entries are ordered by the stamp they became ready at (then by partition id):
//! a claimed partition goes to the back when it is ready again, so competing consumers spread
//! over the partitions and none starves.
//!
//! A group's index is filled from the queue's partitions in bounded steps by its pops
//! (`fill`): a group created late on a queue of a million partitions, or any group of a store
//! written before the index existed, is covered a step at a time, and pushes keep only the
//! partitions already covered. The rows live in the store, so a restart, a snapshot install
//! and every replica see the same index: nothing is rebuilt at start and memory does not grow
//! with the partitions.

use crate::keys;
use serde::{Deserialize, Serialize};

use crate::model::{CursorRec, LeaseRec, PartitionRec, QueueRec};
use crate::store::{StateRead, StoreError, Txn};
use crate::time::Stamp;

use super::{get_rec, put_rec, scan_recs};

/// Partitions one pop adds to a group's index while it is being filled.
pub(crate) const FILL_STEP: usize = 256;

/// The fill mark of a group whose index covers every partition of its queue.
pub(crate) const FILLED: u64 = u64::MAX;

/// What a group's index keeps besides its rows (`READY_FILL(queue, group)`); absent until the
/// group's first pop fills it (or, for queue mode, until its queue is created).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Meta {
    /// Partition ids below this are covered ([`FILLED`]: all of them).
    pub fill: u64,
    /// No row of the index has a `since` below this: a pop's scan starts here instead of at the
    /// start of the group's rows, so it does not step over the deleted rows of every claim
    /// since the store last compacted them (its cost would grow with the messages drained).
    pub front: u64,
}

/// The meta row of `group`'s index on queue `qid` (all zero while it has none).
pub(crate) fn meta(s: &dyn StateRead, qid: u64, group: &str) -> Result<Meta, StoreError> {
    Ok(get_rec::<Meta>(s, &keys::ready_fill(qid, group))?.unwrap_or_default())
}

pub(crate) fn put_meta(txn: &mut Txn<'_>, qid: u64, group: &str, m: Meta) {
    put_rec(txn, keys::ready_fill(qid, group), &m);
}

/// Start queue mode's index with its queue (`qid` has no partition yet): covered from the
/// start, pushes keep it, and its first pop has nothing to fill.
pub(crate) fn start_queue_mode(txn: &mut Txn<'_>, qid: u64, group: &str) {
    put_meta(
        txn,
        qid,
        group,
        Meta {
            fill: FILLED,
            front: 0,
        },
    );
}

/// Whether a group without a lease on `p` could claim from it, `c` being its cursor there.
/// Without a cursor, the group's start decides where it begins; any stored message counts
/// (a group subscribed from a later time may find nothing and drop the entry on its pop).
#[must_use]
pub(crate) fn wanted(p: &PartitionRec, c: Option<&CursorRec>) -> bool {
    match c {
        Some(c) => c.lease.is_none() && c.next.max(p.log_start) < p.next_offset,
        None => p.log_start < p.next_offset,
    }
}

/// Put partition `pid` in `group`'s index (at the back, as of `stamp`) or take it out, as
/// `want` says; an entry already in stays where it is. `m` is the index's meta row as read
/// (its front moves back if this entry lies before it).
pub(crate) fn set(
    txn: &mut Txn<'_>,
    qid: u64,
    group: &str,
    pid: u64,
    want: bool,
    stamp: Stamp,
    m: &mut Meta,
) -> Result<(), StoreError> {
    let of = keys::ready_of(pid, group);
    match (want, get_rec::<u64>(txn, &of)?) {
        (true, None) => {
            put_rec(txn, keys::ready(qid, group, stamp.0, pid), &());
            put_rec(txn, of, &stamp.0);
            if stamp.0 < m.front {
                m.front = stamp.0;
                put_meta(txn, qid, group, *m);
            }
        }
        (false, Some(since)) => {
            txn.delete(keys::ready(qid, group, since, pid));
            txn.delete(of);
        }
        _ => {}
    }
    Ok(())
}

/// Take partition `pid` out of `group`'s index.
pub(crate) fn remove(txn: &mut Txn<'_>, qid: u64, group: &str, pid: u64) -> Result<(), StoreError> {
    set(txn, qid, group, pid, false, Stamp(0), &mut Meta::default())
}

/// Bring partition `p`'s entry in `group`'s index in step with the group's cursor `c` there.
pub(crate) fn sync(
    txn: &mut Txn<'_>,
    group: &str,
    p: &PartitionRec,
    c: Option<&CursorRec>,
    stamp: Stamp,
) -> Result<(), StoreError> {
    let mut m = meta(txn, p.qid, group)?;
    if p.pid >= m.fill {
        return Ok(());
    }
    set(txn, p.qid, group, p.pid, wanted(p, c), stamp, &mut m)
}

/// The groups of queue `qid` whose index has started, with its meta row.
pub(crate) fn groups(s: &dyn StateRead, qid: u64) -> Result<Vec<(String, Meta)>, StoreError> {
    let prefix = keys::pid_prefix(keys::table::READY_FILL, qid);
    let rows: Vec<(Vec<u8>, Meta)> = scan_recs(s, &prefix, &keys::prefix_end(&prefix), usize::MAX)?;
    Ok(rows
        .into_iter()
        .map(|(k, m)| (String::from_utf8_lossy(&k[prefix.len()..]).into_owned(), m))
        .collect())
}

/// After a push appended to `p` (which ended at `old_next` before): the partition is ready for
/// every group that covers it, holds no lease on it and had nothing left in it before (one
/// that had something left is in its index already). `groups` is [`groups`] of its queue.
pub(crate) fn pushed(
    txn: &mut Txn<'_>,
    groups: &mut [(String, Meta)],
    p: &PartitionRec,
    old_next: u64,
    stamp: Stamp,
) -> Result<(), StoreError> {
    for (group, m) in groups.iter_mut() {
        if p.pid >= m.fill {
            continue;
        }
        let c = get_rec::<CursorRec>(txn, &keys::cursor(p.pid, group))?;
        if c.as_ref().is_some_and(|c| c.lease.is_some()) {
            continue;
        }
        let before = PartitionRec {
            next_offset: old_next,
            ..p.clone()
        };
        if wanted(&before, c.as_ref()) {
            continue;
        }
        set(txn, p.qid, group, p.pid, true, stamp, m)?;
    }
    Ok(())
}

/// Cover up to [`FILL_STEP`] more partitions of queue `q` in `group`'s index (nothing once it
/// covers them all). A lease found expired at `lease_now` is released on the way: its record
/// may have been swept by a build that did not release cursors.
pub(crate) fn fill(
    txn: &mut Txn<'_>,
    q: &QueueRec,
    group: &str,
    stamp: Stamp,
    lease_now: Stamp,
) -> Result<(), StoreError> {
    let mut m = meta(txn, q.qid, group)?;
    if m.fill == FILLED {
        return Ok(());
    }
    let mark = m.fill;
    let prefix = keys::pid_prefix(keys::table::QUEUE_PARTITION, q.qid);
    let rows: Vec<(Vec<u8>, ())> = scan_recs(
        txn,
        &keys::queue_partition(q.qid, mark),
        &keys::prefix_end(&prefix),
        FILL_STEP,
    )?;
    let mut next = FILLED;
    if rows.len() == FILL_STEP {
        next = rows
            .last()
            .and_then(|(k, ())| keys::u64_at(k, 9))
            .map_or(FILLED, |pid| pid + 1);
    }
    for (k, ()) in &rows {
        let Some(pid) = keys::u64_at(k, 9) else {
            continue;
        };
        let Some(p) = get_rec::<PartitionRec>(txn, &keys::partition(pid))? else {
            continue;
        };
        let ck = keys::cursor(pid, group);
        let mut c = get_rec::<CursorRec>(txn, &ck)?;
        if let Some(cur) = c.as_mut()
            && cur.lease.as_ref().is_some_and(|l| l.expires <= lease_now)
        {
            cur.lease = None;
            put_rec(txn, ck, &*cur);
        }
        set(
            txn,
            q.qid,
            group,
            pid,
            wanted(&p, c.as_ref()),
            stamp,
            &mut m,
        )?;
    }
    m.fill = next;
    put_meta(txn, q.qid, group, m);
    Ok(())
}

/// Forget `group`'s index on queue `qid` (its positions moved everywhere at once: a seek, a
/// deleted group, a new subscription); its next pop fills it again.
pub(crate) fn reset(txn: &mut Txn<'_>, qid: u64, group: &str) -> Result<(), StoreError> {
    let prefix = keys::ready_prefix(qid, group);
    let rows: Vec<(Vec<u8>, ())> = scan_recs(txn, &prefix, &keys::prefix_end(&prefix), usize::MAX)?;
    for (k, ()) in rows {
        if let Some(pid) = keys::pid_of_ready_key(&k) {
            txn.delete(keys::ready_of(pid, group));
        }
        txn.delete(k);
    }
    txn.delete(keys::ready_fill(qid, group));
    Ok(())
}

/// Delete the records of leases expired at `lease_now` (at most `max` leases, oldest first)
/// and, with `cursors` (the cluster reads the index), release their cursors: each partition
/// they held is ready again where it has something left. Answers how many rows it deleted.
pub(crate) fn release_expired(
    txn: &mut Txn<'_>,
    stamp: Stamp,
    lease_now: Stamp,
    max: usize,
    cursors: bool,
) -> Result<usize, StoreError> {
    let start = keys::table_start(keys::table::LEASE_EXPIRY);
    // A lease is live while its expiry is after `lease_now`: one expiring at it is due too
    // (the build before the index left that one for the next tick).
    let end = keys::lease_expiry(lease_now.0 + u64::from(cursors), "");
    let due: Vec<(Vec<u8>, ())> = scan_recs(txn, &start, &end, max)?;
    let mut deleted = 0;
    for (k, ()) in due {
        let id = String::from_utf8_lossy(k.get(9..).unwrap_or_default()).into_owned();
        let lk = keys::lease(&id);
        if let Some(l) = get_rec::<LeaseRec>(txn, &lk)?
            && l.expires <= lease_now
        {
            for pid in l.parts.iter().filter(|_| cursors) {
                let ck = keys::cursor(*pid, &l.group);
                let Some(mut c) = get_rec::<CursorRec>(txn, &ck)? else {
                    continue;
                };
                if c.lease.as_ref().is_none_or(|cl| cl.id.as_str() != id) {
                    continue;
                }
                c.lease = None;
                put_rec(txn, ck, &c);
                if let Some(p) = get_rec::<PartitionRec>(txn, &keys::partition(*pid))? {
                    sync(txn, &l.group, &p, Some(&c), stamp)?;
                }
            }
            txn.delete(lk);
            deleted += 1;
        }
        txn.delete(k);
        deleted += 1;
    }
    Ok(deleted)
}
