//! Request bodies to domain commands. Every refusal names the field (`items[2].queue`).

use queen_domain::command::{AckItem, AckStatus, PushItem, TxnOp};
use queen_domain::ids::{IdError, LeaseId, PartitionRef, TransactionId};
use queen_domain::model::QueueOptions;
use queen_domain::names::{GroupName, PartitionName, QueueName};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::api::ApiError;
pub(crate) use crate::fields::{list, name, object, opt_str, req_str, uuid_v7};
use crate::raw::{RawObject, path};

/// Most items one push may carry.
pub(crate) const MAX_PUSH_ITEMS: usize = 10_000;
/// Most acknowledgements one batch may carry.
pub(crate) const MAX_ACK_ITEMS: usize = 10_000;
/// Longest transactionId, in bytes (the domain's rule, checked before the text is copied).
pub(crate) const MAX_TXN_BYTES: usize = queen_domain::ids::MAX_TRANSACTION_ID_BYTES;

/// Most operations one transaction may carry.
pub(crate) const MAX_TXN_OPS: usize = 10_000;

/// A parsed transaction: operations, required leases, KV rider.
pub(crate) type TxnRequest = (
    Vec<TxnOp>,
    Vec<LeaseId>,
    Vec<queen_domain::kv::KvOp>,
    Vec<queen_domain::timers::TimerOp>,
);

/// Fields of a transaction operation read as values (push items stay raw).
const TXN_OP_FIELDS: &[&str] = &[
    "type",
    "consumerGroup",
    "transactionId",
    "partitionId",
    "status",
    "error",
    "leaseId",
];

/// `{"operations": [...], "requiredLeases": [...], "kv"?: [...], "timers"?: [...]}` to a
/// transaction. Push payloads and KV values are kept as the client wrote them.
pub(crate) fn transaction(body: &[u8]) -> Result<TxnRequest, ApiError> {
    transaction_parts(body, false)
}

/// The JSON head of a binary transaction body (QTB1): the same object, but it may be empty or
/// hold no operations, because its pushes travel in the binary groups after it.
pub(crate) fn transaction_head(head: &[u8]) -> Result<TxnRequest, ApiError> {
    transaction_parts(head, true)
}

fn transaction_parts(body: &[u8], head: bool) -> Result<TxnRequest, ApiError> {
    let top = RawObject::body(body, head)?;
    let ops = match top.list("operations", "operations", MAX_TXN_OPS)? {
        Some(ops) => ops,
        None if head => Vec::new(),
        None => return Err(ApiError::bad_request("operations", "is required")),
    };
    if ops.is_empty() && !head {
        return Err(ApiError::bad_request("operations", "must not be empty"));
    }
    let mut out = Vec::with_capacity(ops.len());
    for (i, op) in ops.iter().enumerate() {
        let at = format!("operations[{i}]");
        let f = |k: &str| path(&at, k);
        let raw_op = RawObject::of(op, &at)?;
        let o = raw_op.values(TXN_OP_FIELDS, &at)?;
        match opt_str(&o, "type", &f("type"))?.as_deref() {
            Some("ack") => {
                let group = GroupName::or_queue_mode(
                    opt_str(&o, "consumerGroup", &f("consumerGroup"))?.as_deref(),
                )
                .map_err(|e| ApiError::bad_request(&f("consumerGroup"), &e.to_string()))?;
                out.push(TxnOp::Ack {
                    group,
                    item: ack_item(&o, &f)?,
                });
            }
            Some("push") => {
                let items = raw_op
                    .list("items", &f("items"), MAX_PUSH_ITEMS)?
                    .ok_or_else(|| ApiError::bad_request(&f("items"), "is required"))?;
                for (j, item) in items.iter().enumerate() {
                    out.push(TxnOp::Push(push_item(item, &format!("{at}.items[{j}]"))?));
                }
            }
            Some(other) => {
                return Err(ApiError::bad_request(
                    &f("type"),
                    &format!("must be ack or push, not '{other}'"),
                ));
            }
            None => return Err(ApiError::bad_request(&f("type"), "is required")),
        }
    }
    let m = top.values(&["requiredLeases", "timers"], "")?;
    let leases = match m.get("requiredLeases") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let field = || format!("requiredLeases[{i}]");
                match v {
                    Value::String(s) => LeaseId::new(s.clone())
                        .map_err(|e| ApiError::bad_request(&field(), &e.to_string())),
                    _ => Err(ApiError::bad_request(&field(), "must be a string")),
                }
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(ApiError::bad_request("requiredLeases", "must be a list")),
    };
    let kv = match top.list("kv", "kv", usize::MAX)? {
        None => Vec::new(),
        Some(a) if a.is_empty() => Vec::new(),
        Some(a) => crate::kv_json::kv_list(&a, true, "kv")?,
    };
    let timers = match m.get("timers") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) if a.is_empty() => Vec::new(),
        Some(Value::Array(a)) => crate::timers_json::parse_list(a, "timers")?,
        Some(_) => return Err(ApiError::bad_request("timers", "must be a list")),
    };
    Ok((out, leases, kv, timers))
}

