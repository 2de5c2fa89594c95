//! Domain outcomes to the contract's JSON shapes.

use queen_domain::command::{
    AckOutcome, PopOutcome, PushOutcome, PushStatus, TxnOutcome, TxnResult,
};
use serde::Serialize;
use serde_json::{Value, json};

#[cfg(test)]
use crate::raw::StoredJson;

fn uuid_text(b: &[u8; 16]) -> String {
    uuid::Uuid::from_bytes(*b).to_string()
}

/// The push answer, one object per item in order, fields sorted by name (as a JSON map writes
/// them), written by hand: `serde_json`'s serializer calls per field, even from a struct, were
/// 5% of a leader's samples under batches of 100 (`perf --call-graph dwarf`). A test holds the
/// bytes equal to the answer built as JSON values.
pub(crate) fn push(outcomes: &[PushOutcome]) -> Vec<u8> {
    let mut out = Vec::with_capacity(push_len_hint(outcomes));
    let mut num = itoa::Buffer::new();
    out.push(b'[');
    for (i, o) in outcomes.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let (status, error): (&[u8], _) = match &o.status {
            PushStatus::Queued => (b"queued", None),
            PushStatus::Duplicate => (b"duplicate", None),
            PushStatus::Failed(e) => (b"failed", Some(e.as_str())),
        };
        out.push(b'{');
        if let Some(e) = error {
            out.extend_from_slice(b"\"error\":");
            json_str(&mut out, e);
            out.push(b',');
        }
        out.extend_from_slice(b"\"index\":");
        out.extend_from_slice(num.format(i).as_bytes());
        out.extend_from_slice(b",\"message_id\":");
        uuid_quoted(&mut out, &o.message_id);
        out.extend_from_slice(b",\"offset\":");
        out.extend_from_slice(num.format(o.offset).as_bytes());
        out.extend_from_slice(b",\"partitionId\":\"");
        out.extend_from_slice(num.format(o.partition_id).as_bytes());
        out.extend_from_slice(b"\",\"queueName\":");
        json_str(&mut out, &o.queue);
        out.extend_from_slice(b",\"status\":\"");
        out.extend_from_slice(status);
        out.extend_from_slice(b"\",\"transaction_id\":");
        json_str(&mut out, &o.transaction_id);
        out.push(b'}');
    }
    out.push(b']');
    out
}

/// `s` as a JSON string: as it is when nothing in it needs escaping (the usual name or id),
/// else through `serde_json`, so the escapes are the ones it always wrote.
fn json_str(out: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else if serde_json::to_writer(&mut *out, s).is_err() {
        // Writing a string into a vector does not fail; keep the answer valid JSON if it did.
        out.extend_from_slice(b"\"\"");
    }
}

/// The push answer a binary body asks for with its COUNTS flag.
pub(crate) fn push_counts(outcomes: &[PushOutcome]) -> Value {
    let of = |f: fn(&PushStatus) -> bool| outcomes.iter().filter(|o| f(&o.status)).count();
    json!({
        "count": outcomes.len(),
        "queued": of(|s| matches!(s, PushStatus::Queued)),
        "duplicate": of(|s| matches!(s, PushStatus::Duplicate)),
        "error": of(|s| matches!(s, PushStatus::Failed(_))),
    })
}

/// Ack answers: one object per item, in order.
pub(crate) fn acks(outcomes: &[AckOutcome]) -> Vec<AckAnswer<'_>> {
    outcomes
        .iter()
        .enumerate()
        .map(|(i, o)| AckAnswer {
            dlq: o.verdict.dlq,
            error: o.verdict.error.as_deref(),
            index: i,
            lease_released: o.verdict.lease_released,
            noop: o.verdict.noop,
            success: o.verdict.success,
            transaction_id: &o.transaction_id,
        })
        .collect()
}

/// One item of the ack answer, fields in the order they have always been written (sorted by
/// name, as a JSON map writes them; `error` is `null` when there is none).
#[derive(Serialize)]
pub(crate) struct AckAnswer<'a> {
    dlq: bool,
    error: Option<&'a str>,
    index: usize,
    #[serde(rename = "leaseReleased")]
    lease_released: bool,
    noop: bool,
    success: bool,
    #[serde(rename = "transactionId")]
    transaction_id: &'a str,
}

