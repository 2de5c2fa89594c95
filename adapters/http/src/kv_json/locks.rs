//! Lock request bodies (acquire, release, renew) and their answers.

use super::*;

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
