//! Where an ephemeral operation is served: each (queue, partition) has one owner among the
//! live members (rendezvous hashing, computed alike on every node), and a node that does not
//! own a partition hands the operation to the one that does over the raft port. Operations on
//! a whole queue (a pop without a partition, reset, delete, depth, the listing) ask every
//! live member and put the answers together.
//!
//! Which members count as live: every member of the raft configuration, except one whose
//! last call from this node failed to connect, for `DOWN_FOR` after that failure. A node
//! learns of a member's return by trying it again once that time is up.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use queen_domain::ephemeral::{self, AckOutcome, GroupView, PartitionView, QueueView};
use queen_ports::{BrokerError, EphemeralAnswer, EphemeralOp, EphemeralQueue};

use super::Broker;
use super::ephemeral_lane::{self, ROUTE, Remote};

/// How long a member whose call failed to connect owns nothing in this node's view.
const DOWN_FOR: Duration = Duration::from_secs(5);
/// Deadline of a handed-over operation that does not wait.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a partition-less waiting pop parks between rounds over the members.
const ROUND: Duration = Duration::from_millis(200);

/// The members a node may hand operations to, and those it saw fail or say they leave.
#[derive(Default)]
pub(crate) struct Owners {
    /// Members excluded until the instant: a failed connection, or a member that said it
    /// stops (until it says it is ready, or the time is up).
    down: std::sync::Mutex<HashMap<u64, Instant>>,
    /// This node is stopping: it owns nothing any more.
    pub(crate) leaving: std::sync::atomic::AtomicBool,
    /// The raft members as last read, and when (read again after `MEMBERS_FRESH`).
    members: std::sync::Mutex<Option<(Instant, Vec<u64>)>>,
    /// What each other member said it held when last asked: `(epoch, messages)`.
    pub(crate) seen: std::sync::Mutex<HashMap<u64, (u64, u64)>>,
    /// Members that said they stop (their rings were handed over, not lost).
    pub(crate) graceful: std::sync::Mutex<std::collections::HashSet<u64>>,
    /// Members that came back with a new incarnation without having said they stop: what
    /// they held when last asked was lost. `(node, messages, when in ms)`, the last 32.
    pub(crate) losses: std::sync::Mutex<std::collections::VecDeque<(u64, u64, u64)>>,
}

/// How long the member list is used before it is read from raft again.
const MEMBERS_FRESH: Duration = Duration::from_millis(250);

impl Owners {
    fn mark_down(&self, node: u64) {
        self.exclude(node, DOWN_FOR);
    }

    /// Exclude `node` for `period` (a longer exclusion already in place stays).
    pub(crate) fn exclude(&self, node: u64, period: Duration) {
        let until = Instant::now() + period;
        let mut d = self.lock();
        let e = d.entry(node).or_insert(until);
        *e = (*e).max(until);
    }

