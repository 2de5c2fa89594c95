//! Message traces: events a consumer records against a message it handles
//! (`message.trace({...})` in the official client), read back per message, per trace name, and as
//! the list of names in use.
//!
//! Traces are rows of the replicated KV store in the tenant's `queen-traces` namespace, so they
//! are written through the log like any KV write (one entry per trace, every row of it in the same
//! atomic batch), survive restarts, reach every node, and expire after [`RETENTION_SECONDS`] by
//! the KV store's own TTL sweep. A trace is written once per name index:
//!
//! - `m/<partition>/<transaction>/<stamp>-<id>`: the message's traces, oldest first;
//! - `n/<name>/<inverted stamp>-<id>`: one copy per trace name, newest first;
//! - `k/<name>`: the name itself, rewritten by every trace that carries it, so the names in use
//!   are the live `k/` rows.
//!
//! Parts of a key are escaped (`%` and `/`), so a transactionId holding `/` never reads as
//! another message's prefix. This module builds the rows and reads them; it does no I/O.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::keys;
use crate::kv::{Expiry, KvOp, escape_part as esc};
use crate::store::{StateRead, StoreError};
use crate::tenant::Tenant;
use crate::time::Stamp;

pub use crate::kv::TRACES_NS as NS;

/// How long a trace is kept: seven days.
pub const RETENTION_SECONDS: u64 = 7 * 24 * 3600;

/// Most names one trace carries.
pub const MAX_NAMES: usize = 16;

/// Longest trace name, event type, partition id or transactionId, in bytes.
pub const MAX_TEXT: usize = 256;

/// Most rows one read looks at (a listing's `total` counts at most this many).
pub const MAX_SCANNED: usize = 100_000;

/// Why a trace is refused (the field is named in the answer).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} {reason}")]
pub struct TraceError {
    /// The field.
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

fn refuse(field: &'static str, reason: impl Into<String>) -> TraceError {
    TraceError {
        field,
        reason: reason.into(),
    }
}

fn text(field: &'static str, v: &str) -> Result<(), TraceError> {
    if v.is_empty() || v.len() > MAX_TEXT {
        Err(refuse(field, format!("must be 1 to {MAX_TEXT} bytes")))
    } else if v.chars().any(char::is_control) {
        Err(refuse(
            field,
            "must not contain control characters".to_owned(),
        ))
    } else {
        Ok(())
    }
}

/// One trace, as stored and as answered.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Trace {
    /// Its id (a UUID minted by the node that took it).
    pub id: String,
    /// The message's transactionId.
    #[serde(rename = "transactionId")]
    pub transaction_id: String,
    /// The message's partition id.
    #[serde(rename = "partitionId")]
    pub partition_id: String,
    /// The group that handled it (`__QUEUE_MODE__` in queue mode).
    #[serde(rename = "consumerGroup")]
    pub consumer_group: String,
    /// `info` unless the consumer named another.
    #[serde(rename = "eventType")]
    pub event_type: String,
    /// The names it is filed under.
    #[serde(rename = "traceNames")]
    pub names: Vec<String>,
    /// The consumer's object, verbatim.
    pub data: Box<RawValue>,
    /// When the node took it (ISO 8601, milliseconds).
    #[serde(rename = "createdAt")]
    pub created_at: String,
}

impl Trace {
    /// Check a trace's fields.
    ///
    /// # Errors
    /// The first field out of bounds: empty or long texts, more than [`MAX_NAMES`] names, or
    /// `data` that is not a JSON object.
    pub fn check(&self) -> Result<(), TraceError> {
        text("transactionId", &self.transaction_id)?;
        text("partitionId", &self.partition_id)?;
        text("consumerGroup", &self.consumer_group)?;
        text("eventType", &self.event_type)?;
        if self.names.len() > MAX_NAMES {
            return Err(refuse(
                "traceNames",
                format!("must hold at most {MAX_NAMES} names"),
            ));
        }
        for n in &self.names {
            text("traceNames", n)?;
        }
        if !self.data.get().trim_start().starts_with('{') {
            return Err(refuse("data", "must be a JSON object"));
        }
        Ok(())
    }
}

/// The key prefix of one message's traces.
fn message_prefix(partition_id: &str, transaction_id: &str) -> String {
    format!("m/{}/{}/", esc(partition_id), esc(transaction_id))
}

/// The key prefix of one name's traces.
fn name_prefix(name: &str) -> String {
    format!("n/{}/", esc(name))
}

/// The KV operations that record `trace` at `now` for `tenant`: one atomic batch.
///
/// # Errors
/// A JSON encoding failure of the trace (not expected for a checked trace).
pub fn record(tenant: &Tenant, trace: &Trace, now: Stamp) -> Result<Vec<KvOp>, serde_json::Error> {
    let ns = tenant.name(NS);
    let value = serde_json::to_vec(trace)?;
    let expiry = Expiry::Ttl(RETENTION_SECONDS);
    let put = |key: String, value: Vec<u8>| KvOp::Put {
        ns: ns.clone(),
        key,
        value,
        expiry,
        expect: None,
        required: false,
    };
    let mut ops = vec![put(
        format!(
            "{}{:020}-{}",
            message_prefix(&trace.partition_id, &trace.transaction_id),
            now.0,
            trace.id
        ),
        value.clone(),
    )];
    for name in &trace.names {
        ops.push(put(
            format!("{}{:020}-{}", name_prefix(name), u64::MAX - now.0, trace.id),
            value.clone(),
        ));
        let row = serde_json::json!({"traceName": name, "lastSeenAt": trace.created_at});
        ops.push(put(format!("k/{}", esc(name)), serde_json::to_vec(&row)?));
    }
    Ok(ops)
}

