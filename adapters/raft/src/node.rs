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
use queen_ports::ProposeError;
use queen_ports::RaftRole;
use queen_ports::ReplicatedLog;
use queen_ports::StateMachineBackend;

use crate::config::RaftNodeConfig;
use crate::error::RaftShutdownError;
use crate::error::RaftStartError;
use crate::log_store::LogLiveness;
use crate::log_store::LogStore;
use crate::log_store::LogStoreOptions;
use crate::network::NoTransportFactory;
use crate::state_machine::StateMachineStore;
use crate::type_config::Command;
use crate::type_config::NodeInfo;
use crate::type_config::Raft;
use crate::type_config::TypeConfig;

/// How long `shutdown` waits for the log store to be dropped (and its directory lock released).
const LOG_RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

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
    /// # Errors
    /// A bad config, a log that cannot be opened or recovered (corruption, directory in use), a
    /// backend that cannot load its meta, or a raft core that does not start.
    pub async fn start(
        cfg: RaftNodeConfig,
        backend: Arc<dyn StateMachineBackend>,
    ) -> Result<RaftNode, RaftStartError> {
        Self::start_with(cfg, backend, LogStoreOptions::default()).await
    }

    /// `start` with explicit log store tuning.
    pub(crate) async fn start_with(
        cfg: RaftNodeConfig,
        backend: Arc<dyn StateMachineBackend>,
        log_options: LogStoreOptions,
    ) -> Result<RaftNode, RaftStartError> {
        cfg.validate()?;
        if !cfg.is_single_voter() {
            return Err(RaftStartError::Unsupported(format!(
                "{} voters configured; multi-node groups need the raft transport, which is not built yet",
                cfg.peers.len()
            )));
        }
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

        let sm = StateMachineStore::open(backend)
            .await
            .map_err(RaftStartError::StateMachine)?;

        let raft = Raft::new(cfg.node_id, raft_config, NoTransportFactory, store, sm)
            .await
            .map_err(|e| RaftStartError::Raft(e.to_string()))?;

        let node = RaftNode {
            inner: Arc::new(NodeInner {
                node_id: cfg.node_id,
                raft,
                fsyncs,
                log_liveness,
            }),
        };
        node.join_or_form(&cfg).await?;
        Ok(node)
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
    /// opened again.
    ///
    /// # Errors
    /// The core ended abnormally, or the log store was still held after the core stopped.
    pub async fn shutdown(&self) -> Result<(), RaftShutdownError> {
        self.inner
            .raft
            .shutdown()
            .await
            .map_err(|e| RaftShutdownError::Core(e.to_string()))?;
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

fn map_fatal(e: Fatal<TypeConfig>) -> ProposeError {
    match e {
        Fatal::Stopped => ProposeError::Unavailable("raft node stopped".into()),
        Fatal::Panicked => ProposeError::Fatal("raft core panicked".into()),
        Fatal::StorageError(e) => ProposeError::Fatal(e.to_string()),
    }
}

fn map_write_error(e: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> ProposeError {
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

fn map_read_error(e: RaftError<TypeConfig, LinearizableReadError<TypeConfig>>) -> ProposeError {
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
            match self.inner.raft.client_write(Command(command)).await {
                Ok(resp) => Ok(resp.data),
                Err(e) => Err(map_write_error(e)),
            }
        })
    }

    fn read_barrier(&self) -> Pin<Box<dyn Future<Output = Result<(), ProposeError>> + Send + '_>> {
        Box::pin(async move {
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
        }
    }
}
