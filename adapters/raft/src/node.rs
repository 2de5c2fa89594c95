//! `RaftNode`: one running raft node (openraft core, log store, state machine) behind the
//! `ReplicatedLog` port. This is where openraft's errors become port errors.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Duration;

use openraft::ReadPolicy;
use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;
use openraft::errors::ClientWriteError;
use openraft::errors::Fatal;
use openraft::errors::InitializeError;
use openraft::errors::LinearizableReadError;
use openraft::errors::RaftError;
use queen_ports::LogProgress;
use queen_ports::Member;
use queen_ports::Membership;
use queen_ports::MembershipChange;
use queen_ports::MembershipError;
use queen_ports::ProposeError;
use queen_ports::RaftRole;
use queen_ports::ReplicatedLog;
use queen_ports::StateMachineBackend;
use tokio::sync::Semaphore;

use crate::config::Peer;
use crate::config::RaftNodeConfig;
use crate::error::RaftShutdownError;
use crate::error::RaftStartError;
use crate::log_store::LogLiveness;
use crate::log_store::LogStore;
use crate::log_store::LogStoreOptions;
use crate::network::CallError;
use crate::network::NetworkFactory;
use crate::network::Transport;
use crate::network::full;
use crate::server::BodyLimits;
use crate::server::RaftServer;
use crate::snapshot_spool::SnapshotSpool;
use crate::state_machine::StateMachineStore;
use crate::type_config::Command;
use crate::type_config::NodeInfo;
use crate::type_config::Raft;
use crate::type_config::TypeConfig;
use crate::wire;

/// How long `shutdown` waits for the log store to be dropped (and its directory lock released).
const LOG_RELEASE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a multi-node `start` waits until some leader is known.
const LEADER_KNOWN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a forwarded command may take on the leader (append, commit, apply).
const FORWARD_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a follower waits to apply up to the index of its forwarded command or read index.
const APPLY_WAIT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long asking the leader for a read index may take.
const READ_INDEX_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a leader stepping down waits for another leader.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(3);
/// Attempts of a forward when the addressed node no longer leads.
const FORWARD_ATTEMPTS: usize = 3;

/// A running raft node. Cheap to clone; all clones drive the same node.
#[derive(Clone)]
pub struct RaftNode {
    /// Shared by all clones.
    inner: Arc<NodeInner>,
}

/// The parts of a node.
struct NodeInner {
    /// This node's id, for progress figures.
    node_id: u64,
    /// The openraft handle.
    raft: Raft,
    /// fdatasync/fsync calls made by the log store.
    fsyncs: Arc<AtomicU64>,
    /// Tells when the log store is gone after shutdown.
    log_liveness: LogLiveness,
    /// Whether other voters were configured (multi-node transport in use).
    multi: bool,
    /// The configured peers, to find a leader's raft address when the membership lacks it.
    peers: Vec<Peer>,
    /// The client side of the raft port (forwarding, read index).
    transport: Arc<Transport>,
    /// The raft-port server, until shutdown.
    server: tokio::sync::Mutex<Option<RaftServer>>,
    /// The highest log format this node reads.
    log_kinds: u32,
}

impl RaftNode {
    /// Open the log in `cfg.dir/log`, wrap `backend`, and start the raft core.
    ///
    /// On an empty directory with a single voter, the membership `{node_id}` is initialized
    /// once. On restart the log is recovered and the node resumes: the state machine's last
    /// applied point comes from `backend.load_meta()`, and openraft re-applies the committed
    /// entries after it from the log. A single voter campaigns at once and this call waits (up
    /// to a few election timeouts) until it leads.
    ///
    /// With several peers the node serves raft RPCs on its own `raft_addr` (HTTP/1, token
    /// checked). On empty directories the voter with the smallest id initializes the membership
    /// from the peer list and the others wait to be contacted; afterwards the membership lives
    /// in the log. This call waits until some leader is known or 10 s passed, then returns Ok.
    ///
    /// # Errors
    /// A bad config, a log that cannot be opened or recovered (corruption, directory in use), a
    /// backend that cannot load its meta, or a raft core that does not start.
    pub async fn start(
        cfg: RaftNodeConfig,
        backend: Arc<dyn StateMachineBackend>,
    ) -> Result<RaftNode, RaftStartError> {
        let options = LogStoreOptions {
            segment_max_bytes: cfg.log_segment_bytes,
            ..LogStoreOptions::default()
        };
        Self::start_with(cfg, backend, options).await
    }

