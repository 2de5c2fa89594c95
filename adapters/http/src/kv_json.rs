//! KV and lock request bodies and answers.
//!
//! A KV value is the client's own text: `put` stores it byte for byte and every answer that
//! shows a value writes the stored text back verbatim ([`StoredJson`]).

use queen_domain::kv::{
    Expiry, Holder, KvOp, KvOutcome, KvResult, KvRowView, LOCKS_NS, LockOp, LockResult, Num,
    check_key, check_ns, permit_key,
};
use queen_domain::model::MAX_DURATION_SECONDS;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use crate::api::ApiError;
use crate::fields::{object, opt_str};
use crate::raw::{RawNumber, RawObject, StoredJson, number, path};

mod answer;
pub(crate) use answer::{Failure, ResultOut, failure, outcome, result};

mod locks;
pub(crate) use locks::{lock_ops, lock_results};

/// Most operations one KV or lock call may carry.
const MAX_OPS: usize = 1000;

/// Fields of a KV operation read as values; `value`, `delta`, `min` and `max` are read from
/// the client's text.
const KV_FIELDS: &[&str] = &[
    "op",
    "ns",
    "key",
    "keys",
    "prefix",
    "after",
    "limit",
    "keysOnly",
    "expect",
    "required",
    "ttlSeconds",
    "forever",
];

fn field(i: usize, k: &str) -> String {
    format!("operations[{i}].{k}")
}

fn req_string(o: &Map<String, Value>, at: &str, k: &str) -> Result<String, ApiError> {
    opt_str(o, k, &path(at, k))?.ok_or_else(|| ApiError::bad_request(&path(at, k), "is required"))
}

fn opt_u64(o: &Map<String, Value>, at: &str, k: &str) -> Result<Option<u64>, ApiError> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| ApiError::bad_request(&path(at, k), "must be a non-negative integer")),
    }
}

fn required(o: &Map<String, Value>, at: &str) -> Result<bool, ApiError> {
    match o.get("required") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(true)) => Ok(true),
        Some(_) => Err(ApiError::bad_request(
            &path(at, "required"),
            "may only be true",
        )),
    }
}

fn ns_of(o: &Map<String, Value>, at: &str) -> Result<String, ApiError> {
    let ns = req_string(o, at, "ns")?;
    check_ns(&ns).map_err(|e| ApiError::bad_request(&path(at, "ns"), &e.to_string()))?;
    Ok(ns)
}

/// A write to a namespace the node keeps for itself is refused on the generic KV routes.
pub(crate) fn client_write(op: &KvOp, field: &str) -> Result<(), ApiError> {
    if op.writes() && queen_domain::kv::is_reserved_ns(op.ns()) {
        return Err(ApiError::bad_request(
            field,
            &format!(
                "'{}' is reserved for the node's own records ({}): written only by the routes of that feature",
                op.ns(),
                queen_domain::kv::RESERVED_NAMESPACES.join(", ")
            ),
        ));
    }
    Ok(())
}

fn ns_key(o: &Map<String, Value>, at: &str) -> Result<(String, String), ApiError> {
    let ns = ns_of(o, at)?;
    let key = req_string(o, at, "key")?;
    check_key(&key).map_err(|e| ApiError::bad_request(&path(at, "key"), &e.to_string()))?;
    crate::fields::no_control(&path(at, "key"), &key)?;
    Ok((ns, key))
}

/// A TTL in seconds: an integer from 1 to ten years.
fn ttl_range(field: &str) -> ApiError {
    ApiError::bad_request(
        field,
        &format!("must be 1 to {MAX_DURATION_SECONDS} seconds (ten years)"),
    )
}

