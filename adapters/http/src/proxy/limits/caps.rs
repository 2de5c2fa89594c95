//! The plan's queue and partition caps on a push, at a cost that does not grow with the data:
//! one read of each distinct queue's record (its `partitions` field counts the partitions made,
//! and a partition is only ever removed with its whole queue, whose next incarnation starts
//! again at zero), one lookup per distinct partition name, and the tenant's queue count from a
//! bounded read (at most the cap plus one rows) kept for a few seconds. A queue of 100,000
//! partitions costs the same as a queue of one, in shadow mode as in enforce mode, so one
//! tenant's pushes cannot hold the node's threads or state for the others.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use queen_domain::StateRead;
use queen_domain::command::PushItem;
use queen_domain::tenant::Tenant;

/// How long a counted number of queues is trusted (pushes that make queues add to it).
const QUEUES_KEPT: Duration = Duration::from_secs(5);

/// A cluster's queues as last counted on this node.
#[derive(Debug, Clone, Copy)]
pub(super) struct QueueCount {
    /// Queues counted (at most the cap plus one: the read stops there).
    count: u64,
    /// When they were counted.
    at: Instant,
}

impl QueueCount {
    /// The count, when it is recent enough to use.
    pub(super) fn fresh(this: Option<Self>) -> Option<u64> {
        this.filter(|c| c.at.elapsed() < QUEUES_KEPT)
            .map(|c| c.count)
    }

    /// A count read now.
    pub(super) fn now(count: u64) -> Self {
        Self {
            count,
            at: Instant::now(),
        }
    }

    /// Add the queues a push is about to make (an estimate until the next count).
    pub(super) fn add(&mut self, made: u64) {
        self.count = self.count.saturating_add(made);
    }
}

/// What a push would make, as far as the caps care.
#[derive(Debug, Default)]
pub(super) struct Growth {
    /// Distinct queues the push names that do not exist yet.
    pub(super) new_queues: u64,
    /// The first queue the push would take beyond `max_parts` partitions, and its cap.
    pub(super) full_queue: Option<(String, u64)>,
}

/// The queues and partitions `items` would make in `tenant`'s data, judged against
/// `max_parts`: O(1) reads per distinct queue and per distinct partition name.
pub(super) fn growth(
    state: &dyn StateRead,
    tenant: &Tenant,
    max_parts: Option<u64>,
    items: &[PushItem],
) -> Growth {
    let mut out = Growth::default();
    // Per distinct queue: the partitions it will have once this push's new ones are made, and
    // whether it exists (`None`: unreadable, not judged).
    let mut queues: HashMap<&str, Option<(u64, bool)>> = HashMap::new();
    let mut seen: HashSet<(&str, &str)> = HashSet::new();
    for item in items {
        let (q, p) = (item.queue.as_str(), item.partition.as_str());
        if !seen.insert((q, p)) {
            continue;
        }
        let stored = tenant.name(q);
        let judged =
            queues
                .entry(q)
                .or_insert_with(|| match queen_domain::reads::queue(state, &stored) {
                    Ok(Some(rec)) => Some((rec.partitions, true)),
                    Ok(None) => {
                        out.new_queues += 1;
                        Some((0, false))
                    }
                    Err(_) => None,
                });
        let (Some((count, exists)), Some(max)) = (judged.as_mut(), max_parts) else {
            continue;
        };
        if out.full_queue.is_some() {
            continue;
        }
        // Every partition of a new queue is new; of a stored one, only a name not found.
        if *exists
            && queen_domain::reads::partition_by_name(state, &stored, p)
                .map_or(true, |found| found.is_some())
        {
            continue;
        }
        if *count >= max {
            out.full_queue = Some((q.to_owned(), max));
        }
        *count += 1;
    }
    out
}

/// The tenant's queues, read up to `max + 1` rows (enough to tell whether the cap is reached).
pub(super) fn count_queues(state: &dyn StateRead, tenant: &Tenant, max: u64) -> u64 {
    let limit = usize::try_from(max).unwrap_or(usize::MAX).saturating_add(1);
    queen_domain::reads::tenant_queues(state, tenant, limit).map_or(0, |q| q.len() as u64)
}
