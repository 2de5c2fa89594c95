//! Wake-ups of waiting pops on replicated queues, sized to what a commit made deliverable.
//!
//! Waiting pops register per (queue, group, partition they name or none) and park on that key's
//! `Notify`, which wakes its waiters one at a time in the order they registered. Every node
//! learns from its own apply (`queen_ports::ApplyObserver`, leader or follower) which partitions
//! a batch changed and which became claimable for a group, and wakes, per key, at most one
//! waiter per such partition: a partition is claimed under one lease per group, so a second
//! waiter for it would only lose the race. A waiter that finds nothing parks again; one that
//! delivered passes a wake-up on to the next waiter of its key (there may be more), so a
//! backlog is drained by as many waiters as it keeps busy and no more.
//!
//! What a commit does not signal (a delayed message coming due, a lease that expired and was
//! not released yet on this node, a seek on another node) is found by one checker per key,
//! which re-looks every [`RECHECK`] or so, and by waiters parking no longer than the next due
//! time a push to a delayed queue set. So an idle queue costs one look per key per second,
//! whatever the number of its waiters. A key's entry goes when its last waiter leaves (answer,
//! timeout or a client that went away): memory follows the waiters connected.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use queen_domain::StateRead;
use queen_domain::reads;
use queen_ports::{AppliedChanges, ApplyObserver};
use tokio::sync::Notify;

/// How often one waiter of each key looks again on its own (jittered by up to a quarter).
pub(crate) const RECHECK: Duration = Duration::from_secs(1);

/// Slack after a delayed message's due time before its waiters look (clocks of nodes differ a
/// little; broker time decides visibility).
const DUE_SLACK: Duration = Duration::from_millis(5);

/// Waiters of one queue are told apart by group and by the partition they name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    group: String,
    partition: Option<String>,
}

/// The waiters of one key.
#[derive(Default)]
pub(crate) struct Slot {
    notify: Notify,
    /// Waiters registered on this key.
    count: AtomicUsize,
    /// Whether one of them is the key's checker.
    checker: AtomicBool,
    /// The earliest due time of a delayed message pushed since (pops park no longer).
    due: Mutex<Option<Instant>>,
}

impl Slot {
    /// Wake up to `n` waiters (never more than are registered).
    fn wake(&self, n: usize) {
        for _ in 0..n.min(self.count.load(Ordering::SeqCst)) {
            self.notify.notify_one();
        }
    }

    fn set_due(&self, at: Instant) {
        let mut due = lock(&self.due);
        let now = Instant::now();
        *due = Some(match *due {
            Some(d) if d > now => d.min(at),
            _ => at,
        });
    }
}

/// A key with waiters, and the partitions an applied batch made worth a look for it.
type Touched = (Key, Arc<Slot>, HashSet<u64>);

/// The wake-up registry of one broker.
#[derive(Default)]
pub(crate) struct Wakeups {
    queues: Mutex<HashMap<String, HashMap<Key, Arc<Slot>>>>,
    /// Waiters registered (observers skip the work when there are none).
    registered: AtomicUsize,
    /// Pops parked after an empty look (the `waiting_pops` gauge).
    parked: AtomicU64,
    /// Registrations so far (spreads the checkers' re-looks).
    serial: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Wakeups {
    /// Register a waiting pop on `queue` for `group`, naming `partition` or not, before its
    /// first look (a commit between the look and the park then still wakes it).
    pub(crate) fn register(
        &self,
        queue: &str,
        group: &str,
        partition: Option<&str>,
    ) -> Registration<'_> {
        let key = Key {
            group: group.to_owned(),
            partition: partition.map(str::to_owned),
        };
        let slot = {
            let mut m = lock(&self.queues);
            let slot = m
                .entry(queue.to_owned())
                .or_default()
                .entry(key.clone())
                .or_default()
                .clone();
            slot.count.fetch_add(1, Ordering::SeqCst);
            slot
        };
        self.registered.fetch_add(1, Ordering::SeqCst);
        let serial = self.serial.fetch_add(1, Ordering::Relaxed);
        Registration {
            wakeups: self,
            queue: queue.to_owned(),
            key,
            slot,
            checker: AtomicBool::new(false),
            parked: AtomicBool::new(false),
            jitter: Duration::from_millis(serial % 250),
        }
    }

    /// Pops parked now.
    pub(crate) fn parked(&self) -> u64 {
        self.parked.load(Ordering::Relaxed)
    }

