//! Group commit for pushes: push requests that arrive while the log is busy share one entry.
//!
//! Every entry costs the same fixed work whatever it holds (the raft core, the log write, the
//! replication round, the apply transaction), so many clients sending one message each make
//! the log, not the messages, the limit. The lane keeps a few entries in flight, and only one
//! small one (under `LARGE_ITEMS` messages); requests that arrive while the slots they need are
//! taken wait together and go out as one entry when a slot frees. Under light load a request
//! goes out alone at once, so nothing waits that would not have waited anyway.
//!
//! Nothing about a push changes: each request still gets its own answers in its item order,
//! items of one entry share a stamp as the items of one request always did, and a failure of
//! the entry is every request's failure (the same error each would have got alone).

use std::sync::{Arc, Mutex, PoisonError};

use queen_domain::command::{PushItem, PushOutcome};
use queen_ports::BrokerError;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, oneshot};

/// Entries in flight at once. Four, not eight: with 128 clients sending one message each, the
/// entries hold twice as many requests, and the fixed work per entry (on three nodes) is
/// shared by twice as many messages (`queen-bench cluster`, two rounds: 15.4k and 14.0k msg/s
/// at 86-88 µs of server CPU per message with eight; 17.1k and 15.6k at 73-76 µs with four,
/// p99 lower; batches of 100 unchanged; two was no better than four and worse for batches).
pub(crate) const SLOTS: usize = 4;
/// Entries of fewer than [`LARGE_ITEMS`] messages in flight at once: one. Small requests (one
/// message each, from many clients) wait for it while more of them arrive, so they share
/// fewer, fuller entries (classic group commit); entries of batches keep all [`SLOTS`], whose
/// overlap they use. Measured with `queen-bench --seconds 6 cluster --rounds 1 --backlog 0`:
/// two slots for every entry against four gave single pushes 37.6k / 37.6k msg/s at 33.8 /
/// 33.9 µs of server CPU per message against 35.6k / 35.8k at 34.9 / 36.7 µs, batches of 100 as
/// JSON the same but as QPB1 4% slower, hence the split by size; then one small slot against
/// two, 38.2k / 37.1k against 35.6k / 35.9k; one against none (four for all), 36.2k / 36.6k at
/// 36.0 / 35.5 µs, p99 6.1 / 5.9 ms, against 33.1k / 35.6k at 41.2 / 38.6 µs, p99 6.6 / 6.4 ms,
/// batches unchanged.
pub(crate) const SMALL_SLOTS: usize = 1;
/// An entry of at least this many messages is large: it takes any free slot at once.
pub(crate) const LARGE_ITEMS: usize = 64;
/// At most this many items in one entry.
const MAX_ITEMS: usize = 4_096;
/// At most this many payload bytes in one entry (a request larger than this goes alone).
const MAX_BYTES: usize = 4 << 20;

type Reply = oneshot::Sender<Result<Vec<PushOutcome>, BrokerError>>;

struct Waiting {
    items: Vec<PushItem>,
    /// The producer the messages are stamped with (`producerSub`).
    producer: Option<String>,
    bytes: usize,
    reply: Reply,
}

/// The requests waiting for an entry, and how many messages they hold.
#[derive(Default)]
struct Queue {
    list: Vec<Waiting>,
    items: usize,
}

/// The requests waiting for an entry, and the slots for entries in flight.
pub(crate) struct PushLane {
    waiting: Mutex<Queue>,
    /// Told when requests arrive with none waiting, and when the waiting ones become a large
    /// entry (not at every arrival: a small entry's wait is not woken by each request).
    wake: Notify,
    slots: Arc<Semaphore>,
    /// Held, besides a slot, by an entry of fewer than [`LARGE_ITEMS`] messages.
    small: Arc<Semaphore>,
}

/// An entry's place in flight: released when dropped.
pub(crate) struct Slot {
    _slot: OwnedSemaphorePermit,
    _small: Option<OwnedSemaphorePermit>,
}

/// Requests taken together for one entry: the items, and how many each request gave. Every
/// request of a batch has the same producer.
pub(crate) struct Batch {
    pub(crate) items: Vec<PushItem>,
    pub(crate) producer: Option<String>,
    parts: Vec<(usize, Reply)>,
}

