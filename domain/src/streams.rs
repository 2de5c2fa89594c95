//! Streams: the broker's side of the official client's streaming runtime (`/streams/v1/*`).
//!
//! The client runs the operators; the broker keeps what must survive a crash of the client and
//! change in one step with the source's acknowledgement:
//!
//! - a registry of queries by name, with the hash of the operator chain's shape (a query
//!   restarted with another chain is refused unless it asks for a reset, which wipes its state);
//! - the state rows of each (query, source partition): window accumulators, watermarks;
//! - a **cycle**: state writes, pushes to the sink queue and the source ack, proposed as one
//!   transaction entry, so a crash between them cannot emit twice or lose a window.
//!
//! Everything is rows of the replicated KV store in the tenant's `queen-streams` namespace:
//!
//! - `q/<name>`: the query (`QueryRow`), written with a version precondition;
//! - `s/<query id>/<partition id>/<key>`: one state row, its value the client's JSON.
//!
//! This module names the rows, decides a registration and reads state; it does no I/O.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::keys;
use crate::kv::{Expiry, KvOp, escape_part as esc};
use crate::store::{StateRead, StoreError};
use crate::tenant::Tenant;
use crate::time::Stamp;

pub use crate::kv::STREAMS_NS as NS;

/// Most state rows one read answers (a shard holding more is refused, not cut short: a window
/// runtime that saw part of its state would emit wrong figures).
pub const MAX_STATE_ROWS: usize = 10_000;

/// Longest query name, hash, queue name or partition id, in bytes.
pub const MAX_TEXT: usize = 256;

/// A registered query.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueryRow {
    /// The id state rows are filed under (a UUID minted at creation).
    pub id: String,
    /// The client's name for it (its `query_id`).
    pub name: String,
    /// The queue it reads.
    pub source_queue: String,
    /// The queue it writes, when it has a sink.
    pub sink_queue: Option<String>,
    /// The hash of the operator chain's shape.
    pub config_hash: String,
    /// When it was created or last reset (ISO 8601).
    pub created_at: String,
}

/// What a registration does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registration {
    /// No such query: create it.
    Fresh,
    /// The same chain again: nothing to write.
    Same,
    /// A reset: wipe its state and store the new chain.
    Reset,
    /// Another chain under the same name without a reset: refused.
    Mismatch {
        /// The hash stored.
        stored: String,
    },
}

/// Decide a registration of `hash` under a name whose stored query is `existing`.
#[must_use]
pub fn decide(existing: Option<&QueryRow>, hash: &str, reset: bool) -> Registration {
    match existing {
        None => Registration::Fresh,
        Some(_) if reset => Registration::Reset,
        Some(q) if q.config_hash == hash => Registration::Same,
        Some(q) => Registration::Mismatch {
            stored: q.config_hash.clone(),
        },
    }
}

/// The key of a query by name.
#[must_use]
pub fn query_key(name: &str) -> String {
    format!("q/{}", esc(name))
}

/// The key prefix of every state row of a query.
fn query_prefix(query_id: &str) -> String {
    format!("s/{}/", esc(query_id))
}

/// The key prefix of one (query, partition) shard.
fn shard_prefix(query_id: &str, partition_id: &str) -> String {
    format!("{}{}/", query_prefix(query_id), esc(partition_id))
}

/// A query by name, with its row's version (for a precondition), when it is registered.
///
/// # Errors
/// Store failures.
pub fn query(
    s: &dyn StateRead,
    tenant: &Tenant,
    name: &str,
    now: Stamp,
) -> Result<Option<(QueryRow, u64)>, StoreError> {
    let row = crate::machine::kv::live_row(s, &tenant.name(NS), &query_key(name), now)?;
    Ok(row.and_then(|r| {
        serde_json::from_slice::<QueryRow>(&r.value)
            .ok()
            .map(|q| (q, r.version))
    }))
}

