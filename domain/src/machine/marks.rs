//! Message marks: the rows that let one stored message be taken out of delivery without
//! rewriting the log it sits in.
//!
//! `(MARK, pid, offset) -> Option<group>`:
//! - `None`: the message is **deleted** for every group. Pops step over it (a group whose
//!   cursor reaches it moves past it as if it had been consumed) and browsing no longer lists it.
//!   The record stays in the log, so `fetch` and the S3 sink still read it, until retention
//!   drops it with its neighbours.
//! - `Some(group)`: the message is the copy of a **retried dead letter**, delivered to that group
//!   only; every other group steps over it.
//!
//! Pops read a claim's marks from the state alone (never from the messages), so a leader that
//! reads the messages and a follower that does not decide the same claim.

use crate::command::{MessageChange, Outcome, PushItemRef};
use crate::ids::TransactionId;
use crate::keys;
use crate::model::{DlqRec, PartitionRec};
use crate::names::GroupName;
use crate::store::{StateRead, StoreError, Txn};
use crate::time::Stamp;

use super::{get_rec, put_rec, scan_recs};

/// Ranges of at most this many offsets are read mark by mark instead of scanned.
const POINT_READS: u64 = 4;

/// The marks of partition `pid` on offsets `from..until`, in offset order.
pub(crate) fn in_range(
    s: &dyn StateRead,
    pid: u64,
    from: u64,
    until: u64,
) -> Result<Vec<(u64, Option<String>)>, StoreError> {
    if from >= until {
        return Ok(Vec::new());
    }
    if until - from <= POINT_READS {
        // A short range (a claim of one or a few messages: one message per partition is the
        // common shape) is read by key: a point read the engine answers from its filters when
        // nothing is marked, where a range scan opens every table it overlaps.
        let mut marks = Vec::new();
        for offset in from..until {
            if let Some(g) = get_rec::<Option<String>>(s, &keys::mark(pid, offset))? {
                marks.push((offset, g));
            }
        }
        return Ok(marks);
    }
    let rows: Vec<(Vec<u8>, Option<String>)> = scan_recs(
        s,
        &keys::mark(pid, from),
        &keys::mark(pid, until),
        usize::MAX,
    )?;
    Ok(rows
        .into_iter()
        .filter_map(|(k, g)| keys::u64_at(&k, 9).map(|o| (o, g)))
        .collect())
}

/// Whether a message at `offset` is out of `group`'s delivery, given its range's marks.
pub(crate) fn hidden(marks: &[(u64, Option<String>)], offset: u64, group: &str) -> bool {
    marks
        .binary_search_by_key(&offset, |(o, _)| *o)
        .ok()
        .is_some_and(|i| marks[i].1.as_deref() != Some(group))
}

/// Where a message stands: its partition and offset, when it is stored.
fn find(
    txn: &Txn<'_>,
    pid: u64,
    transaction_id: &str,
) -> Result<Option<(PartitionRec, u64)>, StoreError> {
    let Some(p) = get_rec::<PartitionRec>(txn, &keys::partition(pid))? else {
        return Ok(None);
    };
    let offset =
        super::dedup::lookup(txn, pid, transaction_id)?.offset(txn, pid, transaction_id)?;
    Ok(offset
        .filter(|o| *o >= p.log_start && *o < p.next_offset)
        .map(|o| (p, o)))
}

/// Apply `Command::DeleteMessage`.
pub(crate) fn delete_message(
    txn: &mut Txn<'_>,
    pid: u64,
    transaction_id: &TransactionId,
) -> Result<Outcome, StoreError> {
    let Some((_, offset)) = find(txn, pid, transaction_id.as_str())? else {
        return Ok(Outcome::MessageChanged(MessageChange::NotFound));
    };
    put_rec(txn, keys::mark(pid, offset), &None::<String>);
    Ok(Outcome::MessageChanged(MessageChange::Deleted))
}

