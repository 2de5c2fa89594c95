//! Consumer-group administration: delete a group's positions, seek, rewrite the subscription.

use crate::keys;
use crate::model::{CursorRec, GroupRec, PartitionRec, QueueRec, SubscriptionStart};
use crate::names::{GroupName, QueueName};
use crate::store::{StoreError, Txn};
use crate::time::Stamp;

use super::claim_read::start_offset;
use super::queue::partition_ids;
use super::{get_rec, put_rec, scan_recs};

/// The queues (id, name) a group has a record on, or just `queue` when named.
/// The queues a group command reaches, with the group's own name: one queue when named;
/// otherwise every queue of the group's tenant that has the group. A group under a tenant's
/// scope (`tenant::Tenant::name`) stands for that tenant's group and reaches only its queues;
/// an unscoped group reaches only the default tenant's.
fn queues_of<'g>(
    txn: &Txn<'_>,
    group: &'g str,
    queue: Option<&QueueName>,
) -> Result<(Vec<QueueRec>, &'g str), StoreError> {
    let (tenant, local) = crate::tenant::split(group);
    if let Some(q) = queue {
        let found = get_rec::<QueueRec>(txn, &keys::queue(q.as_str()))?;
        return Ok((found.into_iter().collect(), local));
    }
    let all: Vec<(Vec<u8>, QueueRec)> = scan_recs(
        txn,
        &keys::table_start(keys::table::QUEUE),
        &keys::table_end(keys::table::QUEUE),
        usize::MAX,
    )?;
    let mut out = Vec::new();
    for (_, q) in all {
        if crate::tenant::split(&q.name).0 == tenant
            && get_rec::<GroupRec>(txn, &keys::group(q.qid, local))?.is_some()
        {
            out.push(q);
        }
    }
    Ok((out, local))
}

/// Drop a group's cursors (and leases with them) on one queue or all; with `metadata`, also its
/// recorded subscription, so it starts over per its mode. Answers (partitions, metadata rows).
pub(crate) fn delete(
    txn: &mut Txn<'_>,
    group: &GroupName,
    queue: Option<&QueueName>,
    metadata: bool,
) -> Result<(u64, u64), StoreError> {
    let (mut parts, mut meta) = (0, 0);
    let (queues, group) = queues_of(txn, group.as_str(), queue)?;
    for q in queues {
        super::ready::reset(txn, q.qid, group)?;
        for pid in partition_ids(txn, q.qid)? {
            let ck = keys::cursor(pid, group);
            if get_rec::<CursorRec>(txn, &ck)?.is_some() {
                txn.delete(ck);
                parts += 1;
            }
        }
        if metadata && get_rec::<GroupRec>(txn, &keys::group(q.qid, group))?.is_some() {
            txn.delete(keys::group(q.qid, group));
            super::conflation::forget(txn, q.qid, group);
            meta += 1;
        }
    }
    Ok((parts, meta))
}

/// Move a group's cursor on every partition of a queue to the end (`to` = None) or to just
/// after `to`; leases are released. Answers the partitions updated.
pub(crate) fn seek(
    txn: &mut Txn<'_>,
    stamp: Stamp,
    group: &GroupName,
    queue: &QueueName,
    to: Option<Stamp>,
) -> Result<u64, StoreError> {
    let Some(q) = get_rec::<QueueRec>(txn, &keys::queue(queue.as_str()))? else {
        return Ok(0);
    };
    let gk = keys::group(q.qid, group.as_str());
    if get_rec::<GroupRec>(txn, &gk)?.is_none() {
        put_rec(
            txn,
            gk,
            &GroupRec {
                start: SubscriptionStart::All,
                created: stamp,
                last_pid: 0,
            },
        );
    }
    super::ready::reset(txn, q.qid, group.as_str())?;
    let mut n = 0;
    for pid in partition_ids(txn, q.qid)? {
        let Some(p) = get_rec::<PartitionRec>(txn, &keys::partition(pid))? else {
            continue;
        };
        let ck = keys::cursor(pid, group.as_str());
        let mut c = get_rec::<CursorRec>(txn, &ck)?.unwrap_or_default();
        c.next = match to {
            None => p.next_offset,
            Some(t) => start_offset(
                txn,
                &p,
                SubscriptionStart::From(Stamp(t.0.saturating_add(1))),
            )?,
        };
        c.lease = None;
        c.retries = 0;
        put_rec(txn, ck, &c);
        n += 1;
    }
    Ok(n)
}

/// Rewrite a group's recorded start on every queue it has a record on (partitions it has not
/// touched start there). Answers the rows updated.
pub(crate) fn resubscribe(
    txn: &mut Txn<'_>,
    group: &GroupName,
    from: Stamp,
) -> Result<u64, StoreError> {
    let mut n = 0;
    let (queues, group) = queues_of(txn, group.as_str(), None)?;
    for q in queues {
        let gk = keys::group(q.qid, group);
        if let Some(mut g) = get_rec::<GroupRec>(txn, &gk)? {
            super::ready::reset(txn, q.qid, group)?;
            g.start = SubscriptionStart::From(from);
            put_rec(txn, gk, &g);
            n += 1;
        }
    }
    Ok(n)
}
