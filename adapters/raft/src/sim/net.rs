//! The simulated network: openraft's RPCs between nodes of one process, each request and each
//! answer encoded and decoded with the raft port's own codec, delayed by a seeded draw, and
//! subject to the faults the driver sets: links cut one way, nodes held (their traffic waits
//! until released, then arrives late and out of order), random loss, crashed nodes.

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use crate::state_machine::Raft;
use openraft::errors::NetworkError;
use openraft::errors::RPCError;
use openraft::errors::ReplicationClosed;
use openraft::errors::StreamingError;
use openraft::errors::Unreachable;
use openraft::network::RPCOption;
use openraft::network::RaftNetworkFactory;
use openraft::network::v2::RaftNetworkV2;
use openraft::raft::AppendEntriesRequest;
use openraft::raft::AppendEntriesResponse;
use openraft::raft::SnapshotResponse;
use openraft::raft::TransferLeaderRequest;
use openraft::raft::TransferLeaderResponse;
use openraft::raft::VoteRequest;
use openraft::raft::VoteResponse;
use rand::RngExt;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::state_machine::Snapshot;
use crate::state_machine::SnapshotData;
use crate::type_config::NodeInfo;
use crate::type_config::TypeConfig;
use crate::type_config::Vote;
use crate::wire;

/// How long a request to a crashed node takes to fail (a refused connection).
const REFUSED: Duration = Duration::from_millis(1);

/// What the network does to traffic now; the driver changes it between steps.
#[derive(Debug, Default, Clone)]
pub(super) struct Faults {
    /// Directed links that drop everything: (from, to).
    pub(super) cut: BTreeSet<(u64, u64)>,
    /// Nodes whose traffic (both ways) waits until they are released.
    pub(super) held: BTreeSet<u64>,
    /// Per mille of messages lost.
    pub(super) loss_per_mille: u32,
    /// Delay of one message, drawn uniformly from this range (ms).
    pub(super) delay_ms: (u64, u64),
}

/// The network's state: who is up, the faults, the generator of every network draw.
struct State {
    /// The nodes that run, by id.
    up: BTreeMap<u64, Raft>,
    /// The faults in force.
    faults: Faults,
    /// The seed of every delay and loss.
    seed: u64,
    /// Messages sent so far on each directed link: a message's fate is drawn from the seed, its
    /// link and its number on the link, so that two messages sent at the same virtual instant
    /// get the same fates whichever of their tasks the executor polls first.
    per_link: BTreeMap<(u64, u64), u64>,
    /// Messages sent, lost, cut (counted for the report).
    sent: u64,
    lost: u64,
    cut: u64,
    /// Snapshots installed by their receiver.
    snapshots: u64,
    /// Every message's fate, when asked for (debugging a replay).
    pub(super) detail: Option<Vec<String>>,
}

/// The network all simulated nodes share.
#[derive(Clone)]
pub(super) struct Net {
    state: Arc<Mutex<State>>,
    /// Woken when held nodes are released.
    released: Arc<tokio::sync::Notify>,
}

/// What happened to one message.
enum Fate {
    /// Delivered after this delay.
    Deliver(Duration),
    /// Lost or cut: the sender waits for its timeout.
    Dropped,
}