/// `{"items": [...]}` to push items; a missing transactionId gets a UUIDv7. The body is never
/// parsed into a value as a whole: each payload is stored as the producer wrote it, byte for
/// byte (so `42.00`, `-0`, `1e400` and integers of any length stay as they are).
pub(crate) fn push_items(body: &[u8]) -> Result<Vec<PushItem>, ApiError> {
    // The common case in one pass over the body. A body whose shape is off (not JSON, no list
    // of objects) is read again below, which names what is wrong.
    match crate::raw::pick_list(
        body,
        "items",
        &[],
        &PUSH_FIELDS,
        MAX_PUSH_ITEMS,
        crate::raw::Unknown::Lax,
    ) {
        Some(([], items)) => items
            .iter()
            .enumerate()
            .map(|(i, f)| push_item_fields(f, &|| format!("items[{i}]")))
            .collect(),
        None => push_items_slow(body),
    }
}

/// `push_items` object by object, naming what is wrong with the body's shape.
fn push_items_slow(body: &[u8]) -> Result<Vec<PushItem>, ApiError> {
    let top = RawObject::body(body, false)?;
    let items = top
        .list("items", "items", MAX_PUSH_ITEMS)?
        .ok_or_else(|| ApiError::bad_request("items", "is required"))?;
    items
        .iter()
        .enumerate()
        .map(|(i, item)| push_item(item, &format!("items[{i}]")))
        .collect()
}

/// The fields of a push item, in this order: the first four are small strings; `payload` (or
/// `data`) stays raw.
const PUSH_FIELDS: [&str; 6] = [
    "queue",
    "partition",
    "transactionId",
    "traceId",
    "payload",
    "data",
];

/// One push item; `at` is its path in the body (`items[2]`, `operations[0].items[2]`).
fn push_item(raw: &RawValue, at: &str) -> Result<PushItem, ApiError> {
    let obj = RawObject::of(raw, at)?;
    push_item_fields(&PUSH_FIELDS.map(|k| obj.raw(k)), &|| at.to_owned())
}

