//! `apply(state, entry) -> outcome`: the deterministic state machine of the broker.
//!
//! Each entry is stamped `max(previous stamp + 1, proposed_at)` and every rule that depends on
//! time compares stamps, never a clock, so every replica computes the same state.

mod ack;
mod claim_read;
pub mod cluster;
pub(crate) mod conflation;
pub(crate) mod dedup;
mod groups;
mod housekeeping;
pub(crate) mod kv;
mod locks;
pub(crate) mod marks;
mod pop;
mod push;
mod queue;
pub(crate) mod ready;
pub(crate) mod timers;
mod transaction;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::codec::{decode, encode};
use crate::command::{Command, Entry, Outcome, PushItem, Response};
use crate::keys;
use crate::store::{StateRead, StoreError, Txn};
use crate::time::Stamp;

pub use ack::{DeliveredOffsets, resolve_offsets as resolve_ack_offsets};
pub use housekeeping::HousekeepingBudget;
pub use pop::MAX_FILL_STEPS;
pub(crate) use pop::pop;

/// Apply one entry on top of `txn`. The entry's effects are staged in `txn`; the caller commits
/// them atomically (with whatever else it batches). `index` is the entry's log index: KV
/// versions are the index of the write, so they rise and are never reissued.
///
/// # Errors
/// Only store failures; every rule violation is an outcome, never an error.
pub fn apply_entry(txn: &mut Txn<'_>, entry: &Entry, index: u64) -> Result<Response, StoreError> {
    apply_entry_as(txn, entry, index, true)
}

/// `apply_entry`, with `answered` false when nobody on this node waits for the response (a
/// follower): the state changes are exactly the same, but a rule may leave out of the outcome
/// what only the answer needs (a pop does not read the messages it claims), so the response is
/// not to be sent to anyone.
///
/// # Errors
/// Only store failures.
pub fn apply_entry_as(
    txn: &mut Txn<'_>,
    entry: &Entry,
    index: u64,
    answered: bool,
) -> Result<Response, StoreError> {
    let stamp = next_stamp(txn, entry.proposed_at)?;
    // A push, transaction or timer schedule on behalf of an authenticated producer stamps its
    // messages (a timer's when it is delivered). Its pushes are stored as encoded messages (no
    // origin in the entry: a kept entry is read back as a plain push).
    let (command, producer) = match &entry.command {
        Command::AsProducer { producer, command } => match &**command {
            c @ (Command::Push(_) | Command::Transaction { .. } | Command::Timers(_)) => {
                (c, Some(producer.as_str()))
            }
            _ => {
                return Ok(Response {
                    stamp,
                    outcome: Outcome::Rejected(
                        "only a push, a transaction or timers are applied as a producer".into(),
                    ),
                });
            }
        },
        c => (c, None),
    };
    let outcome = match command {
        Command::Tick => {
            housekeeping::run(txn, stamp, HousekeepingBudget::default())?;
            Outcome::Tick
        }
        Command::Push(items) => {
            let items: Vec<_> = items.iter().map(PushItem::as_item_ref).collect();
            let from_entry = producer.is_none();
            Outcome::Push(push::push(
                txn, stamp, &items, answered, from_entry, producer,
            )?)
        }
        Command::Pop(cmd) => Outcome::Pop(pop::pop(txn, stamp, cmd, false, answered)?),
        Command::PopConflating(cmd) => Outcome::Pop(pop::pop(txn, stamp, cmd, true, answered)?),
        Command::Ack { group, items } => {
            Outcome::Ack(ack::ack(txn, stamp, group, items, &[], answered)?)
        }
        Command::AckAt {
            group,
            items,
            offsets,
        } => Outcome::Ack(ack::ack(txn, stamp, group, items, offsets, answered)?),
        Command::ExtendLease { lease_id } => ack::extend(txn, stamp, lease_id)?,
        Command::Configure {
            queue,
            namespace,
            task,
            options,
        } => Outcome::Configured(queue::configure(
            txn, stamp, queue, namespace, task, options,
        )?),
        Command::DeleteQueue { queue } => Outcome::Deleted {
            existed: queue::delete(txn, queue)?,
        },
        Command::DeleteGroup {
            group,
            queue,
            delete_metadata,
        } => {
            let (partitions, metadata) =
                groups::delete(txn, group, queue.as_ref(), *delete_metadata)?;
            Outcome::GroupDeleted {
                partitions,
                metadata,
            }
        }
        Command::Seek { group, queue, to } => Outcome::Seeked {
            partitions: groups::seek(txn, stamp, group, queue, *to)?,
        },
        Command::Resubscribe { group, from } => Outcome::Resubscribed {
            rows: groups::resubscribe(txn, group, *from)?,
        },
        Command::Timers(ops) => Outcome::Timers(timers::apply(txn, stamp, ops, producer)?),
        Command::Kv(ops) => Outcome::Kv(kv::apply(txn, stamp, index, ops)?),
        Command::Locks(ops) => Outcome::Locks(locks::apply(txn, stamp, index, ops)?),
        Command::Transaction {
            ops,
            required_leases,
            kv,
            timers,
        } => Outcome::Transaction(transaction::apply(
            txn,
            stamp,
            index,
            ops,
            required_leases,
            kv,
            timers,
            producer,
        )?),
        Command::ClusterSettings {
            version,
            max_clock_skew_ms,
        } => Outcome::ClusterSettings {
            version: cluster::apply_settings(txn, *version, *max_clock_skew_ms)?,
        },
        // Unwrapped above: a producer wraps only a push, a transaction or timers.
        Command::AsProducer { .. } => Outcome::Rejected("a producer inside a producer".into()),
        Command::DeleteMessage {
            pid,
            transaction_id,
        } => marks::delete_message(txn, *pid, transaction_id)?,
        Command::RetryDeadLetter {
            pid,
            transaction_id,
            group,
            message_id,
        } => marks::retry_dead_letter(
            txn,
            stamp,
            *pid,
            transaction_id,
            group.as_ref(),
            *message_id,
            answered,
        )?,
    };
    Ok(Response { stamp, outcome })
}