impl Net {
    /// A network with no faults and no node up, its draws seeded; with `detail` it records
    /// every message's fate.
    pub(super) fn new(seed: u64, detail: bool) -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                up: BTreeMap::new(),
                faults: Faults {
                    delay_ms: (1, 3),
                    ..Faults::default()
                },
                seed,
                per_link: BTreeMap::new(),
                sent: 0,
                lost: 0,
                cut: 0,
                snapshots: 0,
                detail: detail.then(Vec::new),
            })),
            released: Arc::new(tokio::sync::Notify::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A node is up and reachable through `raft`.
    pub(super) fn set_up(&self, id: u64, raft: Raft) {
        self.lock().up.insert(id, raft);
    }

    /// A node crashed: calls to it are refused.
    pub(super) fn set_down(&self, id: u64) {
        self.lock().up.remove(&id);
    }

    /// The running node `id`, if up.
    pub(super) fn node(&self, id: u64) -> Option<Raft> {
        self.lock().up.get(&id).cloned()
    }

    /// Replace the faults.
    pub(super) fn set_faults(&self, faults: Faults) {
        self.lock().faults = faults;
        self.released.notify_waiters();
    }

    /// The fates recorded so far.
    pub(super) fn detail(&self) -> Vec<String> {
        self.lock().detail.clone().unwrap_or_default()
    }

    /// Messages sent, lost and cut so far, and snapshots installed.
    pub(super) fn counts(&self) -> (u64, u64, u64, u64) {
        let s = self.lock();
        (s.sent, s.lost, s.cut, s.snapshots)
    }

    /// Wait while `from` or `to` is held.
    async fn while_held(&self, from: u64, to: u64) {
        loop {
            let notified = self.released.notified();
            {
                let s = self.lock();
                if !s.faults.held.contains(&from) && !s.faults.held.contains(&to) {
                    return;
                }
            }
            notified.await;
        }
    }

    /// Decide one message's fate now (the cut is checked again on arrival).
    fn fate(&self, from: u64, to: u64) -> Fate {
        let mut s = self.lock();
        s.sent += 1;
        if s.faults.cut.contains(&(from, to)) {
            s.cut += 1;
            return Fate::Dropped;
        }
        let n = {
            let n = s.per_link.entry((from, to)).or_default();
            *n += 1;
            *n
        };
        let mut rng = SmallRng::seed_from_u64(
            s.seed ^ (from << 56) ^ (to << 48) ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15),
        );
        let loss = s.faults.loss_per_mille;
        if loss > 0 && rng.random_range(0..1000) < loss {
            s.lost += 1;
            return Fate::Dropped;
        }
        let (lo, hi) = s.faults.delay_ms;
        let d = if hi > lo {
            rng.random_range(lo..=hi)
        } else {
            lo
        };
        if let Some(detail) = &mut s.detail {
            let now = tokio::time::Instant::now();
            detail.push(format!("{now:?} {from}->{to} {d}"));
        }
        Fate::Deliver(Duration::from_millis(d))
    }

    /// Carry one message from `from` to `to`: wait while held, then drop it or deliver it after
    /// its delay. `Ok(true)` when it arrived, `Ok(false)` when it was lost or cut.
    async fn carry(&self, from: u64, to: u64) -> bool {
        self.while_held(from, to).await;
        match self.fate(from, to) {
            Fate::Dropped => false,
            Fate::Deliver(d) => {
                tokio::time::sleep(d).await;
                self.while_held(from, to).await;
                !self.lock().faults.cut.contains(&(from, to))
            }
        }
    }

    /// One request and its answer between `from` and `to`, through the codec, within `ttl`.
    /// A message that is lost makes the caller wait its whole timeout, as on a real network.
    pub(super) async fn call<Req, Resp, F, Fut, E>(
        &self,
        from: u64,
        to: u64,
        req: &Req,
        ttl: Duration,
        serve: F,
    ) -> Result<Resp, RPCError<TypeConfig>>
    where
        Req: Serialize + DeserializeOwned,
        Resp: Serialize + DeserializeOwned,
        F: FnOnce(Raft, Req) -> Fut,
        Fut: Future<Output = Result<Resp, E>>,
        E: std::fmt::Display,
    {
        let bytes = wire::encode(req).map_err(net_err)?;
        let trip = async {
            let Some(raft) = self.node(to) else {
                tokio::time::sleep(REFUSED).await;
                return Err(RPCError::Unreachable(Unreachable::from_string(format!(
                    "node {to} is down"
                ))));
            };
            if !self.carry(from, to).await {
                return Err(self.lost(ttl).await);
            }
            // The target may have crashed while the request travelled.
            if self.node(to).is_none() {
                return Err(self.lost(ttl).await);
            }
            let req: Req = wire::decode(&bytes).map_err(net_err)?;
            let resp = serve(raft, req).await.map_err(|e| net_err(e.to_string()))?;
            let back = wire::encode(&resp).map_err(net_err)?;
            if !self.carry(to, from).await {
                return Err(self.lost(ttl).await);
            }
            wire::decode(&back).map_err(net_err)
        };
        match tokio::time::timeout(ttl, trip).await {
            Ok(r) => r,
            Err(_) => Err(net_err("timed out")),
        }
    }

    /// A lost message: nothing comes back; the caller's timeout ends the wait.
    async fn lost(&self, ttl: Duration) -> RPCError<TypeConfig> {
        tokio::time::sleep(ttl).await;
        net_err("timed out")
    }

    /// A whole snapshot from `from` to `to`, handed over in-process (the chunks are read off the
    /// sender's pinned view by the receiver's install).
    async fn snapshot(
        &self,
        from: u64,
        to: u64,
        vote: Vote,
        snapshot: Snapshot,
        ttl: Duration,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let lost = || StreamingError::Network(NetworkError::from_string("snapshot lost"));
        let Some(raft) = self.node(to) else {
            tokio::time::sleep(REFUSED).await;
            return Err(StreamingError::Unreachable(Unreachable::from_string(
                "node is down",
            )));
        };
        let trip = async {
            if !self.carry(from, to).await || self.node(to).is_none() {
                tokio::time::sleep(ttl).await;
                return Err(lost());
            }
            let resp = raft
                .install_full_snapshot(vote, snapshot)
                .await
                .map_err(|e| StreamingError::Network(NetworkError::from_string(e.to_string())))?;
            self.lock().snapshots += 1;
            if !self.carry(to, from).await {
                tokio::time::sleep(ttl).await;
                return Err(lost());
            }
            Ok(resp)
        };
        // A snapshot is given ten chunk budgets to arrive whole.
        match tokio::time::timeout(ttl * 10, trip).await {
            Ok(r) => r,
            Err(_) => Err(lost()),
        }
    }
}