/// Exactly one of `ttlSeconds` (1 to ten years) or `forever: true`; `at` is the operation's
/// path (`operations[2]`, `kv[0]`), empty for a body's top level.
pub(crate) fn expiry(o: &Map<String, Value>, at: &str) -> Result<Expiry, ApiError> {
    let ttl = o.get("ttlSeconds").filter(|v| !v.is_null());
    let forever = o.get("forever").filter(|v| !v.is_null());
    let whole = if at.is_empty() { "body" } else { at };
    let refuse = || {
        ApiError::new(
            400,
            "kv_expiry_not_specified",
            format!(
                "{whole} needs exactly one of ttlSeconds (an integer above 0) or forever: true"
            ),
        )
    };
    match (ttl, forever) {
        (Some(t), None) => match (t.as_u64(), t.as_f64()) {
            (Some(n), _) if n > MAX_DURATION_SECONDS => Err(ttl_range(&path(at, "ttlSeconds"))),
            (None, Some(f)) if f > MAX_DURATION_SECONDS as f64 => {
                Err(ttl_range(&path(at, "ttlSeconds")))
            }
            (Some(n), _) if n > 0 => Ok(Expiry::Ttl(n)),
            _ => Err(refuse()),
        },
        (None, Some(Value::Bool(true))) => Ok(Expiry::Forever),
        _ => Err(refuse()),
    }
}

/// A value as the client wrote it (the text stored).
fn value_text(raw: &RawObject<'_>, at: &str) -> Result<Vec<u8>, ApiError> {
    raw.raw("value")
        .map(|v| v.get().as_bytes().to_vec())
        .ok_or_else(|| ApiError::bad_request(&path(at, "value"), "is required"))
}

/// An `incr` bound: stored as a 64-bit float, so an integer bound must be one a float holds
/// exactly (any integer up to 2^53 in magnitude), or the comparison could not be exact.
fn bound(raw: Option<&RawValue>, field: &str) -> Result<Option<f64>, ApiError> {
    match raw.map(|r| number(r, field)).transpose()? {
        None => Ok(None),
        Some(RawNumber::Float(f)) => Ok(Some(f)),
        Some(RawNumber::Int(i)) => {
            let f = i as f64;
            if f as i128 == i128::from(i) {
                Ok(Some(f))
            } else {
                Err(ApiError::bad_request(
                    field,
                    "must be an integer a 64-bit float holds exactly (any up to 9007199254740992 in magnitude)",
                ))
            }
        }
    }
}

/// A KV put's fields: the path form's body (`at` empty) as one put.
pub(crate) fn path_put(body: &[u8], ns: String, key: String) -> Result<KvOp, ApiError> {
    let raw = RawObject::body(body, false)?;
    let m = raw.values(&["expect", "ttlSeconds", "forever"], "")?;
    let value = value_text(&raw, "")?;
    let expect = opt_u64(&m, "", "expect")?;
    Ok(KvOp::Put {
        ns,
        key,
        value,
        expiry: expiry(&m, "")?,
        expect,
        required: false,
    })
}

/// `{"operations": [...]}` to KV operations.
pub(crate) fn kv_ops(body: &[u8], in_transaction: bool) -> Result<Vec<KvOp>, ApiError> {
    let top = RawObject::body(body, false)?;
    match top.list("operations", "operations", usize::MAX)? {
        Some(a) => kv_list(&a, in_transaction, "operations"),
        None => Err(ApiError::bad_request("operations", "is required")),
    }
}

/// A list of KV operations (also a transaction's `kv` rider); `name` is the list's path.
pub(crate) fn kv_list(
    a: &[&RawValue],
    in_transaction: bool,
    name: &str,
) -> Result<Vec<KvOp>, ApiError> {
    if a.is_empty() || a.len() > MAX_OPS {
        return Err(ApiError::bad_request(
            name,
            &format!("must have 1 to {MAX_OPS} operations"),
        ));
    }
    a.iter()
        .enumerate()
        .map(|(i, v)| {
            let at = format!("{name}[{i}]");
            let op = kv_op(v, in_transaction, &at)?;
            client_write(&op, &path(&at, "ns"))?;
            Ok(op)
        })
        .collect()
}