/// Apply an encoded entry; an entry this build cannot decode is answered `Rejected` and changes
/// nothing (every replica of the same build decides the same). `answered` as in
/// [`apply_entry_as`].
///
/// # Errors
/// Store failures.
pub fn apply_encoded<'a>(
    txn: &mut Txn<'a>,
    bytes: &'a [u8],
    index: u64,
    answered: bool,
) -> Result<Response, StoreError> {
    // A push, the bulk of the log, is applied from the entry's bytes in place.
    if let Some((proposed_at, items)) = crate::command::decode_push(bytes) {
        let stamp = next_stamp(txn, proposed_at)?;
        let outcome = Outcome::Push(push::push_in_place(txn, stamp, &items, answered)?);
        return Ok(Response { stamp, outcome });
    }
    match Entry::decode(bytes) {
        Ok(entry) => apply_entry_as(txn, &entry, index, answered),
        Err(e) => Ok(Response {
            stamp: last_stamp(txn)?,
            outcome: Outcome::Rejected(format!("undecodable entry: {e}")),
        }),
    }
}

/// The greatest applied stamp (`safeTime`).
///
/// # Errors
/// Store failures.
pub fn last_stamp(s: &dyn StateRead) -> Result<Stamp, StoreError> {
    Ok(get_rec::<Stamp>(s, &keys::meta_stamp())?.unwrap_or_default())
}

fn next_stamp(txn: &mut Txn<'_>, proposed: u64) -> Result<Stamp, StoreError> {
    let prev = last_stamp(txn)?;
    let stamp = Stamp(proposed.max(prev.0.saturating_add(1)));
    put_rec(txn, keys::meta_stamp(), &stamp);
    Ok(stamp)
}

/// A copy of `text` for an answer somebody waits for; nothing where nobody does (`answered`
/// false, see [`apply_entry_as`]).
pub(crate) fn text_for_answer(answered: bool, text: &str) -> String {
    if answered {
        text.to_owned()
    } else {
        String::new()
    }
}