    /// Wake every waiter of `queue` (a change no apply reports: options, a seek).
    pub(crate) fn wake_queue(&self, queue: &str) {
        let m = lock(&self.queues);
        for slot in m.get(queue).into_iter().flat_map(HashMap::values) {
            slot.notify.notify_waiters();
        }
    }

    /// Wake every waiter (a change whose queue is not known here).
    pub(crate) fn wake_all(&self) {
        let m = lock(&self.queues);
        for slot in m.values().flat_map(HashMap::values) {
            slot.notify.notify_waiters();
        }
    }

    /// The keys of `queue` with waiters now.
    fn keys_of(&self, queue: &str) -> Vec<(Key, Arc<Slot>)> {
        lock(&self.queues)
            .get(queue)
            .map(|keys| keys.iter().map(|(k, s)| (k.clone(), s.clone())).collect())
            .unwrap_or_default()
    }

    /// Wake, per key of the queues `changes` touched, one waiter per partition that may have
    /// something for it: changed partitions for every group, ready ones for their group.
    fn wake_for(&self, changes: &AppliedChanges, state: &dyn StateRead) {
        // Partition id -> (queue, partition name), read once each.
        let mut names: HashMap<u64, Option<(String, String)>> = HashMap::new();
        let mut name_of = |pid: u64| -> Option<(String, String)> {
            names
                .entry(pid)
                .or_insert_with(|| {
                    reads::partition(state, pid)
                        .ok()
                        .flatten()
                        .map(|p| (p.queue, p.name))
                })
                .clone()
        };
        // Per queue: its keys, and per key the partitions that may serve it.
        let mut touched: HashMap<String, Vec<Touched>> = HashMap::new();
        let mut delayed: HashSet<String> = HashSet::new();
        let mut note = |queue: &str, pid: u64, pname: &str, group: Option<&str>| {
            let keys = touched.entry(queue.to_owned()).or_insert_with(|| {
                self.keys_of(queue)
                    .into_iter()
                    .map(|(k, s)| (k, s, HashSet::new()))
                    .collect()
            });
            for (k, _, pids) in keys.iter_mut() {
                if group.is_none_or(|g| g == k.group)
                    && k.partition.as_deref().is_none_or(|p| p == pname)
                {
                    pids.insert(pid);
                }
            }
        };
        for &pid in &changes.partitions {
            if let Some((q, p)) = name_of(pid) {
                note(&q, pid, &p, None);
                delayed.insert(q);
            }
        }
        for (pid, group) in &changes.ready {
            if let Some((q, p)) = name_of(*pid) {
                note(&q, *pid, &p, Some(group));
            }
        }
        for (queue, keys) in &touched {
            if keys.is_empty() {
                continue;
            }
            // A push to a delayed queue: its waiters look again when the message comes due.
            if delayed.contains(queue)
                && let Ok(Some(q)) = reads::queue(state, queue)
                && q.options.delayed_processing > 0
            {
                let at =
                    Instant::now() + Duration::from_secs(q.options.delayed_processing) + DUE_SLACK;
                for (_, slot, _) in keys {
                    slot.set_due(at);
                }
            }
            for (_, slot, pids) in keys {
                slot.wake(pids.len());
            }
        }
    }
}

impl ApplyObserver for Wakeups {
    fn wants(&self) -> bool {
        self.registered.load(Ordering::SeqCst) > 0
    }

    fn applied(&self, changes: &AppliedChanges, state: &dyn StateRead) {
        self.wake_for(changes, state);
    }
}

/// One waiting pop's place among its key's waiters, until it drops.
pub(crate) struct Registration<'a> {
    wakeups: &'a Wakeups,
    queue: String,
    key: Key,
    slot: Arc<Slot>,
    /// Whether this waiter is its key's checker.
    checker: AtomicBool,
    /// Whether it was counted as parked.
    parked: AtomicBool,
    jitter: Duration,
}

