//! KV and lock request bodies and answers.

use queen_domain::kv::{Expiry, Holder, KvOp, KvOutcome, KvResult, KvRowView, LOCKS_NS, LockOp, LockResult, Num, check_key, check_ns, permit_key};
use serde_json::{Map, Value, json};

use crate::api::ApiError;
use crate::json::{object, opt_str};

/// Most operations one KV or lock call may carry.
const MAX_OPS: usize = 1000;

fn field(i: usize, k: &str) -> String {
    format!("operations[{i}].{k}")
}

fn req_string(o: &Map<String, Value>, i: usize, k: &str) -> Result<String, ApiError> {
    opt_str(o, k, &field(i, k))?.ok_or_else(|| ApiError::bad_request(&field(i, k), "is required"))
}

fn opt_u64(o: &Map<String, Value>, i: usize, k: &str) -> Result<Option<u64>, ApiError> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| ApiError::bad_request(&field(i, k), "must be a non-negative integer")),
    }
}

fn opt_f64(o: &Map<String, Value>, i: usize, k: &str) -> Result<Option<f64>, ApiError> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| ApiError::bad_request(&field(i, k), "must be a number")),
    }
}

fn required(o: &Map<String, Value>, i: usize) -> Result<bool, ApiError> {
    match o.get("required") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(true)) => Ok(true),
        Some(_) => Err(ApiError::bad_request(&field(i, "required"), "may only be true")),
    }
}

fn ns_key(o: &Map<String, Value>, i: usize) -> Result<(String, String), ApiError> {
    let ns = req_string(o, i, "ns")?;
    check_ns(&ns).map_err(|e| ApiError::bad_request(&field(i, "ns"), &e.to_string()))?;
    let key = req_string(o, i, "key")?;
    check_key(&key).map_err(|e| ApiError::bad_request(&field(i, "key"), &e.to_string()))?;
    Ok((ns, key))
}

/// Exactly one of `ttlSeconds` (> 0) or `forever: true`.
pub(crate) fn expiry(o: &Map<String, Value>, at: &str) -> Result<Expiry, ApiError> {
    let ttl = o.get("ttlSeconds").filter(|v| !v.is_null());
    let forever = o.get("forever").filter(|v| !v.is_null());
    let refuse = || {
        ApiError::new(400, "kv_expiry_not_specified", format!("{at} needs exactly one of ttlSeconds (an integer above 0) or forever: true"))
    };
    match (ttl, forever) {
        (Some(t), None) => t.as_u64().filter(|t| *t > 0).map(Expiry::Ttl).ok_or_else(refuse),
        (None, Some(Value::Bool(true))) => Ok(Expiry::Forever),
        _ => Err(refuse()),
    }
}

/// `{"operations": [...]}` to KV operations.
pub(crate) fn kv_ops(body: &[u8], in_transaction: bool) -> Result<Vec<KvOp>, ApiError> {
    let m = object(body, false)?;
    match m.get("operations") {
        Some(Value::Array(a)) => kv_list(a, in_transaction, "operations"),
        None | Some(Value::Null) => Err(ApiError::bad_request("operations", "is required")),
        Some(_) => Err(ApiError::bad_request("operations", "must be a list")),
    }
}

