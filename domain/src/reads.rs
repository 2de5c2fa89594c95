//! Read-only queries of the applied state: what status pages, dead-letter listings and the
//! long-poll pre-check need. Nothing here writes.

use crate::command::{Command, PopCommand, PopOutcome};
use crate::keys;
use crate::machine::{get_rec, pop, scan_recs, try_scan};
use crate::model::{CursorRec, DlqRec, PartitionRec, QueueRec};
use crate::store::{StateRead, StoreError, Txn};
use crate::time::Stamp;

pub use crate::machine::cluster::{cluster_version, max_clock_skew_ms};
pub use crate::machine::last_stamp as safe_time;

/// One queue with its partitions.
#[derive(Debug, Clone)]
pub struct QueueView {
    /// The queue.
    pub queue: QueueRec,
    /// Its partitions in creation order.
    pub partitions: Vec<PartitionRec>,
}

/// A queue by name.
///
/// # Errors
/// Store failures.
pub fn queue(s: &dyn StateRead, name: &str) -> Result<Option<QueueRec>, StoreError> {
    get_rec(s, &keys::queue(name))
}

/// Every queue, in name order, at most `limit`.
///
/// # Errors
/// Store failures.
pub fn queues(s: &dyn StateRead, limit: usize) -> Result<Vec<QueueRec>, StoreError> {
    Ok(scan_recs::<QueueRec>(
        s,
        &keys::table_start(keys::table::QUEUE),
        &keys::table_end(keys::table::QUEUE),
        limit,
    )?
    .into_iter()
    .map(|(_, q)| q)
    .collect())
}

/// One tenant's queues, in name order, at most `limit`: a range of the queue table, so a
/// listing reads no other tenant's rows.
///
/// # Errors
/// Store failures.
pub fn tenant_queues(
    s: &dyn StateRead,
    tenant: &crate::tenant::Tenant,
    limit: usize,
) -> Result<Vec<QueueRec>, StoreError> {
    let (start, end) = if tenant.is_default() {
        // Every client name starts at or above ' '; scoped names start with the mark.
        (keys::queue("\u{2}"), keys::table_end(keys::table::QUEUE))
    } else {
        let scope = tenant.scope();
        let mut end = keys::queue(scope);
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        (keys::queue(scope), end)
    };
    Ok(scan_recs::<QueueRec>(s, &start, &end, limit)?
        .into_iter()
        .map(|(_, q)| q)
        .collect())
}

/// The tenants other than the default one that have a row in `table` (whose keys start with a
/// stored name: queues, KV rows, timers), found by skipping from one tenant's scope to the
/// next: one seek per tenant, whatever their rows. Ids as stored (lowercase).
///
/// # Errors
/// Store failures.
pub fn scoped_tenants(s: &dyn StateRead, table: u8) -> Result<Vec<String>, StoreError> {
    let mark = crate::tenant::SCOPE_MARK as u8;
    let end = [table, mark + 1];
    let mut from = vec![table, mark];
    let mut out = Vec::new();
    loop {
        let mut next: Option<Vec<u8>> = None;
        try_scan(s, &from, &end, |k, _| {
            next = Some(k.to_vec());
            Ok(false)
        })?;
        let Some(k) = next else {
            return Ok(out);
        };
        let rest = k.get(2..).unwrap_or_default();
        match rest.iter().position(|b| *b == mark) {
            Some(at) => {
                out.push(String::from_utf8_lossy(&rest[..at]).into_owned());
                from = keys::prefix_end(&k[..2 + at + 1]);
            }
            // Not a scoped name after all: step past this key.
            None => from = keys::prefix_end(&k),
        }
    }
}

/// A partition's record, if the partition exists.
///
/// # Errors
/// Store failures.
pub fn partition(s: &dyn StateRead, pid: u64) -> Result<Option<PartitionRec>, StoreError> {
    get_rec::<PartitionRec>(s, &keys::partition(pid))
}

/// The queue a partition belongs to (its stored name), if the partition exists.
///
/// # Errors
/// Store failures.
pub fn partition_queue(s: &dyn StateRead, pid: u64) -> Result<Option<String>, StoreError> {
    Ok(get_rec::<PartitionRec>(s, &keys::partition(pid))?.map(|p| p.queue))
}

/// The queue a live lease was granted on (its stored name), if the lease exists and still
/// holds a partition.
///
/// # Errors
/// Store failures.
pub fn lease_queue(s: &dyn StateRead, lease_id: &str) -> Result<Option<String>, StoreError> {
    let Some(l) = get_rec::<crate::model::LeaseRec>(s, &keys::lease(lease_id))? else {
        return Ok(None);
    };
    match l.parts.first() {
        Some(pid) => partition_queue(s, *pid),
        None => Ok(None),
    }
}

/// A queue and its partitions.
///
/// # Errors
/// Store failures.
pub fn queue_view(s: &dyn StateRead, name: &str) -> Result<Option<QueueView>, StoreError> {
    let Some(q) = queue(s, name)? else {
        return Ok(None);
    };
    let mut partitions = Vec::new();
    for pid in crate::machine::partition_ids_pub(s, q.qid)? {
        if let Some(p) = get_rec::<PartitionRec>(s, &keys::partition(pid))? {
            partitions.push(p);
        }
    }
    Ok(Some(QueueView {
        queue: q,
        partitions,
    }))
}

