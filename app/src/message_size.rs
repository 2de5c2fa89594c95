//! The largest payload one message may carry (`QUEEN_MAX_MESSAGE_BYTES`), checked before a
//! command is proposed, for every way a payload enters the log: pushes, pushes inside a
//! transaction, timer payloads and KV values. A refusal (`BrokerError::TooLarge`, a
//! 413 on the wire) names the item.

use queen_domain::command::{PushItem, TxnOp};
use queen_domain::kv::KvOp;
use queen_domain::timers::TimerOp;
use queen_ports::BrokerError;

fn too_large(field: &str, len: usize, max: usize) -> BrokerError {
    BrokerError::TooLarge {
        field: field.to_owned(),
        len,
        max,
    }
}

/// Every pushed payload within `max`; the refusal names `items[i].payload`.
pub(crate) fn check_push(items: &[PushItem], max: usize) -> Result<(), BrokerError> {
    match items.iter().position(|i| i.payload.len() > max) {
        Some(i) => Err(too_large(
            &format!("items[{i}].payload"),
            items[i].payload.len(),
            max,
        )),
        None => Ok(()),
    }
}

/// Every KV value within `max`; `field` names the list (`operations` or a transaction's `kv`).
pub(crate) fn check_kv(ops: &[KvOp], max: usize, field: &str) -> Result<(), BrokerError> {
    for (i, op) in ops.iter().enumerate() {
        if let KvOp::Put { value, .. } = op
            && value.len() > max
        {
            return Err(too_large(&format!("{field}[{i}].value"), value.len(), max));
        }
    }
    Ok(())
}

/// Every timer payload within `max`.
pub(crate) fn check_timers(ops: &[TimerOp], max: usize, field: &str) -> Result<(), BrokerError> {
    for (i, op) in ops.iter().enumerate() {
        if let TimerOp::Schedule { payload, .. } = op
            && payload.len() > max
        {
            return Err(too_large(
                &format!("{field}[{i}].payload"),
                payload.len(),
                max,
            ));
        }
    }
    Ok(())
}

/// A transaction's pushes, KV rider and timers within `max`.
pub(crate) fn check_transaction(
    ops: &[TxnOp],
    kv: &[KvOp],
    timers: &[TimerOp],
    max: usize,
) -> Result<(), BrokerError> {
    let pushed = ops.iter().filter_map(|op| match op {
        TxnOp::Push(item) => Some(item),
        TxnOp::Ack { .. } => None,
    });
    for (n, item) in pushed.enumerate() {
        if item.payload.len() > max {
            return Err(too_large(
                &format!("operations: pushed item {n} (counting from 0, in order) payload"),
                item.payload.len(),
                max,
            ));
        }
    }
    check_kv(kv, max, "kv")?;
    check_timers(timers, max, "timers")
}

#[cfg(test)]
mod tests {
    use super::*;
    use queen_domain::kv::Expiry;
    use queen_domain::names::{PartitionName, QueueName};

    fn item(len: usize) -> PushItem {
        PushItem {
            queue: QueueName::new("q").unwrap(),
            partition: PartitionName::default_partition(),
            transaction_id: queen_domain::ids::TransactionId::new("t").unwrap(),
            message_id: [0; 16],
            payload: vec![b'1'; len],
            trace_id: None,
        }
    }

    #[test]
    fn refusals_name_the_item_and_the_limit() {
        assert!(check_push(&[item(10), item(100)], 100).is_ok());
        let e = check_push(&[item(10), item(101)], 100).unwrap_err();
        assert!(matches!(
            e,
            BrokerError::TooLarge {
                len: 101,
                max: 100,
                ..
            }
        ));
        assert_eq!(
            e.to_string(),
            "items[1].payload is 101 bytes; a message may carry at most 100 (QUEEN_MAX_MESSAGE_BYTES)"
        );
        let put = KvOp::Put {
            ns: "n".into(),
            key: "k".into(),
            value: vec![b'1'; 101],
            expiry: Expiry::Forever,
            expect: None,
            required: false,
        };
        assert!(
            check_kv(std::slice::from_ref(&put), 100, "operations")
                .unwrap_err()
                .to_string()
                .starts_with("operations[0].value")
        );
        let e = check_transaction(&[TxnOp::Push(item(1))], &[put], &[], 100).unwrap_err();
        assert!(e.to_string().starts_with("kv[0].value"), "{e}");
        let e = check_transaction(
            &[TxnOp::Push(item(1)), TxnOp::Push(item(200))],
            &[],
            &[],
            100,
        )
        .unwrap_err();
        assert!(e.to_string().contains("pushed item 1"), "{e}");
    }
}