/// One delivered message; `data` is the producer's text, verbatim. The answer as `serde_json`
/// writes it from these structs is what [`pop_json`] writes by hand (tests hold them equal).
#[cfg(test)]
#[derive(Serialize)]
struct PopMessage<'a> {
    id: String,
    #[serde(rename = "transactionId")]
    transaction_id: &'a str,
    #[serde(rename = "traceId")]
    trace_id: Option<&'a str>,
    data: StoredJson<'a>,
    #[serde(rename = "producerSub")]
    producer_sub: Option<&'a str>,
    #[serde(rename = "createdAt")]
    created_at: String,
    queue: &'a str,
    #[serde(rename = "partitionId")]
    partition_id: String,
    partition: &'a str,
    #[serde(rename = "leaseId")]
    lease_id: &'a str,
    #[serde(rename = "consumerGroup")]
    consumer_group: &'a str,
    offset: u64,
    #[serde(rename = "deliveryAttempt")]
    delivery_attempt: u32,
    #[serde(rename = "retryCount")]
    retry_count: u32,
}

/// A pop's answer (see [`PopMessage`]).
#[cfg(test)]
#[derive(Serialize)]
pub(crate) struct PopOut<'a> {
    success: bool,
    queue: &'a str,
    partition: Option<&'a str>,
    #[serde(rename = "partitionId")]
    partition_id: Option<String>,
    #[serde(rename = "leaseId")]
    lease_id: &'a str,
    #[serde(rename = "leaseExpiresAt")]
    lease_expires_at: Option<String>,
    #[serde(rename = "consumerGroup")]
    consumer_group: &'a str,
    messages: Vec<PopMessage<'a>>,
    #[serde(rename = "partitionsClaimed")]
    partitions_claimed: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    autopilot: Option<Value>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    conflation: bool,
    #[serde(
        rename = "conflationConflict",
        skip_serializing_if = "std::ops::Not::not"
    )]
    conflation_conflict: bool,
}

/// The consumer group as answers name it (queue mode's internal name is `__QUEUE_MODE__`).
pub(crate) fn group_on_wire(group: &str) -> &str {
    if group == queen_domain::names::QUEUE_MODE_GROUP {
        "__QUEUE_MODE__"
    } else {
        group
    }
}

/// The `autopilot` key of a pop answer: the knobs the pop used and the broker's `waitMs`
/// advice (contract 2.0.7).
pub(crate) fn autopilot_echo(a: queen_ports::AutopilotEcho) -> Value {
    json!({"batch": a.batch, "partitions": a.partitions, "waitMs": a.wait_ms})
}

/// About how many bytes a push answer takes (ids and names of each item, plus the text).
pub(crate) fn push_len_hint(outcomes: &[PushOutcome]) -> usize {
    16 + outcomes
        .iter()
        .map(|o| 160 + o.transaction_id.len() + o.queue.len())
        .sum::<usize>()
}

/// About how many bytes an ack answer takes.
pub(crate) fn acks_len_hint(outcomes: &[AckOutcome]) -> usize {
    16 + 96 * outcomes.len()
}

/// About how many bytes a pop answer takes (each message's payload, names and ids).
pub(crate) fn pop_len_hint(p: &PopOutcome) -> usize {
    256 + p
        .claims
        .iter()
        .flat_map(|c| &c.messages)
        .map(|m| 320 + m.payload.len() + m.transaction_id.len())
        .sum::<usize>()
}

/// A pop with messages, as structs `serde_json` writes (the reference of [`pop_json`]).
#[cfg(test)]
pub(crate) fn pop<'a>(
    queue: &'a str,
    group: &'a str,
    p: &'a PopOutcome,
    autopilot: Option<queen_ports::AutopilotEcho>,
) -> PopOut<'a> {
    let group_out = group_on_wire(group);
    let mut messages = Vec::new();
    for c in &p.claims {
        let pid = c.pid.to_string();
        for m in &c.messages {
            messages.push(PopMessage {
                id: uuid_text(&m.id),
                transaction_id: &m.transaction_id,
                trace_id: m.trace_id.as_deref(),
                data: StoredJson(&m.payload),
                producer_sub: m.producer.as_deref(),
                created_at: m.created.iso_millis(),
                queue,
                partition_id: pid.clone(),
                partition: &c.partition,
                lease_id: &p.lease_id,
                consumer_group: group_out,
                offset: m.offset,
                delivery_attempt: m.attempt,
                retry_count: m.attempt.saturating_sub(1),
            });
        }
    }
    let first = p.claims.first();
    PopOut {
        success: true,
        queue,
        partition: first.map(|c| c.partition.as_str()),
        partition_id: first.map(|c| c.pid.to_string()),
        lease_id: &p.lease_id,
        lease_expires_at: (!p.lease_id.is_empty()).then(|| p.lease_expires.iso_millis()),
        consumer_group: group_out,
        messages,
        partitions_claimed: p.claims.len(),
        autopilot: autopilot.map(autopilot_echo),
        conflation: p.conflation.conflating,
        conflation_conflict: p.conflation.conflict,
    }
}

