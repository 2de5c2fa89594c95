//! Long-poll wake-ups of ephemeral queues: one `Notify` per queue, signalled after an operation
//! that may make messages deliverable there (replicated queues: `broker/wakeups.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// The wake-up registry.
#[derive(Default)]
pub(crate) struct Waiters {
    by_queue: Mutex<HashMap<String, Arc<Notify>>>,
    /// Pops currently parked.
    parked: AtomicU64,
}

impl Waiters {
    /// The queue's notifier for one waiting pop, or `None` when `most` queues already have
    /// one and `queue` is not among them. The entry goes when the last `Watch` of it drops, so
    /// names a client makes up (ephemeral queues) hold nothing past their pops.
    pub(crate) fn watch(&self, queue: &str, most: usize) -> Option<Watch<'_>> {
        let mut m = self
            .by_queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if m.len() >= most && !m.contains_key(queue) {
            return None;
        }
        let notify = m.entry(queue.to_owned()).or_default().clone();
        Some(Watch {
            waiters: self,
            queue: queue.to_owned(),
            notify,
        })
    }

    /// Wake the pops parked on `queue`.
    pub(crate) fn wake(&self, queue: &str) {
        let m = self
            .by_queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = m.get(queue) {
            n.notify_waiters();
        }
    }

    /// Forget a deleted queue.
    pub(crate) fn forget(&self, queue: &str) {
        let mut m = self
            .by_queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = m.remove(queue) {
            n.notify_waiters();
        }
    }

    /// Count one parked pop until the returned guard drops: at its end, or when the request is
    /// cancelled because its client left.
    pub(crate) fn park(&self) -> Parked<'_> {
        self.parked.fetch_add(1, Ordering::Relaxed);
        Parked(&self.parked)
    }
}

/// One parked pop, counted while it lives.
pub(crate) struct Parked<'a>(&'a AtomicU64);

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One waiting pop's hold on its queue's notifier (`Waiters::watch`).
pub(crate) struct Watch<'a> {
    waiters: &'a Waiters,
    queue: String,
    /// The queue's notifier.
    pub(crate) notify: Arc<Notify>,
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        let mut m = self
            .waiters
            .by_queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // The map's copy and this one: nobody else waits on it.
        if m.get(&self.queue)
            .is_some_and(|n| Arc::ptr_eq(n, &self.notify) && Arc::strong_count(n) == 2)
        {
            m.remove(&self.queue);
        }
    }
}
