//! KV rules: versions are the log index of the write; expired rows never read as existing;
//! preconditions are data; a lost `required` precondition rolls the whole call back.

use serde::{Deserialize, Serialize};

use crate::keys;
use crate::kv::{Expiry, KvOp, KvOutcome, KvResult, KvRowView, MAX_PREFIX_LIMIT, Num};
use crate::store::{StateRead, StoreError, Txn};
use crate::time::Stamp;

use super::{get_rec, put_rec};

/// A stored row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct KvRow {
    #[serde(with = "serde_bytes")]
    pub(crate) value: Vec<u8>,
    pub(crate) version: u64,
    pub(crate) expires: Option<Stamp>,
    pub(crate) created: Stamp,
    pub(crate) updated: Stamp,
}

impl KvRow {
    fn live(&self, now: Stamp) -> bool {
        self.expires.is_none_or(|e| e > now)
    }

    fn view(&self, key: &str) -> KvRowView {
        KvRowView {
            key: key.to_owned(),
            value: self.value.clone(),
            version: self.version,
            expires: self.expires,
            updated: self.updated,
            created: self.created,
        }
    }
}

/// The live row under (ns, key) at `now`.
pub(crate) fn live_row(
    s: &dyn StateRead,
    ns: &str,
    key: &str,
    now: Stamp,
) -> Result<Option<KvRow>, StoreError> {
    Ok(get_rec::<KvRow>(s, &keys::kv(ns, key))?.filter(|r| r.live(now)))
}

/// The value of a row read raw by a scan, when the row is live at `now`.
pub(crate) fn live_value(k: &[u8], v: &[u8], now: Stamp) -> Result<Option<Vec<u8>>, StoreError> {
    let row = crate::codec::decode::<KvRow>(k, v)?;
    Ok(row.live(now).then_some(row.value))
}

/// Write a row (replacing any), keeping the expiry index in step.
pub(crate) fn write_row(
    txn: &mut Txn<'_>,
    ns: &str,
    key: &str,
    row: &KvRow,
) -> Result<(), StoreError> {
    if let Some(old) = get_rec::<KvRow>(txn, &keys::kv(ns, key))?
        && let Some(e) = old.expires
    {
        txn.delete(keys::kv_expiry(e.0, ns, key));
    }
    if let Some(e) = row.expires {
        put_rec(txn, keys::kv_expiry(e.0, ns, key), &());
    }
    put_rec(txn, keys::kv(ns, key), row);
    Ok(())
}

/// Delete a row and its expiry index entry.
pub(crate) fn delete_row(txn: &mut Txn<'_>, ns: &str, key: &str) -> Result<(), StoreError> {
    if let Some(old) = get_rec::<KvRow>(txn, &keys::kv(ns, key))?
        && let Some(e) = old.expires
    {
        txn.delete(keys::kv_expiry(e.0, ns, key));
    }
    txn.delete(keys::kv(ns, key));
    Ok(())
}

fn expires_at(expiry: Expiry, now: Stamp) -> Option<Stamp> {
    match expiry {
        Expiry::Ttl(s) => Some(now.plus_seconds(s)),
        Expiry::Forever => None,
    }
}

fn not_applied(reason: &str, current: Option<&KvRow>, key: &str) -> KvResult {
    KvResult::Write {
        applied: false,
        reason: Some(reason.to_owned()),
        current: current.map(|r| r.view(key)),
    }
}

/// Whether `expect` holds for `current`: 0 = absent, N = that version.
fn precondition(expect: u64, current: Option<&KvRow>) -> Option<&'static str> {
    match (expect, current) {
        (0, None) => None,
        (0, Some(_)) => Some("exists"),
        (_, None) => Some("absent"),
        (n, Some(r)) if r.version == n => None,
        _ => Some("version"),
    }
}

/// A stored number as `incr` reads it.
enum Stored {
    /// An integer literal inside i64.
    Int(i64),
    /// A literal with a fraction or exponent, as a 64-bit float (maybe not finite: `1e400`).
    Float(f64),
}

/// Read a stored value as a number: `Ok(None)` when it is not a JSON number, `Err(())` when it
/// is an integer literal outside i64 (no exact sum exists).
fn stored_number(bytes: &[u8]) -> Result<Option<Stored>, ()> {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Ok(None);
    };
    let t = text.trim();
    if !t.starts_with(|c: char| c == '-' || c.is_ascii_digit())
        || serde_json::from_str::<serde::de::IgnoredAny>(t).is_err()
    {
        return Ok(None);
    }
    if t.contains(['.', 'e', 'E']) {
        return Ok(t.parse::<f64>().ok().map(Stored::Float));
    }
    t.parse::<i64>()
        .map(|i| Some(Stored::Int(i)))
        .map_err(|_| ())
}

