//! A simulated node: the adapter's own log store (on tmpfs, flushed inline), its state machine
//! adapter over the in-memory backend (called inline), openraft with the product's timings, and
//! the simulated network. A crash stops the node the way kill -9 does: what the log wrote stays
//! (the page cache survives a process), and the backend may lose what it applied since its last
//! `persist`, as a storage engine that had not synced its journal would.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use crate::state_machine::Raft;
use queen_ports::Answer;
use queen_ports::ApplyEntry;
use queen_ports::BackendError;
use queen_ports::SnapshotChunks;
use queen_ports::StateMachineBackend;

use super::net::Factory;
use super::net::Net;
use crate::config::RaftNodeConfig;
use crate::log_store::LogLiveness;
use crate::log_store::LogStore;
use crate::log_store::LogStoreOptions;
use crate::mem_backend::MemBackend;
use crate::mem_backend::MemState;
use crate::state_machine::LogHandles;
use crate::state_machine::StateMachineStore;
use crate::type_config::NodeInfo;

/// Snapshot every this many entries: small, so runs build and send snapshots and purge the log.
const SNAPSHOT_EVERY: u64 = 50;
/// Log segments roll at this size, so purges delete whole files.
const SEGMENT_BYTES: u64 = 4096;

/// The in-memory backend, plus what a crash keeps of it.
pub(super) struct SimBackend {
    /// The state.
    mem: MemBackend,
    /// The state made durable last (by `persist` or a snapshot install), and how many apply
    /// calls the history held then.
    durable: Mutex<(MemState, usize)>,
}

impl SimBackend {
    fn new(state: MemState) -> Self {
        Self {
            mem: MemBackend::from_state(state.clone()),
            durable: Mutex::new((state, 0)),
        }
    }

    /// The current state.
    pub(super) fn state(&self) -> MemState {
        self.mem.state()
    }

    /// What a crash leaves: the durable state or any later one, as `pick` chooses among the
    /// `n` candidates (0: the durable state; n-1: the current state).
    fn after_crash(&self, pick: impl FnOnce(usize) -> usize) -> MemState {
        let (durable, base) = lock(&self.durable).clone();
        let history = self.mem.history();
        let mut candidates = vec![durable];
        candidates.extend(history.into_iter().skip(base));
        let i = pick(candidates.len()).min(candidates.len() - 1);
        candidates.swap_remove(i)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl StateMachineBackend for SimBackend {
    fn apply(&self, entries: Vec<ApplyEntry>, meta: Vec<u8>) -> Result<Vec<Answer>, BackendError> {
        self.mem.apply(entries, meta)
    }

    fn load_meta(&self) -> Result<Option<Vec<u8>>, BackendError> {
        self.mem.load_meta()
    }

    fn persist(&self) -> Result<(), BackendError> {
        self.mem.persist()?;
        *lock(&self.durable) = (self.mem.state(), self.mem.history().len());
        Ok(())
    }

    fn snapshot(&self) -> Result<Box<dyn SnapshotChunks>, BackendError> {
        self.mem.snapshot()
    }

    fn install_snapshot(
        &self,
        chunks: &mut dyn Iterator<Item = Result<Vec<u8>, BackendError>>,
        meta: Vec<u8>,
    ) -> Result<(), BackendError> {
        self.mem.install_snapshot(chunks, meta)?;
        *lock(&self.durable) = (self.mem.state(), self.mem.history().len());
        Ok(())
    }
}

/// One node of the simulated cluster.
pub(super) struct SimNode {
    pub(super) id: u64,
    /// Its directory (the log lives in `dir/log`).
    dir: PathBuf,
    /// The running raft, or `None` while crashed.
    pub(super) raft: Option<Raft>,
    /// Its backend (kept across a crash as what the crash left).
    pub(super) backend: Arc<SimBackend>,
    /// Tells when the log store of the last run is gone.
    liveness: Option<LogLiveness>,
}

impl SimNode {
    /// A node that never ran, over an empty backend.
    pub(super) fn new(id: u64, dir: PathBuf) -> Self {
        Self {
            id,
            dir,
            raft: None,
            backend: Arc::new(SimBackend::new(MemState::default())),
            liveness: None,
        }
    }

    /// The node's configuration: the product's timings, small snapshots.
    fn config(&self) -> RaftNodeConfig {
        let mut c = RaftNodeConfig::single(self.id, self.dir.clone());
        c.snapshot_every_entries = SNAPSHOT_EVERY;
        c
    }

    /// Open the log and the state machine and start raft; join the net.
    pub(super) async fn start(&mut self, net: &Net) -> Result<(), String> {
        let cfg = self.config();
        let mut raft_config = cfg.openraft_config().map_err(|e| e.to_string())?;
        // Purge as soon as a snapshot allows (the product purges in steps of 1,024 entries,
        // more than a run writes), so that restarted nodes need snapshots.
        raft_config.purge_batch_size = 1;
        let raft_config = Arc::new(raft_config);
        let options = LogStoreOptions {
            segment_max_bytes: SEGMENT_BYTES,
            inline_flush: true,
            ..LogStoreOptions::default()
        };
        let store = LogStore::open(&cfg.log_dir(), options).map_err(|e| e.to_string())?;
        let liveness = store.liveness();
        let files = store.files();
        let spans = files.clone();
        let handles = LogHandles {
            files: Arc::new(files),
            spans: Arc::new(move |index, len| spans.command_span(index, len)),
        };
        let backend: Arc<dyn StateMachineBackend> = self.backend.clone();
        let sm = StateMachineStore::open_with(backend, Some(handles), true)
            .await
            .map_err(|e| e.to_string())?;
        let factory = Factory {
            me: self.id,
            net: net.clone(),
        };
        let raft = Raft::new(self.id, raft_config, factory, store, sm)
            .await
            .map_err(|e| e.to_string())?;
        net.set_up(self.id, raft.clone());
        self.raft = Some(raft);
        self.liveness = Some(liveness);
        Ok(())
    }

    /// Form the cluster from this node (first start only).
    pub(super) async fn initialize(&self, voters: &[u64]) -> Result<(), String> {
        let Some(raft) = &self.raft else {
            return Err("not running".into());
        };
        let members: BTreeMap<u64, NodeInfo> =
            voters.iter().map(|&v| (v, NodeInfo::default())).collect();
        raft.initialize(members).await.map_err(|e| e.to_string())
    }

    /// Stop the node like kill -9; the backend keeps what `pick` chooses among its durable
    /// state and the states after it.
    pub(super) async fn crash(&mut self, net: &Net, pick: impl FnOnce(usize) -> usize) {
        net.set_down(self.id);
        if let Some(raft) = self.raft.take() {
            let _ = raft.shutdown().await;
        }
        // The log store goes when openraft's tasks drop it; bounded in virtual time.
        if let Some(l) = self.liveness.take() {
            for _ in 0..10_000 {
                if l.is_released() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        let kept = self.backend.after_crash(pick);
        self.backend = Arc::new(SimBackend::new(kept));
    }

    /// Sabotage: the backend loses everything, durable or not.
    pub(super) fn forget_backend(&mut self) {
        self.backend = Arc::new(SimBackend::new(MemState::default()));
    }
}