/// The write that stores `q` under its name: created only while absent (`version` None), else
/// replaced only at the version read. Lost preconditions roll the whole call back.
///
/// # Errors
/// A JSON encoding failure.
pub fn store_query(
    tenant: &Tenant,
    q: &QueryRow,
    version: Option<u64>,
) -> Result<KvOp, serde_json::Error> {
    Ok(KvOp::Put {
        ns: tenant.name(NS),
        key: query_key(&q.name),
        value: serde_json::to_vec(q)?,
        expiry: Expiry::Forever,
        expect: Some(version.unwrap_or(0)),
        required: true,
    })
}

/// One state operation of a cycle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateOp {
    /// Write a row (the client's JSON text).
    Upsert {
        /// The client's key.
        key: String,
        /// The value, as JSON text.
        value: Vec<u8>,
    },
    /// Remove a row.
    Delete {
        /// The client's key.
        key: String,
    },
}

/// The KV operations of a cycle's state operations on one shard.
///
/// # Errors
/// A key that does not fit a KV key (over 1024 bytes with its prefix) or holds a NUL, naming
/// the operation's index.
pub fn state_writes(
    tenant: &Tenant,
    query_id: &str,
    partition_id: &str,
    ops: Vec<StateOp>,
) -> Result<Vec<KvOp>, usize> {
    let ns = tenant.name(NS);
    let prefix = shard_prefix(query_id, partition_id);
    ops.into_iter()
        .enumerate()
        .map(|(i, op)| {
            let key = |k: &str| {
                let full = format!("{prefix}{k}");
                crate::kv::check_key(&full).map(|()| full).map_err(|_| i)
            };
            Ok(match op {
                StateOp::Upsert { key: k, value } => KvOp::Put {
                    ns: ns.clone(),
                    key: key(&k)?,
                    value,
                    expiry: Expiry::Forever,
                    expect: None,
                    required: false,
                },
                StateOp::Delete { key: k } => KvOp::Delete {
                    ns: ns.clone(),
                    key: key(&k)?,
                    expect: None,
                    required: false,
                },
            })
        })
        .collect()
}

/// The transactionId of the `index`-th message a cycle pushes: the same for the same cycle, so
/// that a cycle the client sends again (its answer lost) pushes nothing twice. `anchor` is what
/// makes the cycle unique: the transactionId it acknowledges (the cursor moves past it once, so
/// no other cycle of the query and partition acknowledges it).
#[must_use]
pub fn emit_id(query_id: &str, partition_id: &str, anchor: &str, index: usize) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for part in [query_id, partition_id, anchor, &index.to_string()] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    let d = h.finalize();
    let hex: String = d[..20].iter().map(|b| format!("{b:02x}")).collect();
    format!("stream-{hex}")
}

/// Which rows of a shard a read wants.
#[derive(Debug, Clone, Default)]
pub struct StateQuery<'a> {
    /// Only these keys (all when empty).
    pub keys: &'a [String],
    /// Only keys starting with this.
    pub key_prefix: Option<&'a str>,
    /// Only window rows due: a JSON object whose `windowEnd` (epoch ms) is at or before this.
    pub ripe_at_or_before: Option<f64>,
}

/// Why a state read gives no rows.
#[derive(Debug, thiserror::Error)]
pub enum StateReadError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The shard holds more rows than one answer carries.
    #[error("the state of this partition holds more than {MAX_STATE_ROWS} rows")]
    TooMany,
}