/// A group's cursor on a partition.
///
/// # Errors
/// Store failures.
pub fn cursor(s: &dyn StateRead, pid: u64, group: &str) -> Result<Option<CursorRec>, StoreError> {
    get_rec(s, &keys::cursor(pid, group))
}

/// The cursors of every group on a partition, as (group, cursor).
///
/// # Errors
/// Store failures.
pub fn cursors(s: &dyn StateRead, pid: u64) -> Result<Vec<(String, CursorRec)>, StoreError> {
    let prefix = keys::pid_prefix(keys::table::CURSOR, pid);
    Ok(
        scan_recs::<CursorRec>(s, &prefix, &keys::prefix_end(&prefix), usize::MAX)?
            .into_iter()
            .map(|(k, c)| {
                (
                    String::from_utf8_lossy(k.get(9..).unwrap_or_default()).into_owned(),
                    c,
                )
            })
            .collect(),
    )
}

/// A page of a queue's dead letters, filtered, with the filtered total.
///
/// # Errors
/// Store failures.
pub fn dead_letters(
    s: &dyn StateRead,
    qid: u64,
    filter: &dyn Fn(&DlqRec) -> bool,
    offset: usize,
    limit: usize,
) -> Result<(Vec<DlqRec>, usize), StoreError> {
    let prefix = keys::pid_prefix(keys::table::DLQ, qid);
    let all: Vec<(Vec<u8>, DlqRec)> =
        scan_recs(s, &prefix, &keys::prefix_end(&prefix), usize::MAX)?;
    let matching: Vec<DlqRec> = all
        .into_iter()
        .map(|(_, d)| d)
        .filter(|d| filter(d))
        .collect();
    let total = matching.len();
    Ok((
        matching.into_iter().skip(offset).take(limit).collect(),
        total,
    ))
}

/// What a pop would claim at `now` on the current state, without writing anything: the
/// long-poll pre-check, so that an empty pop never reaches the log. The claims come back
/// without their messages (those are read only when the pop is applied), so a look costs a few
/// row reads, not a read of the messages.
///
/// # Errors
/// Store failures.
pub fn would_pop(
    s: &dyn StateRead,
    now: Stamp,
    cmd: &PopCommand,
) -> Result<PopOutcome, StoreError> {
    would_pop_declaring(s, now, cmd, false)
}

/// [`would_pop`] for a pop that declares conflation (`Command::PopConflating`) when
/// `conflation` is set: the answer's conflation echo is the one such a pop would get (an empty
/// answer carries it too).
///
/// # Errors
/// Store failures.
pub fn would_pop_declaring(
    s: &dyn StateRead,
    now: Stamp,
    cmd: &PopCommand,
    conflation: bool,
) -> Result<PopOutcome, StoreError> {
    let mut scratch = Txn::new(s);
    let now = now.max(Stamp(safe_time(s)?.0 + 1));
    pop(&mut scratch, now, cmd, conflation, false)
}

/// Whether a pop of `queue` by `group` that names no partition reads every partition it could
/// claim from: false while the group's ready index does not cover the queue yet (from
/// [`Command::BOUNDED_FILL_FORMAT`] on, such a pop covers a bounded share more of it, so an
/// empty answer proves nothing and the pop is worth proposing again).
///
/// # Errors
/// Store failures.
pub fn index_covers(s: &dyn StateRead, queue: &str, group: &str) -> Result<bool, StoreError> {
    if crate::machine::cluster::cluster_version(s)? < Command::BOUNDED_FILL_FORMAT {
        return Ok(true);
    }
    let Some(q) = get_rec::<QueueRec>(s, &keys::queue(queue))? else {
        return Ok(true);
    };
    Ok(crate::machine::ready::meta(s, q.qid, group)?.fill == crate::machine::ready::FILLED)
}

/// Whether `group`'s stored delivery policy on queue `qid` conflates (contract 2.0.8).
///
/// # Errors
/// Store failures.
pub fn group_conflates(s: &dyn StateRead, qid: u64, group: &str) -> Result<bool, StoreError> {
    crate::machine::conflation::stored(s, qid, group)
}

/// The stamp of the newest message retention deleted from a partition, if any.
///
/// # Errors
/// Store failures.
pub fn purged_stamp(s: &dyn StateRead, pid: u64) -> Result<Option<Stamp>, StoreError> {
    get_rec(s, &keys::purged(pid))
}

/// A partition of a queue by name.
///
/// # Errors
/// Store failures.
pub fn partition_by_name(
    s: &dyn StateRead,
    queue: &str,
    name: &str,
) -> Result<Option<PartitionRec>, StoreError> {
    let Some(q) = self::queue(s, queue)? else {
        return Ok(None);
    };
    let Some(pid) = get_rec::<u64>(s, &keys::partition_name(q.qid, name))? else {
        return Ok(None);
    };
    get_rec(s, &keys::partition(pid))
}