pub(crate) fn get_rec<T: DeserializeOwned>(
    s: &dyn StateRead,
    key: &[u8],
) -> Result<Option<T>, StoreError> {
    match s.get(key)? {
        Some(bytes) => decode(key, &bytes).map(Some),
        None => Ok(None),
    }
}

pub(crate) fn put_rec<T: Serialize>(txn: &mut Txn<'_>, key: Vec<u8>, value: &T) {
    txn.put(key, encode(value));
}

/// Take the next value of a named counter (starting at 1).
pub(crate) fn next_counter(txn: &mut Txn<'_>, name: &str) -> Result<u64, StoreError> {
    let key = keys::meta(name);
    let next = get_rec::<u64>(txn, &key)?.unwrap_or(0) + 1;
    put_rec(txn, key, &next);
    Ok(next)
}

/// Collect the keys and decoded values of a range, at most `limit`.
pub(crate) fn scan_recs<T: DeserializeOwned>(
    s: &dyn StateRead,
    start: &[u8],
    end: &[u8],
    limit: usize,
) -> Result<Vec<(Vec<u8>, T)>, StoreError> {
    // Decoded as the scan hands each row over: a value is copied once, into its record, not
    // first into a buffer of its own.
    let mut out = Vec::new();
    try_scan(s, start, end, |k, v| {
        out.push((k.to_vec(), decode(k, v)?));
        Ok(out.len() < limit)
    })?;
    Ok(out)
}

/// Visit every pair with `start <= key < end` in key order with a visitor that may fail (a
/// decode, usually) until it answers `false`; its first failure stops the scan and is the
/// answer.
///
/// # Errors
/// Store failures and the visitor's.
pub(crate) fn try_scan(
    s: &dyn StateRead,
    start: &[u8],
    end: &[u8],
    mut visit: impl FnMut(&[u8], &[u8]) -> Result<bool, StoreError>,
) -> Result<(), StoreError> {
    let mut failed = None;
    s.scan(start, end, &mut |k, v| match visit(k, v) {
        Ok(more) => more,
        Err(e) => {
            failed = Some(e);
            false
        }
    })?;
    failed.map_or(Ok(()), Err)
}

/// The partitions of a queue in creation order.
///
/// # Errors
/// Store failures.
pub fn partition_ids_pub(s: &dyn StateRead, qid: u64) -> Result<Vec<u64>, StoreError> {
    queue::partition_ids(s, qid)
}

/// Where a group starts in a partition it has not touched.
///
/// # Errors
/// Store failures.
pub fn start_offset_pub(
    s: &dyn StateRead,
    p: &crate::model::PartitionRec,
    start: crate::model::SubscriptionStart,
) -> Result<u64, StoreError> {
    claim_read::start_offset(s, p, start)
}

/// The due entries of a time index (`[table] ‖ stamp ‖ name ‖ NUL ‖ key`) at or before `now`, at
/// most `limit`, as (index key, name, key). Serves the KV expiry sweep and timer delivery.
pub(crate) fn due_entries(
    s: &dyn StateRead,
    table: u8,
    now: Stamp,
    limit: usize,
) -> Result<Vec<(Vec<u8>, String, String)>, StoreError> {
    let mut end = vec![table];
    end.extend_from_slice(&now.0.saturating_add(1).to_be_bytes());
    let mut due = Vec::new();
    s.scan(&keys::table_start(table), &end, &mut |k, _| {
        due.push(k.to_vec());
        due.len() < limit.max(1)
    })?;
    Ok(due
        .into_iter()
        .map(|k| {
            let rest = k.get(9..).unwrap_or_default();
            let (name, key) = match rest.iter().position(|b| *b == 0) {
                Some(pos) => (
                    String::from_utf8_lossy(&rest[..pos]).into_owned(),
                    String::from_utf8_lossy(&rest[pos + 1..]).into_owned(),
                ),
                None => (String::new(), String::new()),
            };
            (k, name, key)
        })
        .collect())
}