    /// `start` with explicit log store tuning.
    pub(crate) async fn start_with(
        cfg: RaftNodeConfig,
        backend: Arc<dyn StateMachineBackend>,
        log_options: LogStoreOptions,
    ) -> Result<RaftNode, RaftStartError> {
        cfg.validate()?;
        let raft_config = Arc::new(cfg.openraft_config()?);

        let log_dir = cfg.log_dir();
        let open_dir = log_dir.clone();
        let store = tokio::task::spawn_blocking(move || LogStore::open(&open_dir, log_options))
            .await
            .map_err(|e| RaftStartError::LogStore {
                path: log_dir.clone(),
                source: std::io::Error::other(e.to_string()),
            })?
            .map_err(|source| RaftStartError::LogStore {
                path: log_dir.clone(),
                source,
            })?;
        let fsyncs = store.fsync_counter();
        let log_liveness = store.liveness();

        let files = store.files();
        let spans = files.clone();
        let handles = crate::state_machine::LogHandles {
            files: Arc::new(files),
            spans: Arc::new(move |index, len| spans.command_span(index, len)),
        };
        let sm = StateMachineStore::open(backend, Some(handles))
            .await
            .map_err(RaftStartError::StateMachine)?;

        let multi = !cfg.is_single_voter() || cfg.join;
        // Only a node with peers receives snapshots; opening the spool deletes what a process
        // that died mid-transfer or mid-install left there.
        let spool = if multi {
            let dir = cfg.dir.clone();
            let spool_error = |source| RaftStartError::SnapshotSpool {
                path: cfg.dir.clone(),
                source,
            };
            let opened = tokio::task::spawn_blocking(move || SnapshotSpool::open(&dir))
                .await
                .map_err(|e| spool_error(std::io::Error::other(e.to_string())))?
                .map_err(spool_error)?;
            Some(opened)
        } else {
            None
        };

        let faults = cfg.faults_file.clone().map(crate::network::Faults::new);
        let transport = Transport::new(cfg.token.clone(), faults);
        let factory = NetworkFactory {
            transport: transport.clone(),
        };
        let raft = Raft::new(cfg.node_id, raft_config, factory, store, sm)
            .await
            .map_err(|e| RaftStartError::Raft(e.to_string()))?;

        let mut server = None;
        if let Some(snapshot_spool) = spool {
            let addr = cfg
                .peers
                .iter()
                .find(|p| p.id == cfg.node_id)
                .map(|p| p.raft_addr.clone())
                .unwrap_or_default();
            let limits = BodyLimits {
                max_bytes: cfg.max_body_bytes,
                timeout: cfg.body_timeout,
                budget: Arc::new(Semaphore::new(cfg.body_budget_bytes)),
                snapshot_spool,
            };
            match RaftServer::start(
                &addr,
                raft.clone(),
                cfg.token.clone(),
                cfg.node_id,
                transport.clone(),
                cfg.log_kinds,
                limits,
            )
            .await
            {
                Ok(s) => server = Some(s),
                Err(source) => {
                    // Stop the core so the log directory is released.
                    let _ = raft.shutdown().await;
                    return Err(RaftStartError::Listen { addr, source });
                }
            }
        }

        let node = RaftNode {
            inner: Arc::new(NodeInner {
                node_id: cfg.node_id,
                raft,
                fsyncs,
                log_liveness,
                multi,
                peers: cfg.peers.clone(),
                transport,
                server: tokio::sync::Mutex::new(server),
                log_kinds: cfg.log_kinds,
            }),
        };
        if multi {
            if let Err(e) = node.join_cluster(&cfg).await {
                let _ = node.shutdown().await;
                return Err(e);
            }
        } else {
            node.join_or_form(&cfg).await?;
        }
        Ok(node)
    }