/// `n` against `limit`, exactly (no rounding of `n` to a float).
fn cmp_int_float(n: i64, limit: f64) -> Option<std::cmp::Ordering> {
    use std::cmp::Ordering;
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    if limit.is_nan() {
        return None;
    }
    if limit >= TWO_63 {
        return Some(Ordering::Less);
    }
    if limit < -TWO_63 {
        return Some(Ordering::Greater);
    }
    let whole = limit.trunc();
    // In [-2^63, 2^63) a whole float converts to i64 exactly.
    Some(n.cmp(&(whole as i64)).then(if limit > whole {
        Ordering::Less
    } else if limit < whole {
        Ordering::Greater
    } else {
        Ordering::Equal
    }))
}

/// The result of an `incr` before its bounds are checked.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Sum {
    Int(i64),
    Float(f64),
}

impl Sum {
    fn above(self, max: f64) -> bool {
        match self {
            Sum::Int(n) => cmp_int_float(n, max) == Some(std::cmp::Ordering::Greater),
            Sum::Float(f) => f > max,
        }
    }

    fn below(self, min: f64) -> bool {
        match self {
            Sum::Int(n) => cmp_int_float(n, min) == Some(std::cmp::Ordering::Less),
            Sum::Float(f) => f < min,
        }
    }

    fn text(self) -> Vec<u8> {
        match self {
            Sum::Int(n) => n.to_string().into_bytes(),
            // Finite by construction; `null` would only show a broken invariant.
            Sum::Float(f) => serde_json::Number::from_f64(f)
                .map_or_else(|| b"null".to_vec(), |n| n.to_string().into_bytes()),
        }
    }
}

/// `incr`'s arithmetic: exact in i64 when the stored value and the delta are integers (a sum
/// outside i64 is `None`), else in 64-bit floats (a sum that is not finite is `None`).
fn add(base: Stored, delta: Num) -> Option<Sum> {
    match (base, delta) {
        (Stored::Int(a), Num::Int(b)) => a.checked_add(b).map(Sum::Int),
        (Stored::Int(a), Num::Float(b)) => finite(a as f64 + b),
        (Stored::Float(a), d) => finite(a + d.as_f64()),
    }
}

fn finite(f: f64) -> Option<Sum> {
    f.is_finite().then_some(Sum::Float(f))
}

fn one(
    txn: &mut Txn<'_>,
    now: Stamp,
    index: u64,
    op: &KvOp,
) -> Result<(KvResult, bool), StoreError> {
    Ok(match op {
        KvOp::Get { ns, key } => (
            KvResult::Get(live_row(txn, ns, key, now)?.map(|r| r.view(key))),
            true,
        ),
        KvOp::GetMany { ns, keys: ks } => {
            let (mut rows, mut missing) = (Vec::new(), Vec::new());
            for k in ks {
                match live_row(txn, ns, k, now)? {
                    Some(r) => rows.push(r.view(k)),
                    None => missing.push(k.clone()),
                }
            }
            (KvResult::Many { rows, missing }, true)
        }
        KvOp::GetPrefix {
            ns,
            prefix,
            after,
            limit,
            keys_only,
        } => {
            let limit = (*limit).clamp(1, MAX_PREFIX_LIMIT) as usize;
            let base = keys::kv_ns(ns);
            let start = match after {
                Some(a) if a.as_str() >= prefix.as_str() => {
                    let mut k = keys::kv(ns, a);
                    k.push(0);
                    k
                }
                _ => keys::kv(ns, prefix),
            };
            let end = keys::prefix_end(&keys::kv(ns, prefix));
            let mut raw = Vec::new();
            StateRead::scan(&*txn, &start, &end, &mut |k, v| {
                raw.push((k.to_vec(), v.to_vec()));
                raw.len() <= limit * 4 + 1
            })?;
            let mut rows = Vec::new();
            let mut truncated = false;
            for (k, v) in raw {
                let row: KvRow = crate::codec::decode(&k, &v)?;
                if !row.live(now) {
                    continue;
                }
                if rows.len() == limit {
                    truncated = true;
                    break;
                }
                let key =
                    String::from_utf8_lossy(k.get(base.len()..).unwrap_or_default()).into_owned();
                let mut view = row.view(&key);
                if *keys_only {
                    view.value.clear();
                }
                rows.push(view);
            }
            let next_after = if truncated {
                rows.last().map(|r| r.key.clone())
            } else {
                None
            };
            (
                KvResult::Prefix {
                    rows,
                    truncated,
                    next_after,
                    keys_only: *keys_only,
                },
                true,
            )
        }
        KvOp::Put {
            ns,
            key,
            value,
            expiry,
            expect,
            ..
        } => {
            let current = live_row(txn, ns, key, now)?;
            if let Some(e) = expect
                && let Some(why) = precondition(*e, current.as_ref())
            {
                return Ok((not_applied(why, current.as_ref(), key), false));
            }
            let row = KvRow {
                value: value.clone(),
                version: index,
                expires: expires_at(*expiry, now),
                created: current.as_ref().map_or(now, |c| c.created),
                updated: now,
            };
            write_row(txn, ns, key, &row)?;
            (
                KvResult::Write {
                    applied: true,
                    reason: None,
                    current: Some(row.view(key)),
                },
                true,
            )
        }
        KvOp::Delete {
            ns, key, expect, ..
        } => {
            let current = live_row(txn, ns, key, now)?;
            let Some(cur) = current.as_ref() else {
                return Ok((not_applied("absent", None, key), false));
            };
            if let Some(e) = expect
                && let Some(why) = precondition(*e, Some(cur))
            {
                return Ok((not_applied(why, Some(cur), key), false));
            }
            delete_row(txn, ns, key)?;
            (
                KvResult::Write {
                    applied: true,
                    reason: None,
                    current: None,
                },
                true,
            )
        }
        KvOp::Check {
            ns, key, expect, ..
        } => {
            let current = live_row(txn, ns, key, now)?;
            match precondition(*expect, current.as_ref()) {
                Some(why) => (not_applied(why, current.as_ref(), key), false),
                None => (
                    KvResult::Write {
                        applied: true,
                        reason: None,
                        current: current.map(|r| r.view(key)),
                    },
                    true,
                ),
            }
        }
        KvOp::Incr {
            ns,
            key,
            delta,
            min,
            max,
            expiry,
            ..
        } => {
            let current = live_row(txn, ns, key, now)?;
            let base = match &current {
                None => Stored::Int(0),
                Some(r) => match stored_number(&r.value) {
                    Ok(Some(n)) => n,
                    Ok(None) => return Ok((not_applied("type", current.as_ref(), key), false)),
                    Err(()) => return Ok((not_applied("overflow", current.as_ref(), key), false)),
                },
            };
            let Some(next) = add(base, *delta) else {
                return Ok((not_applied("overflow", current.as_ref(), key), false));
            };
            if max.is_some_and(|m| next.above(m)) || min.is_some_and(|m| next.below(m)) {
                return Ok((not_applied("limit", current.as_ref(), key), false));
            }
            let row = KvRow {
                value: next.text(),
                version: index,
                expires: match &current {
                    Some(c) => c.expires,
                    None => expires_at(*expiry, now),
                },
                created: current.as_ref().map_or(now, |c| c.created),
                updated: now,
            };
            write_row(txn, ns, key, &row)?;
            (
                KvResult::Write {
                    applied: true,
                    reason: None,
                    current: Some(row.view(key)),
                },
                true,
            )
        }
    })
}

