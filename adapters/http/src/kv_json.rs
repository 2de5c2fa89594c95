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

fn ns_key(o: &Map<String, Value>, at: &str) -> Result<(String, String), ApiError> {
    let ns = ns_of(o, at)?;
    let key = req_string(o, at, "key")?;
    check_key(&key).map_err(|e| ApiError::bad_request(&path(at, "key"), &e.to_string()))?;
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
        .map(|(i, v)| kv_op(v, in_transaction, &format!("{name}[{i}]")))
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
                            .filter(|k| check_key(k).is_ok())
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

/// A row as answered; `value` is the stored text, verbatim (left out when keys only).
#[derive(Serialize)]
pub(crate) struct RowOut<'a> {
    key: &'a str,
    version: u64,
    #[serde(rename = "expiresAt")]
    expires_at: Option<String>,
    #[serde(rename = "updatedAt")]
    updated_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<StoredJson<'a>>,
}

fn row(r: &KvRowView, keys_only: bool) -> RowOut<'_> {
    RowOut {
        key: &r.key,
        version: r.version,
        expires_at: r.expires.map(|e| e.iso_millis()),
        updated_at: r.updated.iso_millis(),
        value: (!keys_only).then_some(StoredJson(&r.value)),
    }
}

/// The shape of one result, by kind of operation.
#[derive(Serialize)]
#[serde(untagged)]
enum ResultBody<'a> {
    Found {
        #[serde(flatten)]
        row: RowOut<'a>,
        found: bool,
    },
    Missing {
        found: bool,
        key: &'a str,
    },
    Many {
        rows: Vec<RowOut<'a>>,
        missing: &'a [String],
        truncated: bool,
    },
    Prefix {
        rows: Vec<RowOut<'a>>,
        truncated: bool,
        #[serde(rename = "nextAfter")]
        next_after: Option<&'a str>,
    },
    Write {
        applied: bool,
        value: Option<StoredJson<'a>>,
        version: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<&'a str>,
        /// Present (maybe null) only when there is a current row.
        #[serde(rename = "expiresAt", skip_serializing_if = "Option::is_none")]
        expires_at: Option<Option<String>>,
    },
}

/// One KV result as answered; a transaction adds `opIndex` and `type`.
#[derive(Serialize)]
pub(crate) struct ResultOut<'a> {
    #[serde(flatten)]
    body: ResultBody<'a>,
    index: usize,
    op: &'static str,
    #[serde(rename = "opIndex", skip_serializing_if = "Option::is_none")]
    op_index: Option<usize>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
}

impl ResultOut<'_> {
    /// The result as a transaction lists it: `index` counts every result before it.
    pub(crate) fn in_transaction(mut self, index: usize) -> Self {
        self.op_index = Some(self.index);
        self.index = index;
        self.kind = Some("kv");
        self
    }
}

/// One KV result.
pub(crate) fn result<'a>(i: usize, op: &'a KvOp, r: &'a KvResult) -> ResultOut<'a> {
    let body = match r {
        KvResult::Get(Some(row_v)) => ResultBody::Found {
            row: row(row_v, false),
            found: true,
        },
        KvResult::Get(None) => ResultBody::Missing {
            found: false,
            key: match op {
                KvOp::Get { key, .. } => key,
                _ => "",
            },
        },
        KvResult::Many { rows, missing } => ResultBody::Many {
            rows: rows.iter().map(|r| row(r, false)).collect(),
            missing,
            truncated: false,
        },
        KvResult::Prefix {
            rows,
            truncated,
            next_after,
            keys_only,
        } => ResultBody::Prefix {
            rows: rows.iter().map(|r| row(r, *keys_only)).collect(),
            truncated: *truncated,
            next_after: next_after.as_deref(),
        },
        KvResult::Write {
            applied,
            reason,
            current,
        } => ResultBody::Write {
            applied: *applied,
            value: current.as_ref().map(|c| StoredJson(&c.value)),
            version: current.as_ref().map(|c| c.version),
            reason: reason.as_deref(),
            expires_at: current.as_ref().map(|c| c.expires.map(|e| e.iso_millis())),
        },
    };
    ResultOut {
        body,
        index: i,
        op: op_name(op),
        op_index: None,
        kind: None,
    }
}

/// What a lost required precondition reports: its reason, and the current version and value.
#[derive(Serialize)]
pub(crate) struct Failure<'a> {
    #[serde(rename = "kvReason")]
    kv_reason: Option<&'a str>,
    version: Option<u64>,
    value: Option<StoredJson<'a>>,
}

/// The failure fields of a result (all null when it is not a write).
pub(crate) fn failure(r: &KvResult) -> Failure<'_> {
    match r {
        KvResult::Write {
            reason, current, ..
        } => Failure {
            kv_reason: reason.as_deref(),
            version: current.as_ref().map(|c| c.version),
            value: current.as_ref().map(|c| StoredJson(&c.value)),
        },
        _ => Failure {
            kv_reason: None,
            version: None,
            value: None,
        },
    }
}

