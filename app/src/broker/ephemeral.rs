//! Ephemeral queues: the rings this node owns, in memory, and the use case over them.
//! Configuration goes through the replicated KV store (namespace `queen-ephemeral` of the
//! queue's tenant); contents never reach the log.

use std::pin::pin;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use queen_domain::ephemeral::{self, Declared, Delivered, Limits, Options, Rings, Take};
use queen_domain::kv::{Expiry, KvOp};
use queen_domain::tenant::Tenant;
use queen_domain::time::Stamp;
use queen_ports::{BrokerError, EphemeralAnswer, EphemeralOp, EphemeralQueue};

use super::Broker;
use crate::waiters::Waiters;

/// How often a parked ephemeral pop looks again on its own (lease expiry is not signalled).
const RECHECK: Duration = Duration::from_millis(250);
/// The most declared queues one listing reads.
const LIST_LIMIT: usize = 10_000;

/// How long a queue's declared options are read from memory before the store is asked
/// again (a `configure` through another node shows here within this time).
const OPTIONS_FRESH: Duration = Duration::from_secs(1);
/// Most queues whose options are kept in memory (the map is emptied when it grows past it):
/// pushes and pops name queues a client makes up, so this is part of the memory no budget
/// counts (about 400 bytes an entry at most, `docs/ephemeral.md`).
const OPTIONS_KEPT: usize = 4_096;
/// Most queue names with a waiting pop parked on them at once; a waiting pop on one more name
/// is refused (503, retried): a name a client makes up must not hold memory past its pop.
const WATCHED_MAX: usize = 4_096;

/// The rings of the ephemeral partitions this node owns, and the pops waiting on them.
pub(crate) struct EphemeralRings {
    rings: Mutex<Rings>,
    /// The node's bounds (fixed at start; the rings hold the same, this copy is read without
    /// their lock).
    limits: Limits,
    waiters: Waiters,
    /// Declared options as last read, and when.
    options: Mutex<std::collections::HashMap<String, (Instant, Option<Declared>)>>,
}

impl EphemeralRings {
    /// Empty rings of a new incarnation (a random epoch).
    pub(crate) fn new(limits: Limits) -> Self {
        let epoch = uuid::Uuid::now_v7().as_u64_pair().1;
        Self {
            rings: Mutex::new(Rings::new(epoch, limits.clone())),
            limits,
            waiters: Waiters::default(),
            options: Mutex::default(),
        }
    }

    /// The rings, for one short step (never held across an await).
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Rings> {
        self.rings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The node's bounds.
    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Wake the pops waiting on `queue`.
    pub(crate) fn wake(&self, queue: &str) {
        self.waiters.wake(queue);
    }

    /// `(bytes counted against the budget, messages, queues)` held, for the gauges.
    pub(crate) fn figures(&self) -> (u64, u64, u64) {
        let r = self.lock();
        (r.used(), r.len(), r.queue_count())
    }
}

impl Broker {
    fn eph_now(&self) -> u64 {
        self.clock.now_micros() / 1000
    }

    /// A queue's declared options, when it was configured.
    fn eph_declared(&self, queue: &str) -> Result<Option<Declared>, BrokerError> {
        ephemeral::declared(&*self.state.view(), queue, Stamp(self.clock.now_micros()))
            .map_err(|e| Self::read_error(&e))
    }

    /// The bounds `queue` works under on this node (its declared options read at most
    /// `OPTIONS_FRESH` ago).
    fn eph_options(&self, queue: &str) -> Result<Options, BrokerError> {
        let declared = self.eph_declared_cached(queue)?;
        Ok(declared
            .unwrap_or_default()
            .effective(self.ephemeral.limits()))
    }

