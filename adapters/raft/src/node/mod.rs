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
use openraft::errors::InitializeError;
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

use crate::body_limits::BodyLimits;
use crate::config::Peer;
use crate::config::RaftNodeConfig;
use crate::error::RaftShutdownError;
use crate::error::RaftStartError;
use crate::error::{map_read_error, map_write_error};
use crate::log_store::LogLiveness;
use crate::log_store::LogStore;
use crate::log_store::LogStoreOptions;
use crate::membership::{ask_kinds, change_here, members_of};
use crate::network::CallError;
use crate::network::NetworkFactory;
use crate::network::Transport;
use crate::network::full;
use crate::server::RaftServer;
use crate::snapshot_spool::SnapshotSpool;
use crate::state_machine::Raft;
use crate::state_machine::StateMachineStore;
use crate::type_config::Command;
use crate::type_config::NodeInfo;
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

mod forward;
mod members;

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
    /// The application's handler of calls from other nodes (`PeerCalls::serve`), and when a
    /// leader last reached this node.
    shared: crate::server::Shared,
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
        let shared = crate::server::Shared::default();
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
                cfg.node_id,
                transport.clone(),
                crate::wire::InfoReply {
                    kinds: cfg.log_kinds,
                    groups: cfg.groups,
                },
                limits,
                shared.clone(),
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
                shared,
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
        self.transfer_to(to).await
    }

    /// On a leader: hand leadership to voter `to` and wait (up to 3 s) until another leader is
    /// known. Returns the new leader and how long the hand-off took in milliseconds; `None`
    /// when this node does not lead or no other leader appeared in time.
    pub async fn transfer_to(&self, to: u64) -> Option<(u64, u128)> {
        let raft = &self.inner.raft;
        let me = self.inner.node_id;
        if to == me || raft.metrics().borrow_watched().state != ServerState::Leader {
            return None;
        }
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

    /// Resolves when the raft core has stopped on an error (a storage write that failed, a
    /// full disk among them), with the error; never after a deliberate `shutdown`. A node whose
    /// core stopped can no longer replicate or apply anything: the application stops it, so that
    /// a supervisor starts it again on its data once the cause is fixed.
    pub async fn core_failed(&self) -> String {
        use openraft::errors::Fatal;
        // `Some(None)`: stopped on purpose; `Some(Some(e))`: stopped on an error.
        let stopped = || match &self.inner.raft.metrics().borrow_watched().running_state {
            Ok(()) => None,
            Err(Fatal::Stopped) => Some(None),
            Err(e) => Some(Some(e.to_string())),
        };
        // Woken by the server metrics (leader, term, membership: they change rarely), not by
        // `metrics()`, which the core sends on every turn of its loop: a watcher of that one
        // costs every node a task wake-up, often a thread's, several times per raft round.
        // The core drops the sender when its task ends (after recording why in `metrics()`), or
        // as it unwinds from a panic.
        let mut rx = self.inner.raft.server_metrics();
        loop {
            let ended = rx.changed().await.is_err();
            match stopped() {
                Some(Some(e)) => return e,
                Some(None) => return std::future::pending().await,
                // The core's task ended without saying why (a panic): a stop, deliberate or on
                // an error, is recorded first.
                None if ended => return "the raft core ended".to_owned(),
                None => {}
            }
        }
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

impl queen_ports::PeerCalls for RaftNode {
    fn me(&self) -> u64 {
        self.inner.node_id
    }

    fn call(
        &self,
        target: u64,
        route: &'static str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<u8>, queen_ports::PeerCallError>> + Send + '_>>
    {
        Box::pin(async move {
            let addr = self
                .members()
                .into_iter()
                .find(|m| m.id == target)
                .map(|m| m.raft)
                .or_else(|| {
                    self.inner
                        .peers
                        .iter()
                        .find(|p| p.id == target)
                        .map(|p| p.raft_addr.clone())
                })
                .filter(|a| !a.is_empty())
                .ok_or_else(|| queen_ports::PeerCallError::Unreachable {
                    node: target,
                    detail: "not a member with a raft address".into(),
                })?;
            let path = format!("{}{route}", wire::APP_PREFIX);
            self.inner
                .transport
                .post(
                    target,
                    &addr,
                    &path,
                    full(bytes::Bytes::from(body)),
                    timeout,
                )
                .await
                .map(|b| b.to_vec())
                .map_err(|e| match e {
                    CallError::Connect(detail) => queen_ports::PeerCallError::Unreachable {
                        node: target,
                        detail,
                    },
                    other => queen_ports::PeerCallError::Failed {
                        node: target,
                        detail: other.to_string(),
                    },
                })
        })
    }

    fn serve(&self, handler: Arc<dyn queen_ports::PeerHandler>) {
        let _ = self.inner.shared.app.set(handler);
    }
}