/// A pop with messages, written by hand: the same bytes as `serde_json` writes from
/// [`PopOut`] (a test holds them equal), without a struct, a `String` per id, stamp and
/// partition id, and a serializer call per field for every message (the answer was 9% of a
/// leader's samples under pop 100 + ack, `perf --call-graph dwarf`).
pub(crate) fn pop_json(
    queue: &str,
    group: &str,
    p: &PopOutcome,
    autopilot: Option<queen_ports::AutopilotEcho>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(pop_len_hint(p));
    let mut num = itoa::Buffer::new();
    let group = group_on_wire(group);
    let first = p.claims.first();
    out.extend_from_slice(b"{\"success\":true,\"queue\":");
    json_str(&mut out, queue);
    out.extend_from_slice(b",\"partition\":");
    match first {
        Some(c) => json_str(&mut out, &c.partition),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"partitionId\":");
    match first {
        Some(c) => quoted(&mut out, num.format(c.pid).as_bytes()),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"leaseId\":");
    json_str(&mut out, &p.lease_id);
    out.extend_from_slice(b",\"leaseExpiresAt\":");
    if p.lease_id.is_empty() {
        out.extend_from_slice(b"null");
    } else {
        json_str(&mut out, &p.lease_expires.iso_millis());
    }
    out.extend_from_slice(b",\"consumerGroup\":");
    json_str(&mut out, group);
    out.extend_from_slice(b",\"messages\":[");
    let mut comma = false;
    for c in &p.claims {
        let mut pid = itoa::Buffer::new();
        let pid = pid.format(c.pid).as_bytes();
        for m in &c.messages {
            if comma {
                out.push(b',');
            }
            comma = true;
            out.extend_from_slice(b"{\"id\":");
            uuid_quoted(&mut out, &m.id);
            out.extend_from_slice(b",\"transactionId\":");
            json_str(&mut out, &m.transaction_id);
            out.extend_from_slice(b",\"traceId\":");
            opt_str(&mut out, m.trace_id.as_deref());
            out.extend_from_slice(b",\"data\":");
            stored_json(&mut out, &m.payload);
            out.extend_from_slice(b",\"producerSub\":");
            opt_str(&mut out, m.producer.as_deref());
            out.extend_from_slice(b",\"createdAt\":");
            json_str(&mut out, &m.created.iso_millis());
            out.extend_from_slice(b",\"queue\":");
            json_str(&mut out, queue);
            out.extend_from_slice(b",\"partitionId\":");
            quoted(&mut out, pid);
            out.extend_from_slice(b",\"partition\":");
            json_str(&mut out, &c.partition);
            out.extend_from_slice(b",\"leaseId\":");
            json_str(&mut out, &p.lease_id);
            out.extend_from_slice(b",\"consumerGroup\":");
            json_str(&mut out, group);
            out.extend_from_slice(b",\"offset\":");
            out.extend_from_slice(num.format(m.offset).as_bytes());
            out.extend_from_slice(b",\"deliveryAttempt\":");
            out.extend_from_slice(num.format(m.attempt).as_bytes());
            out.extend_from_slice(b",\"retryCount\":");
            out.extend_from_slice(num.format(m.attempt.saturating_sub(1)).as_bytes());
            out.push(b'}');
        }
    }
    out.extend_from_slice(b"],\"partitionsClaimed\":");
    out.extend_from_slice(num.format(p.claims.len()).as_bytes());
    if let Some(a) = autopilot {
        out.extend_from_slice(b",\"autopilot\":");
        if serde_json::to_writer(&mut out, &autopilot_echo(a)).is_err() {
            // Writing a value into a vector does not fail; keep the answer valid JSON if it did.
            out.extend_from_slice(b"null");
        }
    }
    // Contract 2.0.8: present only when true.
    if p.conflation.conflating {
        out.extend_from_slice(b",\"conflation\":true");
    }
    if p.conflation.conflict {
        out.extend_from_slice(b",\"conflationConflict\":true");
    }
    out.push(b'}');
    out
}

/// `"…"` around bytes that need no escape (digits, a UUID's text).
fn quoted(out: &mut Vec<u8>, b: &[u8]) {
    out.push(b'"');
    out.extend_from_slice(b);
    out.push(b'"');
}

/// A UUID's hyphenated text in quotes, written from the stack (no `String`).
fn uuid_quoted(out: &mut Vec<u8>, b: &[u8; 16]) {
    let mut id = [0u8; uuid::fmt::Hyphenated::LENGTH];
    uuid::Uuid::from_bytes(*b)
        .hyphenated()
        .encode_lower(&mut id);
    quoted(out, &id);
}

fn opt_str(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => json_str(out, s),
        None => out.extend_from_slice(b"null"),
    }
}

