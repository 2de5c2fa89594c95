//! Timer rules: schedule (upsert), cancel, and delivery of due timers by ticks.

use crate::command::PushItemRef;
use crate::keys;
use crate::names::{PartitionName, QueueName};
use crate::store::{StoreError, Txn};
use crate::time::Stamp;
use crate::timers::{TimerOp, TimerRec, TimerResult};

use super::{get_rec, put_rec};

fn remove(txn: &mut Txn<'_>, queue: &str, key: &str) -> Result<Option<TimerRec>, StoreError> {
    let k = keys::timer(queue, key);
    let Some(t) = get_rec::<TimerRec>(txn, &k)? else {
        return Ok(None);
    };
    txn.delete(k);
    txn.delete(keys::timer_due(t.deliver_at.0, queue, key));
    Ok(Some(t))
}

/// Apply timer operations in order.
pub(crate) fn apply(
    txn: &mut Txn<'_>,
    stamp: Stamp,
    ops: &[TimerOp],
    producer: Option<&str>,
) -> Result<Vec<TimerResult>, StoreError> {
    let mut out = Vec::with_capacity(ops.len());
    for op in ops {
        out.push(match op {
            TimerOp::Schedule {
                queue,
                key,
                payload,
                delay_ms,
                txn: t,
                partition,
                message_id,
                reschedule,
            } => {
                remove(txn, queue.as_str(), key)?;
                let deliver_at = Stamp(stamp.0.saturating_add(delay_ms.saturating_mul(1000)));
                let rec = TimerRec {
                    payload: payload.clone(),
                    deliver_at,
                    txn: t.clone(),
                    partition: partition.as_ref().map_or_else(
                        || PartitionName::default_partition().as_str().to_owned(),
                        |p| p.as_str().to_owned(),
                    ),
                    message_id: *message_id,
                    scheduled: stamp,
                    producer: producer.map(str::to_owned),
                };
                put_rec(txn, keys::timer_due(deliver_at.0, queue.as_str(), key), &());
                put_rec(txn, keys::timer(queue.as_str(), key), &rec);
                TimerResult {
                    ok: true,
                    status: if *reschedule {
                        "rescheduled"
                    } else {
                        "scheduled"
                    }
                    .to_owned(),
                    queue: queue.as_str().to_owned(),
                    key: key.clone(),
                    txn: Some(t.clone()),
                    message_id: Some(*message_id),
                    deliver_at: Some(deliver_at),
                }
            }
            TimerOp::Cancel { queue, key } => match remove(txn, queue.as_str(), key)? {
                Some(t) => TimerResult {
                    ok: true,
                    status: "cancelled".to_owned(),
                    queue: queue.as_str().to_owned(),
                    key: key.clone(),
                    txn: Some(t.txn),
                    message_id: Some(t.message_id),
                    deliver_at: Some(t.deliver_at),
                },
                None => TimerResult {
                    ok: true,
                    status: "absent".to_owned(),
                    queue: queue.as_str().to_owned(),
                    key: key.clone(),
                    txn: None,
                    message_id: None,
                    deliver_at: None,
                },
            },
        });
    }
    Ok(out)
}

/// Deliver due timers (at most `budget / 4`): each becomes a push into its queue.
pub(crate) fn deliver_due(
    txn: &mut Txn<'_>,
    stamp: Stamp,
    budget: &mut usize,
) -> Result<(), StoreError> {
    for (k, queue, key) in super::due_entries(&*txn, keys::table::TIMER_DUE, stamp, *budget / 4)? {
        txn.delete(k);
        *budget = budget.saturating_sub(4);
        if queue.is_empty() {
            continue;
        }
        let Some(t) = remove(txn, &queue, &key)? else {
            continue;
        };
        let (Ok(q), Ok(p)) = (
            QueueName::try_from(queue),
            PartitionName::new(t.partition.clone()),
        ) else {
            continue;
        };
        super::push::push(
            txn,
            stamp,
            &[PushItemRef {
                queue: q.as_str(),
                partition: p.as_str(),
                transaction_id: &t.txn,
                message_id: t.message_id,
                payload: &t.payload,
                trace_id: None,
            }],
            false,
            false,
            t.producer.as_deref(),
        )?;
    }
    Ok(())
}
