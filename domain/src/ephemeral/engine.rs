//! The rings of the ephemeral partitions a node owns.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::options::{Limits, Options, Policy};
use super::{MESSAGE_OVERHEAD, MessageId};

mod books;
mod cost;

/// One held message.
#[derive(Debug, Clone)]
struct Held {
    /// The payload as the client wrote it (JSON text).
    payload: Vec<u8>,
    /// When it was pushed (ms).
    at: u64,
}

impl Held {
    fn cost(&self) -> u64 {
        self.payload.len() as u64 + MESSAGE_OVERHEAD
    }
}

/// A delivered, unacknowledged message of one group.
#[derive(Debug, Clone, Copy)]
struct Lease {
    /// When it is delivered again (ms).
    until: u64,
    /// Deliveries so far.
    attempts: u32,
}

/// One group's position in one ring.
#[derive(Debug, Clone, Default)]
struct Position {
    /// The next message never delivered to this group.
    next: u64,
    /// Delivered and not yet acknowledged, by seq.
    leased: BTreeMap<u64, Lease>,
    /// Waiting to be delivered again, by seq, with the deliveries so far.
    again: BTreeMap<u64, u32>,
    /// Messages dropped before this group consumed them.
    skipped: u64,
    /// The last pop (ms).
    seen: u64,
}

impl Position {
    /// The oldest message this group still needs.
    fn low(&self) -> u64 {
        let mut low = self.next;
        if let Some((s, _)) = self.leased.first_key_value() {
            low = low.min(*s);
        }
        if let Some((s, _)) = self.again.first_key_value() {
            low = low.min(*s);
        }
        low
    }

    /// Messages waiting for this group in a ring that ends before `end`.
    fn pending(&self, end: u64) -> u64 {
        end.saturating_sub(self.next) + self.again.len() as u64
    }
}

/// One partition's ring.
#[derive(Debug, Clone, Default)]
struct Ring {
    /// The seq of `held[0]`.
    base: u64,
    held: VecDeque<Held>,
    bytes: u64,
    groups: BTreeMap<String, Position>,
    /// What its structure costs as last counted (`books.rs`), beside its messages.
    cost: u64,
}

impl Ring {
    fn end(&self) -> u64 {
        self.base + self.held.len() as u64
    }

    fn get(&self, seq: u64) -> Option<&Held> {
        let i = usize::try_from(seq.checked_sub(self.base)?).ok()?;
        self.held.get(i)
    }

    /// Drop the front message, which some groups may not have consumed: they skip it.
    fn drop_front(&mut self) -> Option<u64> {
        let h = self.held.pop_front()?;
        let seq = self.base;
        self.base += 1;
        self.bytes -= h.cost();
        for g in self.groups.values_mut() {
            let pending =
                g.next <= seq || g.leased.remove(&seq).is_some() || g.again.remove(&seq).is_some();
            if g.next <= seq {
                g.next = seq + 1;
            }
            if pending {
                g.skipped += 1;
            }
        }
        self.shrink();
        Some(h.cost())
    }

    /// Free the front messages every group has passed; `(messages, bytes)` freed. A ring no
    /// group consumes yet keeps everything.
    fn trim(&mut self) -> (u64, u64) {
        let Some(low) = self.groups.values().map(Position::low).min() else {
            return (0, 0);
        };
        let (mut n, mut b) = (0, 0);
        while self.base < low {
            let Some(h) = self.held.pop_front() else {
                break;
            };
            self.base += 1;
            self.bytes -= h.cost();
            n += 1;
            b += h.cost();
        }
        self.shrink();
        (n, b)
    }

    /// Give back most of a buffer that emptied (it never shrinks on its own, and it is counted).
    fn shrink(&mut self) {
        let (len, cap) = (self.held.len(), self.held.capacity());
        if cap > 16 && len < cap / 4 {
            self.held.shrink_to((len * 2).max(4));
        }
    }
}