/// The transactionId of a dead letter's copy: the original's with `#retry<seq>`, cut to fit.
fn copy_id(original: &str, seq: u64) -> String {
    let suffix = format!("#retry{seq}");
    let room = crate::ids::MAX_TRANSACTION_ID_BYTES - suffix.len();
    let mut cut = original.len().min(room);
    while !original.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}{suffix}", &original[..cut])
}

/// Apply `Command::RetryDeadLetter`.
pub(crate) fn retry_dead_letter(
    txn: &mut Txn<'_>,
    stamp: Stamp,
    pid: u64,
    transaction_id: &TransactionId,
    group: Option<&GroupName>,
    message_id: [u8; 16],
    answered: bool,
) -> Result<Outcome, StoreError> {
    let Some(p) = get_rec::<PartitionRec>(txn, &keys::partition(pid))? else {
        return Ok(Outcome::MessageChanged(MessageChange::NotFound));
    };
    let prefix = keys::pid_prefix(keys::table::DLQ, p.qid);
    let dead: Vec<(Vec<u8>, DlqRec)> =
        scan_recs(txn, &prefix, &keys::prefix_end(&prefix), usize::MAX)?
            .into_iter()
            .filter(|(_, d): &(Vec<u8>, DlqRec)| {
                d.pid == pid
                    && d.transaction_id == transaction_id.as_str()
                    && group.is_none_or(|g| d.group == g.as_str())
            })
            .collect();
    let (key, d) = match dead.as_slice() {
        [] => return Ok(Outcome::MessageChanged(MessageChange::NotFound)),
        [one] => one.clone(),
        many => {
            let groups: Vec<&str> = many.iter().map(|(_, d)| d.group.as_str()).collect();
            return Ok(Outcome::MessageChanged(MessageChange::Refused(format!(
                "it is a dead letter of several groups ({}): name one in consumerGroup",
                groups.join(", ")
            ))));
        }
    };
    let seq = keys::u64_at(&key, 9).unwrap_or(0);
    let id = copy_id(&d.transaction_id, seq);
    let answer = super::push::push(
        txn,
        stamp,
        &[PushItemRef {
            queue: &p.queue,
            partition: &p.name,
            transaction_id: &id,
            message_id,
            payload: &d.payload,
            trace_id: None,
        }],
        answered,
        false,
        None,
    )?;
    let Some(pushed) = answer.into_iter().next() else {
        return Ok(Outcome::MessageChanged(MessageChange::NotFound));
    };
    match pushed.status {
        crate::command::PushStatus::Queued => {}
        crate::command::PushStatus::Duplicate => {
            // Retried before and not consumed yet: that copy stands.
        }
        crate::command::PushStatus::Failed(why) => {
            return Ok(Outcome::MessageChanged(MessageChange::Refused(why)));
        }
    }
    put_rec(txn, keys::mark(pid, pushed.offset), &Some(d.group.clone()));
    txn.delete(key);
    Ok(Outcome::MessageChanged(MessageChange::Retried {
        offset: pushed.offset,
        transaction_id: id,
        group: d.group,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_hide_deleted_messages_from_all_and_copies_from_other_groups() {
        let marks = vec![(3, None), (5, Some("billing".to_owned()))];
        assert!(hidden(&marks, 3, "billing"));
        assert!(hidden(&marks, 3, "audit"));
        assert!(!hidden(&marks, 5, "billing"));
        assert!(hidden(&marks, 5, "audit"));
        assert!(!hidden(&marks, 4, "audit"));
    }

    #[test]
    fn a_copy_id_keeps_its_original_and_fits() {
        assert_eq!(copy_id("order-1", 7), "order-1#retry7");
        let long = "é".repeat(400);
        let id = copy_id(&long, 12);
        assert!(id.len() <= crate::ids::MAX_TRANSACTION_ID_BYTES);
        assert!(id.ends_with("#retry12"));
    }
}
