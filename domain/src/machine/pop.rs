//! Pop: claim deliverable messages for a group under one lease.

use crate::command::{Claim, Delivered, PopCommand, PopOutcome, Subscription};
use crate::keys;
use crate::model::{
    CursorLease, CursorRec, GroupRec, LeaseRec, MessageRec, PartitionRec, QueueRec,
    SubscriptionStart,
};
use crate::store::{StateRead, StoreError, Txn};
use crate::time::Stamp;

use super::queue::partition_ids;
use super::{get_rec, put_rec, try_scan};

/// Claim up to `batch` messages over up to `max_partitions` partitions. Partitions under a
/// live lease of the same group are skipped; an expired lease is simply replaced (redelivery
/// without counting a retry).
///
/// `answered` is false when nobody on this node waits for the answer (a follower applying the
/// leader's pop): the state changes are the same, but without a delay the messages are not
/// read at all. Every offset from `log_start` to `next_offset` is stored (`invariants::check`),
/// so the claim's extent follows from the offsets alone, and the claims come back without their
/// messages.
pub(crate) fn pop(
    txn: &mut Txn<'_>,
    stamp: Stamp,
    cmd: &PopCommand,
    answered: bool,
) -> Result<PopOutcome, StoreError> {
    let mut out = PopOutcome {
        lease_id: String::new(),
        lease_expires: Stamp(0),
        claims: Vec::new(),
    };
    let Some(q) = get_rec::<QueueRec>(txn, &keys::queue(cmd.queue.as_str()))? else {
        return Ok(out);
    };
    let group = cmd.group.as_str();
    let group_key = keys::group(q.qid, group);
    let mut g = match get_rec::<GroupRec>(txn, &group_key)? {
        Some(g) => g,
        None => GroupRec {
            start: if cmd.group.is_queue_mode() {
                SubscriptionStart::All
            } else {
                match cmd.subscription {
                    Subscription::Default | Subscription::All => SubscriptionStart::All,
                    Subscription::New => SubscriptionStart::From(stamp),
                    Subscription::From(s) => SubscriptionStart::From(s),
                }
            },
            created: stamp,
            last_pid: 0,
        },
    };
    let candidates: Vec<u64> = match &cmd.partition {
        Some(name) => get_rec::<u64>(txn, &keys::partition_name(q.qid, name.as_str()))?
            .into_iter()
            .collect(),
        None => {
            let mut all = partition_ids(txn, q.qid)?;
            // Start after the partition this group claimed last, so competing consumers
            // spread over the partitions.
            let split = all.partition_point(|pid| *pid <= g.last_pid);
            all.rotate_left(split);
            all
        }
    };
    let lease_expires = stamp.plus_seconds(q.options.lease_time);
    // Leases are judged live against this (behind `stamp` while a leader change holds them).
    let lease_now = super::cluster::lease_now(txn, stamp)?;
    let delay = q.options.delayed_processing;
    let mut budget = cmd.batch.max(1) as usize;
    let max_parts = cmd.max_partitions.max(1) as usize;
    for pid in candidates {
        if budget == 0 || out.claims.len() >= max_parts {
            break;
        }
        let Some(p) = get_rec::<PartitionRec>(txn, &keys::partition(pid))? else {
            continue;
        };
        let cursor_key = keys::cursor(pid, group);
        let mut c = match get_rec::<CursorRec>(txn, &cursor_key)? {
            Some(c) => c,
            None => CursorRec {
                next: start_offset(txn, &p, g.start)?,
                ..CursorRec::default()
            },
        };
        if c.live_lease(lease_now).is_some() {
            continue;
        }
        let from = c.next.max(p.log_start);
        if from >= p.next_offset {
            continue;
        }
        let mut until = p.next_offset.min(from.saturating_add(budget as u64));
        // Deleted messages, and retried dead letters of other groups, are stepped over: the
        // claim starts at its first message this group may see and ends after its last, and
        // counts only those (decided from the marks alone, the same with or without reading
        // the messages).
        let marks = super::marks::in_range(txn, pid, from, p.next_offset)?;
        let mut from = from;
        let mut live = until - from;
        if !marks.is_empty() {
            // Walk past hidden offsets until the claim holds `budget` messages this group sees
            // (marks are few: operators' deletions and retries).
            let mut seen: Vec<u64> = Vec::new();
            let mut at = from;
            while at < p.next_offset && seen.len() < budget {
                if !super::marks::hidden(&marks, at, group) {
                    seen.push(at);
                }
                at += 1;
            }
            let (Some(&first), Some(&last)) = (seen.first(), seen.last()) else {
                c.next = at;
                put_rec(txn, cursor_key, &c);
                continue;
            };
            (from, until, live) = (first, last + 1, seen.len() as u64);
        }
        let (count, last, delivered) = if !answered && delay == 0 {
            (live, until - 1, Vec::new())
        } else {
            let d = read_claim(
                txn, pid, from, until, budget, delay, stamp, &c, &marks, group,
            )?;
            let Some(last) = d.last().map(|d| d.offset) else {
                continue;
            };
            (d.len() as u64, last, d)
        };
        budget -= count as usize;
        c.next = from;
        if cmd.auto_ack {
            c.next = last + 1;
            c.lease = None;
            c.last_consumed = stamp;
        } else {
            c.lease = Some(CursorLease {
                id: cmd.lease_id.clone(),
                expires: lease_expires,
                end: last + 1,
            });
        }
        put_rec(txn, cursor_key, &c);
        g.last_pid = pid;
        out.claims.push(Claim {
            pid,
            partition: p.name.clone(),
            messages: delivered,
        });
    }
    put_rec(txn, group_key, &g);
    if !out.claims.is_empty() && !cmd.auto_ack {
        out.lease_id = cmd.lease_id.as_str().to_owned();
        out.lease_expires = lease_expires;
        put_rec(
            txn,
            keys::lease(cmd.lease_id.as_str()),
            &LeaseRec {
                qid: q.qid,
                group: group.to_owned(),
                parts: out.claims.iter().map(|c| c.pid).collect(),
                expires: lease_expires,
            },
        );
        put_rec(
            txn,
            keys::lease_expiry(lease_expires.0, cmd.lease_id.as_str()),
            &(),
        );
        super::cluster::note_lease_expiry(txn, lease_expires)?;
    }
    Ok(out)
}