fn required(op: &KvOp) -> bool {
    match op {
        KvOp::Put { required, .. }
        | KvOp::Delete { required, .. }
        | KvOp::Check { required, .. }
        | KvOp::Incr { required, .. } => *required,
        _ => false,
    }
}

/// Apply a KV call: in order, on a child overlay; kept only if no required precondition lost.
pub(crate) fn apply(
    txn: &mut Txn<'_>,
    now: Stamp,
    index: u64,
    ops: &[KvOp],
) -> Result<KvOutcome, StoreError> {
    let (mut results, failed, writes) = {
        let mut child = Txn::new(&*txn);
        let mut results = Vec::with_capacity(ops.len());
        let mut failed = None;
        for (i, op) in ops.iter().enumerate() {
            let (r, ok) = one(&mut child, now, index, op)?;
            results.push(r);
            if !ok && required(op) {
                failed = Some(i);
                break;
            }
        }
        (results, failed, child.into_owned_parts())
    };
    if let Some(f) = failed {
        // Nothing is kept: every write that had applied now reads as rolled back, and the
        // operations after the failed one are answered as not applied.
        for (i, r) in results.iter_mut().enumerate() {
            if i != f
                && let KvResult::Write {
                    applied, reason, ..
                } = r
                && *applied
            {
                *applied = false;
                *reason = Some("rolled_back".to_owned());
            }
        }
        for _ in results.len()..ops.len() {
            results.push(KvResult::Write {
                applied: false,
                reason: Some("rolled_back".to_owned()),
                current: None,
            });
        }
        return Ok(KvOutcome { results, failed });
    }
    txn.absorb_parts(writes);
    Ok(KvOutcome {
        results,
        failed: None,
    })
}

/// Housekeeping: delete rows whose expiry passed, at most `budget`.
pub(crate) fn sweep(txn: &mut Txn<'_>, now: Stamp, budget: &mut usize) -> Result<(), StoreError> {
    for (k, ns, key) in super::due_entries(&*txn, keys::table::KV_EXPIRY, now, *budget / 2)? {
        if !ns.is_empty()
            && let Some(row) = get_rec::<KvRow>(txn, &keys::kv(&ns, &key))?
            && !row.live(now)
        {
            txn.delete(keys::kv(&ns, &key));
        }
        txn.delete(k);
        *budget = budget.saturating_sub(2);
    }
    Ok(())
}
