//! Housekeeping run by tick entries, in bounded steps: expired lease records, rows of deleted
//! queues, and retention. Every step is decided by the entry's stamp and the state alone, so
//! every replica deletes the same rows; the bounds keep one entry's write set small.

use std::collections::BTreeMap;

use crate::keys;
use crate::model::{CursorRec, MessageHead, PartitionRec, QueueRec};
use crate::store::{StateRead, StoreError, Txn};
use crate::time::Stamp;

use super::{get_rec, put_rec, scan_recs, try_scan};

/// How much one tick may do.
#[derive(Debug, Clone, Copy)]
pub struct HousekeepingBudget {
    /// Most rows deleted.
    pub deletes: usize,
    /// Most partitions inspected for retention.
    pub partitions: usize,
}

impl Default for HousekeepingBudget {
    fn default() -> Self {
        Self {
            deletes: 4096,
            partitions: 256,
        }
    }
}

pub(crate) fn run(
    txn: &mut Txn<'_>,
    stamp: Stamp,
    budget: HousekeepingBudget,
) -> Result<(), StoreError> {
    let mut deletes = budget.deletes;
    expire_leases(txn, stamp, &mut deletes)?;
    super::kv::sweep(txn, stamp, &mut deletes)?;
    super::timers::deliver_due(txn, stamp, &mut deletes)?;
    collect_graves(txn, &mut deletes)?;
    retention(txn, stamp, &mut deletes, budget.partitions)?;
    Ok(())
}

fn expire_leases(txn: &mut Txn<'_>, stamp: Stamp, deletes: &mut usize) -> Result<(), StoreError> {
    // While a leader change holds leases, they expire `skew` late.
    let lease_now = super::cluster::lease_now(txn, stamp)?;
    let cursors =
        super::cluster::cluster_version(txn)? >= crate::command::Command::READY_INDEX_FORMAT;
    let done =
        super::ready::release_expired(txn, stamp, lease_now, (*deletes / 2).max(1), cursors)?;
    *deletes = deletes.saturating_sub(done);
    Ok(())
}

fn delete_range(txn: &mut Txn<'_>, prefix: &[u8], deletes: &mut usize) -> Result<bool, StoreError> {
    let mut doomed = Vec::new();
    StateRead::scan(&*txn, prefix, &keys::prefix_end(prefix), &mut |k, _| {
        doomed.push(k.to_vec());
        doomed.len() < *deletes
    })?;
    let done = doomed.len() < *deletes;
    *deletes -= doomed.len();
    for k in doomed {
        txn.delete(k);
    }
    Ok(done)
}

fn collect_graves(txn: &mut Txn<'_>, deletes: &mut usize) -> Result<(), StoreError> {
    let start = keys::table_start(keys::table::GRAVE);
    let graves: Vec<(Vec<u8>, ())> =
        scan_recs(txn, &start, &keys::table_end(keys::table::GRAVE), 64)?;
    for (k, ()) in graves {
        if *deletes == 0 {
            break;
        }
        let (Some(kind), Some(id)) = (k.get(1).copied(), keys::u64_at(&k, 2)) else {
            txn.delete(k);
            continue;
        };
        if kind == 1 && !detach_partitions(txn, id, deletes)? {
            continue;
        }
        let tables: &[u8] = if kind == 0 {
            &[
                keys::table::MESSAGE,
                keys::table::DEDUP_HASH,
                keys::table::CURSOR,
                keys::table::MARK,
                keys::table::READY_OF,
            ]
        } else {
            &[
                keys::table::GROUP,
                keys::table::DLQ,
                keys::table::READY,
                keys::table::READY_FILL,
                keys::table::GROUP_POLICY,
            ]
        };
        let mut all_done = true;
        for t in tables {
            if !delete_range(txn, &keys::pid_prefix(*t, id), deletes)? {
                all_done = false;
                break;
            }
        }
        if all_done {
            if kind == 0 {
                txn.delete(keys::partition(id));
            }
            txn.delete(k);
        }
    }
    Ok(())
}

/// Detach the partitions of deleted queue `qid` that are still listed under it (names and
/// list rows go; each partition gets a grave of its own, collected later), within `deletes`.
/// Answers whether none is left.
fn detach_partitions(txn: &mut Txn<'_>, qid: u64, deletes: &mut usize) -> Result<bool, StoreError> {
    let prefix = keys::pid_prefix(keys::table::QUEUE_PARTITION, qid);
    let rows: Vec<(Vec<u8>, ())> = scan_recs(
        txn,
        &prefix,
        &keys::prefix_end(&prefix),
        (*deletes / 3).max(1),
    )?;
    let done = rows.len() < (*deletes / 3).max(1);
    for (k, ()) in rows {
        if let Some(pid) = keys::u64_at(&k, 9) {
            if let Some(p) = get_rec::<PartitionRec>(txn, &keys::partition(pid))? {
                txn.delete(keys::partition_name(qid, &p.name));
            }
            put_rec(txn, keys::grave(0, pid), &());
        }
        txn.delete(k);
        *deletes = deletes.saturating_sub(3);
    }
    Ok(done)
}

