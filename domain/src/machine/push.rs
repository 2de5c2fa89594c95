//! Push: append to a partition's log, deduplicated by transactionId.

use crate::command::{PushItem, PushOutcome, PushStatus};
use crate::keys;
use crate::model::{DedupRec, MessageRec};
use crate::store::{StoreError, Txn};
use crate::time::Stamp;

use super::queue::{ensure_partition, ensure_queue};
use super::{get_rec, put_rec};

/// Push every item; each gets its own answer, in order. All records share `stamp`.
pub(crate) fn push(
    txn: &mut Txn<'_>,
    stamp: Stamp,
    items: &[PushItem],
) -> Result<Vec<PushOutcome>, StoreError> {
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let mut q = ensure_queue(txn, &item.queue, stamp)?;
        let mut p = ensure_partition(txn, &mut q, &item.partition, stamp)?;
        let mut answer = PushOutcome {
            status: PushStatus::Queued,
            message_id: item.message_id,
            offset: 0,
            partition_id: p.pid,
            transaction_id: item.transaction_id.clone(),
            queue: q.name.clone(),
        };
        if item.transaction_id.is_empty() {
            answer.status = PushStatus::Failed("transactionId must not be empty".to_owned());
            out.push(answer);
            continue;
        }
        let dedup_key = keys::dedup(p.pid, &item.transaction_id);
        if let Some(orig) = get_rec::<DedupRec>(txn, &dedup_key)? {
            answer.status = PushStatus::Duplicate;
            answer.message_id = orig.id;
            answer.offset = orig.offset;
            out.push(answer);
            continue;
        }
        if q.options.max_size > 0 && q.messages >= q.options.max_size {
            answer.status = PushStatus::Failed(format!(
                "queue '{}' is full (maxSize {})",
                q.name, q.options.max_size
            ));
            out.push(answer);
            continue;
        }
        let offset = p.next_offset;
        put_rec(
            txn,
            keys::message(p.pid, offset),
            &MessageRec {
                transaction_id: item.transaction_id.clone(),
                id: item.message_id,
                trace_id: item.trace_id.clone(),
                stamp,
                payload: item.payload.clone(),
            },
        );
        put_rec(txn, dedup_key, &DedupRec { offset, id: item.message_id });
        p.next_offset += 1;
        p.last_write = stamp;
        put_rec(txn, keys::partition(p.pid), &p);
        q.messages += 1;
        put_rec(txn, keys::queue(&q.name), &q);
        answer.offset = offset;
        out.push(answer);
    }
    Ok(out)
}