/// The live rows of one shard that `want` selects, in key order: `(client key, value)`.
///
/// # Errors
/// Store failures, or more than [`MAX_STATE_ROWS`] selected rows.
pub fn state_rows(
    s: &dyn StateRead,
    tenant: &Tenant,
    query_id: &str,
    partition_id: &str,
    want: &StateQuery<'_>,
    now: Stamp,
) -> Result<Vec<(String, Box<RawValue>)>, StateReadError> {
    #[derive(Deserialize)]
    struct Window {
        #[serde(rename = "windowEnd")]
        window_end: Option<f64>,
    }
    let ns = tenant.name(NS);
    let prefix = shard_prefix(query_id, partition_id);
    let start = keys::kv(&ns, &prefix);
    let mut out = Vec::new();
    let mut failed: Option<StateReadError> = None;
    s.scan(&start, &keys::prefix_end(&start), &mut |k, v| {
        let Some(key) = k
            .get(start.len()..)
            .and_then(|b| std::str::from_utf8(b).ok())
        else {
            return true;
        };
        if !want.keys.is_empty() && !want.keys.iter().any(|w| w == key) {
            return true;
        }
        if want.key_prefix.is_some_and(|p| !key.starts_with(p)) {
            return true;
        }
        let value = match crate::machine::kv::live_value(k, v, now) {
            Ok(Some(value)) => value,
            Ok(None) => return true,
            Err(e) => {
                failed = Some(e.into());
                return false;
            }
        };
        if let Some(ripe) = want.ripe_at_or_before {
            let due = serde_json::from_slice::<Window>(&value)
                .ok()
                .and_then(|w| w.window_end)
                .is_some_and(|end| end <= ripe);
            if !due {
                return true;
            }
        }
        let Ok(raw) = serde_json::from_slice::<Box<RawValue>>(&value) else {
            return true;
        };
        if out.len() == MAX_STATE_ROWS {
            failed = Some(StateReadError::TooMany);
            return false;
        }
        out.push((key.to_owned(), raw));
        true
    })?;
    failed.map_or(Ok(out), Err)
}

/// Deletes of the first `limit` state rows of a query (every shard): a reset proposes pages of
/// these until none is left.
///
/// # Errors
/// Store failures.
pub fn wipe_page(
    s: &dyn StateRead,
    tenant: &Tenant,
    query_id: &str,
    limit: usize,
) -> Result<Vec<KvOp>, StoreError> {
    let ns = tenant.name(NS);
    let start = keys::kv(&ns, &query_prefix(query_id));
    let base = keys::kv_ns(&ns).len();
    let mut out = Vec::new();
    s.scan(&start, &keys::prefix_end(&start), &mut |k, _| {
        if let Some(key) = k.get(base..).and_then(|b| std::str::from_utf8(b).ok()) {
            out.push(KvOp::Delete {
                ns: ns.clone(),
                key: key.to_owned(),
                expect: None,
                required: false,
            });
        }
        out.len() < limit
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(hash: &str) -> QueryRow {
        QueryRow {
            id: "id".into(),
            name: "n".into(),
            source_queue: "src".into(),
            sink_queue: None,
            config_hash: hash.into(),
            created_at: String::new(),
        }
    }

    #[test]
    fn a_registration_is_fresh_same_reset_or_refused() {
        assert_eq!(decide(None, "h", false), Registration::Fresh);
        assert_eq!(decide(None, "h", true), Registration::Fresh);
        assert_eq!(decide(Some(&q("h")), "h", false), Registration::Same);
        assert_eq!(decide(Some(&q("h")), "h", true), Registration::Reset);
        assert_eq!(
            decide(Some(&q("h")), "other", false),
            Registration::Mismatch { stored: "h".into() }
        );
        assert_eq!(decide(Some(&q("h")), "other", true), Registration::Reset);
    }

    #[test]
    fn emitted_ids_repeat_for_the_same_cycle_only() {
        let a = emit_id("q", "1", "t-9", 0);
        assert_eq!(a, emit_id("q", "1", "t-9", 0));
        assert_ne!(a, emit_id("q", "1", "t-9", 1));
        assert_ne!(a, emit_id("q", "2", "t-9", 0));
        assert_ne!(emit_id("q", "1/", "t", 0), emit_id("q", "1", "/t", 0));
        assert!(crate::ids::TransactionId::new(a).is_ok());
    }

    #[test]
    fn shards_of_different_partitions_do_not_share_a_prefix() {
        assert!(!shard_prefix("q", "1/2").starts_with(&shard_prefix("q", "1")));
        assert!(shard_prefix("q", "1").starts_with(&query_prefix("q")));
    }

    #[test]
    fn a_key_too_long_is_refused_by_its_index() {
        let long = "k".repeat(1100);
        let ops = vec![
            StateOp::Delete { key: "a".into() },
            StateOp::Upsert {
                key: long,
                value: b"1".to_vec(),
            },
        ];
        assert_eq!(state_writes(&Tenant::default(), "q", "1", ops), Err(1));
    }
}