    /// `queue`'s declared options as read at most `OPTIONS_FRESH` ago (from the store when the
    /// copy in memory is older or missing).
    fn eph_declared_cached(&self, queue: &str) -> Result<Option<Declared>, BrokerError> {
        let cached = {
            let m = self
                .ephemeral
                .options
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            m.get(queue)
                .filter(|(at, _)| at.elapsed() < OPTIONS_FRESH)
                .map(|(_, d)| d.clone())
        };
        if let Some(d) = cached {
            return Ok(d);
        }
        let d = self.eph_declared(queue)?;
        let mut m = self
            .ephemeral
            .options
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if m.len() >= OPTIONS_KEPT {
            m.clear();
        }
        m.insert(queue.to_owned(), (Instant::now(), d.clone()));
        Ok(d)
    }

    /// Forget `queue`'s options kept in memory (after this node changed them).
    fn eph_forget_options(&self, queue: &str) {
        self.ephemeral
            .options
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(queue);
    }

    /// Serve one ephemeral operation on this node's own rings.
    pub(super) async fn ephemeral_here(
        &self,
        op: EphemeralOp,
    ) -> Result<EphemeralAnswer, BrokerError> {
        match op {
            EphemeralOp::Configure { queue, declared } => {
                let (ns, key) = ephemeral::config_row(&queue);
                let value = serde_json::to_vec(&declared)
                    .map_err(|e| BrokerError::Internal(e.to_string()))?;
                queen_ports::ClientApi::kv(
                    self,
                    vec![KvOp::Put {
                        ns,
                        key,
                        value,
                        expiry: Expiry::Forever,
                        expect: None,
                        required: false,
                    }],
                )
                .await?;
                self.eph_forget_options(&queue);
                let limits = self.ephemeral.limits();
                Ok(EphemeralAnswer::Configured(declared.effective(limits)))
            }
            EphemeralOp::Reset { queue } => {
                let dropped = self.ephemeral.lock().reset(&queue);
                self.ephemeral.waiters.wake(&queue);
                Ok(EphemeralAnswer::Dropped(dropped))
            }
            // The configuration row is the entry node's to delete (`ephemeral_op`); here the
            // rings go.
            EphemeralOp::Delete { queue } => {
                self.eph_forget_options(&queue);
                let held = self.ephemeral.lock().delete(&queue);
                self.ephemeral.waiters.forget(&queue);
                Ok(EphemeralAnswer::Deleted(held))
            }
            EphemeralOp::Push {
                queue,
                partition,
                payloads,
            } => {
                for (i, p) in payloads.iter().enumerate() {
                    if p.len() > self.max_message_bytes {
                        return Err(BrokerError::TooLarge {
                            field: format!("messages[{i}].payload"),
                            len: p.len(),
                            max: self.max_message_bytes,
                        });
                    }
                }
                let opts = self.eph_options(&queue)?;

                let now = self.eph_now();
                let n = self
                    .ephemeral
                    .lock()
                    .push(&queue, &partition, payloads, &opts, now)?;
                self.ephemeral.waiters.wake(&queue);
                Ok(EphemeralAnswer::Pushed(n))
            }
            EphemeralOp::Pop {
                queue,
                partition,
                group,
                batch,
                wait_ms,
                auto_ack,
            } => {
                let out = self
                    .eph_pop(
                        &queue,
                        partition.as_deref(),
                        &group,
                        batch,
                        wait_ms,
                        auto_ack,
                    )
                    .await?;
                Ok(EphemeralAnswer::Delivered(out))
            }
            EphemeralOp::Ack { queue, group, acks } => {
                let opts = self.eph_options(&queue)?;
                let now = self.eph_now();
                let out = self.ephemeral.lock().ack(&queue, &group, &acks, &opts, now);
                // A failed ack makes a message deliverable again.
                self.ephemeral.waiters.wake(&queue);
                Ok(EphemeralAnswer::Acked(out))
            }
            EphemeralOp::Queues { tenant } => {
                let tenant = Tenant::any(&tenant).map_err(|e| BrokerError::Invalid {
                    field: "tenant".into(),
                    problem: e.to_string(),
                })?;
                Ok(EphemeralAnswer::Queues(
                    self.eph_queues(&tenant, None, LIST_LIMIT)?.0,
                ))
            }
            EphemeralOp::QueuesPage {
                tenant,
                after,
                limit,
            } => {
                let tenant = Tenant::any(&tenant).map_err(|e| BrokerError::Invalid {
                    field: "tenant".into(),
                    problem: e.to_string(),
                })?;
                let limit = (limit as usize).clamp(1, LIST_LIMIT);
                let (queues, more) = self.eph_queues(&tenant, after.as_deref(), limit)?;
                Ok(EphemeralAnswer::QueuesPage { queues, more })
            }
            EphemeralOp::Depth { queue, group } => {
                let declared = self.eph_declared(&queue)?;
                let limits = self.ephemeral.limits();
                let view = self.ephemeral.lock().view(&queue, group.as_deref());
                if declared.is_none() && view.is_none() {
                    return Err(BrokerError::EphemeralQueueNotFound {
                        queue: queen_domain::tenant::split(&queue).1.to_owned(),
                    });
                }
                Ok(EphemeralAnswer::Depth(EphemeralQueue {
                    options: declared.clone().unwrap_or_default().effective(limits),
                    declared: declared.is_some(),
                    queue,
                    view: view.unwrap_or_default(),
                }))
            }
        }
    }