/// Messages dropped, by cause.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drops {
    /// By `maxBytes` / `maxLength` under the drop-oldest policy.
    pub bounds: u64,
    /// By `ttlSeconds`.
    pub ttl: u64,
    /// By `retryLimit` (counted per group).
    pub retry: u64,
}

/// One queue's rings on this node.
#[derive(Debug, Clone, Default)]
struct QueueRings {
    partitions: BTreeMap<String, Ring>,
    len: u64,
    bytes: u64,
    drops: Drops,
    /// The last push or pop (ms).
    used: u64,
    /// Where the next partition-less pop starts looking (round robin).
    turn: usize,
    /// What its name and map of rings cost as last counted (`books.rs`).
    own: u64,
}

/// Why a push was refused; nothing of it was kept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum PushRefusal {
    /// The queue's bound with the reject policy: the client retries after consumers drain.
    #[error(
        "ephemeral queue '{queue}' is full on this node ({len} messages, {bytes} bytes; maxLength {max_length}, maxBytes {max_bytes}) and its policy is reject"
    )]
    QueueFull {
        /// The queue.
        queue: String,
        /// Messages held.
        len: u64,
        /// Bytes held.
        bytes: u64,
        /// The bound.
        max_length: u64,
        /// The bound.
        max_bytes: u64,
    },
    /// The node's budget for every ephemeral queue together.
    #[error(
        "this node's ephemeral memory is full ({bytes} of {limit} bytes, QUEEN_EPHEMERAL_MAX_BYTES)"
    )]
    NodeFull {
        /// Bytes held.
        bytes: u64,
        /// The budget.
        limit: u64,
    },
    /// The batch alone is larger than the queue may ever hold: no retry can succeed.
    #[error(
        "the batch ({count} messages, {bytes} bytes) is larger than ephemeral queue '{queue}' may hold (maxLength {max_length}, maxBytes {max_bytes})"
    )]
    TooLarge {
        /// The queue.
        queue: String,
        /// Messages in the batch.
        count: u64,
        /// Bytes of the batch.
        bytes: u64,
        /// The bound.
        max_length: u64,
        /// The bound.
        max_bytes: u64,
    },
    /// A new queue over a cap on how many queues the node keeps: a push to a queue it holds
    /// still passes, a new one once idle queues are forgotten or deleted.
    #[error(
        "{whose} already holds {held} ephemeral queues, the most it may ({limit}, {setting}); push to a queue it holds, or delete one"
    )]
    TooManyQueues {
        /// Queues held.
        held: u64,
        /// The cap.
        limit: u64,
        /// Whose cap: the node's or the tenant's.
        whose: String,
        /// The setting that holds the cap.
        setting: String,
    },
}

/// A delivered message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivered {
    /// Its id (`MessageId` as text).
    pub id: String,
    /// Its partition.
    pub partition: String,
    /// Its payload as pushed (JSON text).
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
    /// Deliveries so far, this one included.
    pub attempts: u32,
}

/// What an ack asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AckStatus {
    /// Done with it.
    Completed,
    /// Deliver it again (until the retry limit).
    Failed,
}

/// What an ack did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AckOutcome {
    /// The message left the group (done, or dropped at its retry limit).
    Acked,
    /// It will be delivered again.
    Redelivered,
    /// The id is of another incarnation (a restart or an ownership move came between).
    Stale,
    /// No such delivery is outstanding (acked already, or never delivered to this group).
    Unknown,
}

impl AckOutcome {
    /// The wire spelling.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            AckOutcome::Acked => "acked",
            AckOutcome::Redelivered => "redelivered",
            AckOutcome::Stale => "stale",
            AckOutcome::Unknown => "unknown",
        }
    }
}

/// One partition in a queue's view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionView {
    /// Its name.
    pub partition: String,
    /// Messages held.
    pub length: u64,
    /// Bytes held.
    pub bytes: u64,
    /// Messages waiting for the group asked about (or the length when none was).
    pub pending: u64,
}