    /// Multi-node start: on a fresh cluster the voter with the smallest id initializes the
    /// membership from the peer list (the others wait to be contacted); then wait, bounded,
    /// until some leader is known.
    async fn join_cluster(&self, cfg: &RaftNodeConfig) -> Result<(), RaftStartError> {
        let raft = &self.inner.raft;
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| RaftStartError::Raft(e.to_string()))?;
        let smallest = cfg.peers.iter().map(|p| p.id).min();
        if cfg.join && !initialized {
            tracing::info!(
                node_id = cfg.node_id,
                "joining: waiting to be added as a learner"
            );
            return Ok(());
        }
        if !initialized && smallest == Some(cfg.node_id) {
            let members: BTreeMap<u64, NodeInfo> = cfg
                .peers
                .iter()
                .map(|p| {
                    (
                        p.id,
                        NodeInfo {
                            raft_addr: p.raft_addr.clone(),
                            http_addr: p.http_addr.clone(),
                        },
                    )
                })
                .collect();
            match raft.initialize(members).await {
                Ok(()) => tracing::info!(
                    node_id = cfg.node_id,
                    voters = cfg.peers.len(),
                    "raft cluster initialized"
                ),
                Err(RaftError::APIError(InitializeError::NotAllowed(e))) => {
                    tracing::info!(reason = %e, "raft cluster already initialized");
                }
                Err(e) => return Err(RaftStartError::Raft(e.to_string())),
            }
        } else if !initialized {
            tracing::info!(
                node_id = cfg.node_id,
                "empty raft log: waiting to be contacted by the cluster"
            );
        }
        match raft
            .wait(Some(LEADER_KNOWN_TIMEOUT))
            .metrics(|m| m.current_leader.is_some(), "a leader is known")
            .await
        {
            Ok(m) => tracing::info!(
                node_id = cfg.node_id,
                leader = ?m.current_leader,
                "raft node joined its cluster"
            ),
            Err(e) => tracing::warn!(
                node_id = cfg.node_id,
                error = %e,
                "no raft leader known yet; continuing to start"
            ),
        }
        Ok(())
    }

    /// The raft address of `leader`: from the membership, else from the configured peers.
    fn leader_addr(&self, leader: u64, hint: Option<&NodeInfo>) -> Option<String> {
        if let Some(n) = hint.filter(|n| !n.raft_addr.is_empty()) {
            return Some(n.raft_addr.clone());
        }
        let m = self.inner.raft.metrics().borrow_watched().clone();
        if let Some(n) = m.membership_config.get_node(&leader)
            && !n.raft_addr.is_empty()
        {
            return Some(n.raft_addr.clone());
        }
        self.inner
            .peers
            .iter()
            .find(|p| p.id == leader)
            .map(|p| p.raft_addr.clone())
    }

    /// The leader this node currently knows (from metrics), other than itself.
    fn known_leader(&self) -> Option<u64> {
        self.inner.raft.metrics().borrow_watched().current_leader
    }

    /// Hand a command to `leader` over the raft port and wait until this node has applied the
    /// entry that carried it.
    async fn forward(
        &self,
        leader: u64,
        addr: &str,
        command: &[u8],
    ) -> Result<Vec<u8>, ProposeError> {
        let bytes = self
            .inner
            .transport
            .post(
                leader,
                addr,
                wire::FORWARD,
                full(bytes::Bytes::copy_from_slice(command)),
                FORWARD_TIMEOUT,
            )
            .await
            .map_err(|e| forward_call_error(leader, e))?;
        let reply: wire::ForwardReply = wire::decode(&bytes).map_err(|e| {
            tracing::warn!(leader, error = %e, "undecodable forward reply");
            ProposeError::OutcomeUnknown
        })?;
        let fwd = reply.map_err(ProposeError::from)?;
        if !self.wait_applied(fwd.index, APPLY_WAIT_TIMEOUT).await {
            tracing::warn!(
                index = fwd.index,
                "forwarded command committed but not applied here in time"
            );
            return Err(ProposeError::OutcomeUnknown);
        }
        Ok(fwd.data)
    }

    /// `propose` on a multi-node group: write locally when leading, else forward to the leader.
    async fn propose_multi(&self, command: Vec<u8>) -> Result<Vec<u8>, ProposeError> {
        let command = bytes::Bytes::from(command);
        let raft = &self.inner.raft;
        let mut hint: Option<(u64, Option<NodeInfo>)> = None;
        for attempt in 1..=FORWARD_ATTEMPTS {
            let target = match hint.take() {
                Some(h) => Some(h),
                None if raft.is_leader() => None,
                None => match self.known_leader() {
                    Some(l) if l == self.inner.node_id => None,
                    Some(l) => Some((l, None)),
                    None => return Err(ProposeError::NotLeader { leader: None }),
                },
            };
            let Some((leader, node)) = target else {
                match raft.client_write(Command(command.clone())).await {
                    Ok(resp) => return Ok(resp.data),
                    Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                        match f.leader_id {
                            Some(l) if l != self.inner.node_id => {
                                hint = Some((l, f.leader_node));
                                continue;
                            }
                            _ => return Err(ProposeError::NotLeader { leader: None }),
                        }
                    }
                    Err(e) => return Err(map_write_error(e)),
                }
            };
            let Some(addr) = self.leader_addr(leader, node.as_ref()) else {
                return Err(ProposeError::NotLeader {
                    leader: Some(leader),
                });
            };
            match self.forward(leader, &addr, &command).await {
                Err(ProposeError::NotLeader { leader: next }) if attempt < FORWARD_ATTEMPTS => {
                    tokio::time::sleep(Duration::from_millis(20 * attempt as u64)).await;
                    if let Some(n) = next.filter(|n| *n != leader) {
                        hint = Some((n, None));
                    }
                }
                r => return r,
            }
        }
        Err(ProposeError::NotLeader {
            leader: self.known_leader(),
        })
    }

    /// `read_barrier` on a multi-node group: a leader confirms its read index itself; a
    /// follower asks the leader for it and waits until it has applied that far.
    async fn read_barrier_multi(&self) -> Result<(), ProposeError> {
        let raft = &self.inner.raft;
        let leader = self.known_leader();
        if raft.is_leader() || leader == Some(self.inner.node_id) {
            return raft
                .ensure_linearizable(ReadPolicy::ReadIndex)
                .await
                .map(|_| ())
                .map_err(map_read_error);
        }
        let Some(leader) = leader else {
            return Err(ProposeError::NotLeader { leader: None });
        };
        let Some(addr) = self.leader_addr(leader, None) else {
            return Err(ProposeError::NotLeader {
                leader: Some(leader),
            });
        };
        let bytes = self
            .inner
            .transport
            .post(
                leader,
                &addr,
                wire::READ_INDEX,
                full(bytes::Bytes::new()),
                READ_INDEX_TIMEOUT,
            )
            .await
            .map_err(|e| ProposeError::Unavailable(format!("read index from {leader}: {e}")))?;
        let reply: wire::ReadIndexReply =
            wire::decode(&bytes).map_err(ProposeError::Unavailable)?;
        let index = reply.map_err(ProposeError::from)?;
        if self.wait_applied(index, APPLY_WAIT_TIMEOUT).await {
            Ok(())
        } else {
            Err(ProposeError::Unavailable(format!(
                "did not apply up to read index {index} in time"
            )))
        }
    }

    /// On a leader of a multi-node group: hand leadership to the most caught-up other voter and
    /// wait (up to 3 s) until another leader is known. Returns the new leader and how long the
    /// hand-off took in milliseconds; `None` when this node does not lead, has no other voter,
    /// or no other leader appeared in time.
    pub async fn transfer_leadership(&self) -> Option<(u64, u128)> {
        let raft = &self.inner.raft;
        let me = self.inner.node_id;
        let m = raft.metrics().borrow_watched().clone();
        if m.state != ServerState::Leader {
            return None;
        }
        let replication = m.replication.clone().unwrap_or_default();
        let to = m
            .membership_config
            .voter_ids()
            .filter(|id| *id != me)
            .max_by_key(|id| replication.get(id).cloned().flatten().map(|l| l.index))?;
        let started = std::time::Instant::now();
        if let Err(e) = raft.trigger().transfer_leader(to).await {
            tracing::warn!(to, error = %e, "leader transfer could not be started");
            return None;
        }
        match raft
            .wait(Some(TRANSFER_TIMEOUT))
            .metrics(
                |m| m.current_leader.is_some_and(|l| l != me),
                "another leader after transfer",
            )
            .await
        {
            Ok(m) => {
                let new = m.current_leader.unwrap_or(to);
                let ms = started.elapsed().as_millis();
                tracing::info!("leadership handed off to={new} ms={ms}");
                Some((new, ms))
            }
            Err(e) => {
                tracing::warn!(to, error = %e, "leadership hand-off did not complete in time");
                None
            }
        }
    }

    /// Initialize a fresh single-voter group, or campaign at once after a restart.
    async fn join_or_form(&self, cfg: &RaftNodeConfig) -> Result<(), RaftStartError> {
        let raft = &self.inner.raft;
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| RaftStartError::Raft(e.to_string()))?;
        if initialized {
            // The only voter: no need to sit out an election timeout before leading again.
            if let Err(e) = raft.trigger().elect(false).await {
                return Err(RaftStartError::Raft(e.to_string()));
            }
        } else {
            let info = cfg
                .peers
                .first()
                .map(|p| NodeInfo {
                    raft_addr: p.raft_addr.clone(),
                    http_addr: p.http_addr.clone(),
                })
                .unwrap_or_default();
            let members = BTreeMap::from([(cfg.node_id, info)]);
            match raft.initialize(members).await {
                Ok(()) => tracing::info!(node_id = cfg.node_id, "raft group initialized"),
                Err(RaftError::APIError(InitializeError::NotAllowed(e))) => {
                    tracing::info!(reason = %e, "raft group already initialized");
                }
                Err(e) => return Err(RaftStartError::Raft(e.to_string())),
            }
        }

        let wait = Duration::from_millis(cfg.election_max_ms.saturating_mul(5));
        match raft
            .wait(Some(wait))
            .current_leader(cfg.node_id, "single voter becomes leader")
            .await
        {
            Ok(_) => tracing::info!(node_id = cfg.node_id, "raft node leads"),
            Err(e) => tracing::warn!(error = %e, "raft node did not become leader in time"),
        }
        Ok(())
    }

    /// Stop the raft core and wait until the log store is closed, so the same directory can be
    /// opened again. A leader of a multi-node group first hands leadership to the most
    /// caught-up voter (waiting up to 3 s); the raft port closes after the core stopped.
    ///
    /// # Errors
    /// The core ended abnormally, or the log store was still held after the core stopped.
    pub async fn shutdown(&self) -> Result<(), RaftShutdownError> {
        let server = self.inner.server.lock().await.take();
        if self.inner.multi && server.is_some() {
            let _ = self.transfer_leadership().await;
        }
        let core = self
            .inner
            .raft
            .shutdown()
            .await
            .map_err(|e| RaftShutdownError::Core(e.to_string()));
        if let Some(s) = server {
            s.stop().await;
        }
        core?;
        let deadline = tokio::time::Instant::now() + LOG_RELEASE_TIMEOUT;
        while !self.inner.log_liveness.is_released() {
            if tokio::time::Instant::now() >= deadline {
                return Err(RaftShutdownError::LogNotReleased(LOG_RELEASE_TIMEOUT));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tracing::info!(node_id = self.inner.node_id, "raft node stopped");
        Ok(())
    }

    /// Number of fdatasync/fsync calls the log store made since it opened (for benchmarks).
    pub fn fsync_count(&self) -> u64 {
        self.inner.fsyncs.load(Ordering::Relaxed)
    }

    /// Index of the last entry purged from this node's log (0 when none): a follower whose
    /// applied index is below it can only catch up by snapshot.
    pub fn purged_index(&self) -> u64 {
        self.inner
            .raft
            .metrics()
            .borrow_watched()
            .purged
            .map_or(0, |l| l.index)
    }

    /// Build a snapshot of what this node applied and purge its log up to it, past the entries
    /// the log normally keeps below a snapshot for followers that lag a little (they catch up by
    /// snapshot instead). The log files whose messages were all deleted then go at once, and
    /// the others move to the archive, instead of waiting for the next scheduled snapshot. False
    /// when it did not finish within `timeout` (it may still finish later).
    pub async fn compact_log(&self, timeout: Duration) -> bool {
        let raft = &self.inner.raft;
        let applied = raft
            .metrics()
            .borrow_watched()
            .last_applied
            .map_or(0, |l| l.index);
        if applied == 0 || raft.trigger().snapshot().await.is_err() {
            return false;
        }
        let Ok(m) = raft
            .wait(Some(timeout))
            .metrics(
                |m| m.snapshot.is_some_and(|s| s.index >= applied),
                "compact_log snapshot",
            )
            .await
        else {
            return false;
        };
        let upto = m.snapshot.map_or(0, |s| s.index);
        if raft.trigger().purge_log(upto).await.is_err() {
            return false;
        }
        raft.wait(Some(timeout))
            .metrics(
                |m| m.purged.is_some_and(|p| p.index >= upto),
                "compact_log purge",
            )
            .await
            .is_ok()
    }

    /// Wait until this node has applied `index`; false on timeout or when the node stopped.
    pub async fn wait_applied(&self, index: u64, timeout: Duration) -> bool {
        self.inner
            .raft
            .wait(Some(timeout))
            .applied_index_at_least(Some(index), "wait_applied")
            .await
            .is_ok()
    }
}

/// A failed forward call as the app sees it: nothing sent means retry; maybe sent means unknown.
fn forward_call_error(leader: u64, e: CallError) -> ProposeError {
    match e {
        CallError::Connect(e) => {
            ProposeError::Unavailable(format!("leader {leader} is unreachable: {e}"))
        }
        CallError::Status(401, _) => {
            ProposeError::Unavailable(format!("leader {leader} refused the raft token"))
        }
        CallError::Status(s, b) => {
            ProposeError::Unavailable(format!("leader {leader} answered {s}: {b}"))
        }
        CallError::Timeout | CallError::Sent(_) => ProposeError::OutcomeUnknown,
    }
}

fn map_fatal(e: Fatal<TypeConfig>) -> ProposeError {
    match e {
        Fatal::Stopped => ProposeError::Unavailable("raft node stopped".into()),
        Fatal::Panicked => ProposeError::Fatal("raft core panicked".into()),
        Fatal::StorageError(e) => ProposeError::Fatal(e.to_string()),
    }
}

pub(crate) fn map_write_error(
    e: RaftError<TypeConfig, ClientWriteError<TypeConfig>>,
) -> ProposeError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => ProposeError::NotLeader {
            leader: f.leader_id,
        },
        RaftError::APIError(ClientWriteError::LogEntryDiscarded(_)) => ProposeError::OutcomeUnknown,
        // Neither can happen for a plain command without preconditions.
        RaftError::APIError(e @ ClientWriteError::ChangeMembershipError(_))
        | RaftError::APIError(e @ ClientWriteError::PreconditionFailed(_)) => {
            ProposeError::Unavailable(e.to_string())
        }
        RaftError::Fatal(f) => map_fatal(f),
    }
}