/// A KV call's answer: index-aligned `results`, plus the verdict of a lost required precondition.
#[derive(Serialize)]
pub(crate) struct OutcomeOut<'a> {
    ok: bool,
    results: Vec<ResultOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
    #[serde(rename = "failedIndex", skip_serializing_if = "Option::is_none")]
    failed_index: Option<usize>,
    #[serde(flatten)]
    failure: Option<Failure<'a>>,
}

/// A KV call's answer.
pub(crate) fn outcome<'a>(ops: &'a [KvOp], o: &'a KvOutcome) -> OutcomeOut<'a> {
    let results = ops
        .iter()
        .zip(&o.results)
        .enumerate()
        .map(|(i, (op, r))| result(i, op, r))
        .collect();
    let failed = o.failed.filter(|f| *f < o.results.len());
    OutcomeOut {
        ok: failed.is_none(),
        results,
        reason: failed.map(|_| "kv_precondition"),
        failed_index: failed,
        failure: failed.map(|f| failure(&o.results[f])),
    }
}

fn lock_name(o: &Map<String, Value>, i: usize) -> Result<String, ApiError> {
    let name = req_string(o, &format!("operations[{i}]"), "name")?;
    if name.is_empty() || name.len() > 256 || name.chars().any(|c| c.is_control() || c == '#') {
        return Err(ApiError::bad_request(
            &field(i, "name"),
            "must be 1 to 256 bytes without control characters or '#'",
        ));
    }
    Ok(name)
}

fn positive(o: &Map<String, Value>, i: usize, k: &str) -> Result<u64, ApiError> {
    opt_u64(o, &format!("operations[{i}]"), k)?
        .filter(|v| *v > 0)
        .ok_or_else(|| ApiError::bad_request(&field(i, k), "must be an integer above 0"))
}

/// A lock's lifetime: 1 second to ten years.
fn lock_ttl(o: &Map<String, Value>, i: usize) -> Result<u64, ApiError> {
    match o.get("ttlSeconds").and_then(Value::as_f64) {
        Some(t) if t > MAX_DURATION_SECONDS as f64 => Err(ttl_range(&field(i, "ttlSeconds"))),
        _ => positive(o, i, "ttlSeconds"),
    }
}

/// `{"operations": [...]}` to lock operations; `mint` gives an owner to acquires without one.
pub(crate) fn lock_ops(body: &[u8], mint: &dyn Fn() -> String) -> Result<Vec<LockOp>, ApiError> {
    let m = object(body, false)?;
    let ops = match m.get("operations") {
        Some(Value::Array(a)) if !a.is_empty() && a.len() <= MAX_OPS => a,
        _ => {
            return Err(ApiError::bad_request(
                "operations",
                &format!("must be a list of 1 to {MAX_OPS} operations"),
            ));
        }
    };
    let mut out = Vec::with_capacity(ops.len());
    for (i, v) in ops.iter().enumerate() {
        let Value::Object(o) = v else {
            return Err(ApiError::bad_request(
                &format!("operations[{i}]"),
                "must be an object",
            ));
        };
        let slot = u32::try_from(opt_u64(o, &format!("operations[{i}]"), "slot")?.unwrap_or(0))
            .map_err(|_| ApiError::bad_request(&field(i, "slot"), "is too large"))?;
        out.push(
            match req_string(o, &format!("operations[{i}]"), "op")?.as_str() {
                "acquire" => {
                    let owner = match opt_str(o, "owner", &field(i, "owner"))? {
                        Some(w)
                            if w.is_empty() || w.len() > 256 || w.chars().any(char::is_control) =>
                        {
                            return Err(ApiError::bad_request(
                                &field(i, "owner"),
                                "must be 1 to 256 bytes without control characters",
                            ));
                        }
                        Some(w) => w,
                        None => mint(),
                    };
                    let limit = opt_u64(o, &format!("operations[{i}]"), "limit")?.unwrap_or(1);
                    if !(1..=1024).contains(&limit) {
                        return Err(ApiError::bad_request(
                            &field(i, "limit"),
                            "must be 1 to 1024",
                        ));
                    }
                    LockOp::Acquire {
                        name: lock_name(o, i)?,
                        ttl: lock_ttl(o, i)?,
                        owner,
                        limit: limit as u32,
                    }
                }
                "renew" => LockOp::Renew {
                    name: lock_name(o, i)?,
                    token: positive(o, i, "token")?,
                    ttl: lock_ttl(o, i)?,
                    slot,
                },
                "release" => LockOp::Release {
                    name: lock_name(o, i)?,
                    token: positive(o, i, "token")?,
                    slot,
                },
                "get" => LockOp::Get {
                    name: lock_name(o, i)?,
                },
                other => {
                    return Err(ApiError::bad_request(
                        &field(i, "op"),
                        &format!("'{other}' is not a lock operation"),
                    ));
                }
            },
        );
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

#[cfg(test)]
mod tests;
