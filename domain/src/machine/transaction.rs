//! Transactions: acks and pushes in one entry, all or nothing.
//!
//! The operations run on a child overlay; the child's writes reach the entry's overlay only when
//! every lease in `required_leases` is live and every operation succeeded. A pushed item that
//! is already stored answers `duplicate` and does not fail the bundle. A resend of a bundle that
//! did commit fails on its required lease (the first attempt released it) and writes nothing.

use crate::command::{AckOutcome, PushStatus, TxnOp, TxnOutcome, TxnResult};
use crate::keys;
use crate::model::LeaseRec;
use crate::store::{StoreError, Txn};
use crate::time::Stamp;

use super::ack::{LeasedOffsets, ack_one};
use super::get_rec;
use super::push::push;

fn failed(error: String) -> TxnOutcome {
    TxnOutcome {
        success: false,
        error: Some(error),
        results: Vec::new(),
        kv: None,
        timers: Vec::new(),
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn apply(
    txn: &mut Txn<'_>,
    stamp: Stamp,
    index: u64,
    ops: &[TxnOp],
    required_leases: &[crate::ids::LeaseId],
    kv_ops: &[crate::kv::KvOp],
    timer_ops: &[crate::timers::TimerOp],
    producer: Option<&str>,
) -> Result<TxnOutcome, StoreError> {
    let lease_now = super::cluster::lease_now(txn, stamp)?;
    for lease in required_leases {
        let live = get_rec::<LeaseRec>(txn, &keys::lease(lease.as_str()))?
            .is_some_and(|l| l.expires > lease_now);
        if !live {
            return Ok(TxnOutcome::lease_not_live(lease));
        }
    }
    // With exactly one required lease, an ack that names none is fenced by it.
    let borrowed = match required_leases {
        [only] => Some(only.clone()),
        _ => None,
    };
    let (results, kv, timers, writes) = {
        let mut child = Txn::new(&*txn);
        let mut results = Vec::with_capacity(ops.len());
        let mut leased = LeasedOffsets::default();
        for (i, op) in ops.iter().enumerate() {
            match op {
                TxnOp::Ack { group, item } => {
                    let mut item = item.clone();
                    if item.lease_id.is_none() {
                        item.lease_id.clone_from(&borrowed);
                    }
                    let verdict =
                        ack_one(&mut child, stamp, group.as_str(), &item, None, &mut leased)?;
                    if !verdict.success {
                        let why = verdict.error.unwrap_or_default();
                        return Ok(failed(format!(
                            "operation {i} (ack of {}): {why}",
                            item.transaction_id
                        )));
                    }
                    results.push(TxnResult::Ack(AckOutcome {
                        transaction_id: item.transaction_id.as_str().to_owned(),
                        verdict,
                    }));
                }
                TxnOp::Push(item) => {
                    let mut out = push(
                        &mut child,
                        stamp,
                        &[item.as_item_ref()],
                        true,
                        false,
                        producer,
                    )?;
                    let Some(o) = out.pop() else { continue };
                    if let PushStatus::Failed(why) = &o.status {
                        return Ok(failed(format!(
                            "operation {i} (push of {}): {why}",
                            item.transaction_id
                        )));
                    }
                    results.push(TxnResult::Push(o));
                }
            }
        }
        leased.write_cursors(&mut child, stamp)?;
        let kv = if kv_ops.is_empty() {
            None
        } else {
            Some(super::kv::apply(&mut child, stamp, index, kv_ops)?)
        };
        if let Some(k) = &kv
            && k.failed.is_some()
        {
            return Ok(TxnOutcome {
                success: false,
                error: Some("a required KV precondition was lost".to_owned()),
                results,
                kv,
                timers: Vec::new(),
            });
        }
        let timers = super::timers::apply(&mut child, stamp, timer_ops, producer)?;
        (results, kv, timers, child.into_owned_parts())
    };
    txn.absorb_parts(writes);
    Ok(TxnOutcome {
        success: true,
        error: None,
        results,
        kv,
        timers,
    })
}