pub(crate) fn map_read_error(
    e: RaftError<TypeConfig, LinearizableReadError<TypeConfig>>,
) -> ProposeError {
    match e {
        RaftError::APIError(LinearizableReadError::ForwardToLeader(f)) => ProposeError::NotLeader {
            leader: f.leader_id,
        },
        RaftError::APIError(e @ LinearizableReadError::QuorumNotEnough(_)) => {
            ProposeError::Unavailable(e.to_string())
        }
        RaftError::Fatal(f) => map_fatal(f),
    }
}

impl ReplicatedLog for RaftNode {
    fn propose(
        &self,
        command: Vec<u8>,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<u8>, ProposeError>> + Send + '_>> {
        Box::pin(async move {
            if self.inner.multi {
                return self.propose_multi(command).await;
            }
            match self.inner.raft.client_write(Command(command.into())).await {
                Ok(resp) => Ok(resp.data),
                Err(e) => Err(map_write_error(e)),
            }
        })
    }

    fn read_barrier(&self) -> Pin<Box<dyn Future<Output = Result<(), ProposeError>> + Send + '_>> {
        Box::pin(async move {
            if self.inner.multi {
                return self.read_barrier_multi().await;
            }
            self.inner
                .raft
                .ensure_linearizable(ReadPolicy::ReadIndex)
                .await
                .map(|_| ())
                .map_err(map_read_error)
        })
    }

    fn progress(&self) -> LogProgress {
        let m = self.inner.raft.metrics().borrow_watched().clone();
        let role = match m.state {
            ServerState::Leader => RaftRole::Leader,
            ServerState::Follower => RaftRole::Follower,
            ServerState::Candidate => RaftRole::Candidate,
            ServerState::Learner => RaftRole::Learner,
            ServerState::Shutdown => RaftRole::Shutdown,
        };
        LogProgress {
            node_id: self.inner.node_id,
            role,
            leader: m.current_leader,
            term: m.current_term,
            applied: m.last_applied.map_or(0, |l| l.index),
            commit: m.local_committed.map_or(0, |l| l.index),
            last_log: m.last_log_index.unwrap_or(0),
            storage_ready: m.running_state.is_ok(),
            // A lone voter is its own quorum; otherwise the time since a majority acknowledged.
            quorum_ack_ms: match m.state {
                ServerState::Leader
                    if m.membership_config.membership().voter_ids().count() <= 1 =>
                {
                    Some(0)
                }
                ServerState::Leader => m
                    .last_quorum_acked
                    .as_ref()
                    .map(|t| openraft::Instant::elapsed(&**t).as_millis() as u64),
                _ => None,
            },
        }
    }
}