/// A list of KV operations (also a transaction's `kv` rider).
pub(crate) fn kv_list(a: &[Value], in_transaction: bool, name: &str) -> Result<Vec<KvOp>, ApiError> {
    if a.is_empty() || a.len() > MAX_OPS {
        return Err(ApiError::bad_request(name, &format!("must have 1 to {MAX_OPS} operations")));
    }
    let mut out = Vec::with_capacity(a.len());
    for (i, v) in a.iter().enumerate() {
        let Value::Object(o) = v else {
            return Err(ApiError::bad_request(&format!("{name}[{i}]"), "must be an object"));
        };
        let op = req_string(o, i, "op")?;
        out.push(match op.as_str() {
            "get" => {
                let (ns, key) = ns_key(o, i)?;
                KvOp::Get { ns, key }
            }
            "getMany" => {
                let ns = req_string(o, i, "ns")?;
                check_ns(&ns).map_err(|e| ApiError::bad_request(&field(i, "ns"), &e.to_string()))?;
                let keys = match o.get("keys") {
                    Some(Value::Array(ks)) if !ks.is_empty() && ks.len() <= MAX_OPS => ks
                        .iter()
                        .map(|k| k.as_str().filter(|k| check_key(k).is_ok()).map(str::to_owned))
                        .collect::<Option<Vec<_>>>()
                        .ok_or_else(|| ApiError::bad_request(&field(i, "keys"), "must hold valid keys"))?,
                    _ => return Err(ApiError::bad_request(&field(i, "keys"), "must be a non-empty list")),
                };
                KvOp::GetMany { ns, keys }
            }
            "getPrefix" => {
                if in_transaction {
                    return Err(ApiError::bad_request(&field(i, "op"), "getPrefix is refused inside a transaction"));
                }
                let ns = req_string(o, i, "ns")?;
                check_ns(&ns).map_err(|e| ApiError::bad_request(&field(i, "ns"), &e.to_string()))?;
                let prefix = req_string(o, i, "prefix")?;
                if prefix.is_empty() {
                    return Err(ApiError::new(400, "kv_prefix_required", format!("{} must not be empty", field(i, "prefix"))));
                }
                let limit = opt_u64(o, i, "limit")?.unwrap_or(100).clamp(1, 1000) as u32;
                let keys_only = match o.get("keysOnly") {
                    None | Some(Value::Null) | Some(Value::Bool(false)) => false,
                    Some(Value::Bool(true)) => true,
                    Some(_) => return Err(ApiError::bad_request(&field(i, "keysOnly"), "must be true")),
                };
                KvOp::GetPrefix { ns, prefix, after: opt_str(o, "after", &field(i, "after"))?, limit, keys_only }
            }
            "put" | "putIfAbsent" => {
                let (ns, key) = ns_key(o, i)?;
                let value = match o.get("value") {
                    Some(v) => serde_json::to_vec(v).unwrap_or_default(),
                    None => return Err(ApiError::bad_request(&field(i, "value"), "is required")),
                };
                let mut expect = opt_u64(o, i, "expect")?;
                if op == "putIfAbsent" {
                    if expect.is_some_and(|e| e != 0) {
                        return Err(ApiError::bad_request(&field(i, "expect"), "must be absent or 0 on putIfAbsent"));
                    }
                    expect = Some(0);
                }
                KvOp::Put { ns, key, value, expiry: expiry(o, &format!("operations[{i}]"))?, expect, required: required(o, i)? }
            }
            "delete" => {
                let (ns, key) = ns_key(o, i)?;
                KvOp::Delete { ns, key, expect: opt_u64(o, i, "expect")?, required: required(o, i)? }
            }
            "check" => {
                let (ns, key) = ns_key(o, i)?;
                let expect = opt_u64(o, i, "expect")?.ok_or_else(|| ApiError::bad_request(&field(i, "expect"), "is required"))?;
                KvOp::Check { ns, key, expect, required: required(o, i)? }
            }
            "incr" => {
                let (ns, key) = ns_key(o, i)?;
                if o.get("expect").is_some_and(|v| !v.is_null()) {
                    return Err(ApiError::bad_request(&field(i, "expect"), "is not allowed on incr"));
                }
                let delta = match o.get("delta") {
                    None | Some(Value::Null) => Num::Int(1),
                    Some(Value::Number(n)) => n.as_i64().map(Num::Int).or_else(|| n.as_f64().map(Num::Float)).unwrap_or(Num::Int(1)),
                    Some(_) => return Err(ApiError::bad_request(&field(i, "delta"), "must be a number")),
                };
                KvOp::Incr {
                    ns,
                    key,
                    delta,
                    min: opt_f64(o, i, "min")?,
                    max: opt_f64(o, i, "max")?,
                    expiry: expiry(o, &format!("operations[{i}]"))?,
                    required: required(o, i)?,
                }
            }
            other => return Err(ApiError::bad_request(&field(i, "op"), &format!("'{other}' is not a KV operation"))),
        });
    }
    Ok(out)
}

