//! What one bounded pass of a tenant purge removes: the tenant's queues (their partitions are
//! collected by the deletion's own bounded housekeeping), its timers, its KV rows (its locks
//! among them, which live in its own namespaces) and the sink's documents of its queues. The
//! lake is never touched. Pure: the application runs the plan as ordinary commands, timers
//! first (a timer left behind would bring a deleted queue back), then queues, then rows.

use crate::keys;
use crate::model::QueueRec;
use crate::names::QueueName;
use crate::reads;
use crate::store::{StateRead, StoreError};

use super::Tenant;

/// Most queues one pass deletes.
pub const QUEUES_PER_PASS: usize = 64;
/// Most KV rows, and most timers, one pass deletes.
pub const ROWS_PER_PASS: usize = 1000;

/// One pass of a purge.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PurgePlan {
    /// Queues to delete, with how many partitions each has.
    pub queues: Vec<(QueueName, u64)>,
    /// Timers to cancel: (queue, timer key).
    pub timers: Vec<(QueueName, String)>,
    /// KV rows to delete: (namespace, key).
    pub rows: Vec<(String, String)>,
    /// Whether anything was left for a later pass.
    pub more: bool,
}

impl PurgePlan {
    /// Partitions the pass deletes.
    #[must_use]
    pub fn partitions(&self) -> u64 {
        self.queues.iter().map(|(_, n)| n).sum()
    }
}

/// Raw `(key, value)` rows with `prefix`, at most `limit`; answers whether more exist.
fn rows_with(
    s: &dyn StateRead,
    prefix: &[u8],
    limit: usize,
    keep: &mut dyn FnMut(&[u8]) -> bool,
) -> Result<(Vec<Vec<u8>>, bool), StoreError> {
    let mut out = Vec::new();
    let mut more = false;
    s.scan(prefix, &keys::prefix_end(prefix), &mut |k, _| {
        if !keep(k) {
            return true;
        }
        if out.len() == limit {
            more = true;
            return false;
        }
        out.push(k.to_vec());
        true
    })?;
    Ok((out, more))
}

/// `(name, rest)` of a key `<table byte><name>\0<rest>`.
fn split_key(k: &[u8]) -> Option<(String, String)> {
    let body = k.get(1..)?;
    let nul = body.iter().position(|b| *b == 0)?;
    Some((
        String::from_utf8(body[..nul].to_vec()).ok()?,
        String::from_utf8(body[nul + 1..].to_vec()).ok()?,
    ))
}

/// The next pass of purging `tenant`. For the default tenant it names every unscoped queue,
/// timer and KV row (the sink's and the locks' namespaces included): callers refuse it.
///
/// # Errors
/// Store failures.
pub fn plan(s: &dyn StateRead, tenant: &Tenant) -> Result<PurgePlan, StoreError> {
    let mut plan = PurgePlan::default();
    let queues: Vec<QueueRec> = reads::tenant_queues(s, tenant, QUEUES_PER_PASS + 1)?;
    plan.more |= queues.len() > QUEUES_PER_PASS;
    for q in queues.into_iter().take(QUEUES_PER_PASS) {
        let partitions = reads::queue_view(s, &q.name)?.map_or(0, |v| v.partitions.len() as u64);
        if let Ok(name) = QueueName::try_from(q.name) {
            plan.queues.push((name, partitions));
        }
    }
    let scope = tenant.scope().as_bytes();
    let mut timer_prefix = vec![keys::table::TIMER];
    timer_prefix.extend_from_slice(scope);
    // The default tenant's prefix is empty: skip the scoped rows it would also cover.
    let mut owned = |k: &[u8]| !tenant.is_default() || k.get(1) != Some(&1);
    let (timers, more) = rows_with(s, &timer_prefix, ROWS_PER_PASS, &mut owned)?;
    plan.more |= more;
    for k in timers {
        if let Some((q, key)) = split_key(&k)
            && let Ok(q) = QueueName::try_from(q)
        {
            plan.timers.push((q, key));
        }
    }
    let mut kv_prefix = vec![keys::table::KV];
    kv_prefix.extend_from_slice(scope);
    let (rows, more) = rows_with(s, &kv_prefix, ROWS_PER_PASS, &mut owned)?;
    plan.more |= more;
    plan.rows.extend(rows.iter().filter_map(|k| split_key(k)));
    // The sink's documents name the queue percent-encoded: `s3:<sink>:<queue>:<kind>`.
    let marker = format!(":{}", crate::sink::keys::encode(tenant.scope()));
    let sink_ns = keys::kv_ns(crate::sink::documents::NS);
    let room = ROWS_PER_PASS.saturating_sub(plan.rows.len()).max(1);
    let (docs, more) = rows_with(s, &sink_ns, room, &mut |k| {
        std::str::from_utf8(&k[sink_ns.len()..]).is_ok_and(|key| key.contains(&marker))
    })?;
    plan.more |= more;
    plan.rows.extend(docs.iter().filter_map(|k| split_key(k)));
    Ok(plan)
}