fn retention(
    txn: &mut Txn<'_>,
    stamp: Stamp,
    deletes: &mut usize,
    max_parts: usize,
) -> Result<(), StoreError> {
    let cursor_key = keys::meta("retention_cursor");
    let from = get_rec::<u64>(txn, &cursor_key)?.unwrap_or(0);
    let parts: Vec<(Vec<u8>, PartitionRec)> = scan_recs(
        txn,
        &keys::partition(from),
        &keys::table_end(keys::table::PARTITION),
        max_parts,
    )?;
    let wrapped = parts.len() < max_parts;
    let mut queues: BTreeMap<String, Option<QueueRec>> = BTreeMap::new();
    let mut last = from;
    for (_, mut p) in parts {
        last = p.pid + 1;
        if *deletes == 0 {
            last = p.pid;
            break;
        }
        if !queues.contains_key(&p.queue) {
            let q = get_rec::<QueueRec>(txn, &keys::queue(&p.queue))?.filter(|q| q.qid == p.qid);
            queues.insert(p.queue.clone(), q);
        }
        let Some(Some(q)) = queues.get_mut(&p.queue) else {
            continue;
        };
        let o = q.options.clone();
        if !o.has_retention() || p.log_start >= p.next_offset {
            continue;
        }
        let min_cursor = if o.completed_retention_seconds > 0 {
            let prefix = keys::pid_prefix(keys::table::CURSOR, p.pid);
            let cursors: Vec<(Vec<u8>, CursorRec)> =
                scan_recs(txn, &prefix, &keys::prefix_end(&prefix), usize::MAX)?;
            cursors.iter().map(|(_, c)| c.next).min()
        } else {
            None
        };
        let hold = sink_hold(txn, &o, &p.queue, stamp)?;
        let budget = (*deletes / 2).max(1);
        // Walk from the oldest message and stop at the first one retention keeps: only the
        // messages deleted here (and that one) are read, and only their heads are decoded, so a
        // large payload is never copied for a stamp.
        let mut doomed: Vec<(Vec<u8>, u64, MessageHead)> = Vec::new();
        try_scan(
            &*txn,
            &keys::message(p.pid, p.log_start),
            &keys::message(p.pid, p.next_offset),
            |k, v| {
                let m = crate::codec::decode_head::<MessageHead>(k, v)?;
                let offset = keys::offset_of_message_key(k).unwrap_or(p.log_start);
                let aged = |secs: u64| secs > 0 && m.stamp.plus_seconds(secs) <= stamp;
                let held = hold.is_some_and(|h| m.stamp > h);
                let expired = aged(o.max_wait_time_seconds)
                    || (!held
                        && (aged(o.retention_seconds)
                            || (min_cursor.is_some_and(|mc| offset < mc)
                                && aged(o.completed_retention_seconds))));
                if !expired {
                    return Ok(false);
                }
                doomed.push((k.to_vec(), offset, m));
                Ok(doomed.len() < budget)
            },
        )?;
        let before = p.log_start;
        let mut purged = None;
        for (k, offset, m) in doomed {
            purged = Some(m.stamp);
            txn.delete(k);
            super::dedup::forget(txn, p.pid, &m.transaction_id);
            *deletes = deletes.saturating_sub(2);
            p.log_start = offset + 1;
            q.messages = q.messages.saturating_sub(1);
        }
        if let Some(at) = purged {
            put_rec(txn, keys::purged(p.pid), &at);
        }
        if p.log_start != before {
            put_rec(txn, keys::partition(p.pid), &p);
            put_rec(txn, keys::queue(&q.name), &*q);
        }
    }
    put_rec(txn, cursor_key, &if wrapped { 0 } else { last });
    Ok(())
}

/// The newest stamp retention may delete on a queue held for an S3 sink: the commit pointer's
/// tEnd minus a minute, never further back than `retentionSinkHoldMaxSeconds` before `now`
/// (so a sink that stopped for good cannot grow the queue's disk for ever). `None` when the
/// queue has no hold.
fn sink_hold(
    s: &dyn StateRead,
    o: &crate::model::QueueOptions,
    queue: &str,
    now: Stamp,
) -> Result<Option<Stamp>, StoreError> {
    let Some(sink) = o.retention_sink_hold.as_deref() else {
        return Ok(None);
    };
    let floor = now.minus_seconds(o.retention_sink_hold_max_seconds);
    let committed = crate::sink::documents::pointer(s, sink, queue, now)?.map_or(Stamp(0), |p| {
        Stamp(p.t_end).minus_seconds(crate::sink::documents::HOLD_MARGIN_SECONDS)
    });
    Ok(Some(committed.max(floor)))
}