fn op_name(op: &KvOp) -> &'static str {
    match op {
        KvOp::Get { .. } => "get",
        KvOp::GetMany { .. } => "getMany",
        KvOp::GetPrefix { .. } => "getPrefix",
        KvOp::Put { expect: Some(0), .. } => "put",
        KvOp::Put { .. } => "put",
        KvOp::Delete { .. } => "delete",
        KvOp::Check { .. } => "check",
        KvOp::Incr { .. } => "incr",
    }
}

fn value_of(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap_or(Value::Null)
}

/// A row as JSON.
pub(crate) fn row(r: &KvRowView, keys_only: bool) -> Value {
    let mut v = json!({
        "key": r.key,
        "version": r.version,
        "expiresAt": r.expires.map(|e| e.iso_millis()),
        "updatedAt": r.updated.iso_millis(),
    });
    if !keys_only {
        v["value"] = value_of(&r.value);
    }
    v
}

/// One KV result as JSON.
pub(crate) fn result(i: usize, op: &KvOp, r: &KvResult) -> Value {
    let mut v = match r {
        KvResult::Get(Some(row_v)) => {
            let mut v = row(row_v, false);
            v["found"] = json!(true);
            v
        }
        KvResult::Get(None) => json!({"found": false, "key": match op { KvOp::Get { key, .. } => key.clone(), _ => String::new() }}),
        KvResult::Many { rows, missing } => json!({"rows": rows.iter().map(|r| row(r, false)).collect::<Vec<_>>(), "missing": missing, "truncated": false}),
        KvResult::Prefix { rows, truncated, next_after, keys_only } => {
            json!({"rows": rows.iter().map(|r| row(r, *keys_only)).collect::<Vec<_>>(), "truncated": truncated, "nextAfter": next_after})
        }
        KvResult::Write { applied, reason, current } => {
            let mut v = json!({
                "applied": applied,
                "value": current.as_ref().map_or(Value::Null, |c| value_of(&c.value)),
                "version": current.as_ref().map(|c| c.version),
            });
            if let Some(r) = reason {
                v["reason"] = json!(r);
            }
            if let Some(c) = current {
                v["expiresAt"] = json!(c.expires.map(|e| e.iso_millis()));
            }
            v
        }
    };
    v["index"] = json!(i);
    v["op"] = json!(op_name(op));
    v
}

/// A KV call's answer: index-aligned `results`, plus the verdict of a lost required precondition.
pub(crate) fn outcome(ops: &[KvOp], o: &KvOutcome) -> Value {
    let results: Vec<Value> = ops.iter().zip(&o.results).enumerate().map(|(i, (op, r))| result(i, op, r)).collect();
    match o.failed {
        None => json!({"ok": true, "results": results}),
        Some(f) => {
            let failed = &results[f];
            json!({
                "ok": false, "reason": "kv_precondition", "failedIndex": f,
                "kvReason": failed.get("reason").cloned().unwrap_or(Value::Null),
                "version": failed.get("version").cloned().unwrap_or(Value::Null),
                "value": failed.get("value").cloned().unwrap_or(Value::Null),
                "results": results,
            })
        }
    }
}

fn lock_name(o: &Map<String, Value>, i: usize) -> Result<String, ApiError> {
    let name = req_string(o, i, "name")?;
    if name.is_empty() || name.len() > 256 || name.chars().any(|c| c.is_control() || c == '#') {
        return Err(ApiError::bad_request(&field(i, "name"), "must be 1 to 256 bytes without control characters or '#'"));
    }
    Ok(name)
}

fn positive(o: &Map<String, Value>, i: usize, k: &str) -> Result<u64, ApiError> {
    opt_u64(o, i, k)?.filter(|v| *v > 0).ok_or_else(|| ApiError::bad_request(&field(i, k), "must be an integer above 0"))
}

