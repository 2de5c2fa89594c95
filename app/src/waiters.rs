//! Long-poll wake-ups: one `Notify` per queue, signalled after a commit that may make messages
//! deliverable there.

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
    /// The queue's notifier (created on first use).
    pub(crate) fn of(&self, queue: &str) -> Arc<Notify> {
        let mut m = self
            .by_queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        m.entry(queue.to_owned()).or_default().clone()
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

    /// Wake every parked pop (after acks, which do not name their queue).
    pub(crate) fn wake_all(&self) {
        let m = self
            .by_queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for n in m.values() {
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

    pub(crate) fn parked(&self) -> u64 {
        self.parked.load(Ordering::Relaxed)
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