/// A member that acknowledged the leader within this long counts as live (membership checks);
/// longer than the election timeout, so a slow heartbeat on a loaded machine does not count.
const LIVE_WITHIN: Duration = Duration::from_secs(2);
/// How long the leader waits for a member's answer to `/info`.
const INFO_TIMEOUT: Duration = Duration::from_secs(1);

/// The members as `raft` sees them (liveness and lag are known on the leader).
fn members_of(raft: &Raft, me: u64) -> Vec<Member> {
    let m = raft.metrics().borrow_watched().clone();
    let last = m.last_log_index.unwrap_or(0);
    let leader = m.state == ServerState::Leader;
    let replication = m.replication.clone().unwrap_or_default();
    let heartbeat = m.heartbeat.clone().unwrap_or_default();
    let live_within = LIVE_WITHIN;
    let cfg = m.membership_config.membership();
    let voters: std::collections::BTreeSet<u64> = cfg.voter_ids().collect();
    cfg.nodes()
        .map(|(id, node)| {
            let is_me = *id == me;
            let matched = replication
                .get(id)
                .cloned()
                .flatten()
                .map_or(0, |l| l.index);
            let live = is_me
                || heartbeat
                    .get(id)
                    .cloned()
                    .flatten()
                    .is_some_and(|t| openraft::Instant::elapsed(&*t) <= live_within);
            Member {
                id: *id,
                raft: node.raft_addr.clone(),
                http: node.http_addr.clone(),
                voter: voters.contains(id),
                live: if leader { live } else { is_me },
                lag: if is_me {
                    0
                } else {
                    last.saturating_sub(matched)
                },
            }
        })
        .collect()
}