/// One group in a queue's view (summed over the partitions).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupView {
    /// Its name.
    pub group: String,
    /// Messages waiting for it.
    pub pending: u64,
    /// Delivered and not acknowledged.
    pub in_flight: u64,
    /// Dropped before it consumed them.
    pub skipped: u64,
}

/// A queue as this node holds it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueView {
    /// Messages held.
    pub length: u64,
    /// Bytes held.
    pub bytes: u64,
    /// Its partitions.
    pub partitions: Vec<PartitionView>,
    /// Its groups.
    pub groups: Vec<GroupView>,
    /// Drops so far.
    pub drops: Drops,
}

/// A ring as it is handed to its next owner: its messages in order, and each group's position
/// relative to the first of them. Leased messages travel as redeliveries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingExport {
    /// The stored queue name.
    pub queue: String,
    /// The partition.
    pub partition: String,
    /// `(pushed at, payload)`, oldest first.
    pub messages: Vec<(u64, serde_bytes::ByteBuf)>,
    /// Each group's position.
    pub groups: Vec<GroupExport>,
}

/// A group's position in a handed-over ring, counted from the ring's first message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupExport {
    /// The group.
    pub group: String,
    /// The next message never delivered to it.
    pub next: u64,
    /// Messages to deliver again, with their deliveries so far.
    pub again: Vec<(u64, u32)>,
    /// Messages dropped before it consumed them.
    pub skipped: u64,
}

/// What a pop asks for.
#[derive(Debug, Clone, Copy)]
pub struct Take<'a> {
    /// One partition, or the queue's partitions in turn.
    pub partition: Option<&'a str>,
    /// The consumer group.
    pub group: &'a str,
    /// At most this many messages.
    pub batch: usize,
    /// Commit at delivery (no lease).
    pub auto_ack: bool,
}

/// Node-wide counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// Messages pushed.
    pub pushed: u64,
    /// Deliveries.
    pub delivered: u64,
    /// Acks that completed a message.
    pub acked: u64,
    /// Drops by cause.
    pub drops: Drops,
    /// Messages removed by `reset` or `delete`.
    pub wiped: u64,
}

/// The rings of every ephemeral partition this node owns.
#[derive(Debug)]
pub struct Rings {
    epoch: u64,
    limits: Limits,
    queues: BTreeMap<String, QueueRings>,
    /// Messages' bytes (payload and `MESSAGE_OVERHEAD` each).
    bytes: u64,
    /// What the queues, rings, groups and leases cost beside their messages (`books.rs`).
    structure: u64,
    /// Queues held per tenant id (`""`: the default tenant), for its cap.
    tenants: BTreeMap<String, u64>,
    totals: Totals,
}

impl Rings {
    /// Empty rings of the incarnation `epoch` (random per start).
    #[must_use]
    pub fn new(epoch: u64, limits: Limits) -> Self {
        Self {
            epoch,
            limits,
            queues: BTreeMap::new(),
            bytes: 0,
            structure: 0,
            tenants: BTreeMap::new(),
            totals: Totals::default(),
        }
    }

    /// The incarnation.
    #[must_use]
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The node's ceilings.
    #[must_use]
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Bytes of the messages held by every queue (the budget counts [`Rings::used`]).
    #[must_use]
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Messages held by every queue.
    #[must_use]
    pub fn len(&self) -> u64 {
        self.queues.values().map(|q| q.len).sum()
    }

    /// Whether nothing is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The counters.
    #[must_use]
    pub fn totals(&self) -> Totals {
        self.totals
    }

    /// The queues held in memory (stored names).
    pub fn queue_names(&self) -> impl Iterator<Item = &str> {
        self.queues.keys().map(String::as_str)
    }

    /// Whether this node holds a ring for `(queue, partition)`.
    #[must_use]
    pub fn holds(&self, queue: &str, partition: &str) -> bool {
        self.queues
            .get(queue)
            .is_some_and(|q| q.partitions.contains_key(partition))
    }