    /// Remove a queue's configuration row, when there is one; whether there was.
    pub(super) async fn ephemeral_unconfigure(&self, queue: &str) -> Result<bool, BrokerError> {
        if self.eph_declared(queue)?.is_none() {
            return Ok(false);
        }
        let (ns, key) = ephemeral::config_row(queue);
        self.eph_forget_options(queue);
        queen_ports::ClientApi::kv(
            self,
            vec![KvOp::Delete {
                ns,
                key,
                expect: None,
                required: false,
            }],
        )
        .await?;
        Ok(true)
    }

    /// A page of `tenant`'s ephemeral queues, the declared ones and those held in memory, in
    /// name order after `after` (a name the tenant uses), at most `limit`; and whether more
    /// follow.
    fn eph_queues(
        &self,
        tenant: &Tenant,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<EphemeralQueue>, bool), BrokerError> {
        let declared = ephemeral::declared_queues(
            &*self.state.view(),
            tenant,
            Stamp(self.clock.now_micros()),
            after,
            limit + 1,
        )
        .map_err(|e| Self::read_error(&e))?;
        let rings = self.ephemeral.lock();
        let limits = self.ephemeral.limits();
        let mut out: std::collections::BTreeMap<String, EphemeralQueue> = declared
            .into_iter()
            .map(|(queue, d)| {
                let view = rings.view(&queue, None).unwrap_or_default();
                (
                    queue.clone(),
                    EphemeralQueue {
                        queue,
                        declared: true,
                        options: d.effective(limits),
                        view,
                    },
                )
            })
            .collect();
        // Scoped names sort before every unscoped one (they start with the scope mark), and a
        // tenant's own sort together after its scope.
        let start = match after {
            Some(a) => tenant.name(a),
            None if tenant.is_default() => {
                format!("{}\u{10ffff}", queen_domain::tenant::SCOPE_MARK)
            }
            None => tenant.name(""),
        };
        let held: Vec<&str> = rings
            .queue_names_after(Some(&start))
            .take_while(|q| tenant.owns(q))
            .take(limit + 1)
            .collect();
        for q in held {
            if out.contains_key(q) {
                continue;
            }
            out.insert(
                q.to_owned(),
                EphemeralQueue {
                    queue: q.to_owned(),
                    declared: false,
                    options: Declared::default().effective(limits),
                    view: rings.view(q, None).unwrap_or_default(),
                },
            );
        }
        let more = out.len() > limit;
        Ok((out.into_values().take(limit).collect(), more))
    }