/// One push item from its fields as written; `at` makes its path for a refusal.
fn push_item_fields(
    fields: &crate::raw::Picked<'_, 6>,
    at: &dyn Fn() -> String,
) -> Result<PushItem, ApiError> {
    let f = |i: usize| path(&at(), PUSH_FIELDS[i]);
    // A number no value holds is refused before anything else, as reading the fields as
    // values refuses it.
    for (i, raw) in fields[..4].iter().enumerate() {
        if let Some(t) = raw.map(RawValue::get)
            && !t.starts_with('"')
            && serde_json::from_str::<Value>(t).is_err()
        {
            return Err(ApiError::bad_request(&f(i), "holds a number out of range"));
        }
    }
    let text = |i: usize| {
        plain_text(fields[i]).ok_or_else(|| ApiError::bad_request(&f(i), "must be a string"))
    };
    // Paths are formatted only for a refusal (twice per item otherwise, measured).
    let refused = |i: usize| {
        move |e: queen_domain::names::NameError| ApiError::bad_request(&f(i), &e.to_string())
    };
    let queue =
        QueueName::new(text(0)?.ok_or_else(|| ApiError::bad_request(&f(0), "is required"))?)
            .map_err(refused(0))?;
    let partition = match text(1)? {
        Some(p) => PartitionName::new(p).map_err(refused(1))?,
        None => PartitionName::default_partition(),
    };
    let id = uuid_v7();
    let transaction_id = match text(2)? {
        None => TransactionId::minted(id.to_string()),
        Some(t) => {
            TransactionId::new(t).map_err(|e| ApiError::bad_request(&f(2), &e.to_string()))?
        }
    };
    let payload = match fields[4].or(fields[5]) {
        Some(text) => text.get().as_bytes().to_vec(),
        None => b"null".to_vec(),
    };
    let trace_id = text(3)?;
    Ok(PushItem {
        queue,
        partition,
        transaction_id,
        message_id: *id.as_bytes(),
        payload,
        trace_id,
    })
}

fn ack_item(it: &Map<String, Value>, f: &dyn Fn(&str) -> String) -> Result<AckItem, ApiError> {
    let transaction_id = req_str(it, "transactionId", &f("transactionId"))?;
    let partition_id = match it.get("partitionId") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        None | Some(Value::Null) => {
            return Err(ApiError::bad_request(&f("partitionId"), "is required"));
        }
        Some(_) => {
            return Err(ApiError::bad_request(
                &f("partitionId"),
                "must be a non-empty string",
            ));
        }
    };
    let status = ack_status(opt_str(it, "status", &f("status"))?).ok_or_else(|| {
        ApiError::bad_request(
            &f("status"),
            "must be completed, success, failed, dlq or retry",
        )
    })?;
    let error = opt_str(it, "error", &f("error"))?;
    let lease_id = opt_str(it, "leaseId", &f("leaseId"))?;
    ack_of(transaction_id, partition_id, status, error, lease_id)
        .map_err(|(key, e)| ApiError::bad_request(&f(key), &e.to_string()))
}

/// The status an ack names: none is `completed`; `None` for a word this build does not know.
fn ack_status(word: Option<String>) -> Option<AckStatus> {
    match word {
        None => Some(AckStatus::Completed),
        Some(w) => AckStatus::parse(&w),
    }
}

/// An ack item from its fields as read, its ids checked: an empty lease id is none. A refusal
/// names the field's key.
fn ack_of(
    transaction_id: String,
    partition_id: String,
    status: AckStatus,
    error: Option<String>,
    lease_id: Option<String>,
) -> Result<AckItem, (&'static str, IdError)> {
    Ok(AckItem {
        transaction_id: TransactionId::new(transaction_id).map_err(|e| ("transactionId", e))?,
        partition_id: PartitionRef::parse(&partition_id),
        status,
        error,
        lease_id: match lease_id.filter(|l| !l.is_empty()) {
            Some(l) => Some(LeaseId::new(l).map_err(|e| ("leaseId", e))?),
            None => None,
        },
    })
}

fn group_of(m: &Map<String, Value>) -> Result<GroupName, ApiError> {
    let g = opt_str(m, "consumerGroup", "consumerGroup")?;
    GroupName::or_queue_mode(g.as_deref())
        .map_err(|e| ApiError::bad_request("consumerGroup", &e.to_string()))
}

/// One ack.
pub(crate) fn ack_single(body: &[u8]) -> Result<(GroupName, AckItem), ApiError> {
    let m = object(body, false)?;
    Ok((group_of(&m)?, ack_item(&m, &|k| k.to_owned())?))
}

/// The fields of an ack item, in this order.
const ACK_FIELDS: [&str; 5] = ["transactionId", "partitionId", "status", "error", "leaseId"];