impl Registration<'_> {
    /// The key's notifier: register a `notified()` of it before each look.
    pub(crate) fn notify(&self) -> &Notify {
        &self.slot.notify
    }

    /// How long to park at most, `remaining` being what is left of the pop's wait: the
    /// checker re-looks every [`RECHECK`], every waiter when a delayed message comes due.
    pub(crate) fn park_for(&self, remaining: Duration) -> Duration {
        if !self.parked.swap(true, Ordering::Relaxed) {
            self.wakeups.parked.fetch_add(1, Ordering::Relaxed);
        }
        if !self.checker.load(Ordering::Relaxed) && !self.slot.checker.swap(true, Ordering::SeqCst)
        {
            self.checker.store(true, Ordering::Relaxed);
        }
        let mut d = remaining;
        if self.checker.load(Ordering::Relaxed) {
            d = d.min(RECHECK + self.jitter);
        }
        let now = Instant::now();
        if let Some(due) = *lock(&self.slot.due)
            && due > now
        {
            d = d.min(due - now);
        }
        d.max(Duration::from_millis(1))
    }

    /// This waiter delivered: the next one of its key looks too (there may be more).
    pub(crate) fn pass_on(&self) {
        if self.slot.count.load(Ordering::SeqCst) > 1 {
            self.slot.notify.notify_one();
        }
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        if *self.parked.get_mut() {
            self.wakeups.parked.fetch_sub(1, Ordering::Relaxed);
        }
        let mut m = lock(&self.wakeups.queues);
        let left = self.slot.count.fetch_sub(1, Ordering::SeqCst) - 1;
        if *self.checker.get_mut() {
            // Hand the checks over: the waiter woken takes the role when it parks again.
            self.slot.checker.store(false, Ordering::SeqCst);
            if left > 0 {
                self.slot.notify.notify_one();
            }
        }
        if left == 0
            && let Some(keys) = m.get_mut(&self.queue)
        {
            if keys
                .get(&self.key)
                .is_some_and(|s| Arc::ptr_eq(s, &self.slot))
            {
                keys.remove(&self.key);
            }
            if keys.is_empty() {
                m.remove(&self.queue);
            }
        }
        drop(m);
        self.wakeups.registered.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use queen_domain::command::PushItem;
    use queen_domain::names::{PartitionName, QueueName};
    use queen_ports::{ClientApi, PopRequest};

    use super::*;
    use crate::broker::twins::{FakeLog, ManualClock, MemState, broker};

    fn item(partition: &str, id: &str) -> PushItem {
        PushItem {
            queue: QueueName::new("q".to_owned()).unwrap(),
            partition: PartitionName::new(partition.to_owned()).unwrap(),
            transaction_id: queen_domain::ids::TransactionId::new(id).unwrap(),
            message_id: [1; 16],
            payload: b"{}".to_vec(),
            trace_id: None,
        }
    }

    /// `n` waiters registered on (q, group, partition), each with its wake-up armed.
    fn arm<'a>(
        w: &'a Wakeups,
        n: usize,
        group: &str,
        partition: Option<&str>,
    ) -> Vec<Registration<'a>> {
        (0..n).map(|_| w.register("q", group, partition)).collect()
    }

    type Armed<'a> = Vec<std::pin::Pin<Box<tokio::sync::futures::Notified<'a>>>>;

    /// How many of the `armed` wake-ups came within a short while.
    async fn woken(armed: Armed<'_>) -> usize {
        let mut count = 0;
        for f in armed {
            if tokio::time::timeout(Duration::from_millis(20), f)
                .await
                .is_ok()
            {
                count += 1;
            }
        }
        count
    }

    /// Each of `regs` with its wake-up armed.
    fn armed<'a>(regs: &'a [Registration<'_>]) -> Armed<'a> {
        regs.iter()
            .map(|r| {
                let mut f = Box::pin(r.notify().notified());
                f.as_mut().enable();
                f
            })
            .collect()
    }

    fn twin() -> (Arc<FakeLog>, crate::broker::Broker) {
        let log = FakeLog::leader(MemState::default());
        let b = broker(
            &log,
            Arc::new(ManualClock::at(1_700_000_000_000_000)),
            Duration::from_secs(5),
        );
        (log, b)
    }

    #[tokio::test]
    async fn a_push_into_k_partitions_wakes_k_waiters_of_each_group_not_all() {
        let (_log, b) = twin();
        let w = &b.wakeups;
        let g1 = arm(w, 10, "g1", None);
        let g2 = arm(w, 10, "g2", None);
        let (a1, a2) = (armed(&g1), armed(&g2));
        b.push(
            vec![item("a", "t1"), item("b", "t2"), item("c", "t3")],
            None,
        )
        .await
        .unwrap();
        assert_eq!(woken(a1).await, 3, "one waiter of g1 per partition pushed");
        assert_eq!(woken(a2).await, 3, "and as many of g2: each group its own");
    }

    #[tokio::test]
    async fn many_messages_into_one_partition_wake_one_waiter_per_group() {
        let (_log, b) = twin();
        let g = arm(&b.wakeups, 10, "g", None);
        let a = armed(&g);
        let items: Vec<_> = (0..50).map(|i| item("only", &format!("t{i}"))).collect();
        b.push(items, None).await.unwrap();
        assert_eq!(
            woken(a).await,
            1,
            "one lease per partition and group: a second waiter could only lose the race"
        );
    }

    #[tokio::test]
    async fn a_waiter_naming_a_partition_is_woken_by_that_partition_only() {
        let (_log, b) = twin();
        let named = arm(&b.wakeups, 2, "g", Some("mine"));
        let a = armed(&named);
        b.push(vec![item("other", "t1")], None).await.unwrap();
        assert_eq!(woken(a).await, 0);
        let a = armed(&named);
        b.push(vec![item("mine", "t2")], None).await.unwrap();
        assert_eq!(woken(a).await, 1);
    }

    #[tokio::test]
    async fn an_ack_that_frees_a_partition_wakes_a_waiter_of_its_own_group_only() {
        use queen_domain::command::{AckItem, AckStatus, PopCommand, Subscription};
        use queen_domain::ids::{LeaseId, PartitionRef};
        use queen_domain::names::GroupName;
        let (_log, b) = twin();
        // Acks put partitions back in the ready index once every member reads its format.
        b.propose(queen_domain::command::Command::ClusterSettings {
            version: queen_domain::command::Command::READY_INDEX_FORMAT,
            max_clock_skew_ms: 500,
        })
        .await
        .unwrap();
        b.push(vec![item("a", "t1"), item("a", "t2")], None)
            .await
            .unwrap();
        let pop = |group: &str| PopRequest {
            command: PopCommand {
                queue: QueueName::new("q".to_owned()).unwrap(),
                partition: None,
                group: GroupName::new(group.to_owned()).unwrap(),
                batch: 1,
                max_partitions: 1,
                lease_id: LeaseId::new("placeholder").unwrap(),
                auto_ack: false,
                subscription: Subscription::All,
            },
            wait: false,
            timeout: Duration::ZERO,
            autopilot: None,
            conflation: false,
        };
        // Both groups hold the partition's lease: their waiters have nothing to take.
        let got = b.pop(pop("g1")).await.unwrap();
        b.pop(pop("g2")).await.unwrap();
        let g1 = arm(&b.wakeups, 5, "g1", None);
        let g2 = arm(&b.wakeups, 5, "g2", None);
        let (a1, a2) = (armed(&g1), armed(&g2));
        let claim = &got.outcome.claims[0];
        b.ack(
            GroupName::new("g1".to_owned()).unwrap(),
            vec![AckItem {
                transaction_id: queen_domain::ids::TransactionId::new(
                    claim.messages[0].transaction_id.clone(),
                )
                .unwrap(),
                partition_id: PartitionRef::Id(claim.pid),
                status: AckStatus::Completed,
                error: None,
                lease_id: Some(LeaseId::new(got.outcome.lease_id.clone()).unwrap()),
            }],
        )
        .await
        .unwrap();
        assert_eq!(
            woken(a1).await,
            1,
            "g1's partition is claimable again, with t2"
        );
        assert_eq!(
            woken(a2).await,
            0,
            "g2 still holds its lease: its waiters sleep on"
        );
    }

    #[tokio::test]
    async fn nothing_is_collected_without_waiters_and_keys_go_with_their_last_waiter() {
        let (_log, b) = twin();
        let w = &b.wakeups;
        assert!(!w.wants());
        {
            let _one = w.register("q", "g", None);
            let _two = w.register("q", "g", Some("p"));
            assert!(w.wants());
            assert_eq!(lock(&w.queues)["q"].len(), 2);
        }
        assert!(!w.wants());
        assert!(lock(&w.queues).is_empty(), "no entry outlives its waiters");
    }

    #[tokio::test]
    async fn one_checker_per_key_re_looks_the_others_wait_for_a_wake_up() {
        let (_log, b) = twin();
        let w = &b.wakeups;
        let mut regs = arm(w, 3, "g", None);
        let long = Duration::from_secs(30);
        let waits: Vec<Duration> = regs.iter().map(|r| r.park_for(long)).collect();
        assert!(waits[0] <= RECHECK + Duration::from_millis(250));
        assert_eq!(&waits[1..], [long, long]);
        assert_eq!(w.parked(), 3);
        // The checker leaves: the role is handed to the next waiter that parks again.
        let first = regs.remove(0);
        drop(first);
        assert!(regs[0].park_for(long) <= RECHECK + Duration::from_millis(250));
    }
}