/// `{"operations": [...]}` to lock operations; `mint` gives an owner to acquires without one.
pub(crate) fn lock_ops(body: &[u8], mint: &dyn Fn() -> String) -> Result<Vec<LockOp>, ApiError> {
    let m = object(body, false)?;
    let ops = match m.get("operations") {
        Some(Value::Array(a)) if !a.is_empty() && a.len() <= MAX_OPS => a,
        _ => return Err(ApiError::bad_request("operations", &format!("must be a list of 1 to {MAX_OPS} operations"))),
    };
    let mut out = Vec::with_capacity(ops.len());
    for (i, v) in ops.iter().enumerate() {
        let Value::Object(o) = v else {
            return Err(ApiError::bad_request(&format!("operations[{i}]"), "must be an object"));
        };
        let slot = u32::try_from(opt_u64(o, i, "slot")?.unwrap_or(0)).map_err(|_| ApiError::bad_request(&field(i, "slot"), "is too large"))?;
        out.push(match req_string(o, i, "op")?.as_str() {
            "acquire" => {
                let owner = match opt_str(o, "owner", &field(i, "owner"))? {
                    Some(w) if w.is_empty() || w.len() > 256 || w.chars().any(char::is_control) => {
                        return Err(ApiError::bad_request(&field(i, "owner"), "must be 1 to 256 bytes without control characters"));
                    }
                    Some(w) => w,
                    None => mint(),
                };
                let limit = opt_u64(o, i, "limit")?.unwrap_or(1);
                if !(1..=1024).contains(&limit) {
                    return Err(ApiError::bad_request(&field(i, "limit"), "must be 1 to 1024"));
                }
                LockOp::Acquire { name: lock_name(o, i)?, ttl: positive(o, i, "ttlSeconds")?, owner, limit: limit as u32 }
            }
            "renew" => LockOp::Renew { name: lock_name(o, i)?, token: positive(o, i, "token")?, ttl: positive(o, i, "ttlSeconds")?, slot },
            "release" => LockOp::Release { name: lock_name(o, i)?, token: positive(o, i, "token")?, slot },
            "get" => LockOp::Get { name: lock_name(o, i)? },
            other => return Err(ApiError::bad_request(&field(i, "op"), &format!("'{other}' is not a lock operation"))),
        });
    }
    Ok(out)
}

fn holders(hs: &[Holder]) -> Value {
    Value::Array(
        hs.iter()
            .map(|h| json!({"slot": h.slot, "owner": h.owner, "token": h.token, "since": h.since.iso_millis(), "expiresAt": h.expires.map(|e| e.iso_millis()), "renewedAt": h.renewed.iso_millis()}))
            .collect(),
    )
}

fn guard(name: &str, slot: u32, token: u64) -> Value {
    json!({"op": "check", "ns": LOCKS_NS, "key": permit_key(name, slot), "expect": token, "required": true})
}

/// Lock answers, one per operation.
pub(crate) fn lock_results(ops: &[LockOp], rs: &[LockResult]) -> Value {
    let results: Vec<Value> = ops
        .iter()
        .zip(rs)
        .map(|(op, r)| {
            let name = match op {
                LockOp::Acquire { name, .. } | LockOp::Renew { name, .. } | LockOp::Release { name, .. } | LockOp::Get { name } => name,
            };
            match r {
                LockResult::Acquired { slot, token, owner, already } => {
                    let mut v = json!({"acquired": true, "slot": slot, "token": token, "owner": owner, "guard": guard(name, *slot, *token)});
                    if *already {
                        v["already"] = json!(true);
                    }
                    v
                }
                LockResult::NotAcquired { reason, holders: hs } => json!({"acquired": false, "reason": reason, "holders": holders(hs)}),
                LockResult::Renewed { slot, token } => json!({"renewed": true, "slot": slot, "token": token, "guard": guard(name, *slot, *token)}),
                LockResult::Lost { holders: hs } => json!({"renewed": false, "reason": "lost", "holders": holders(hs)}),
                LockResult::Released(true) => json!({"released": true}),
                LockResult::Released(false) => json!({"released": false, "reason": "lost"}),
                LockResult::Held(hs) => json!({"held": !hs.is_empty(), "holders": holders(hs)}),
            }
        })
        .collect();
    json!({ "results": results })
}
