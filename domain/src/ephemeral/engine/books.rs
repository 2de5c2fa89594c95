//! The rings' books of what their structures cost (`cost.rs` says how much each one is): a
//! queue, a ring, a group and a lease are counted when they come and uncounted when they go, so
//! the node's budget compares what is really held. Every change to a ring's groups, leases or
//! buffer ends with `recount` of that ring; every queue enters through `enter` and leaves through
//! `leave`.

use std::ops::Bound;

use super::cost;
use super::{PushRefusal, QueueRings, Rings};

/// The tenant a stored queue name belongs to (`""` for the default tenant).
pub(super) fn tenant_of(queue: &str) -> &str {
    crate::tenant::split(queue).0.unwrap_or("")
}

impl Rings {
    /// Bytes the budget counts: every message (payload and `MESSAGE_OVERHEAD`) and every
    /// structure that holds them (queues, rings, groups, leases, the maps and names).
    #[must_use]
    pub fn used(&self) -> u64 {
        self.bytes + self.structure + cost::node(self.queues.len(), self.tenants.len())
    }

    /// Queues held for `tenant` (its id; `""` for the default tenant).
    #[must_use]
    pub fn queues_of(&self, tenant: &str) -> u64 {
        self.tenants.get(tenant).copied().unwrap_or(0)
    }

    /// Queues held on this node.
    #[must_use]
    pub fn queue_count(&self) -> u64 {
        self.queues.len() as u64
    }

    /// The queues held whose stored names sort after `after` (all of them when `None`), in
    /// order: a page of the listing starts here.
    pub fn queue_names_after(&self, after: Option<&str>) -> impl Iterator<Item = &str> {
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        self.queues
            .range::<str, _>((from, Bound::Unbounded))
            .map(|(k, _)| k.as_str())
    }

    /// Count again what `queue` costs, and its ring `partition` when named, after a change
    /// (a ring or queue that is gone is left as it was uncounted).
    pub(super) fn recount(&mut self, queue: &str, partition: Option<&str>) {
        let Some(q) = self.queues.get_mut(queue) else {
            return;
        };
        if let Some(p) = partition
            && let Some(r) = q.partitions.get_mut(p)
        {
            let now = cost::ring(p, r);
            self.structure = self.structure - r.cost + now;
            r.cost = now;
        }
        let own = cost::queue(queue, q);
        self.structure = self.structure - q.own + own;
        q.own = own;
    }

    /// Count again every ring of `queue` (after a change that may touch them all).
    pub(super) fn recount_all(&mut self, queue: &str) {
        let Some(q) = self.queues.get_mut(queue) else {
            return;
        };
        for (p, r) in &mut q.partitions {
            let now = cost::ring(p, r);
            self.structure = self.structure - r.cost + now;
            r.cost = now;
        }
        self.recount(queue, None);
    }

    /// Uncount the ring `partition` of `queue` before it is removed from its queue.
    pub(super) fn uncount_ring(&mut self, queue: &str, partition: &str) {
        if let Some(r) = self
            .queues
            .get(queue)
            .and_then(|q| q.partitions.get(partition))
        {
            self.structure -= r.cost;
        }
    }

    /// The queue `queue`, entered (and counted, with its tenant) when it is new.
    pub(super) fn enter(&mut self, queue: &str) -> &mut QueueRings {
        if !self.queues.contains_key(queue) {
            self.queues.insert(queue.to_owned(), QueueRings::default());
            *self.tenants.entry(tenant_of(queue).to_owned()).or_default() += 1;
            self.recount(queue, None);
        }
        self.queues.get_mut(queue).expect("entered above")
    }

    /// Remove `queue` and uncount it, its rings and its tenant's share.
    pub(super) fn leave(&mut self, queue: &str) -> Option<QueueRings> {
        let q = self.queues.remove(queue)?;
        self.structure -= q.own + q.partitions.values().map(|r| r.cost).sum::<u64>();
        let tenant = tenant_of(queue);
        if let Some(n) = self.tenants.get_mut(tenant) {
            *n -= 1;
            if *n == 0 {
                self.tenants.remove(tenant);
            }
        }
        Some(q)
    }
}

impl Rings {
    /// Whether a push of `count` messages (`add` bytes) to `(queue, partition)` fits the node's
    /// caps on queues and its budget, with `dropping` bytes freed first by the queue's policy.
    /// Changes nothing.
    pub(super) fn admit(
        &self,
        queue: &str,
        partition: &str,
        count: usize,
        add: u64,
        dropping: u64,
    ) -> Result<(), PushRefusal> {
        let q = self.queues.get(queue);
        let new_queue = if q.is_none() {
            let held = self.queue_count();
            if held >= self.limits.max_queues {
                return Err(PushRefusal::TooManyQueues {
                    held,
                    limit: self.limits.max_queues,
                    whose: "this node".into(),
                    setting: "QUEEN_EPHEMERAL_MAX_QUEUES".into(),
                });
            }
            let held = self.queues_of(tenant_of(queue));
            if held >= self.limits.max_queues_per_tenant {
                return Err(PushRefusal::TooManyQueues {
                    held,
                    limit: self.limits.max_queues_per_tenant,
                    whose: "this tenant on this node".into(),
                    setting: "QUEEN_EPHEMERAL_MAX_QUEUES_PER_TENANT".into(),
                });
            }
            Some((queue, self.queues.len(), self.tenants.len()))
        } else {
            None
        };
        let ring = q.and_then(|q| q.partitions.get(partition));
        let new_ring = ring
            .is_none()
            .then(|| (partition, q.map_or(0, |q| q.partitions.len())));
        let growth = cost::push_growth(new_queue, new_ring, ring, count);
        let used = self.used();
        if used.saturating_sub(dropping) + add + growth > self.limits.node_max_bytes {
            return Err(PushRefusal::NodeFull {
                bytes: used,
                limit: self.limits.node_max_bytes,
            });
        }
        Ok(())
    }
}