    /// Pop, waiting up to `wait_ms` for a message; a queue with a window waits on, once one
    /// is there, until the window's count is there or its time has passed.
    async fn eph_pop(
        &self,
        queue: &str,
        partition: Option<&str>,
        group: &str,
        batch: u32,
        wait_ms: Option<u64>,
        auto_ack: bool,
    ) -> Result<Vec<Delivered>, BrokerError> {
        let opts = self.eph_options(queue)?;
        let deadline = Instant::now() + Duration::from_millis(wait_ms.unwrap_or(0));
        // Only a pop that waits registers, and its name goes when its last waiter does.
        let watch = match wait_ms {
            Some(ms) if ms > 0 => Some(
                self.ephemeral
                    .waiters
                    .watch(queue, WATCHED_MAX)
                    .ok_or_else(|| {
                        BrokerError::Unavailable(format!(
                            "this node already parks waiting ephemeral pops on {WATCHED_MAX} queues; retry, or pop without waiting"
                        ))
                    })?,
            ),
            _ => None,
        };
        let idle = tokio::sync::Notify::new();
        let notify = watch.as_ref().map_or(&idle, |w| &*w.notify);
        let take = Take {
            partition,
            group,
            batch: batch as usize,
            auto_ack,
        };
        let mut parked = None;
        let mut window_end: Option<Instant> = None;
        loop {
            let mut notified = pin!(notify.notified());
            notified.as_mut().enable();
            let now = self.eph_now();
            let ready = {
                let mut rings = self.ephemeral.lock();
                let available = rings.available(queue, partition, group);
                // The window holds a waiting pop back until its count is there or its time
                // is up (counted from the first look that found something).
                let hold = match (wait_ms, opts.window) {
                    (Some(_), Some(w)) if available > 0 => {
                        let want = u64::from(w.count).min(u64::from(batch));
                        let end = *window_end
                            .get_or_insert_with(|| Instant::now() + Duration::from_millis(w.ms));
                        available < want && Instant::now() < end.min(deadline)
                    }
                    _ => false,
                };
                if hold {
                    None
                } else {
                    let out = rings.pop(queue, take, &opts, now);
                    if out.is_empty() && available > 0 {
                        // Messages are there but a new group or lease does not fit the budget.
                        return Err(ephemeral::PushRefusal::NodeFull {
                            bytes: rings.used(),
                            limit: self.ephemeral.limits.node_max_bytes,
                        }
                        .into());
                    }
                    Some(out)
                }
            };
            match ready {
                Some(out) if !out.is_empty() => {
                    self.telemetry
                        .metrics()
                        .messages_delivered(out.len() as u64);
                    return Ok(out);
                }
                _ => {}
            }
            let mut remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Ok(Vec::new());
            }
            if let Some(end) = window_end {
                remaining = remaining.min(end.saturating_duration_since(Instant::now()));
            }
            if parked.is_none() {
                parked = Some(self.ephemeral.waiters.park());
            }
            let _ = tokio::time::timeout(
                remaining.min(RECHECK).max(Duration::from_millis(1)),
                notified,
            )
            .await;
        }
    }

    /// Apply ages and lease expiry everywhere and forget idle groups and queues (every second).
    pub fn ephemeral_sweep(&self) {
        let now = self.eph_now();
        let names: Vec<String> = self
            .ephemeral
            .lock()
            .queue_names()
            .map(str::to_owned)
            .collect();
        let limits = self.ephemeral.limits();
        let mut known = std::collections::HashMap::with_capacity(names.len());
        for q in names {
            // Read, not cached: the cache is for the hot path, and is kept small.
            let d = self.eph_declared(&q).ok().flatten();
            known.insert(
                q,
                (d.clone().unwrap_or_default().effective(limits), d.is_some()),
            );
        }
        let mut rings = self.ephemeral.lock();
        rings.sweep(now, &mut |q| {
            known
                .get(q)
                .copied()
                .unwrap_or_else(|| (Declared::default().effective(limits), false))
        });
        drop(rings);
        let (bytes, messages, queues) = self.ephemeral.figures();
        let t = self.ephemeral.lock().totals();
        self.telemetry.metrics().set_ephemeral(
            bytes,
            messages,
            queues,
            queen_telemetry::EphemeralTotals {
                pushed: t.pushed,
                delivered: t.delivered,
                acked: t.acked,
                dropped_bounds: t.drops.bounds,
                dropped_ttl: t.drops.ttl,
                dropped_retry: t.drops.retry,
                wiped: t.wiped,
            },
        );
    }
}
