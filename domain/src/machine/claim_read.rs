//! What a claim reads: the messages it delivers, and where a group starts in a partition it
//! has not touched. Pops use both; seeks and the read routes use the start too.

use crate::command::Delivered;
use crate::keys;
use crate::model::{CursorRec, MessageRec, PartitionRec, SubscriptionStart};
use crate::store::{StateRead, StoreError, Txn};
use crate::time::Stamp;

use super::{get_rec, try_scan};

/// The messages of a claim on partition `pid` from `from` (at most `budget`, before `until`):
/// all of them, or up to the first one still inside the queue's `delay` (seconds) at `stamp`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn read_claim(
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
