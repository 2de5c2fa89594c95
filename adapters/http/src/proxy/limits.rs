//! The proxy's limits and metering, per node (a three-node cluster can reach three times a
//! plan's rate, as documented): request and message token buckets, parked long polls, size
//! caps, the queue cap, the retention ceiling, the monthly message quota and the feature gate,
//! from the cluster's plan and overrides (`queen_domain::proxy::plans`). In shadow mode
//! (`QUEEN_PROXY_ENFORCE=false`, the default) rate, cap and parked decisions are only logged
//! (`would_block`, at most one line per cluster a minute); size caps, the monthly quota and the
//! feature gate are always enforced. Metering counts requests, pushed messages and bytes per
//! cluster, minute and op class, and writes them to the replicated KV store every
//! `QUEEN_PROXY_METER_FLUSH_MS` (15 s).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use queen_domain::command::PushItem;
use queen_domain::kv::{Expiry, KvOp, Num};
use queen_domain::proxy::Effective;
use queen_domain::proxy::directory::{self as d, ClusterEntry, USAGE_MIN, USAGE_MONTH};
use queen_domain::proxy::plans::{self, Bucket, Plan};
use queen_domain::proxy::routes::{Class, GatedOp};
use queen_ports::ClientApi;
use serde_json::Value;

use crate::api::ApiError;

mod blocked;
mod caps;

/// How long usage rows are kept (`QUEEN_PROXY_USAGE_KEEP_DAYS`, 90).
const USAGE_KEEP: u64 = 90 * 86_400;
/// How long a month counter is kept.
const MONTH_KEEP: u64 = 70 * 86_400;
/// How often one cluster's shadow decisions are logged at most.
const SHADOW_LOG_EVERY: Duration = Duration::from_secs(60);

/// A metered minute of one cluster and op class on this process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Counters {
    pub(crate) reqs: u64,
    pub(crate) msgs: u64,
    pub(crate) bytes_in: u64,
    pub(crate) bytes_out: u64,
}

#[derive(Default)]
struct ClusterState {
    plan_at: u64,
    plan: Arc<Plan>,
    req: Option<Bucket>,
    msgs: Option<Bucket>,
    parked: Arc<AtomicU64>,
    shadow_logged: Option<Instant>,
    shadow_count: u64,
    storage: Storage,
    /// The cluster's queues as last counted (for the queue cap).
    queues: Option<caps::QueueCount>,
}

/// A cluster's storage quota on this node: the bytes its stored messages took at the last
/// count, the bytes pushed since (an estimate of what the next count adds), and whether pushes
/// are blocked (strictly above the cap; released at 90% of it).
#[derive(Default)]
struct Storage {
    counted: u64,
    since: u64,
    at: Option<Instant>,
    blocked: bool,
}

impl Storage {
    fn judge(&mut self, cap: u64) {
        let now = self.counted.saturating_add(self.since);
        if self.blocked {
            self.blocked = now.saturating_mul(10) > cap.saturating_mul(9);
        } else {
            self.blocked = now > cap;
        }
    }
}

/// One admitted request: what its body check and its metering need.
pub(crate) struct Ticket {
    cluster: String,
    tenant: String,
    class: Class,
    plan: Arc<Plan>,
    op: &'static str,
    msgs: u64,
    /// The cluster's pushes are blocked (what its body would add is refused).
    push_blocked: bool,
    /// Held while a long poll waits.
    _parked: Option<Parked>,
}

struct Parked(Arc<AtomicU64>);

impl Drop for Parked {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The node's limit and meter state.
pub(crate) struct Limits {
    enforce: bool,
    flush_every: Duration,
    reconcile_every: Duration,
    instance: String,
    clusters: Mutex<HashMap<String, ClusterState>>,
    /// (cluster, minute µs, op) -> this process's counters; the month deltas not flushed yet.
    meter: Mutex<Meter>,
}

#[derive(Default)]
struct Meter {
    minutes: HashMap<(String, u64, &'static str), Counters>,
    dirty: std::collections::HashSet<(String, u64, &'static str)>,
    month: HashMap<String, u64>,
    /// This process's activity per cluster, and which changed since the last flush.
    activity: HashMap<String, d::ActivityDoc>,
    activity_dirty: std::collections::HashSet<String>,
    flushed_at: Option<Instant>,
}

fn op_class(class: Class, segs: &[&str]) -> &'static str {
    match class {
        Class::Produce if matches!(segs, [.., "transaction"]) => "txn",
        Class::Produce | Class::Gated(_, GatedOp::Grow | GatedOp::Mixed | GatedOp::Open) => "push",
        Class::Consume => "delivery",
        Class::QueueAdmin => "configure",
        _ => "read",
    }
}

/// The calendar month (UTC) of a stamp, `YYYY-MM`.
pub(crate) fn month(now: queen_domain::time::Stamp) -> String {
    now.iso_millis().chars().take(7).collect()
}

fn too_large(what: String) -> ApiError {
    ApiError::new(413, "payload_too_large", what)
}

impl Limits {
    pub(crate) fn new(enforce: bool, flush_every: Duration, reconcile_every: Duration) -> Self {
        Self {
            enforce,
            flush_every,
            reconcile_every,
            instance: uuid::Builder::from_random_bytes(rand::random())
                .into_uuid()
                .simple()
                .to_string(),
            clusters: Mutex::default(),
            meter: Mutex::default(),
        }
    }