fn kv_op(v: &RawValue, in_transaction: bool, at: &str) -> Result<KvOp, ApiError> {
    let f = |k: &str| path(at, k);
    let raw = RawObject::of(v, at)?;
    let o = raw.values(KV_FIELDS, at)?;
    let op = req_string(&o, at, "op")?;
    Ok(match op.as_str() {
        "get" => {
            let (ns, key) = ns_key(&o, at)?;
            KvOp::Get { ns, key }
        }
        "getMany" => {
            let ns = ns_of(&o, at)?;
            let keys = match o.get("keys") {
                Some(Value::Array(ks)) if !ks.is_empty() && ks.len() <= MAX_OPS => ks
                    .iter()
                    .map(|k| {
                        k.as_str()
                            .filter(|k| check_key(k).is_ok() && !k.chars().any(char::is_control))
                            .map(str::to_owned)
                    })
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| ApiError::bad_request(&f("keys"), "must hold valid keys"))?,
                _ => {
                    return Err(ApiError::bad_request(
                        &f("keys"),
                        "must be a non-empty list",
                    ));
                }
            };
            KvOp::GetMany { ns, keys }
        }
        "getPrefix" => {
            if in_transaction {
                return Err(ApiError::bad_request(
                    &f("op"),
                    "getPrefix is refused inside a transaction",
                ));
            }
            let ns = ns_of(&o, at)?;
            let prefix = req_string(&o, at, "prefix")?;
            if prefix.is_empty() {
                return Err(ApiError::new(
                    400,
                    "kv_prefix_required",
                    format!("{} must not be empty", f("prefix")),
                ));
            }
            let limit = opt_u64(&o, at, "limit")?.unwrap_or(100).clamp(1, 1000) as u32;
            let keys_only = match o.get("keysOnly") {
                None | Some(Value::Null) | Some(Value::Bool(false)) => false,
                Some(Value::Bool(true)) => true,
                Some(_) => return Err(ApiError::bad_request(&f("keysOnly"), "must be true")),
            };
            KvOp::GetPrefix {
                ns,
                prefix,
                after: opt_str(&o, "after", &f("after"))?,
                limit,
                keys_only,
            }
        }
        "put" | "putIfAbsent" => {
            let (ns, key) = ns_key(&o, at)?;
            let value = value_text(&raw, at)?;
            let mut expect = opt_u64(&o, at, "expect")?;
            if op == "putIfAbsent" {
                if expect.is_some_and(|e| e != 0) {
                    return Err(ApiError::bad_request(
                        &f("expect"),
                        "must be absent or 0 on putIfAbsent",
                    ));
                }
                expect = Some(0);
            }
            KvOp::Put {
                ns,
                key,
                value,
                expiry: expiry(&o, at)?,
                expect,
                required: required(&o, at)?,
            }
        }
        "delete" => {
            let (ns, key) = ns_key(&o, at)?;
            KvOp::Delete {
                ns,
                key,
                expect: opt_u64(&o, at, "expect")?,
                required: required(&o, at)?,
            }
        }
        "check" => {
            let (ns, key) = ns_key(&o, at)?;
            let expect = opt_u64(&o, at, "expect")?
                .ok_or_else(|| ApiError::bad_request(&f("expect"), "is required"))?;
            KvOp::Check {
                ns,
                key,
                expect,
                required: required(&o, at)?,
            }
        }
        "incr" => {
            let (ns, key) = ns_key(&o, at)?;
            if o.get("expect").is_some_and(|v| !v.is_null()) {
                return Err(ApiError::bad_request(
                    &f("expect"),
                    "is not allowed on incr",
                ));
            }
            let delta = match raw
                .present("delta")
                .map(|d| number(d, &f("delta")))
                .transpose()?
            {
                None => Num::Int(1),
                Some(RawNumber::Int(i)) => Num::Int(i),
                Some(RawNumber::Float(x)) => Num::Float(x),
            };
            KvOp::Incr {
                ns,
                key,
                delta,
                min: bound(raw.present("min"), &f("min"))?,
                max: bound(raw.present("max"), &f("max"))?,
                expiry: expiry(&o, at)?,
                required: required(&o, at)?,
            }
        }
        other => {
            return Err(ApiError::bad_request(
                &f("op"),
                &format!("'{other}' is not a KV operation"),
            ));
        }
    })
}

fn op_name(op: &KvOp) -> &'static str {
    match op {
        KvOp::Get { .. } => "get",
        KvOp::GetMany { .. } => "getMany",
        KvOp::GetPrefix { .. } => "getPrefix",
        KvOp::Put { .. } => "put",
        KvOp::Delete { .. } => "delete",
        KvOp::Check { .. } => "check",
        KvOp::Incr { .. } => "incr",
    }
}

#[cfg(test)]
mod tests;