fn require_leader(raft: &Raft, me: u64) -> Result<Vec<Member>, MembershipError> {
    let m = raft.metrics().borrow_watched().clone();
    if m.state != ServerState::Leader {
        let leader = m.current_leader;
        let leader_http = leader.and_then(|l| {
            m.membership_config
                .membership()
                .get_node(&l)
                .map(|n| n.http_addr.clone())
        });
        return Err(MembershipError::NotLeader {
            leader,
            leader_http,
        });
    }
    Ok(members_of(raft, me))
}

fn live_majority(members: &[Member], voters: &std::collections::BTreeSet<u64>) -> bool {
    let live = members
        .iter()
        .filter(|m| voters.contains(&m.id) && m.live)
        .count();
    live * 2 > voters.len()
}

async fn change(
    raft: &Raft,
    change: openraft::ChangeMembers<u64, NodeInfo>,
) -> Result<(), MembershipError> {
    raft.change_membership(change, false)
        .await
        .map(|_| ())
        .map_err(|e| MembershipError::Failed(e.to_string()))
}

/// Ask node `id` at `addr` which log format it reads; `None` when it does not answer.
pub(crate) async fn ask_kinds(transport: &Transport, id: u64, addr: &str) -> Option<u32> {
    let bytes = transport
        .post(
            id,
            addr,
            wire::INFO,
            full(bytes::Bytes::new()),
            INFO_TIMEOUT,
        )
        .await
        .ok()?;
    wire::decode::<wire::InfoReply>(&bytes)
        .ok()
        .map(|r| r.kinds)
}