    /// A refusal that shadow mode only logs.
    fn shadow(&self, cluster: &str, e: ApiError) -> Result<(), ApiError> {
        if self.enforce {
            return Err(e);
        }
        let mut all = self.clusters.lock().unwrap_or_else(PoisonError::into_inner);
        let st = all.entry(cluster.to_owned()).or_default();
        st.shadow_count += 1;
        if st
            .shadow_logged
            .is_none_or(|t| t.elapsed() >= SHADOW_LOG_EVERY)
        {
            tracing::info!(target: "limits", would_block = true, cluster, code = e.code, count = st.shadow_count, reason = %e.message, "shadow mode: would block");
            st.shadow_logged = Some(Instant::now());
            st.shadow_count = 0;
        }
        Ok(())
    }

    /// The checks before the body: feature, request rate, parked polls, monthly quota.
    pub(crate) fn admit<A: ClientApi>(
        &self,
        api: &A,
        entry: &ClusterEntry,
        class: Class,
        segs: &[&str],
        query: &str,
    ) -> Result<Ticket, ApiError> {
        let now = api.now();
        let id = entry.doc.id.clone();
        let (plan, req_ok, parked, storage_blocked) = {
            let mut all = self.clusters.lock().unwrap_or_else(PoisonError::into_inner);
            let st = all.entry(id.clone()).or_default();
            if st.plan_at != entry.doc.updated_us || st.plan_at == 0 {
                st.plan = Arc::new(plans::effective(&entry.doc.plan_code, &entry.doc.overrides));
                st.plan_at = entry.doc.updated_us;
            }
            let plan = st.plan.clone();
            let req_ok = match (plan.req_per_sec, plan.req_burst) {
                (Some(rate), burst) => {
                    let burst = burst.unwrap_or(rate).max(1);
                    st.req
                        .get_or_insert_with(|| Bucket::full(burst, now.0))
                        .take(1, rate, burst, now.0)
                }
                (None, _) => Ok(()),
            };
            let grows = matches!(class, Class::Produce | Class::Gated(_, GatedOp::Grow));
            let storage_blocked = grows && plan.max_retained_bytes.is_some() && st.storage.blocked;
            (plan, req_ok, st.parked.clone(), storage_blocked)
        };
        if storage_blocked {
            return Err(ApiError::new(
                403,
                "storage_quota_exceeded",
                "this cluster stores more than its plan allows; consume or delete to push again",
            ));
        }
        if let Class::Gated(f, _) = class
            && !plan.has(f)
        {
            return Err(ApiError::new(
                403,
                "feature_gated",
                "this cluster's plan does not include this feature",
            ));
        }
        if let Err(wait) = req_ok {
            let mut e = ApiError::new(
                429,
                "rate_limited",
                "too many requests for this cluster's plan",
            );
            e.retry_after = Some(wait);
            self.shadow(&id, e)?;
        }
        let long_poll = class == Class::Consume
            && matches!(segs, ["api", "v1", "pop", ..])
            && !crate::pop_query::parse_query(query)
                .iter()
                .any(|(k, v)| k == "wait" && v == "false");
        let mut held = None;
        if long_poll {
            let now_parked = parked.fetch_add(1, Ordering::Relaxed) + 1;
            held = Some(Parked(parked));
            if plan.max_parked_pops.is_some_and(|max| now_parked > max) {
                let mut e = ApiError::new(
                    429,
                    "rate_limited",
                    "too many long polls waiting for this cluster",
                );
                e.retry_after = Some(5);
                self.shadow(&id, e)?;
            }
        }
        if class == Class::Produce
            && let Some(quota) = plan.monthly_msgs_quota
        {
            let m = month(now);
            let stored = {
                let state = api.state();
                d::month_count(&*state, &id, &m, now).unwrap_or(0)
            };
            let pending = self
                .meter
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .month
                .get(&id)
                .copied()
                .unwrap_or(0);
            if stored + pending >= quota {
                return Err(ApiError::new(
                    403,
                    "quota_exceeded",
                    "this cluster's monthly message quota is used up",
                ));
            }
        }
        Ok(Ticket {
            cluster: id,
            tenant: entry.doc.broker_tenant_uuid.clone(),
            class,
            plan,
            op: op_class(class, segs),
            msgs: 0,
            push_blocked: entry.effective() == Effective::PushBlocked,
            _parked: held,
        })
    }