    /// Every `(queue, partition)` held.
    #[must_use]
    pub fn partitions(&self) -> Vec<(String, String)> {
        self.queues
            .iter()
            .flat_map(|(q, r)| r.partitions.keys().map(|p| (q.clone(), p.clone())))
            .collect()
    }

    /// Push `payloads` to the end of `(queue, partition)`, all or nothing.
    ///
    /// # Errors
    /// A bound refused it; nothing was kept.
    pub fn push(
        &mut self,
        queue: &str,
        partition: &str,
        payloads: Vec<Vec<u8>>,
        opts: &Options,
        now: u64,
    ) -> Result<u64, PushRefusal> {
        let mut payloads = payloads;
        let cost = |p: &Vec<u8>| p.len() as u64 + MESSAGE_OVERHEAD;
        let mut count = payloads.len() as u64;
        let mut add: u64 = payloads.iter().map(cost).sum();
        // A feed keeps the newest: a batch larger than the queue loses its own oldest first.
        let mut shed = 0;
        if opts.policy == Policy::DropOldest {
            while count > 1 && (count > opts.max_length || add > opts.max_bytes) {
                add -= cost(&payloads[shed]);
                count -= 1;
                shed += 1;
            }
        }
        payloads.drain(..shed);
        if count > opts.max_length || add > opts.max_bytes {
            return Err(PushRefusal::TooLarge {
                queue: crate::tenant::display(queue).into_owned(),
                count,
                bytes: add,
                max_length: opts.max_length,
                max_bytes: opts.max_bytes,
            });
        }
        self.sweep_queue(queue, opts, now);
        let over =
            |len: u64, bytes: u64| len + count > opts.max_length || bytes + add > opts.max_bytes;
        let mut dropping = 0;
        if let Some(q) = self.queues.get(queue)
            && over(q.len, q.bytes)
        {
            if opts.policy == Policy::Reject {
                return Err(PushRefusal::QueueFull {
                    queue: crate::tenant::display(queue).into_owned(),
                    len: q.len,
                    bytes: q.bytes,
                    max_length: opts.max_length,
                    max_bytes: opts.max_bytes,
                });
            }
            dropping = oldest_first(q, over).1;
        }
        self.admit(queue, partition, payloads.len(), add, dropping)?;
        self.enter(queue);
        let q = self.queues.get_mut(queue).expect("entered above");
        q.used = now;
        q.drops.bounds += shed as u64;
        let mut touched = Vec::new();
        if dropping > 0 {
            while over(q.len, q.bytes) {
                let Some(p) = oldest_partition(q) else { break };
                let ring = q.partitions.get_mut(&p).expect("named by oldest_partition");
                let Some(cost) = ring.drop_front() else { break };
                q.len -= 1;
                q.bytes -= cost;
                q.drops.bounds += 1;
                self.bytes -= cost;
                self.totals.drops.bounds += 1;
                touched.push(p);
            }
        }
        let ring = q.partitions.entry(partition.to_owned()).or_default();
        for payload in payloads {
            let h = Held { payload, at: now };
            ring.bytes += h.cost();
            ring.held.push_back(h);
        }
        q.len += count;
        q.bytes += add;
        self.bytes += add;
        self.totals.pushed += count + shed as u64;
        self.totals.drops.bounds += shed as u64;
        touched.dedup();
        for p in touched {
            self.recount(queue, Some(&p));
        }
        self.recount(queue, Some(partition));
        Ok(count + shed as u64)
    }