impl PushLane {
    pub(crate) fn new() -> Self {
        Self {
            waiting: Mutex::default(),
            wake: Notify::new(),
            slots: Arc::new(Semaphore::new(SLOTS)),
            small: Arc::new(Semaphore::new(SMALL_SLOTS)),
        }
    }

    /// Queue a request; the receiver answers once its entry has committed and applied.
    pub(crate) fn submit(
        &self,
        items: Vec<PushItem>,
        producer: Option<String>,
    ) -> oneshot::Receiver<Result<Vec<PushOutcome>, BrokerError>> {
        let (reply, rx) = oneshot::channel();
        let bytes = items
            .iter()
            .map(|i| i.payload.len() + i.transaction_id.as_str().len() + 64)
            .sum();
        let n = items.len();
        let before = {
            let mut q = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
            q.list.push(Waiting {
                items,
                producer,
                bytes,
                reply,
            });
            let before = q.items;
            q.items += n;
            before
        };
        if before == 0 || (before < LARGE_ITEMS && before + n >= LARGE_ITEMS) {
            self.wake.notify_one();
        }
        rx
    }

    /// Wait for a free slot and for requests, and take as many as fit in one entry (always at
    /// least one). Fewer than [`LARGE_ITEMS`] messages waiting also wait for a small entry's
    /// slot, gathering more requests meanwhile. The slot is held until it drops.
    pub(crate) async fn next(&self) -> (Slot, Batch) {
        let slot = acquire(&self.slots).await;
        loop {
            let waiting = self.waiting_items();
            if waiting == 0 {
                self.wake.notified().await;
                continue;
            }
            let small = if waiting < LARGE_ITEMS {
                // Until the small entry's slot frees, more requests may make this one large.
                tokio::select! {
                    small = acquire(&self.small) => Some(small),
                    () = self.wake.notified() => continue,
                }
            } else {
                None
            };
            if let Some(batch) = self.take() {
                let small = small.filter(|_| batch.items.len() < LARGE_ITEMS);
                let slot = Slot {
                    _slot: slot,
                    _small: small,
                };
                return (slot, batch);
            }
        }
    }

    /// Messages waiting for an entry.
    fn waiting_items(&self) -> usize {
        self.waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .items
    }

    fn take(&self) -> Option<Batch> {
        let mut q = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        let waiting = &mut q.list;
        if waiting.is_empty() {
            return None;
        }
        let (mut n, mut items, mut bytes) = (0, 0, 0);
        let producer = waiting[0].producer.clone();
        for w in waiting.iter() {
            if n > 0
                && (items + w.items.len() > MAX_ITEMS
                    || bytes + w.bytes > MAX_BYTES
                    || w.producer != producer)
            {
                break;
            }
            n += 1;
            items += w.items.len();
            bytes += w.bytes;
        }
        let mut taken: Vec<Waiting> = waiting.drain(..n).collect();
        let more = !waiting.is_empty();
        q.items -= items;
        drop(q);
        if more {
            // Another slot may take the rest.
            self.wake.notify_one();
        }
        // Requests of one partition side by side (stably: each partition's requests keep their
        // order), so that a partition's messages are consecutive items of the entry and the
        // store keeps them where the raft log wrote them instead of copying them elsewhere.
        taken.sort_by(|a, b| first_partition(a).cmp(&first_partition(b)));
        let mut batch = Batch {
            items: Vec::with_capacity(items),
            producer,
            parts: Vec::with_capacity(n),
        };
        for w in taken {
            batch.parts.push((w.items.len(), w.reply));
            batch.items.extend(w.items);
        }
        Some(batch)
    }
}

async fn acquire(slots: &Arc<Semaphore>) -> OwnedSemaphorePermit {
    slots
        .clone()
        .acquire_owned()
        .await
        .unwrap_or_else(|_| unreachable!("the lane never closes its slots"))
}

/// The queue and partition of a request's first item, which the lane orders requests by.
fn first_partition(w: &Waiting) -> Option<(&str, &str)> {
    w.items
        .first()
        .map(|i| (i.queue.as_str(), i.partition.as_str()))
}