    /// The checks of a push, on the items its handler read (JSON or QPB1 alike): the batch and
    /// payload size caps, the message rate and the queue and partition caps.
    pub(crate) fn check_push<A: ClientApi>(
        &self,
        api: &A,
        t: &mut Ticket,
        items: &[PushItem],
    ) -> Result<(), ApiError> {
        let plan = t.plan.clone();
        if let Some(max) = plan.max_batch_items
            && items.len() as u64 > max
        {
            return Err(too_large(format!(
                "items holds {} messages; this cluster's plan takes at most {max} per push",
                items.len()
            )));
        }
        if let Some(max) = plan.max_payload_bytes
            && let Some((i, len)) = items
                .iter()
                .map(|item| item.payload.len() as u64)
                .enumerate()
                .find(|(_, len)| *len > max)
        {
            return Err(too_large(format!(
                "items[{i}].payload takes {len} bytes; this cluster's plan takes at most {max}"
            )));
        }
        t.msgs = items.len() as u64;
        self.take_msgs(api, t, t.msgs)?;
        self.queue_cap(api, t, items)
    }

    /// The checks of any other body: what a push block refuses (a new queue, a lock
    /// acquire) and the retention ceiling of a queue's configuration.
    pub(crate) fn check_body<A: ClientApi>(
        &self,
        api: &A,
        t: &Ticket,
        segs: &[&str],
        body: &[u8],
    ) -> Result<(), ApiError> {
        if t.push_blocked
            && let Ok(tenant) = queen_domain::tenant::Tenant::parse(&t.tenant)
            && blocked::grows(&*api.state(), &tenant, segs, body)
        {
            return Err(crate::proxy::push_blocked());
        }
        let plan = &t.plan;
        match (t.class, segs) {
            (Class::QueueAdmin, ["api", "v1", "configure"]) => {
                let Some(max) = plan.max_retention_seconds else {
                    return Ok(());
                };
                let Ok(v) = serde_json::from_slice::<Value>(body) else {
                    return Ok(());
                };
                for field in ["retentionSeconds", "completedRetentionSeconds"] {
                    if let Some(n) = v["options"].get(field).and_then(Value::as_u64)
                        && n > max
                    {
                        let e = ApiError::new(
                            403,
                            "quota_exceeded",
                            format!(
                                "options.{field} is above this cluster's plan ceiling of {max} seconds"
                            ),
                        );
                        self.shadow(&t.cluster, e)?;
                    }
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn take_msgs<A: ClientApi>(&self, api: &A, t: &Ticket, n: u64) -> Result<(), ApiError> {
        let Some(rate) = t.plan.msgs_per_sec else {
            return Ok(());
        };
        let burst = t.plan.msgs_burst.unwrap_or(rate).max(1);
        let now = api.now().0;
        let taken = {
            let mut all = self.clusters.lock().unwrap_or_else(PoisonError::into_inner);
            let st = all.entry(t.cluster.clone()).or_default();
            st.msgs
                .get_or_insert_with(|| Bucket::full(burst, now))
                .take(n, rate, burst, now)
        };
        match taken {
            Ok(()) => Ok(()),
            Err(wait) => {
                let mut e = ApiError::new(
                    429,
                    "rate_limited",
                    "too many messages a second for this cluster's plan",
                );
                e.retry_after = Some(wait);
                self.shadow(&t.cluster, e)
            }
        }
    }

    /// A push that would make a queue, or a partition of a queue, beyond the plan's counts
    /// (O(1) reads per distinct queue and partition: see [`caps`]). No lock is held while the
    /// state is read.
    fn queue_cap<A: ClientApi>(
        &self,
        api: &A,
        t: &Ticket,
        items: &[PushItem],
    ) -> Result<(), ApiError> {
        let (max_queues, max_parts) = (t.plan.max_queues, t.plan.max_partitions_per_queue);
        if max_queues.is_none() && max_parts.is_none() {
            return Ok(());
        }
        let Ok(tenant) = queen_domain::tenant::Tenant::parse(&t.tenant) else {
            return Ok(());
        };
        let growth = {
            let state = api.state();
            caps::growth(&*state, &tenant, max_parts, items)
        };
        if let (true, Some(max)) = (growth.new_queues > 0, max_queues) {
            let kept = {
                let all = self.clusters.lock().unwrap_or_else(PoisonError::into_inner);
                all.get(&t.cluster)
                    .and_then(|st| caps::QueueCount::fresh(st.queues))
            };
            let count = kept.unwrap_or_else(|| {
                let counted = {
                    let state = api.state();
                    caps::count_queues(&*state, &tenant, max)
                };
                self.with_cluster(&t.cluster, |st| {
                    st.queues = Some(caps::QueueCount::now(counted));
                });
                counted
            });
            if count >= max {
                let e = ApiError::new(
                    403,
                    "quota_exceeded",
                    format!("this cluster's plan allows {max} queues"),
                );
                self.shadow(&t.cluster, e)?;
            }
        }
        if let Some((q, max)) = growth.full_queue {
            let e = ApiError::new(
                403,
                "quota_exceeded",
                format!("queue '{q}' has the {max} partitions this cluster's plan allows"),
            );
            self.shadow(&t.cluster, e)?;
        }
        if growth.new_queues > 0 {
            // The push is let through: its queues count until the next count.
            self.with_cluster(&t.cluster, |st| {
                if let Some(c) = st.queues.as_mut() {
                    c.add(growth.new_queues);
                }
            });
        }
        Ok(())
    }

    /// `f` on a cluster's state, under the lock for as long as `f` takes (keep it short).
    fn with_cluster(&self, cluster: &str, f: impl FnOnce(&mut ClusterState)) {
        let mut all = self.clusters.lock().unwrap_or_else(PoisonError::into_inner);
        f(all.entry(cluster.to_owned()).or_default());
    }

    /// Count a served request.
    pub(crate) fn meter(&self, t: &Ticket, status: u16, bytes_in: u64, bytes_out: u64, now: u64) {
        let minute = now / 60_000_000 * 60_000_000;
        let msgs = if status < 300 { t.msgs } else { 0 };
        if msgs > 0
            && let Some(cap) = t.plan.max_retained_bytes
        {
            let mut all = self.clusters.lock().unwrap_or_else(PoisonError::into_inner);
            let st = &mut all.entry(t.cluster.clone()).or_default().storage;
            st.since = st.since.saturating_add(bytes_in);
            st.judge(cap);
        }
        let key = (t.cluster.clone(), minute, t.op);
        let mut m = self.meter.lock().unwrap_or_else(PoisonError::into_inner);
        let c = m.minutes.entry(key.clone()).or_default();
        c.reqs += 1;
        c.msgs += msgs;
        c.bytes_in += bytes_in;
        c.bytes_out += bytes_out;
        m.dirty.insert(key);
        if msgs > 0 {
            *m.month.entry(t.cluster.clone()).or_default() += msgs;
        }
        let a = m.activity.entry(t.cluster.clone()).or_default();
        a.last_activity_us = a.last_activity_us.max(now);
        if msgs > 0 && t.op == "push" && a.first_push_us == 0 {
            a.first_push_us = now;
        }
        m.activity_dirty.insert(t.cluster.clone());
    }

    /// Count again, when due, the stored bytes of every cluster whose plan has a storage cap
    /// (off the runtime's threads: one read per stored record).
    pub(crate) async fn reconcile<A: ClientApi>(
        &self,
        groups: &crate::groups::Groups<A>,
        dir: &d::Directory,
    ) {
        for entry in dir.clusters.values() {
            let plan = plans::effective(&entry.doc.plan_code, &entry.doc.overrides);
            let Some(cap) = plan.max_retained_bytes else {
                continue;
            };
            let due = {
                let all = self.clusters.lock().unwrap_or_else(PoisonError::into_inner);
                all.get(&entry.doc.id)
                    .and_then(|st| st.storage.at)
                    .is_none_or(|t| t.elapsed() >= self.reconcile_every)
            };
            if !due {
                continue;
            }
            let Ok(tenant) = queen_domain::tenant::Tenant::parse(&entry.doc.broker_tenant_uuid)
            else {
                continue;
            };
            let counting = groups.of(&tenant).clone();
            let counted =
                tokio::task::spawn_blocking(move || counting.retained_bytes(&tenant)).await;
            let Ok(Some(bytes)) = counted else {
                continue;
            };
            let mut all = self.clusters.lock().unwrap_or_else(PoisonError::into_inner);
            let st = &mut all.entry(entry.doc.id.clone()).or_default().storage;
            st.counted = bytes;
            st.since = 0;
            st.at = Some(Instant::now());
            let was = st.blocked;
            st.judge(cap);
            if st.blocked != was {
                tracing::info!(target: "limits", cluster = %entry.doc.slug, bytes, cap, blocked = st.blocked, "storage quota");
            }
        }
    }

    /// Write what changed since the last flush, when a flush is due.
    pub(crate) async fn flush<A: ClientApi>(&self, api: &A) {
        let now = api.now();
        let taken = {
            let mut m = self.meter.lock().unwrap_or_else(PoisonError::into_inner);
            if m.flushed_at.is_some_and(|t| t.elapsed() < self.flush_every) {
                return;
            }
            m.flushed_at = Some(Instant::now());
            let dirty: Vec<_> = m.dirty.drain().collect();
            let rows: Vec<_> = dirty
                .iter()
                .filter_map(|k| m.minutes.get(k).map(|c| (k.clone(), *c)))
                .collect();
            // Minutes before this one are final once written.
            let current = now.0 / 60_000_000 * 60_000_000;
            m.minutes.retain(|(_, minute, _), _| *minute >= current);
            let months: Vec<(String, u64)> = m.month.drain().collect();
            let changed: Vec<String> = m.activity_dirty.drain().collect();
            let activity: Vec<(String, d::ActivityDoc)> = changed
                .into_iter()
                .filter_map(|c| m.activity.get(&c).map(|a| (c, *a)))
                .collect();
            Taken {
                rows,
                months,
                activity,
            }
        };
        if taken.rows.is_empty() && taken.months.is_empty() && taken.activity.is_empty() {
            return;
        }
        let month = month(now);
        let mut ops: Vec<KvOp> = taken
            .rows
            .iter()
            .map(|((cluster, minute, op), c)| KvOp::Put {
                ns: d::ns(USAGE_MIN),
                key: format!("#{cluster}/{minute:020}/{op}/{}", self.instance),
                value: serde_json::to_vec(c).unwrap_or_default(),
                expiry: Expiry::Ttl(USAGE_KEEP),
                expect: None,
                required: false,
            })
            .collect();
        ops.extend(taken.months.iter().map(|(cluster, n)| KvOp::Incr {
            ns: d::ns(USAGE_MONTH),
            key: d::month_key(cluster, &month),
            delta: Num::Int(i64::try_from(*n).unwrap_or(i64::MAX)),
            min: None,
            max: None,
            expiry: Expiry::Ttl(MONTH_KEEP),
            required: false,
        }));
        ops.extend(taken.activity.iter().map(|(cluster, a)| KvOp::Put {
            ns: d::ns(d::ACTIVITY),
            key: format!("#{cluster}/{}", self.instance),
            value: serde_json::to_vec(a).unwrap_or_default(),
            expiry: Expiry::Ttl(USAGE_KEEP),
            expect: None,
            required: false,
        }));
        if let Err(e) = api.kv(ops).await {
            tracing::warn!(target: "queen-proxy", error = %e, "usage not written; counted again at the next flush");
            let mut m = self.meter.lock().unwrap_or_else(PoisonError::into_inner);
            for ((cluster, minute, op), c) in taken.rows {
                let key = (cluster, minute, op);
                let slot = m.minutes.entry(key.clone()).or_default();
                // The row holds the minute's total: keep the larger count.
                if slot.reqs < c.reqs {
                    *slot = c;
                }
                m.dirty.insert(key);
            }
            for (cluster, n) in taken.months {
                *m.month.entry(cluster).or_default() += n;
            }
            for (cluster, _) in taken.activity {
                m.activity_dirty.insert(cluster);
            }
        }
    }
}

/// What one flush writes.
struct Taken {
    rows: Vec<((String, u64, &'static str), Counters)>,
    months: Vec<(String, u64)>,
    activity: Vec<(String, d::ActivityDoc)>,
}