    /// Deliver up to `batch` messages of `queue` to `group`: from `partition` alone, or from the
    /// queue's partitions in turn. Each is leased for the queue's lease, or committed at once
    /// with `auto_ack`. Redeliveries come before new messages.
    pub fn pop(&mut self, queue: &str, take: Take<'_>, opts: &Options, now: u64) -> Vec<Delivered> {
        let Take {
            partition,
            group,
            batch,
            auto_ack,
        } = take;
        self.sweep_queue(queue, opts, now);
        let epoch = self.epoch;
        // A new group and each new lease must fit the node's budget; a pop on a queue this
        // node does not hold creates nothing.
        let mut room = self.limits.node_max_bytes.saturating_sub(self.used());
        let Some(q) = self.queues.get_mut(queue) else {
            return Vec::new();
        };
        q.used = now;
        let names: Vec<String> = match partition {
            Some(p) => vec![p.to_owned()],
            None => {
                let mut all: Vec<String> = q.partitions.keys().cloned().collect();
                if !all.is_empty() {
                    let turn = q.turn % all.len();
                    all.rotate_left(turn);
                    q.turn = turn + 1;
                }
                all
            }
        };
        let mut out = Vec::new();
        let mut touched = Vec::new();
        let (mut freed_n, mut freed_b) = (0, 0);
        for name in names {
            if out.len() >= batch {
                break;
            }
            let Some(ring) = q.partitions.get_mut(&name) else {
                continue;
            };
            if !ring.groups.contains_key(group) {
                let need = cost::new_group(group, ring.groups.len());
                if need > room {
                    continue;
                }
                room -= need;
            }
            touched.push(name.clone());
            let fresh_max = if auto_ack {
                u64::MAX
            } else {
                room / cost::lease()
            };
            let base = ring.base;
            let end = ring.end();
            let pos = ring
                .groups
                .entry(group.to_owned())
                .or_insert_with(|| Position {
                    next: base,
                    ..Position::default()
                });
            pos.seen = now;
            let mut picked: Vec<(u64, u32)> = Vec::new();
            while out.len() + picked.len() < batch {
                let Some((seq, n)) = pos.again.pop_first() else {
                    break;
                };
                picked.push((seq, n + 1));
            }
            let mut fresh = 0;
            while out.len() + picked.len() < batch && pos.next < end && fresh < fresh_max {
                picked.push((pos.next, 1));
                pos.next += 1;
                fresh += 1;
            }
            if !auto_ack {
                room -= fresh * cost::lease();
            }
            if !auto_ack {
                for (seq, attempts) in &picked {
                    pos.leased.insert(
                        *seq,
                        Lease {
                            until: now.saturating_add(opts.lease_ms),
                            attempts: *attempts,
                        },
                    );
                }
            }
            for (seq, attempts) in picked {
                let Some(h) = ring.get(seq) else { continue };
                out.push(Delivered {
                    id: MessageId {
                        epoch,
                        seq,
                        partition: name.clone(),
                    }
                    .to_string(),
                    partition: name.clone(),
                    payload: h.payload.clone(),
                    attempts,
                });
            }
            let (n, b) = ring.trim();
            freed_n += n;
            freed_b += b;
        }
        q.len -= freed_n;
        q.bytes -= freed_b;
        self.bytes -= freed_b;
        let delivered = out.len() as u64;
        self.totals.delivered += delivered;
        if auto_ack {
            self.totals.acked += delivered;
        }
        for p in touched {
            self.recount(queue, Some(&p));
        }
        out
    }

    /// Messages `group` could pop now from `queue` (or one partition of it).
    #[must_use]
    pub fn available(&self, queue: &str, partition: Option<&str>, group: &str) -> u64 {
        let Some(q) = self.queues.get(queue) else {
            return 0;
        };
        q.partitions
            .iter()
            .filter(|(p, _)| partition.is_none_or(|want| want == p.as_str()))
            .map(|(_, r)| {
                r.groups
                    .get(group)
                    .map_or(r.held.len() as u64, |g| g.pending(r.end()))
            })
            .sum()
    }