/// Visit the live rows of `tenant`'s traces whose keys start with `prefix`, in key order, until
/// `f` answers false or [`MAX_SCANNED`] rows were seen.
fn scan_rows(
    s: &dyn StateRead,
    tenant: &Tenant,
    prefix: &str,
    now: Stamp,
    f: &mut dyn FnMut(&[u8]) -> bool,
) -> Result<(), StoreError> {
    let ns = tenant.name(NS);
    let start = keys::kv(&ns, prefix);
    let end = keys::prefix_end(&start);
    let mut seen = 0usize;
    let mut failed = None;
    s.scan(&start, &end, &mut |k, v| {
        seen += 1;
        match crate::machine::kv::live_value(k, v, now) {
            Ok(Some(value)) => seen < MAX_SCANNED && f(&value),
            Ok(None) => seen < MAX_SCANNED,
            Err(e) => {
                failed = Some(e);
                false
            }
        }
    })?;
    failed.map_or(Ok(()), Err)
}

/// One message's traces, oldest first (at most `limit`).
///
/// # Errors
/// Store failures.
pub fn of_message(
    s: &dyn StateRead,
    tenant: &Tenant,
    partition_id: &str,
    transaction_id: &str,
    now: Stamp,
    limit: usize,
) -> Result<Vec<Box<RawValue>>, StoreError> {
    let mut out = Vec::new();
    scan_rows(
        s,
        tenant,
        &message_prefix(partition_id, transaction_id),
        now,
        &mut |v| {
            if let Ok(t) = serde_json::from_slice::<Box<RawValue>>(v) {
                out.push(t);
            }
            out.len() < limit
        },
    )?;
    Ok(out)
}

/// A page of a name's traces, newest first, taken between `from` and `to` (inclusive), after
/// skipping `skip`: the page and how many traces match (counted up to [`MAX_SCANNED`]).
///
/// # Errors
/// Store failures.
#[allow(clippy::too_many_arguments)]
pub fn by_name(
    s: &dyn StateRead,
    tenant: &Tenant,
    name: &str,
    from: Option<Stamp>,
    to: Option<Stamp>,
    skip: usize,
    limit: usize,
    now: Stamp,
) -> Result<(Vec<Box<RawValue>>, usize), StoreError> {
    let prefix = name_prefix(name);
    let ns = tenant.name(NS);
    let start = keys::kv(&ns, &prefix);
    let (mut page, mut total) = (Vec::new(), 0usize);
    let mut failed = None;
    let mut seen = 0usize;
    s.scan(&start, &keys::prefix_end(&start), &mut |k, v| {
        seen += 1;
        // The stamp is in the key: `<inverted stamp>-<id>`.
        let stamp = k
            .get(start.len()..start.len() + 20)
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| d.parse::<u64>().ok())
            .map(|inv| Stamp(u64::MAX - inv));
        let Some(stamp) = stamp else {
            return seen < MAX_SCANNED;
        };
        if to.is_some_and(|t| stamp > t) {
            return seen < MAX_SCANNED;
        }
        if from.is_some_and(|f| stamp < f) {
            // Newest first: everything after is older still.
            return false;
        }
        match crate::machine::kv::live_value(k, v, now) {
            Ok(Some(value)) => {
                if total >= skip
                    && page.len() < limit
                    && let Ok(t) = serde_json::from_slice::<Box<RawValue>>(&value)
                {
                    page.push(t);
                }
                total += 1;
            }
            Ok(None) => {}
            Err(e) => {
                failed = Some(e);
                return false;
            }
        }
        seen < MAX_SCANNED
    })?;
    failed.map_or(Ok((page, total)), Err)
}

/// A page of the trace names in use, in name order, whose name holds `search` (any case):
/// the page (`{"traceName", "lastSeenAt"}` objects) and how many names match.
///
/// # Errors
/// Store failures.
pub fn names(
    s: &dyn StateRead,
    tenant: &Tenant,
    search: Option<&str>,
    skip: usize,
    limit: usize,
    now: Stamp,
) -> Result<(Vec<Box<RawValue>>, usize), StoreError> {
    #[derive(Deserialize)]
    struct Name<'a> {
        #[serde(rename = "traceName", borrow)]
        trace_name: std::borrow::Cow<'a, str>,
    }
    let needle = search.map(str::to_lowercase);
    let (mut page, mut total) = (Vec::new(), 0usize);
    scan_rows(s, tenant, "k/", now, &mut |v| {
        let Ok(n) = serde_json::from_slice::<Name<'_>>(v) else {
            return true;
        };
        if needle
            .as_deref()
            .is_some_and(|w| !n.trace_name.to_lowercase().contains(w))
        {
            return true;
        }
        if total >= skip
            && page.len() < limit
            && let Ok(t) = serde_json::from_slice::<Box<RawValue>>(v)
        {
            page.push(t);
        }
        total += 1;
        true
    })?;
    Ok((page, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaped_parts_keep_prefixes_apart() {
        assert!(!message_prefix("1", "a/b").starts_with(&message_prefix("1", "a")));
    }
}