impl Batch {
    /// Hand each request its own answers (or the entry's error).
    pub(crate) fn answer(self, result: Result<Vec<PushOutcome>, BrokerError>) {
        match result {
            Ok(out) => {
                // Answers come back in item order: hand them out front to back.
                let mut out = out.into_iter();
                for (n, reply) in self.parts {
                    let _ = reply.send(Ok(out.by_ref().take(n).collect()));
                }
            }
            Err(e) => {
                for (_, reply) in self.parts {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use queen_domain::command::PushStatus;
    use queen_domain::names::{PartitionName, QueueName};

    use super::*;

    fn item(t: &str, bytes: usize) -> PushItem {
        PushItem {
            queue: QueueName::new("q").unwrap(),
            partition: PartitionName::new("Default").unwrap(),
            transaction_id: queen_domain::ids::TransactionId::new(t).unwrap(),
            message_id: [0; 16],
            trace_id: None,
            payload: vec![b'x'; bytes],
        }
    }

    fn outcome(t: &str) -> PushOutcome {
        PushOutcome {
            status: PushStatus::Queued,
            message_id: [0; 16],
            offset: 0,
            partition_id: 1,
            transaction_id: t.to_owned(),
            queue: "q".into(),
        }
    }

    /// The transactionIds of `batch` in item order, after answering each item as queued.
    fn answer_each(batch: Batch) -> Vec<String> {
        let ids: Vec<String> = batch
            .items
            .iter()
            .map(|i| i.transaction_id.as_str().to_owned())
            .collect();
        batch.answer(Ok(ids.iter().map(|t| outcome(t)).collect()));
        ids
    }

    #[tokio::test]
    async fn requests_of_different_producers_go_in_different_entries() {
        let lane = PushLane::new();
        let _a = lane.submit(vec![item("a1", 10)], Some("alice".into()));
        let _b = lane.submit(vec![item("b1", 10)], Some("bob".into()));
        let _c = lane.submit(vec![item("b2", 10)], Some("bob".into()));
        let (s1, first) = lane.next().await;
        // One small entry in flight at a time: the second waits for the first's slot.
        drop(s1);
        let (_s2, second) = lane.next().await;
        assert_eq!(
            (first.producer.as_deref(), first.items.len()),
            (Some("alice"), 1)
        );
        assert_eq!(
            (second.producer.as_deref(), second.items.len()),
            (Some("bob"), 2)
        );
    }

    #[tokio::test]
    async fn requests_waiting_together_share_an_entry_and_get_their_own_answers() {
        let lane = PushLane::new();
        let a = lane.submit(vec![item("a1", 10), item("a2", 10)], None);
        let b = lane.submit(vec![item("b1", 10)], None);
        let (_slot, batch) = lane.next().await;
        assert_eq!(answer_each(batch), ["a1", "a2", "b1"]);
        let a: Vec<String> = a
            .await
            .unwrap()
            .unwrap()
            .into_iter()
            .map(|o| o.transaction_id)
            .collect();
        let b: Vec<String> = b
            .await
            .unwrap()
            .unwrap()
            .into_iter()
            .map(|o| o.transaction_id)
            .collect();
        assert_eq!(
            (a, b),
            (
                vec!["a1".to_owned(), "a2".to_owned()],
                vec!["b1".to_owned()]
            )
        );
    }

    #[tokio::test]
    async fn an_entry_holds_each_partitions_requests_side_by_side_in_their_order() {
        let lane = PushLane::new();
        let on = |p: &str, t: &str| PushItem {
            partition: PartitionName::new(p).unwrap(),
            ..item(t, 10)
        };
        let b1 = lane.submit(vec![on("b", "b1")], None);
        let a1 = lane.submit(vec![on("a", "a1"), on("a", "a2")], None);
        let b2 = lane.submit(vec![on("b", "b2")], None);
        let a3 = lane.submit(vec![on("a", "a3")], None);
        let (_slot, batch) = lane.next().await;
        assert_eq!(answer_each(batch), ["a1", "a2", "a3", "b1", "b2"]);
        let got = |o: Vec<PushOutcome>| -> Vec<String> {
            o.into_iter().map(|o| o.transaction_id).collect()
        };
        assert_eq!(got(a1.await.unwrap().unwrap()), ["a1", "a2"]);
        assert_eq!(got(a3.await.unwrap().unwrap()), ["a3"]);
        assert_eq!(got(b1.await.unwrap().unwrap()), ["b1"]);
        assert_eq!(got(b2.await.unwrap().unwrap()), ["b2"]);
    }

    #[tokio::test]
    async fn an_entry_stays_within_its_limits_and_a_failure_reaches_every_request() {
        let lane = PushLane::new();
        let big = lane.submit(vec![item("big", MAX_BYTES)], None);
        let small = lane.submit(vec![item("small", 10)], None);
        let (s1, first) = lane.next().await;
        assert_eq!(
            first.items.len(),
            1,
            "a request at the byte limit goes alone"
        );
        drop(s1);
        let (_s2, second) = lane.next().await;
        assert_eq!(second.items[0].transaction_id.as_str(), "small");
        first.answer(Err(BrokerError::Timeout));
        second.answer(Err(BrokerError::Timeout));
        assert!(matches!(
            big.await.unwrap().unwrap_err(),
            BrokerError::Timeout
        ));
        assert!(matches!(
            small.await.unwrap().unwrap_err(),
            BrokerError::Timeout
        ));
    }

    /// `n` requests of `size` items each, an entry taken after each while fewer than `limit`
    /// are held; then no entry goes out until one of them ends, and the rest go out together.
    async fn at_most_in_flight(size: usize, limit: usize) {
        let lane = PushLane::new();
        let mut held = Vec::new();
        let mut rx = Vec::new();
        for i in 0..limit + 3 {
            let items = (0..size).map(|k| item(&format!("t{i}-{k}"), 1)).collect();
            rx.push(lane.submit(items, None));
            if held.len() < limit {
                held.push(lane.next().await);
            }
        }
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(50), lane.next()).await;
        assert!(
            waiting.is_err(),
            "an entry of {size} went out with {limit} of its kind in flight"
        );
        drop(held.pop());
        let (_slot, batch) = lane.next().await;
        assert_eq!(batch.items.len(), 3 * size);
    }

    #[tokio::test]
    async fn no_more_large_entries_in_flight_than_slots() {
        at_most_in_flight(LARGE_ITEMS, SLOTS).await;
    }

    #[tokio::test]
    async fn no_more_small_entries_in_flight_than_small_slots() {
        at_most_in_flight(1, SMALL_SLOTS).await;
    }

    #[tokio::test]
    async fn small_requests_waiting_that_grow_large_go_without_the_small_slot() {
        let lane = PushLane::new();
        drop(lane.submit(vec![item("s0", 1)], None));
        let held = lane.next().await;
        drop(lane.submit(vec![item("s1", 1)], None));
        let next = lane.next();
        tokio::pin!(next);
        let wait = std::time::Duration::from_millis(50);
        assert!(
            tokio::time::timeout(wait, &mut next).await.is_err(),
            "a second small entry went out beside the first"
        );
        let items = (0..LARGE_ITEMS)
            .map(|k| item(&format!("l{k}"), 1))
            .collect();
        drop(lane.submit(items, None));
        let (_slot, batch) = tokio::time::timeout(std::time::Duration::from_secs(5), next)
            .await
            .expect("requests that became a large entry wait for no small entry");
        assert_eq!(batch.items.len(), 1 + LARGE_ITEMS);
        drop(held);
    }

    #[tokio::test]
    async fn a_large_entry_goes_beside_small_ones_in_flight() {
        let lane = PushLane::new();
        let mut held = Vec::new();
        for i in 0..SMALL_SLOTS {
            drop(lane.submit(vec![item(&format!("s{i}"), 1)], None));
            held.push(lane.next().await);
        }
        let items = (0..LARGE_ITEMS)
            .map(|k| item(&format!("l{k}"), 1))
            .collect();
        drop(lane.submit(items, None));
        let (_slot, batch) = tokio::time::timeout(std::time::Duration::from_secs(5), lane.next())
            .await
            .expect("a large entry waits for no small entry");
        assert_eq!(batch.items.len(), LARGE_ITEMS);
    }
}