    /// Settle acks of `group` on `queue`.
    pub fn ack(
        &mut self,
        queue: &str,
        group: &str,
        acks: &[(String, AckStatus)],
        opts: &Options,
        now: u64,
    ) -> Vec<AckOutcome> {
        self.sweep_queue(queue, opts, now);
        let epoch = self.epoch;
        let mut out = Vec::with_capacity(acks.len());
        let Some(q) = self.queues.get_mut(queue) else {
            return acks
                .iter()
                .map(|(id, _)| match MessageId::parse(id) {
                    Some(m) if m.epoch != epoch => AckOutcome::Stale,
                    _ => AckOutcome::Unknown,
                })
                .collect();
        };
        let (mut freed_n, mut freed_b) = (0, 0);
        let mut touched = std::collections::BTreeSet::new();
        for (id, status) in acks {
            let Some(m) = MessageId::parse(id) else {
                out.push(AckOutcome::Unknown);
                continue;
            };
            if m.epoch != epoch {
                out.push(AckOutcome::Stale);
                continue;
            }
            let Some(pos) = q
                .partitions
                .get_mut(&m.partition)
                .and_then(|r| r.groups.get_mut(group))
            else {
                out.push(AckOutcome::Unknown);
                continue;
            };
            let held = pos
                .leased
                .remove(&m.seq)
                .map(|l| l.attempts)
                .or_else(|| pos.again.remove(&m.seq));
            let outcome = match (held, status) {
                (None, _) => AckOutcome::Unknown,
                (Some(_), AckStatus::Completed) => {
                    self.totals.acked += 1;
                    AckOutcome::Acked
                }
                (Some(attempts), AckStatus::Failed) => {
                    if attempts > opts.retry_limit {
                        q.drops.retry += 1;
                        self.totals.drops.retry += 1;
                        AckOutcome::Acked
                    } else {
                        pos.again.insert(m.seq, attempts);
                        AckOutcome::Redelivered
                    }
                }
            };
            out.push(outcome);
            if let Some(r) = q.partitions.get_mut(&m.partition) {
                let (n, b) = r.trim();
                freed_n += n;
                freed_b += b;
            }
            touched.insert(m.partition);
        }
        q.len -= freed_n;
        q.bytes -= freed_b;
        self.bytes -= freed_b;
        for p in touched {
            self.recount(queue, Some(&p));
        }
        out
    }

    /// Drop every message of `queue`, void its leases and forget its groups' positions;
    /// answers how many messages were dropped.
    pub fn reset(&mut self, queue: &str) -> u64 {
        let Some(q) = self.queues.get_mut(queue) else {
            return 0;
        };
        let dropped = q.len;
        self.bytes -= q.bytes;
        self.structure -= q.partitions.values().map(|r| r.cost).sum::<u64>();
        q.partitions.clear();
        q.len = 0;
        q.bytes = 0;
        self.totals.wiped += dropped;
        self.recount(queue, None);
        dropped
    }

    /// Forget `queue` entirely; answers whether this node held it.
    pub fn delete(&mut self, queue: &str) -> bool {
        self.reset(queue);
        self.leave(queue).is_some()
    }

    /// Apply `ttl` and lease expiry to every queue, forget idle groups and idle queues.
    /// `options` gives a queue's bounds and whether it is declared (a declared queue is never
    /// forgotten, only emptied of idle groups).
    pub fn sweep(&mut self, now: u64, options: &mut dyn FnMut(&str) -> (Options, bool)) {
        let names: Vec<String> = self.queues.keys().cloned().collect();
        let idle = self.limits.idle_ms;
        for name in names {
            let (opts, declared) = options(&name);
            self.sweep_queue(&name, &opts, now);
            if idle == 0 {
                continue;
            }
            let Some(q) = self.queues.get_mut(&name) else {
                continue;
            };
            let (mut freed_n, mut freed_b) = (0, 0);
            for ring in q.partitions.values_mut() {
                ring.groups
                    .retain(|_, g| !(g.leased.is_empty() && now.saturating_sub(g.seen) >= idle));
                let (n, b) = ring.trim();
                freed_n += n;
                freed_b += b;
            }
            let mut gone = 0;
            q.partitions.retain(|_, r| {
                let keep = !(r.held.is_empty() && r.groups.is_empty());
                if !keep {
                    gone += r.cost;
                }
                keep
            });
            q.len -= freed_n;
            q.bytes -= freed_b;
            self.bytes -= freed_b;
            self.structure -= gone;
            let forget = !declared && q.len == 0 && now.saturating_sub(q.used) >= idle;
            if forget {
                self.leave(&name);
            } else {
                self.recount_all(&name);
            }
        }
    }