/// Run a membership change on this node, which must lead; answers the members afterwards.
pub(crate) async fn change_here(
    raft: &Raft,
    me: u64,
    transport: &Transport,
    op: MembershipChange,
) -> Result<Vec<Member>, MembershipError> {
    let members = require_leader(raft, me)?;
    match op {
        MembershipChange::List => return Ok(members),
        MembershipChange::AddLearner {
            id,
            raft: raft_addr,
            http,
            min_kinds,
        } => {
            if members.iter().any(|m| m.id == id && m.raft == raft_addr) {
                return Ok(members);
            }
            if min_kinds > 0
                && let Some(kinds) = ask_kinds(transport, id, &raft_addr).await
                && kinds < min_kinds
            {
                return Err(MembershipError::FormatTooOld {
                    id,
                    kinds,
                    version: min_kinds,
                });
            }
            raft.add_learner(
                id,
                NodeInfo {
                    raft_addr,
                    http_addr: http,
                },
                false,
            )
            .await
            .map_err(|e| MembershipError::Failed(e.to_string()))?;
        }
        MembershipChange::Promote {
            ids,
            force,
            max_lag,
        } => {
            let mut to_add = std::collections::BTreeSet::new();
            for id in &ids {
                let Some(m) = members.iter().find(|m| m.id == *id) else {
                    return Err(MembershipError::Unknown(*id));
                };
                if m.voter {
                    continue;
                }
                if !force && m.lag > max_lag {
                    return Err(MembershipError::LearnerBehind {
                        id: *id,
                        lag: m.lag,
                        limit: max_lag,
                    });
                }
                to_add.insert(*id);
            }
            if to_add.is_empty() {
                return Ok(members);
            }
            let mut after: std::collections::BTreeSet<u64> =
                members.iter().filter(|m| m.voter).map(|m| m.id).collect();
            after.extend(to_add.iter().copied());
            if !force && !live_majority(&members, &after) {
                return Err(MembershipError::NoQuorum(
                    "a live majority would not exist after the promotion".into(),
                ));
            }
            change(raft, openraft::ChangeMembers::AddVoterIds(to_add)).await?;
        }
        MembershipChange::Remove { id } => {
            let Some(target) = members.iter().find(|m| m.id == id) else {
                return Ok(members);
            };
            let before: std::collections::BTreeSet<u64> =
                members.iter().filter(|m| m.voter).map(|m| m.id).collect();
            if target.voter {
                if before.len() == 1 {
                    return Err(MembershipError::LastVoter(id));
                }
                let mut after = before.clone();
                after.remove(&id);
                if !live_majority(&members, &before) || !live_majority(&members, &after) {
                    return Err(MembershipError::NoQuorum(
                        "a live majority would not exist before and after the removal".into(),
                    ));
                }
                change(
                    raft,
                    openraft::ChangeMembers::RemoveVoters(std::collections::BTreeSet::from([id])),
                )
                .await?;
            }
            change(
                raft,
                openraft::ChangeMembers::RemoveNodes(std::collections::BTreeSet::from([id])),
            )
            .await?;
        }
    }
    Ok(members_of(raft, me))
}