/// A stored payload as [`StoredJson`] writes it: the producer's text when it is JSON, else as a
/// string.
fn stored_json(out: &mut Vec<u8>, payload: &[u8]) {
    match serde_json::from_slice::<&serde_json::value::RawValue>(payload) {
        Ok(raw) => out.extend_from_slice(raw.get().as_bytes()),
        Err(_) => json_str(out, &String::from_utf8_lossy(payload)),
    }
}

/// One entry of a transaction's `results`: acks, pushes and timers as plain values, KV results
/// with their stored text verbatim.
#[derive(Serialize)]
#[serde(untagged)]
pub(crate) enum TxnEntry<'a> {
    Plain(Value),
    Kv(crate::kv_json::ResultOut<'a>),
}

/// A transaction's answer: always an object.
#[derive(Serialize)]
#[serde(untagged)]
pub(crate) enum TxnOut<'a> {
    /// Every part applied.
    Done {
        success: bool,
        results: Vec<TxnEntry<'a>>,
        #[serde(rename = "transactionId")]
        transaction_id: &'a str,
        /// A binary body's COUNTS: the pushes and acks counted instead of listed.
        #[serde(flatten, skip_serializing_if = "Option::is_none")]
        counts: Option<TxnCounts>,
    },
    /// A required KV precondition lost: nothing applied.
    KvFailed {
        success: bool,
        reason: &'static str,
        #[serde(rename = "failedIndex")]
        failed_index: usize,
        #[serde(flatten)]
        failure: crate::kv_json::Failure<'a>,
        #[serde(rename = "transactionId")]
        transaction_id: &'a str,
    },
    /// Refused for another reason.
    Failed {
        success: bool,
        error: Option<&'a str>,
        #[serde(rename = "transactionId")]
        transaction_id: &'a str,
    },
}

/// The pushes and acks of a transaction counted (QTB1's COUNTS flag).
#[derive(Serialize)]
pub(crate) struct TxnCounts {
    /// Messages stored.
    pushed: usize,
    /// Messages already stored (same transactionId).
    duplicate: usize,
    /// Acknowledgements that took effect.
    acked: usize,
}

/// A transaction's answer with its pushes and acks counted instead of listed; the riders'
/// results stay (QTB1's COUNTS flag).
pub(crate) fn transaction_counted<'a>(
    t: &'a TxnOutcome,
    kv_ops: &'a [queen_domain::kv::KvOp],
    id: &'a str,
) -> TxnOut<'a> {
    let mut out = transaction(t, kv_ops, id);
    if let TxnOut::Done {
        results, counts, ..
    } = &mut out
    {
        let of = |f: &dyn Fn(&TxnResult) -> bool| t.results.iter().filter(|r| f(r)).count();
        *counts = Some(TxnCounts {
            pushed: of(&|r| matches!(r, TxnResult::Push(p) if p.status == PushStatus::Queued)),
            duplicate: of(
                &|r| matches!(r, TxnResult::Push(p) if p.status == PushStatus::Duplicate),
            ),
            acked: of(&|r| matches!(r, TxnResult::Ack(a) if a.verdict.success)),
        });
        results.drain(..t.results.len().min(results.len()));
    }
    out
}

/// A transaction's answer.
pub(crate) fn transaction<'a>(
    t: &'a TxnOutcome,
    kv_ops: &'a [queen_domain::kv::KvOp],
    id: &'a str,
) -> TxnOut<'a> {
    if !t.success {
        if let Some(k) = &t.kv
            && let Some(f) = k.failed
            && let Some(r) = k.results.get(f)
        {
            return TxnOut::KvFailed {
                success: false,
                reason: "kv_precondition",
                failed_index: t.results.len() + f,
                failure: crate::kv_json::failure(r),
                transaction_id: id,
            };
        }
        return TxnOut::Failed {
            success: false,
            error: t.error.as_deref(),
            transaction_id: id,
        };
    }
    let results: Vec<TxnEntry<'a>> = t
        .results
        .iter()
        .enumerate()
        .map(|(i, r)| {
            TxnEntry::Plain(match r {
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
        })
        .chain(t.kv.iter().flat_map(|k| {
            let base = t.results.len();
            kv_ops
                .iter()
                .zip(&k.results)
                .enumerate()
                .map(move |(i, (op, r))| TxnEntry::Kv(crate::kv_json::result(i, op, r).in_transaction(base + i)))
        }))
        .chain(t.timers.iter().enumerate().map(|(i, r)| {
            let mut v = crate::timers_json::result(r);
            v["index"] = json!(t.results.len() + kv_ops.len() + i);
            v["type"] = json!("timer");
            TxnEntry::Plain(v)
        }))
        .collect();
    TxnOut::Done {
        success: true,
        results,
        transaction_id: id,
        counts: None,
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod pop_answer_tests;
#[cfg(test)]
mod push_answer_tests;
