//! Locks and semaphores as KV rows in `queen-locks`: a permit is the row `<name>#<slot>`, its
//! token is the row's version (so tokens only rise), and every renewal writes a new version.
//! A lock name under a tenant's scope lives in that tenant's `queen-locks` namespace, so a
//! tenant's guards (`check` rows in its own namespaces) name its own permits.

use crate::keys;
use crate::kv::{Expiry, Holder, LOCKS_NS, LockOp, LockResult, permit_key};
use crate::store::{StateRead, StoreError, Txn};
use crate::time::Stamp;

use super::kv::{KvRow, delete_row, live_row, write_row};

fn owner_of(row: &KvRow) -> String {
    serde_json::from_slice::<serde_json::Value>(&row.value)
        .ok()
        .and_then(|v| v.get("owner").and_then(|o| o.as_str()).map(str::to_owned))
        .unwrap_or_default()
}

/// The namespace and the name a lock's rows use: `queen-locks` and the name, or for a scoped
/// name the tenant's own `queen-locks` and the client's name.
fn place(name: &str) -> (std::borrow::Cow<'_, str>, &str) {
    match crate::tenant::split(name) {
        (Some(_), local) => {
            let scope = &name[..name.len() - local.len()];
            (format!("{scope}{LOCKS_NS}").into(), local)
        }
        (None, _) => (LOCKS_NS.into(), name),
    }
}

fn holders(s: &dyn StateRead, ns: &str, name: &str, now: Stamp) -> Result<Vec<Holder>, StoreError> {
    let prefix = keys::kv(ns, &format!("{name}#"));
    let base = keys::kv_ns(ns).len() + name.len() + 1;
    let mut raw = Vec::new();
    s.scan(&prefix, &keys::prefix_end(&prefix), &mut |k, v| {
        raw.push((k.to_vec(), v.to_vec()));
        raw.len() < 4096
    })?;
    let mut out = Vec::new();
    for (k, v) in raw {
        let row: KvRow = crate::codec::decode(&k, &v)?;
        if row.expires.is_some_and(|e| e <= now) {
            continue;
        }
        let Some(slot) = std::str::from_utf8(k.get(base..).unwrap_or_default())
            .ok()
            .and_then(|s| s.parse().ok())
        else {
            continue;
        };
        out.push(Holder {
            slot,
            owner: owner_of(&row),
            token: row.version,
            since: row.created,
            expires: row.expires,
            renewed: row.updated,
        });
    }
    out.sort_by_key(|h| h.slot);
    Ok(out)
}

fn permit_row(owner: &str, ttl: u64, now: Stamp, index: u64, created: Stamp) -> KvRow {
    KvRow {
        value: serde_json::json!({ "owner": owner })
            .to_string()
            .into_bytes(),
        version: index,
        expires: match Expiry::Ttl(ttl) {
            Expiry::Ttl(s) => Some(now.plus_seconds(s)),
            Expiry::Forever => None,
        },
        created,
        updated: now,
    }
}

/// Apply lock operations; each is independent.
pub(crate) fn apply(
    txn: &mut Txn<'_>,
    now: Stamp,
    index: u64,
    ops: &[LockOp],
) -> Result<Vec<LockResult>, StoreError> {
    let mut out = Vec::with_capacity(ops.len());
    for op in ops {
        out.push(match op {
            LockOp::Acquire {
                name,
                ttl,
                owner,
                limit,
            } => {
                let (ns, name) = place(name);
                let current = holders(&*txn, &ns, name, now)?;
                if let Some(h) = current.iter().find(|h| h.owner == *owner) {
                    LockResult::Acquired {
                        slot: h.slot,
                        token: h.token,
                        owner: owner.clone(),
                        already: true,
                    }
                } else if let Some(slot) =
                    (0..(*limit).max(1)).find(|s| current.iter().all(|h| h.slot != *s))
                {
                    let key = permit_key(name, slot);
                    write_row(txn, &ns, &key, &permit_row(owner, *ttl, now, index, now))?;
                    LockResult::Acquired {
                        slot,
                        token: index,
                        owner: owner.clone(),
                        already: false,
                    }
                } else {
                    let reason = if *limit > 1 { "contended" } else { "held" };
                    LockResult::NotAcquired {
                        reason: reason.to_owned(),
                        holders: current,
                    }
                }
            }
            LockOp::Renew {
                name,
                token,
                ttl,
                slot,
            } => {
                let (ns, name) = place(name);
                let key = permit_key(name, *slot);
                match live_row(&*txn, &ns, &key, now)? {
                    Some(row) if row.version == *token => {
                        let owner = owner_of(&row);
                        write_row(
                            txn,
                            &ns,
                            &key,
                            &permit_row(&owner, *ttl, now, index, row.created),
                        )?;
                        LockResult::Renewed {
                            slot: *slot,
                            token: index,
                        }
                    }
                    _ => LockResult::Lost {
                        holders: holders(&*txn, &ns, name, now)?,
                    },
                }
            }
            LockOp::Release { name, token, slot } => {
                let (ns, name) = place(name);
                let key = permit_key(name, *slot);
                match live_row(&*txn, &ns, &key, now)? {
                    Some(row) if row.version == *token => {
                        delete_row(txn, &ns, &key)?;
                        LockResult::Released(true)
                    }
                    _ => LockResult::Released(false),
                }
            }
            LockOp::Get { name } => {
                let (ns, name) = place(name);
                LockResult::Held(holders(&*txn, &ns, name, now)?)
            }
        });
    }
    Ok(out)
}