impl RaftNode {
    /// The members as this node sees them (liveness and lag are known on the leader).
    pub fn members(&self) -> Vec<Member> {
        members_of(&self.inner.raft, self.inner.node_id)
    }

    /// Run a membership change (or a listing) on the leader: here when this node leads, else
    /// handed to the leader over the raft port. Answers the members as the leader sees them
    /// afterwards. A listing with no leader reachable answers this node's own view.
    ///
    /// # Errors
    /// No leader known, the leader unreachable, or the leader's refusal (see
    /// `MembershipError`).
    pub async fn membership(&self, op: MembershipChange) -> Result<Vec<Member>, MembershipError> {
        let me = self.inner.node_id;
        let list = matches!(op, MembershipChange::List);
        let leader =
            match change_here(&self.inner.raft, me, &self.inner.transport, op.clone()).await {
                Err(MembershipError::NotLeader {
                    leader: Some(l), ..
                }) if l != me => l,
                Err(MembershipError::NotLeader { .. }) if list => return Ok(self.members()),
                r => return r,
            };
        let forwarded = async {
            let addr = self.leader_addr(leader, None).ok_or_else(|| {
                MembershipError::Unavailable(format!("no raft address known for leader {leader}"))
            })?;
            let body = wire::encode(&op).map_err(MembershipError::Unavailable)?;
            let bytes = self
                .inner
                .transport
                .post(leader, &addr, wire::MEMBERSHIP, full(body), FORWARD_TIMEOUT)
                .await
                .map_err(|e| MembershipError::Unavailable(format!("leader {leader}: {e}")))?;
            wire::decode::<wire::MembershipReply>(&bytes).map_err(MembershipError::Unavailable)?
        };
        match forwarded.await {
            Err(MembershipError::Unavailable(_)) if list => Ok(self.members()),
            r => r,
        }
    }

    /// On the leader: the log format every member reads, `None` for a member that did not
    /// answer within a second. Members are asked in parallel.
    pub async fn member_kinds(&self) -> Vec<(u64, Option<u32>)> {
        let me = self.inner.node_id;
        let nodes: Vec<(u64, String)> = {
            let m = self.inner.raft.metrics().borrow_watched().clone();
            m.membership_config
                .membership()
                .nodes()
                .map(|(id, n)| (*id, n.raft_addr.clone()))
                .collect()
        };
        let transport = &self.inner.transport;
        let asks = nodes.into_iter().map(|(id, addr)| async move {
            if id == me {
                (id, Some(self.inner.log_kinds))
            } else {
                (id, ask_kinds(transport, id, &addr).await)
            }
        });
        futures::future::join_all(asks).await
    }
}

impl Membership for RaftNode {
    fn change(
        &self,
        change: MembershipChange,
    ) -> queen_ports::BoxFuture<'_, Result<Vec<Member>, MembershipError>> {
        Box::pin(self.membership(change))
    }

    fn members(&self) -> Vec<Member> {
        RaftNode::members(self)
    }
}