    /// Age and lease rules of one queue.
    fn sweep_queue(&mut self, queue: &str, opts: &Options, now: u64) {
        let Some(q) = self.queues.get_mut(queue) else {
            return;
        };
        let (mut gone_n, mut gone_b) = (0, 0);
        for ring in q.partitions.values_mut() {
            if opts.ttl_ms > 0 {
                while ring
                    .held
                    .front()
                    .is_some_and(|h| h.at.saturating_add(opts.ttl_ms) <= now)
                {
                    let Some(cost) = ring.drop_front() else { break };
                    gone_n += 1;
                    gone_b += cost;
                    q.drops.ttl += 1;
                    self.totals.drops.ttl += 1;
                }
            }
            for g in ring.groups.values_mut() {
                let expired: Vec<(u64, u32)> = g
                    .leased
                    .iter()
                    .filter(|(_, l)| l.until <= now)
                    .map(|(s, l)| (*s, l.attempts))
                    .collect();
                for (seq, attempts) in expired {
                    g.leased.remove(&seq);
                    if attempts > opts.retry_limit {
                        q.drops.retry += 1;
                        self.totals.drops.retry += 1;
                    } else {
                        g.again.insert(seq, attempts);
                    }
                }
            }
            let (n, b) = ring.trim();
            gone_n += n;
            gone_b += b;
        }
        q.len -= gone_n;
        q.bytes -= gone_b;
        self.bytes -= gone_b;
        self.recount_all(queue);
    }

    /// `queue` as this node holds it; `group` narrows each partition's `pending`. `None` when
    /// this node holds nothing of it.
    #[must_use]
    pub fn view(&self, queue: &str, group: Option<&str>) -> Option<QueueView> {
        let q = self.queues.get(queue)?;
        let partitions = q
            .partitions
            .iter()
            .map(|(p, r)| PartitionView {
                partition: p.clone(),
                length: r.held.len() as u64,
                bytes: r.bytes,
                pending: group
                    .and_then(|g| r.groups.get(g))
                    .map_or(r.held.len() as u64, |g| g.pending(r.end())),
            })
            .collect();
        let mut groups: BTreeMap<&str, GroupView> = BTreeMap::new();
        for r in q.partitions.values() {
            for (name, g) in &r.groups {
                let v = groups.entry(name).or_insert_with(|| GroupView {
                    group: name.clone(),
                    pending: 0,
                    in_flight: 0,
                    skipped: 0,
                });
                v.pending += g.pending(r.end());
                v.in_flight += g.leased.len() as u64;
                v.skipped += g.skipped;
            }
        }
        Some(QueueView {
            length: q.len,
            bytes: q.bytes,
            partitions,
            groups: groups.into_values().collect(),
            drops: q.drops,
        })
    }

    /// Take `(queue, partition)` out of these rings to hand it to its next owner.
    pub fn detach(&mut self, queue: &str, partition: &str) -> Option<RingExport> {
        self.uncount_ring(queue, partition);
        let q = self.queues.get_mut(queue)?;
        let ring = q.partitions.remove(partition)?;
        q.len -= ring.held.len() as u64;
        q.bytes -= ring.bytes;
        self.bytes -= ring.bytes;
        self.recount(queue, None);
        let base = ring.base;
        let groups = ring
            .groups
            .into_iter()
            .map(|(name, g)| {
                let mut again: BTreeMap<u64, u32> = g.again;
                for (s, l) in g.leased {
                    again.insert(s, l.attempts);
                }
                let again = again
                    .into_iter()
                    .filter(|(s, _)| *s >= base)
                    .map(|(s, n)| (s - base, n))
                    .collect();
                GroupExport {
                    group: name,
                    next: g.next.saturating_sub(base),
                    again,
                    skipped: g.skipped,
                }
            })
            .collect();
        Some(RingExport {
            queue: queue.to_owned(),
            partition: partition.to_owned(),
            messages: ring
                .held
                .into_iter()
                .map(|h| (h.at, serde_bytes::ByteBuf::from(h.payload)))
                .collect(),
            groups,
        })
    }