fn net_err(e: impl ToString) -> RPCError<TypeConfig> {
    RPCError::Network(NetworkError::from_string(e.to_string()))
}

/// The factory openraft asks for a client per target.
pub(super) struct Factory {
    /// The node that sends.
    pub(super) me: u64,
    /// The shared network.
    pub(super) net: Net,
}

impl RaftNetworkFactory<TypeConfig> for Factory {
    type Network = Client;

    async fn new_client(&mut self, target: u64, _node: &NodeInfo) -> Client {
        Client {
            me: self.me,
            target,
            net: self.net.clone(),
        }
    }
}

/// One node's client to one target.
pub(super) struct Client {
    me: u64,
    target: u64,
    net: Net,
}

impl RaftNetworkV2<TypeConfig> for Client {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.net
            .call(
                self.me,
                self.target,
                &rpc,
                crate::append_budget::rpc_timeout(&option, 0),
                |r, q| async move { r.append_entries(q).await },
            )
            .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.net
            .call(
                self.me,
                self.target,
                &rpc,
                crate::append_budget::rpc_timeout(&option, 0),
                |r, q| async move { r.vote(q).await },
            )
            .await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.net
            .call(
                self.me,
                self.target,
                &rpc,
                crate::append_budget::rpc_timeout(&option, 0),
                |r, q| async move { r.pre_vote(q).await },
            )
            .await
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.net
            .call(
                self.me,
                self.target,
                &req,
                crate::append_budget::rpc_timeout(&option, 0),
                |r, q| async move { r.handle_transfer_leader(q).await },
            )
            .await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        _cancel: impl Future<Output = ReplicationClosed> + openraft::OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        self.net
            .snapshot(
                self.me,
                self.target,
                vote,
                snapshot,
                crate::append_budget::rpc_timeout(&option, 0),
            )
            .await
    }
}