/// A batch of acks in one group.
pub(crate) fn ack_batch(body: &[u8]) -> Result<(GroupName, Vec<AckItem>), ApiError> {
    // The common case in one pass, without a map per item; anything it does not take (a
    // number, a `null` where a text is required, a bad group, any refusal) is read again
    // below, which answers exactly as before.
    let fast = crate::raw::pick_list(
        body,
        "acknowledgments",
        &["consumerGroup"],
        &ACK_FIELDS,
        MAX_ACK_ITEMS,
        crate::raw::Unknown::Strict,
    )
    .and_then(|([group], acks)| {
        Some((
            GroupName::or_queue_mode(plain_text(group)?.as_deref()).ok()?,
            acks.iter()
                .map(ack_item_plain)
                .collect::<Option<Vec<_>>>()?,
        ))
    });
    if let Some(out) = fast {
        return Ok(out);
    }
    ack_batch_slow(body)
}

/// A field that is absent, `null` or a JSON string: `Some(None)`, `Some(None)`, `Some(text)`;
/// `None` for any other value.
fn plain_text(raw: Option<&RawValue>) -> Option<Option<String>> {
    match raw.map(RawValue::get) {
        None | Some("null") => Some(None),
        Some(t) if t.starts_with('"') => serde_json::from_str::<String>(t).ok().map(Some),
        Some(_) => None,
    }
}

/// An ack item whose fields are all texts as `ack_item` takes them; `None` otherwise.
fn ack_item_plain(f: &crate::raw::Picked<'_, 5>) -> Option<AckItem> {
    let transaction_id = plain_text(f[0])??;
    let partition_id = plain_text(f[1])??;
    if partition_id.is_empty() {
        return None;
    }
    // A word this build does not know, or an id the edge refuses: the slow path names it.
    ack_of(
        transaction_id,
        partition_id,
        ack_status(plain_text(f[2])?)?,
        plain_text(f[3])?,
        plain_text(f[4])?,
    )
    .ok()
}

/// `ack_batch` through a map of values, naming what is wrong.
fn ack_batch_slow(body: &[u8]) -> Result<(GroupName, Vec<AckItem>), ApiError> {
    let m = object(body, false)?;
    let group = group_of(&m)?;
    let acks = list(&m, "acknowledgments", MAX_ACK_ITEMS)?;
    let mut out = Vec::with_capacity(acks.len());
    for (i, a) in acks.iter().enumerate() {
        let Value::Object(it) = a else {
            return Err(ApiError::bad_request(
                &format!("acknowledgments[{i}]"),
                "must be an object",
            ));
        };
        out.push(ack_item(it, &|k| format!("acknowledgments[{i}].{k}"))?);
    }
    Ok((group, out))
}

/// A namespace or task tag: at most 255 bytes (as names), no control characters. It is kept in
/// replicated state, so its size is bounded here.
fn tag(value: Option<String>, field: &str) -> Result<Option<String>, ApiError> {
    match value {
        Some(t) if t.len() > queen_domain::names::MAX_NAME_BYTES => Err(ApiError::bad_request(
            field,
            &format!(
                "must be at most {} bytes",
                queen_domain::names::MAX_NAME_BYTES
            ),
        )),
        Some(t) if t.chars().any(char::is_control) => Err(ApiError::bad_request(
            field,
            "must not contain control characters",
        )),
        other => Ok(other),
    }
}