    /// Take a ring handed over by its previous owner. Its messages go after any this node
    /// already holds for the partition (pushed here meanwhile), and its groups' positions are
    /// kept; the node's budget is not checked (the messages were already admitted once), the
    /// queue's bounds apply at the next push.
    pub fn adopt(&mut self, ring: RingExport, now: u64) -> u64 {
        // Handed-over rings were admitted once: no cap refuses them, but they are counted.
        self.uncount_ring(&ring.queue, &ring.partition);
        self.enter(&ring.queue);
        let q = self.queues.get_mut(&ring.queue).expect("entered above");
        q.used = now;
        let mine = q.partitions.remove(&ring.partition).unwrap_or_default();
        let mut merged = Ring::default();
        let count = ring.messages.len() as u64;
        for (at, p) in ring.messages {
            let h = Held {
                payload: p.into_vec(),
                at,
            };
            merged.bytes += h.cost();
            merged.held.push_back(h);
        }
        for g in ring.groups {
            merged.groups.insert(
                g.group,
                Position {
                    next: g.next.min(count),
                    leased: BTreeMap::new(),
                    again: g.again.into_iter().filter(|(s, _)| *s < count).collect(),
                    skipped: g.skipped,
                    seen: now,
                },
            );
        }
        // Messages pushed here before the hand-over landed follow the handed-over ones; a
        // group that only exists here had consumed from them: its position moves with them.
        let shift = count;
        for (name, g) in mine.groups {
            let moved = Position {
                next: g.next - mine.base + shift,
                leased: g
                    .leased
                    .into_iter()
                    .map(|(s, l)| (s - mine.base + shift, l))
                    .collect(),
                again: g
                    .again
                    .into_iter()
                    .map(|(s, n)| (s - mine.base + shift, n))
                    .collect(),
                skipped: g.skipped,
                seen: g.seen,
            };
            merged.groups.entry(name).or_insert(moved);
        }
        let added = merged.bytes;
        for h in mine.held {
            merged.bytes += h.cost();
            merged.held.push_back(h);
        }
        q.len += count;
        q.bytes += added;
        self.bytes += added;
        q.partitions.insert(ring.partition.clone(), merged);
        self.recount(&ring.queue, Some(&ring.partition));
        count
    }
}

/// How many of `q`'s oldest messages (by push time, across partitions) must go for `over` to
/// turn false: `(messages, bytes)`. Changes nothing.
fn oldest_first(q: &QueueRings, over: impl Fn(u64, u64) -> bool) -> (u64, u64) {
    let mut at: BTreeMap<&str, usize> = q.partitions.keys().map(|p| (p.as_str(), 0)).collect();
    let (mut len, mut bytes) = (q.len, q.bytes);
    let (mut n, mut b) = (0, 0);
    while over(len, bytes) {
        let next = q
            .partitions
            .iter()
            .filter_map(|(p, r)| {
                r.held
                    .get(at[p.as_str()])
                    .map(|h| (h.at, p.as_str(), h.cost()))
            })
            .min();
        let Some((_, p, cost)) = next else { break };
        *at.get_mut(p).expect("every partition is counted") += 1;
        len -= 1;
        bytes -= cost;
        n += 1;
        b += cost;
    }
    (n, b)
}

/// The partition whose front message is the oldest.
fn oldest_partition(q: &QueueRings) -> Option<String> {
    q.partitions
        .iter()
        .filter_map(|(p, r)| r.held.front().map(|h| (h.at, p)))
        .min()
        .map(|(_, p)| p.clone())
}