/// The messages of a claim on partition `pid` from `from` (at most `budget`, before `until`):
/// all of them, or up to the first one still inside the queue's `delay` (seconds) at `stamp`.
#[allow(clippy::too_many_arguments)]
fn read_claim(
    txn: &Txn<'_>,
    pid: u64,
    from: u64,
    until: u64,
    budget: usize,
    delay: u64,
    stamp: Stamp,
    c: &CursorRec,
    marks: &[(u64, Option<String>)],
    group: &str,
) -> Result<Vec<Delivered>, StoreError> {
    // Each message is decoded straight into its answer as the scan hands it over.
    let mut delivered = Vec::with_capacity(budget.min(1024));
    try_scan(
        txn,
        &keys::message(pid, from),
        &keys::message(pid, until),
        |k, v| {
            let offset = keys::offset_of_message_key(k).unwrap_or(from);
            if super::marks::hidden(marks, offset, group) {
                return Ok(true);
            }
            let m = crate::codec::decode::<MessageRec>(k, v)?;
            if delay > 0 && m.stamp.plus_seconds(delay) > stamp {
                return Ok(false);
            }
            let attempt = if offset == c.retry_offset && c.retries > 0 {
                c.retries + 1
            } else {
                1
            };
            delivered.push(Delivered {
                offset,
                transaction_id: m.transaction_id,
                id: m.id,
                trace_id: m.trace_id,
                payload: m.payload,
                created: m.stamp,
                attempt,
                producer: m.producer,
            });
            Ok(delivered.len() < budget)
        },
    )?;
    Ok(delivered)
}

/// Where a group starts in a partition it has not touched: the oldest retained offset, or the
/// first offset stamped at or after its subscription time (stamps rise with offsets, so a
/// binary search over point reads finds it).
pub(crate) fn start_offset(
    s: &dyn StateRead,
    p: &PartitionRec,
    start: SubscriptionStart,
) -> Result<u64, StoreError> {
    let SubscriptionStart::From(t) = start else {
        return Ok(p.log_start);
    };
    let (mut lo, mut hi) = (p.log_start, p.next_offset);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match get_rec::<MessageRec>(s, &keys::message(p.pid, mid))? {
            Some(m) if m.stamp < t => lo = mid + 1,
            Some(_) => hi = mid,
            // A hole can only be below log_start (deleted by retention): move up.
            None => lo = mid + 1,
        }
    }
    Ok(lo)
}
