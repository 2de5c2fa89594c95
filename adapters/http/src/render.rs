//! Domain outcomes to the contract's JSON shapes.

use queen_domain::command::{AckOutcome, PopOutcome, PushOutcome, PushStatus, TxnOutcome, TxnResult};
use serde_json::{Value, json};

fn uuid_text(b: &[u8; 16]) -> String {
    uuid::Uuid::from_bytes(*b).to_string()
}

/// The push answer: one object per item, in order.
pub(crate) fn push(outcomes: &[PushOutcome]) -> Value {
    Value::Array(
        outcomes
            .iter()
            .enumerate()
            .map(|(i, o)| {
                let (status, error) = match &o.status {
                    PushStatus::Queued => ("queued", None),
                    PushStatus::Duplicate => ("duplicate", None),
                    PushStatus::Failed(e) => ("failed", Some(e.clone())),
                };
                let mut v = json!({
                    "index": i,
                    "message_id": uuid_text(&o.message_id),
                    "transaction_id": o.transaction_id,
                    "queueName": o.queue,
                    "partitionId": o.partition_id.to_string(),
                    "status": status,
                    "offset": o.offset,
                });
                if let Some(e) = error {
                    v["error"] = Value::String(e);
                }
                v
            })
            .collect(),
    )
}

/// Ack answers: one object per item, in order.
pub(crate) fn acks(outcomes: &[AckOutcome]) -> Value {
    Value::Array(
        outcomes
            .iter()
            .enumerate()
            .map(|(i, o)| {
                json!({
                    "index": i,
                    "transactionId": o.transaction_id,
                    "success": o.verdict.success,
                    "error": o.verdict.error,
                    "leaseReleased": o.verdict.lease_released,
                    "dlq": o.verdict.dlq,
                    "noop": o.verdict.noop,
                })
            })
            .collect(),
    )
}

/// A pop with messages.
pub(crate) fn pop(queue: &str, group: &str, p: &PopOutcome, autopilot: Option<(u32, u32)>) -> Value {
    let group_out = if group == queen_domain::names::QUEUE_MODE_GROUP { "__QUEUE_MODE__" } else { group };
    let mut messages = Vec::new();
    for c in &p.claims {
        let pid = c.pid.to_string();
        for m in &c.messages {
            let data: Value = serde_json::from_slice(&m.payload).unwrap_or(Value::Null);
            messages.push(json!({
                "id": uuid_text(&m.id),
                "transactionId": m.transaction_id,
                "traceId": m.trace_id,
                "data": data,
                "producerSub": null,
                "createdAt": m.created.iso_millis(),
                "queue": queue,
                "partitionId": pid,
                "partition": c.partition,
                "leaseId": p.lease_id,
                "consumerGroup": group_out,
                "offset": m.offset,
                "deliveryAttempt": m.attempt,
                "retryCount": m.attempt.saturating_sub(1),
            }));
        }
    }
    let first = p.claims.first();
    let mut v = json!({
        "success": true,
        "queue": queue,
        "partition": first.map(|c| c.partition.clone()),
        "partitionId": first.map(|c| c.pid.to_string()),
        "leaseId": p.lease_id,
        "leaseExpiresAt": if p.lease_id.is_empty() { Value::Null } else { Value::String(p.lease_expires.iso_millis()) },
        "consumerGroup": group_out,
        "messages": messages,
        "partitionsClaimed": p.claims.len(),
    });
    if let Some((batch, partitions)) = autopilot {
        v["autopilot"] = json!({"batch": batch, "partitions": partitions, "waitMs": 0});
    }
    v
}

/// A transaction's answer: always an object.
pub(crate) fn transaction(t: &TxnOutcome, kv_ops: &[queen_domain::kv::KvOp], id: &str) -> Value {
    if !t.success {
        if let Some(k) = &t.kv
            && let Some(f) = k.failed
        {
            let r = crate::kv_json::result(f, &kv_ops[f], &k.results[f]);
            return json!({
                "success": false, "reason": "kv_precondition", "failedIndex": t.results.len() + f,
                "kvReason": r.get("reason").cloned().unwrap_or(Value::Null),
                "version": r.get("version").cloned().unwrap_or(Value::Null),
                "value": r.get("value").cloned().unwrap_or(Value::Null),
                "transactionId": id,
            });
        }
        return json!({"success": false, "error": t.error, "transactionId": id});
    }
    let results: Vec<Value> = t
        .results
        .iter()
        .enumerate()
        .map(|(i, r)| match r {
            TxnResult::Ack(a) => json!({
                "index": i, "type": "ack", "transactionId": a.transaction_id, "success": a.verdict.success,
                "error": a.verdict.error, "leaseReleased": a.verdict.lease_released, "dlq": a.verdict.dlq,
            }),
            TxnResult::Push(p) => json!({
                "index": i, "type": "push", "transactionId": p.transaction_id, "message_id": uuid_text(&p.message_id),
                "status": match p.status { PushStatus::Queued => "queued", PushStatus::Duplicate => "duplicate", PushStatus::Failed(_) => "failed" },
                "offset": p.offset, "queueName": p.queue, "partitionId": p.partition_id.to_string(),
            }),
        })
        .chain(t.kv.iter().flat_map(|k| {
            let base = t.results.len();
            kv_ops.iter().zip(&k.results).enumerate().map(move |(i, (op, r))| {
                let mut v = crate::kv_json::result(i, op, r);
                v["opIndex"] = json!(i);
                v["index"] = json!(base + i);
                v["type"] = json!("kv");
                v
            })
        }))
        .chain(t.timers.iter().enumerate().map(|(i, r)| {
            let mut v = crate::timers_json::result(r);
            v["index"] = json!(t.results.len() + kv_ops.len() + i);
            v["type"] = json!("timer");
            v
        }))
        .collect();
    json!({"success": true, "results": results, "transactionId": id})
}