/// Messages of a partition from `from`, up to `max_bytes` of payload (always at least one when
/// there is one, so a read cannot stall) and `max_count`.
///
/// # Errors
/// Store failures.
pub fn messages(
    s: &dyn StateRead,
    p: &PartitionRec,
    from: u64,
    max_bytes: usize,
    max_count: usize,
) -> Result<Vec<(u64, crate::model::MessageRec)>, StoreError> {
    let mut out = Vec::new();
    let mut bytes = 0usize;
    try_scan(
        s,
        &keys::message(p.pid, from),
        &keys::message(p.pid, p.next_offset),
        |k, v| {
            let m = crate::codec::decode::<crate::model::MessageRec>(k, v)?;
            let size = m.payload.len() + m.transaction_id.len() + 64;
            if !out.is_empty() && bytes + size > max_bytes {
                return Ok(false);
            }
            bytes += size;
            out.push((keys::offset_of_message_key(k).unwrap_or(from), m));
            Ok(out.len() < max_count)
        },
    )?;
    Ok(out)
}

/// Every consumer group record as (queue, group, record).
///
/// # Errors
/// Store failures.
pub fn groups(
    s: &dyn StateRead,
) -> Result<Vec<(QueueRec, String, crate::model::GroupRec)>, StoreError> {
    let by_qid: std::collections::BTreeMap<u64, QueueRec> = queues(s, usize::MAX)?
        .into_iter()
        .map(|q| (q.qid, q))
        .collect();
    let rows: Vec<(Vec<u8>, crate::model::GroupRec)> = scan_recs(
        s,
        &keys::table_start(keys::table::GROUP),
        &keys::table_end(keys::table::GROUP),
        usize::MAX,
    )?;
    Ok(rows
        .into_iter()
        .filter_map(|(k, g)| {
            let qid = keys::u64_at(&k, 1)?;
            let q = by_qid.get(&qid)?.clone();
            Some((
                q,
                String::from_utf8_lossy(k.get(9..).unwrap_or_default()).into_owned(),
                g,
            ))
        })
        .collect())
}

/// A group's standing on one partition: (offset lag, stamp of the oldest unconsumed message,
/// live lease).
///
/// # Errors
/// Store failures.
pub fn lag(
    s: &dyn StateRead,
    p: &PartitionRec,
    group: &str,
    start: crate::model::SubscriptionStart,
    now: Stamp,
) -> Result<(u64, Option<Stamp>, bool, Stamp), StoreError> {
    let c = cursor(s, p.pid, group)?;
    let next = match &c {
        Some(c) => c.next.max(p.log_start),
        None => match start {
            crate::model::SubscriptionStart::All => p.log_start,
            crate::model::SubscriptionStart::From(_) => {
                crate::machine::start_offset_pub(s, p, start)?
            }
        },
    };
    let lag = p.next_offset.saturating_sub(next);
    let oldest = if lag > 0 {
        get_rec::<crate::model::MessageRec>(s, &keys::message(p.pid, next))?.map(|m| m.stamp)
    } else {
        None
    };
    let leased = c.as_ref().is_some_and(|c| c.live_lease(now).is_some());
    Ok((lag, oldest, leased, c.map_or(Stamp(0), |c| c.last_consumed)))
}

/// A pending timer.
///
/// # Errors
/// Store failures.
pub fn timer(
    s: &dyn StateRead,
    queue: &str,
    key: &str,
) -> Result<Option<crate::timers::TimerRec>, StoreError> {
    get_rec(s, &keys::timer(queue, key))
}

/// A page of a queue's pending timers by key, after `after` (exclusive); the bool says more follow.
///
/// # Errors
/// Store failures.
pub fn timers(
    s: &dyn StateRead,
    queue: &str,
    after: Option<&str>,
    limit: usize,
) -> Result<(Vec<(String, crate::timers::TimerRec)>, bool), StoreError> {
    let base = keys::timer_queue(queue);
    let start = match after {
        Some(a) => {
            let mut k = keys::timer(queue, a);
            k.push(0);
            k
        }
        None => base.clone(),
    };
    let rows: Vec<(Vec<u8>, crate::timers::TimerRec)> =
        scan_recs(s, &start, &keys::prefix_end(&base), limit + 1)?;
    let more = rows.len() > limit;
    Ok((
        rows.into_iter()
            .take(limit)
            .map(|(k, t)| {
                (
                    String::from_utf8_lossy(k.get(base.len()..).unwrap_or_default()).into_owned(),
                    t,
                )
            })
            .collect(),
        more,
    ))
}

/// Whether rows of deleted queues are still waiting for housekeeping to sweep them (their
/// "graves").
///
/// # Errors
/// Store failures.
pub fn deletions_pending(s: &dyn StateRead) -> Result<bool, StoreError> {
    let mut any = false;
    s.scan(
        &keys::table_start(keys::table::GRAVE),
        &keys::table_end(keys::table::GRAVE),
        &mut |_, _| {
            any = true;
            false
        },
    )?;
    Ok(any)
}
