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
pub(crate) fn push_item(raw: &RawValue, at: &str) -> Result<PushItem, ApiError> {
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

pub(crate) fn ack_item(
    it: &Map<String, Value>,
    f: &dyn Fn(&str) -> String,
) -> Result<AckItem, ApiError> {
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
mod tests;
