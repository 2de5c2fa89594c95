//! Push: append to a partition's log, deduplicated by transactionId.

use crate::command::{PushItemRef, PushOutcome, PushStatus};
use crate::keys::{self, DedupKey};
use crate::model::{MessageRecRef, PartitionRec, QueueRec};
use crate::store::{Appended, StateRead, StoreError, Txn};
use crate::time::Stamp;

use super::dedup;
use super::queue::{ensure_partition, ensure_queue};
use super::{put_rec, text_for_answer};

/// Push every item; each gets its own answer, in order. All records share `stamp`. With
/// `from_entry`, the items are those of the `Command::Push` entry being applied, and each stored
/// message's origin is noted in `txn` (see [`Txn::record_origins`]). Each message is encoded
/// into the overlay as it is stored.
///
/// With `answered` false (nobody on this node waits for the answers) the answers carry their
/// status, ids and offsets but not copies of the transactionId and queue name. `producer`
/// is stamped on every message (`Command::AsProducer`).
pub(crate) fn push(
    txn: &mut Txn<'_>,
    stamp: Stamp,
    items: &[PushItemRef<'_>],
    answered: bool,
    from_entry: bool,
    producer: Option<&str>,
) -> Result<Vec<PushOutcome>, StoreError> {
    push_with(
        txn,
        stamp,
        items,
        answered,
        producer,
        |txn, pid, offset, index, m| {
            txn.append(pid, offset, Appended::Encoded(m.encode()));
            if from_entry {
                txn.note_origin(pid, offset, index);
            }
        },
    )
}

/// [`push`] of the items of the `Command::Push` entry being applied, read in place from the
/// entry's bytes that outlive `txn`: the overlay holds each message as pushed (borrowed), so a
/// store that keeps the entry never copies or encodes the messages it keeps.
pub(crate) fn push_in_place<'a>(
    txn: &mut Txn<'a>,
    stamp: Stamp,
    items: &[PushItemRef<'a>],
    answered: bool,
) -> Result<Vec<PushOutcome>, StoreError> {
    push_with(
        txn,
        stamp,
        items,
        answered,
        None,
        |txn, pid, offset, index, m| {
            txn.append(pid, offset, Appended::Pushed(m));
            txn.note_origin(pid, offset, index);
        },
    )
}

/// The rules of a push; `store` puts the message at (pid, offset), item `index` of `items`.
///
/// The queue and partition records a batch touches are read once and written once, at the end
/// (a batch usually goes to a few partitions); only the dedup lookup is per item.
fn push_with<'t, 'i>(
    txn: &mut Txn<'t>,
    stamp: Stamp,
    items: &[PushItemRef<'i>],
    answered: bool,
    producer: Option<&'i str>,
    mut store: impl FnMut(&mut Txn<'t>, u64, u64, u32, MessageRecRef<'i>),
) -> Result<Vec<PushOutcome>, StoreError> {
    let mut out = Vec::with_capacity(items.len());
    let mut queues: Vec<QueueRec> = Vec::new();
    // (index in `queues`, partition record, whether a message went to it, its end before)
    let mut parts: Vec<(usize, PartitionRec, bool, u64)> = Vec::new();
    // Queues and partitions first, in item order (the order they are created in), then every
    // item's dedup key, so that the store can bring the rows' filter blocks in together.
    let mut at: Vec<(usize, usize)> = Vec::with_capacity(items.len());
    for item in items {
        let qi = match queues.iter().position(|q| q.name == item.queue) {
            Some(i) => i,
            None => {
                queues.push(ensure_queue(txn, item.queue, stamp)?);
                queues.len() - 1
            }
        };
        let pi = match parts
            .iter()
            .position(|(i, p, _, _)| *i == qi && p.name == item.partition)
        {
            Some(i) => i,
            None => {
                let p = ensure_partition(txn, &mut queues[qi], item.partition, stamp)?;
                let end = p.next_offset;
                parts.push((qi, p, false, end));
                parts.len() - 1
            }
        };
        at.push((qi, pi));
    }
    let dedup_keys: Vec<DedupKey> = items
        .iter()
        .zip(&at)
        .map(|(item, &(_, pi))| keys::dedup_key(parts[pi].1.pid, item.transaction_id))
        .collect();
    txn.prefetch_dedup(&dedup_keys);
    txn.reserve_dedup(items.len());
    for (index, (item, &(qi, pi))) in items.iter().zip(&at).enumerate() {
        let q = &mut queues[qi];
        let (_, p, touched, _) = &mut parts[pi];
        let mut answer = PushOutcome {
            status: PushStatus::Queued,
            message_id: item.message_id,
            offset: 0,
            partition_id: p.pid,
            transaction_id: text_for_answer(answered, item.transaction_id),
            queue: text_for_answer(answered, &q.name),
        };
        if item.transaction_id.is_empty() {
            answer.status = PushStatus::Failed("transactionId must not be empty".to_owned());
            out.push(answer);
            continue;
        }
        let row = dedup::lookup_key(txn, dedup_keys[index])?;
        if let Some(orig) = row.original(txn, p.pid, item.transaction_id)? {
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
        store(
            txn,
            p.pid,
            offset,
            u32::try_from(index).unwrap_or(u32::MAX),
            MessageRecRef {
                transaction_id: item.transaction_id,
                id: item.message_id,
                trace_id: item.trace_id,
                stamp,
                payload: item.payload,
                producer,
            },
        );
        row.record(txn, offset);
        p.next_offset += 1;
        p.last_write = stamp;
        *touched = true;
        q.messages += 1;
        answer.offset = offset;
        out.push(answer);
    }
    let mut touched_queues = vec![false; queues.len()];
    // The groups of each queue, read once per push and only for a queue that got a message.
    let mut groups: Vec<Option<Vec<(String, super::ready::Meta)>>> = vec![None; queues.len()];
    for (qi, p, touched, old_next) in &parts {
        if *touched {
            put_rec(txn, keys::partition(p.pid), p);
            touched_queues[*qi] = true;
            if groups[*qi].is_none() {
                groups[*qi] = Some(super::ready::groups(txn, queues[*qi].qid)?);
            }
            let of_queue = groups[*qi].as_deref_mut().unwrap_or_default();
            super::ready::pushed(txn, of_queue, p, *old_next, stamp)?;
        }
    }
    for (q, touched) in queues.iter().zip(touched_queues) {
        if touched {
            put_rec(txn, keys::queue(&q.name), q);
        }
    }
    Ok(out)
}