    /// `node` said it is ready: it owns again.
    pub(crate) fn include(&self, node: u64) {
        self.lock().remove(&node);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Instant>> {
        self.down
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn is_down(&self, node: u64) -> bool {
        let mut d = self.lock();
        match d.get(&node) {
            Some(until) if *until > Instant::now() => true,
            Some(_) => {
                d.remove(&node);
                false
            }
            None => false,
        }
    }
}

impl Broker {
    /// This node's id and the live members (itself always among them); `None` on a node
    /// without peers, which owns everything.
    pub(super) fn eph_members(&self) -> Option<(u64, Vec<u64>)> {
        let peers = self.peers.as_ref()?;
        let me = peers.me();
        let membership = self.membership.as_ref()?;
        let all: Vec<u64> = {
            let mut cached = self
                .eph_owners
                .members
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match &*cached {
                Some((at, ids)) if at.elapsed() < MEMBERS_FRESH => ids.clone(),
                _ => {
                    let ids: Vec<u64> = membership.members().into_iter().map(|m| m.id).collect();
                    *cached = Some((Instant::now(), ids.clone()));
                    ids
                }
            }
        };
        if all.len() <= 1 {
            return None;
        }
        let leaving = self
            .eph_owners
            .leaving
            .load(std::sync::atomic::Ordering::Relaxed);
        let mut ids: Vec<u64> = all
            .into_iter()
            .filter(|id| {
                if *id == me {
                    !leaving
                } else {
                    !self.eph_owners.is_down(*id)
                }
            })
            .collect();
        if ids.is_empty() {
            // Nobody else is reachable: serve here rather than nowhere.
            ids.push(me);
        }
        Some((me, ids))
    }

    /// Hand `op` to node `target` and wait for its answer.
    pub(super) async fn eph_call(
        &self,
        target: u64,
        op: &EphemeralOp,
        timeout: Duration,
    ) -> Result<EphemeralAnswer, BrokerError> {
        let Some(peers) = &self.peers else {
            return Err(BrokerError::Unavailable("no peers".into()));
        };
        let answer = ephemeral_lane::call_one(&**peers, target, op, timeout).await;
        answer.map_err(|e| self.eph_failed(target, e))
    }

    /// Hand push `op` to owner `to` through the owner's lane (grouped with other pushes bound
    /// there) and wait for its answer.
    async fn eph_push_at(
        &self,
        to: u64,
        op: EphemeralOp,
        timeout: Duration,
    ) -> Result<EphemeralAnswer, BrokerError> {
        let Some(peers) = &self.peers else {
            return Err(BrokerError::Unavailable("no peers".into()));
        };
        let answer = self.eph_lanes.push(peers, to, op, timeout).await;
        answer.map_err(|e| self.eph_failed(to, e))
    }

    /// A failed hand-off's error; a member that could not be reached is marked down.
    fn eph_failed(&self, target: u64, (e, unreachable): (BrokerError, bool)) -> BrokerError {
        if unreachable {
            self.eph_owners.mark_down(target);
        }
        e
    }

    /// Serve `op` on node `to`: here when it is this node, else handed over with `timeout`.
    async fn eph_at(
        &self,
        to: u64,
        me: u64,
        op: EphemeralOp,
        timeout: Duration,
    ) -> Result<EphemeralAnswer, BrokerError> {
        if to == me {
            self.ephemeral_here(op).await
        } else {
            self.eph_call(to, &op, timeout).await
        }
    }

    /// Serve an operation another node handed over (always on this node's own rings).
    pub(crate) async fn ephemeral_from_peer(&self, body: Vec<u8>) -> Vec<u8> {
        let answer: Result<EphemeralAnswer, Remote> = match postcard::from_bytes(&body) {
            Ok(op) => self.ephemeral_handed(op).await,
            Err(e) => Err(Remote::Unavailable(format!(
                "the operation did not decode: {e}"
            ))),
        };
        postcard::to_allocvec(&answer).unwrap_or_default()
    }

    /// Serve the grouped pushes another node's lane sent (`ephemeral_lane.rs`): one after
    /// another, in order, each with its own answer.
    pub(crate) async fn ephemeral_many_from_peer(&self, body: Vec<u8>) -> Vec<u8> {
        let answer: Result<Vec<Result<EphemeralAnswer, Remote>>, Remote> =
            match postcard::from_bytes::<Vec<EphemeralOp>>(&body) {
                Ok(ops) => {
                    let mut out = Vec::with_capacity(ops.len());
                    for op in ops {
                        out.push(self.ephemeral_handed(op).await);
                    }
                    Ok(out)
                }
                Err(e) => Err(Remote::Unavailable(format!(
                    "the operations did not decode: {e}"
                ))),
            };
        postcard::to_allocvec(&answer).unwrap_or_default()
    }

    /// One operation handed over by another node.
    async fn ephemeral_handed(&self, op: EphemeralOp) -> Result<EphemeralAnswer, Remote> {
        if self
            .eph_owners
            .leaving
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            // A stopping node relays what it no longer holds to the next owner, so a ring it
            // shipped never grows a second copy here.
            Box::pin(self.ephemeral_op(op)).await.map_err(Remote::from)
        } else {
            self.ephemeral_here(op).await.map_err(Remote::from)
        }
    }

    /// Serve one ephemeral operation where its partition's owner is.
    pub(super) async fn ephemeral_op(
        &self,
        op: EphemeralOp,
    ) -> Result<EphemeralAnswer, BrokerError> {
        let Some((me, members)) = self.eph_members() else {
            return self.ephemeral_delete_config(op).await;
        };
        // A stopping node serves the rings it still holds (until they are shipped) and relays
        // the rest to their next owners; a shipment waits for the operations in progress.
        let leaving = self
            .eph_owners
            .leaving
            .load(std::sync::atomic::Ordering::Relaxed);
        let _shared = if leaving {
            Some(self.eph_ship_lock.read().await)
        } else {
            None
        };
        let owner = |queue: &str, partition: &str| {
            if leaving && self.ephemeral.lock().holds(queue, partition) {
                return me;
            }
            ephemeral::owner::owner(queue, partition, &members).unwrap_or(me)
        };
        // A stopping node does not park pops (a shipment would wait for them).
        let op = match op {
            EphemeralOp::Pop {
                queue,
                partition,
                group,
                batch,
                auto_ack,
                ..
            } if leaving => EphemeralOp::Pop {
                queue,
                partition,
                group,
                batch,
                wait_ms: None,
                auto_ack,
            },
            other => other,
        };
        match op {
            EphemeralOp::Push {
                ref queue,
                ref partition,
                ..
            } => {
                let to = owner(queue, partition);
                if to == me {
                    self.ephemeral_here(op).await
                } else {
                    self.eph_push_at(to, op, CALL_TIMEOUT).await
                }
            }
            EphemeralOp::Pop {
                ref queue,
                partition: Some(ref p),
                wait_ms,
                ..
            } => {
                let to = owner(queue, p);
                self.eph_at(
                    to,
                    me,
                    op,
                    CALL_TIMEOUT + Duration::from_millis(wait_ms.unwrap_or(0)),
                )
                .await
            }
            EphemeralOp::Pop { .. } => self.eph_pop_everywhere(me, &members, op).await,
            EphemeralOp::Ack { queue, group, acks } => {
                let mut by_owner: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
                for (i, (id, _)) in acks.iter().enumerate() {
                    let to =
                        ephemeral::MessageId::parse(id).map_or(me, |m| owner(&queue, &m.partition));
                    by_owner.entry(to).or_default().push(i);
                }
                let mut out = vec![AckOutcome::Unknown; acks.len()];
                for (to, idx) in by_owner {
                    let part = EphemeralOp::Ack {
                        queue: queue.clone(),
                        group: group.clone(),
                        acks: idx.iter().map(|i| acks[*i].clone()).collect(),
                    };
                    let answer = self.eph_at(to, me, part, CALL_TIMEOUT).await?;
                    let EphemeralAnswer::Acked(got) = answer else {
                        return Err(BrokerError::unexpected_outcome());
                    };
                    for (i, o) in idx.into_iter().zip(got) {
                        out[i] = o;
                    }
                }
                Ok(EphemeralAnswer::Acked(out))
            }
            EphemeralOp::Reset { .. } => {
                let mut dropped = 0;
                for to in &members {
                    let answer = self.eph_at(*to, me, op.clone(), CALL_TIMEOUT).await;
                    if let Ok(EphemeralAnswer::Dropped(n)) = answer {
                        dropped += n;
                    }
                }
                Ok(EphemeralAnswer::Dropped(dropped))
            }
            EphemeralOp::Delete { ref queue } => {
                let declared = self.ephemeral_unconfigure(queue).await?;
                let mut held = false;
                for to in &members {
                    let answer = self.eph_at(*to, me, op.clone(), CALL_TIMEOUT).await;
                    held |= matches!(answer, Ok(EphemeralAnswer::Deleted(true)));
                }
                Ok(EphemeralAnswer::Deleted(declared || held))
            }
            EphemeralOp::Depth { .. } => {
                // Configuration as the cluster committed it, not as this node applied it.
                self.proposer.read_barrier().await?;
                let mut found: Option<EphemeralQueue> = None;
                for to in me_first(me, &members) {
                    let answer = self.eph_at(to, me, op.clone(), CALL_TIMEOUT).await;
                    match answer {
                        Ok(EphemeralAnswer::Depth(q)) => merge_into(&mut found, q, to == me),
                        Err(BrokerError::EphemeralQueueNotFound { .. }) => {}
                        Err(e) if to == me => return Err(e),
                        _ => {}
                    }
                }
                let EphemeralOp::Depth { queue, .. } = op else {
                    unreachable!("matched above")
                };
                found.map(EphemeralAnswer::Depth).ok_or_else(|| {
                    BrokerError::EphemeralQueueNotFound {
                        queue: queen_domain::tenant::split(&queue).1.to_owned(),
                    }
                })
            }
            EphemeralOp::Queues { .. } | EphemeralOp::QueuesPage { .. } => {
                self.proposer.read_barrier().await?;
                let mut all: BTreeMap<String, EphemeralQueue> = BTreeMap::new();
                let mut more = false;
                for to in me_first(me, &members) {
                    let answer = self.eph_at(to, me, op.clone(), CALL_TIMEOUT).await;
                    let qs = match answer {
                        Ok(EphemeralAnswer::Queues(qs)) => qs,
                        Ok(EphemeralAnswer::QueuesPage { queues, more: m }) => {
                            more |= m;
                            queues
                        }
                        Err(e) if to == me => return Err(e),
                        _ => continue,
                    };
                    for q in qs {
                        let mut slot = all.remove(&q.queue);
                        let name = q.queue.clone();
                        merge_into(&mut slot, q, to == me);
                        if let Some(s) = slot {
                            all.insert(name, s);
                        }
                    }
                }
                let EphemeralOp::QueuesPage { limit, .. } = op else {
                    return Ok(EphemeralAnswer::Queues(all.into_values().collect()));
                };
                // Each member's first `limit` after the cursor: the union's first `limit` are
                // the cluster's.
                let limit = limit as usize;
                more |= all.len() > limit;
                Ok(EphemeralAnswer::QueuesPage {
                    queues: all.into_values().take(limit).collect(),
                    more,
                })
            }
            EphemeralOp::Configure { .. } => self.ephemeral_here(op).await,
        }
    }

    /// On a node without peers: a delete also removes the configuration row.
    async fn ephemeral_delete_config(
        &self,
        op: EphemeralOp,
    ) -> Result<EphemeralAnswer, BrokerError> {
        if let EphemeralOp::Delete { queue } = &op {
            let declared = self.ephemeral_unconfigure(queue).await?;
            let held = matches!(
                self.ephemeral_here(op).await?,
                EphemeralAnswer::Deleted(true)
            );
            return Ok(EphemeralAnswer::Deleted(declared || held));
        }
        self.ephemeral_here(op).await
    }

    /// A pop that names no partition: this node's rings first, then each other live member's,
    /// until the batch is full; when all are empty and the pop waits, park here a short round
    /// (a push here wakes it) and ask again, until the wait is over.
    async fn eph_pop_everywhere(
        &self,
        me: u64,
        members: &[u64],
        op: EphemeralOp,
    ) -> Result<EphemeralAnswer, BrokerError> {
        let EphemeralOp::Pop {
            queue,
            group,
            batch,
            wait_ms,
            auto_ack,
            ..
        } = op
        else {
            return Err(BrokerError::unexpected_outcome());
        };
        let deadline = Instant::now() + Duration::from_millis(wait_ms.unwrap_or(0));
        // Start after this node among the others by id, so pops through different nodes
        // spread over the members.
        let mut others: Vec<u64> = members.iter().copied().filter(|m| *m != me).collect();
        others.sort_unstable();
        let turn = others.iter().position(|m| *m > me).unwrap_or(0);
        others.rotate_left(turn);
        loop {
            let mut out = Vec::new();
            for to in std::iter::once(me).chain(others.iter().copied()) {
                let want = batch.saturating_sub(u32::try_from(out.len()).unwrap_or(u32::MAX));
                if want == 0 {
                    break;
                }
                let part = EphemeralOp::Pop {
                    queue: queue.clone(),
                    partition: None,
                    group: group.clone(),
                    batch: want,
                    wait_ms: None,
                    auto_ack,
                };
                let answer = self.eph_at(to, me, part, CALL_TIMEOUT).await;
                match answer {
                    Ok(EphemeralAnswer::Delivered(got)) => out.extend(got),
                    Err(e) if to == me => return Err(e),
                    _ => {}
                }
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if !out.is_empty() || remaining.is_zero() {
                return Ok(EphemeralAnswer::Delivered(out));
            }
            // Park here for a round: a push to this node's rings wakes it at once.
            let park = EphemeralOp::Pop {
                queue: queue.clone(),
                partition: None,
                group: group.clone(),
                batch,
                wait_ms: Some(u64::try_from(remaining.min(ROUND).as_millis()).unwrap_or(200)),
                auto_ack,
            };
            if let EphemeralAnswer::Delivered(got) = self.ephemeral_here(park).await?
                && !got.is_empty()
            {
                return Ok(EphemeralAnswer::Delivered(got));
            }
        }
    }
}

/// Add one node's share of a queue to the sum.
/// This node, then the other members.
fn me_first(me: u64, members: &[u64]) -> Vec<u64> {
    std::iter::once(me)
        .chain(members.iter().copied().filter(|m| *m != me))
        .collect()
}

/// Whether a queue is declared, and its options, come from the node that was asked (after a
/// read barrier); the other members add only what they hold.
fn merge_into(sum: &mut Option<EphemeralQueue>, mut q: EphemeralQueue, from_me: bool) {
    let Some(s) = sum else {
        if !from_me {
            q.declared = false;
        }
        *sum = Some(q);
        return;
    };
    if from_me {
        s.declared = q.declared;
        s.options = q.options;
    }
    s.view = merge_views(std::mem::take(&mut s.view), q.view);
}

fn merge_views(a: QueueView, b: QueueView) -> QueueView {
    let mut partitions: Vec<PartitionView> = a.partitions;
    partitions.extend(b.partitions);
    partitions.sort_by(|x, y| x.partition.cmp(&y.partition));
    let mut groups: BTreeMap<String, GroupView> = BTreeMap::new();
    for g in a.groups.into_iter().chain(b.groups) {
        match groups.get_mut(&g.group) {
            Some(s) => {
                s.pending += g.pending;
                s.in_flight += g.in_flight;
                s.skipped += g.skipped;
            }
            None => {
                groups.insert(g.group.clone(), g);
            }
        }
    }
    QueueView {
        length: a.length + b.length,
        bytes: a.bytes + b.bytes,
        partitions,
        groups: groups.into_values().collect(),
        drops: ephemeral::Drops {
            bounds: a.drops.bounds + b.drops.bounds,
            ttl: a.drops.ttl + b.drops.ttl,
            retry: a.drops.retry + b.drops.retry,
        },
    }
}

/// Serves the ephemeral operations other nodes hand to this one. It holds the broker weakly:
/// the broker holds the raft node that holds this, and the broker must still drop at the end.
pub(crate) struct PeerService(pub(crate) std::sync::Weak<Broker>);

impl queen_ports::PeerHandler for PeerService {
    fn handle(&self, route: String, body: Vec<u8>) -> queen_ports::BoxFuture<'static, Vec<u8>> {
        let broker = self.0.upgrade();
        Box::pin(async move {
            let Some(broker) = broker else {
                return postcard::to_allocvec(&Err::<EphemeralAnswer, Remote>(
                    Remote::Unavailable("the node is stopping".into()),
                ))
                .unwrap_or_default();
            };
            if route == ROUTE {
                broker.ephemeral_from_peer(body).await
            } else if route == super::ephemeral_lane::MANY_ROUTE {
                broker.ephemeral_many_from_peer(body).await
            } else if route == super::nodes::NODE_ROUTE {
                serde_json::to_vec(&broker.node_figures()).unwrap_or_default()
            } else if let Some(answer) = broker.ephemeral_handover_call(&route, &body).await {
                answer
            } else {
                postcard::to_allocvec(&Err::<EphemeralAnswer, Remote>(Remote::Unavailable(
                    format!("no peer route {route}"),
                )))
                .unwrap_or_default()
            }
        })
    }
}