/// A configure request.
pub(crate) fn configure(
    body: &[u8],
) -> Result<(QueueName, Option<String>, Option<String>, QueueOptions), ApiError> {
    let m = object(body, false)?;
    let queue = name(req_str(&m, "queue", "queue")?, "queue", QueueName::new)?;
    let namespace = tag(opt_str(&m, "namespace", "namespace")?, "namespace")?;
    let task = tag(opt_str(&m, "task", "task")?, "task")?;
    let options = match m.get("options") {
        None | Some(Value::Null) => QueueOptions::default(),
        Some(Value::Object(o)) => QueueOptions::from_json(o)
            .map_err(|e| ApiError::bad_request(&format!("options.{}", e.field), &e.problem))?,
        Some(_) => return Err(ApiError::bad_request("options", "must be an object")),
    };
    Ok((queue, namespace, task, options))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_names_the_bad_field() {
        let e = push_items(br#"{"items":[{"queue":"q"},{"queue":5}]}"#).unwrap_err();
        assert_eq!(e.message, "items[1].queue must be a string");
        let e = push_items(br#"{"items":[{"queue":"a/b"}]}"#).unwrap_err();
        assert!(e.message.starts_with("items[0].queue"));
        assert_eq!(push_items(b"{").unwrap_err().code, "bad_json");
        assert_eq!(push_items(br#"{"items":[]}"#).unwrap().len(), 0);
    }

    #[test]
    fn push_mints_missing_ids_and_keeps_payload_verbatim() {
        let v = push_items(br#"{"items":[{"queue":"q","payload":{"a":[1,2]}}]}"#).unwrap();
        assert_eq!(v[0].transaction_id.as_str().len(), 36);
        assert_eq!(v[0].payload, br#"{"a":[1,2]}"#);
        let v = push_items(
            br#"{"items":[{"queue":"q","payload":{"total": 42.00}},{"queue":"q","data":1.50}]}"#,
        )
        .unwrap();
        assert_eq!(
            v[0].payload, br#"{"total": 42.00}"#,
            "the producer's own text"
        );
        assert_eq!(v[1].payload, b"1.50");
        assert_eq!(v[0].partition.as_str(), "Default");
    }

    #[test]
    fn acks_accept_nulls_and_numbers() {
        let (g, a) = ack_single(
            br#"{"transactionId":"t","partitionId":7,"consumerGroup":null,"error":null}"#,
        )
        .unwrap();
        assert!(g.is_queue_mode());
        assert_eq!(a.partition_id, PartitionRef::Id(7));
        assert_eq!(a.status, AckStatus::Completed);
        assert!(
            ack_single(br#"{"transactionId":"t"}"#)
                .unwrap_err()
                .message
                .contains("partitionId")
        );
    }

    #[test]
    fn push_stores_every_payload_as_written() {
        for p in crate::raw::ODD_PAYLOADS {
            let body = format!(
                r#"{{"items":[{{"queue":"q","payload": {p} , "unknown": 1e999}}, {{"queue":"q","data":{p}}}]}}"#
            );
            let v = push_items(body.as_bytes()).unwrap_or_else(|e| panic!("{p}: {e}"));
            assert_eq!(String::from_utf8_lossy(&v[0].payload), *p);
            assert_eq!(
                String::from_utf8_lossy(&v[1].payload),
                *p,
                "data is the payload's other name"
            );
        }
        let v = push_items(br#"{"items":[{"queue":"q"}]}"#).unwrap();
        assert_eq!(v[0].payload, b"null");
        let e = push_items(br#"{"items":[{"queue":1e400}]}"#).unwrap_err();
        assert_eq!(e.message, "items[0].queue holds a number out of range");
        assert_eq!(
            push_items(br#"{"items":{}}"#).unwrap_err().message,
            "items must be a list"
        );
        assert_eq!(
            push_items(br#"{"items":null}"#).unwrap_err().message,
            "items is required"
        );
        assert_eq!(
            push_items(br#"{"items":[7]}"#).unwrap_err().message,
            "items[0] must be an object"
        );
    }

    #[test]
    fn transaction_pushes_keep_payloads_and_errors_name_the_exact_path() {
        let body = format!(
            r#"{{"operations":[{{"type":"push","items":[{{"queue":"q","payload":{}}}]}}]}}"#,
            crate::raw::ODD_PAYLOADS[0]
        );
        let (ops, _, _, _) = transaction(body.as_bytes()).unwrap();
        let TxnOp::Push(p) = &ops[0] else {
            panic!("{ops:?}")
        };
        assert_eq!(p.payload, crate::raw::ODD_PAYLOADS[0].as_bytes());
        let msg = |b: &str| transaction(b.as_bytes()).unwrap_err().message;
        assert_eq!(
            msg(r#"{"operations":[{"type":"push","items":[{"queue":"q"},{"queue":5}]}]}"#),
            "operations[0].items[1].queue must be a string"
        );
        assert_eq!(
            msg(r#"{"operations":[{"type":"push"}]}"#),
            "operations[0].items is required"
        );
        assert_eq!(
            msg(r#"{"operations":[{"type":"ack"}]}"#),
            "operations[0].transactionId is required"
        );
        assert_eq!(
            msg(r#"{"operations":[5]}"#),
            "operations[0] must be an object"
        );
        let kv = r#"{"operations":[{"type":"push","items":[{"queue":"q"}]}],"kv":[{"op":"put","ns":"a","key":"k","value":1,"forever":true},{"ns":"a"}]}"#;
        assert_eq!(msg(kv), "kv[1].op is required");
        let kv = r#"{"operations":[{"type":"push","items":[{"queue":"q"}]}],"kv":[{"op":"nope"}]}"#;
        assert_eq!(msg(kv), "kv[0].op 'nope' is not a KV operation");
        let kv = r#"{"operations":[{"type":"push","items":[{"queue":"q"}]}],"kv":[{"op":"incr","ns":"a","key":"k","forever":true,"delta":1e400}]}"#;
        assert!(msg(kv).starts_with("kv[0].delta must be a finite number"));
        let kv = r#"{"operations":[{"type":"push","items":[{"queue":"q"}]}],"kv":[{"op":"put","ns":"a","key":"k","value":{"x": 1e400},"ttlSeconds":9223372036854775807}]}"#;
        assert_eq!(
            msg(kv),
            "kv[0].ttlSeconds must be 1 to 315360000 seconds (ten years)"
        );
        let kv = r#"{"operations":[{"type":"push","items":[{"queue":"q"}]}],"kv":[{"op":"put","ns":"a","key":"k","value":{"x": 1e400},"forever":true}]}"#;
        let (_, _, kv_ops, _) = transaction(kv.as_bytes()).unwrap();
        let queen_domain::kv::KvOp::Put { value, .. } = &kv_ops[0] else {
            panic!()
        };
        assert_eq!(value, br#"{"x": 1e400}"#);
        let t = r#"{"operations":[{"type":"push","items":[{"queue":"q"}]}],"timers":[{"op":"schedule","queue":"q","timerKey":"k","payload":"MQ==","delayMs":315360000001}]}"#;
        assert_eq!(
            msg(t),
            "timers[0].delayMs must be 0 to 315360000000 ms (ten years)"
        );
    }

    #[test]
    fn configure_bounds_what_reaches_replicated_state() {
        let msg = |b: String| configure(b.as_bytes()).unwrap_err().message;
        assert_eq!(
            msg(format!(
                r#"{{"queue":"q","namespace":"{}"}}"#,
                "n".repeat(256)
            )),
            "namespace must be at most 255 bytes"
        );
        assert_eq!(
            msg(format!(
                r#"{{"queue":"q","task":"{}"}}"#,
                "t".repeat(1 << 20)
            )),
            "task must be at most 255 bytes"
        );
        assert_eq!(
            msg(r#"{"queue":"q","task":"a\u0000b"}"#.to_owned()),
            "task must not contain control characters"
        );
        let (_, ns, _, _) =
            configure(format!(r#"{{"queue":"q","namespace":"{}"}}"#, "n".repeat(255)).as_bytes())
                .unwrap();
        assert_eq!(ns.map(|n| n.len()), Some(255));
        assert_eq!(
            msg(r#"{"queue":"q","options":{"leaseTime":9223372036854775807}}"#.to_owned()),
            "options.leaseTime must be 0 to 315360000 seconds (ten years)"
        );
        assert_eq!(
            msg(format!(
                r#"{{"queue":"q","options":{{"custom":"{}"}}}}"#,
                "x".repeat(1 << 20)
            )),
            "options.custom is an unknown option; its value must be at most 4096 bytes of JSON"
        );
        let many: Vec<String> = (0..100_000).map(|i| format!(r#""k{i}":1"#)).collect();
        assert!(
            msg(format!(
                r#"{{"queue":"q","options":{{{}}}}}"#,
                many.join(",")
            ))
            .contains("at most 64 are kept")
        );
    }

    /// The one-pass reading of a push body gives the same items as the field-by-field one
    /// (apart from the minted message ids), and leaves every refusal to it.
    #[test]
    fn one_pass_push_reading_agrees_with_the_field_by_field_one() {
        type Seen = (String, String, String, Vec<u8>, Option<String>);
        let strip = |v: Vec<PushItem>| -> Vec<Seen> {
            v.into_iter()
                .map(|i| {
                    let minted = i.transaction_id
                        == uuid::Uuid::from_bytes(i.message_id).to_string().as_str();
                    let txn = if minted {
                        "<minted>".to_owned()
                    } else {
                        i.transaction_id.into_string()
                    };
                    (
                        i.queue.as_str().to_owned(),
                        i.partition.as_str().to_owned(),
                        txn,
                        i.payload,
                        i.trace_id,
                    )
                })
                .collect()
        };
        let bodies = [
            r#"{"items":[{"queue":"q","payload":{"a":[1,2.50]},"transactionId":"t1"}]}"#,
            r#"{"x":1e400,"items":[{"queue":"q","partition":"p","data":42.00,"traceId":"tr","other":[1e400,{"y":null}]}]}"#,
            r#"{"items":[{"queue":"q","queue":"r","payload":"caf\u00e9","transactionId":"t\"2"}],"items":[{"queue":"s","payload":-0}]}"#,
            r#"{"items":[{"queue":"q","partition":null,"transactionId":null,"traceId":null,"payload":null}]}"#,
            r#" { "items" : [ { "queue" : "q" , "payload" : { "z" : 1 ,
                "a" : [ 1.10 ] } } , {"queue":"q"} ] } "#,
            r#"{"items":[]}"#,
            r#"{"items":[{"queue":"\u0071","partition":"p\u00e9"}]}"#,
        ];
        for b in bodies {
            assert!(
                crate::raw::pick_list(
                    b.as_bytes(),
                    "items",
                    &[],
                    &PUSH_FIELDS,
                    MAX_PUSH_ITEMS,
                    crate::raw::Unknown::Lax
                )
                .is_some(),
                "{b}"
            );
            let fast = strip(push_items(b.as_bytes()).unwrap_or_else(|e| panic!("{b}: {e}")));
            let slow = strip(push_items_slow(b.as_bytes()).unwrap_or_else(|e| panic!("{b}: {e}")));
            assert_eq!(fast, slow, "{b}");
        }
        let refused = [
            r#"{"items":[{"queue":"q"},{"queue":5}]}"#,
            r#"{"items":[{"queue":"a/b"}]}"#,
            r#"{"items":[{"queue":"q","transactionId":""}]}"#,
            r#"{"items":[{"queue":"q","traceId":7}]}"#,
            r#"{"items":[{"queue":1e400}]}"#,
            r#"{"items":[{"queue":5,"traceId":1e400}]}"#,
            r#"{"items":[{"queue":"q","transactionId":7}]}"#,
            r#"{"items":[{"queue":"q"},{"queue":"q","partition":"a/b"}]}"#,
            r#"{"items":[{"partition":"p"}]}"#,
            r#"{"items":[1]}"#,
            r#"{"items":{}}"#,
            r#"{"items":null}"#,
            r#"{"items":[{"queue":"q"}]} x"#,
            r#"{"items":[{"queue":"q"}"#,
            "[]",
            "",
        ];
        for b in refused {
            let fast = push_items(b.as_bytes()).unwrap_err();
            let slow = push_items_slow(b.as_bytes()).unwrap_err();
            assert_eq!((fast.code, fast.message), (slow.code, slow.message), "{b}");
        }
    }

    /// A status is checked once, here: an unknown word is a 400 naming the item's field, by
    /// either reading; `success` is `completed`.
    #[test]
    fn an_ack_status_is_checked_at_the_edge() {
        let e = ack_batch(
            br#"{"acknowledgments":[{"transactionId":"t","partitionId":"1"},{"transactionId":"t","partitionId":"1","status":"weird"}]}"#,
        )
        .unwrap_err();
        assert_eq!((e.status, e.code), (400, "bad_request"));
        assert!(
            e.message.starts_with("acknowledgments[1].status must be"),
            "{}",
            e.message
        );
        let (_, items) = ack_batch(
            br#"{"acknowledgments":[{"transactionId":"t","partitionId":"1","status":"success"},{"transactionId":"t","partitionId":"1","status":"dlq"}]}"#,
        )
        .unwrap();
        assert_eq!(items[0].status, AckStatus::Completed);
        assert_eq!(items[1].status, AckStatus::Dlq);
    }

    /// The one-pass reading of an ack batch gives what the map-of-values reading gives, for the
    /// bodies it takes, and every other body (refused or not) is answered by the latter alone.
    #[test]
    fn one_pass_ack_reading_agrees_with_the_map_reading() {
        let seen = |r: Result<(GroupName, Vec<AckItem>), ApiError>| match r {
            Ok((g, items)) => Ok((format!("{g:?}"), format!("{items:?}"))),
            Err(e) => Err((e.status, e.code, e.message)),
        };
        let bodies = [
            r#"{"consumerGroup":"g","acknowledgments":[{"transactionId":"t1","partitionId":"p","leaseId":"l"},{"transactionId":"t\"2","partitionId":"p\u00e9","status":"failed","error":"boom"}]}"#,
            r#"{"acknowledgments":[{"transactionId":"","partitionId":"p","leaseId":"","error":null,"status":null,"extra":{"a":[1,2.5]}}],"consumerGroup":null}"#,
            r#"{"acknowledgments":[],"x":"y"}"#,
            r#"{"acknowledgments":[{"transactionId":"a","partitionId":"p"}],"acknowledgments":[{"transactionId":"b","partitionId":"q"}]}"#,
            // Taken by the map reading only: a number, a null id, a number no value holds.
            r#"{"acknowledgments":[{"transactionId":"t","partitionId":7}]}"#,
            r#"{"acknowledgments":[{"transactionId":"t","partitionId":"p","other":1e400}]}"#,
            r#"{"x":1e400,"acknowledgments":[{"transactionId":"t","partitionId":"p"}]}"#,
            r#"{"acknowledgments":[{"transactionId":null,"partitionId":"p"}]}"#,
            r#"{"acknowledgments":[{"transactionId":"t","partitionId":""}]}"#,
            r#"{"acknowledgments":[{"transactionId":"t","partitionId":"p","status":5}]}"#,
            r#"{"acknowledgments":[{"transactionId":"t","partitionId":"p","status":"weird"}]}"#,
            r#"{"acknowledgments":[{"transactionId":"t","partitionId":"p","status":"success"}]}"#,
            r#"{"consumerGroup":5,"acknowledgments":[]}"#,
            r#"{"consumerGroup":"a/b","acknowledgments":[]}"#,
            r#"{"acknowledgments":[7]}"#,
            r#"{"acknowledgments":null}"#,
            r#"{"acknowledgments":{}}"#,
            r#"{"acknowledgments":[]} x"#,
            r#"{}"#,
            "[]",
            " ",
            "",
        ];
        for b in bodies {
            assert_eq!(
                seen(ack_batch(b.as_bytes())),
                seen(ack_batch_slow(b.as_bytes())),
                "{b}"
            );
        }
        let fast = |b: &str| {
            crate::raw::pick_list(
                b.as_bytes(),
                "acknowledgments",
                &["consumerGroup"],
                &ACK_FIELDS,
                MAX_ACK_ITEMS,
                crate::raw::Unknown::Strict,
            )
            .is_some()
        };
        assert!(fast(bodies[0]) && fast(bodies[1]));
        assert!(
            !fast(bodies[5]) && !fast(bodies[6]),
            "a number no value holds is left to the map reading"
        );
        assert!(ack_batch(bodies[5].as_bytes()).is_err());
    }
}
