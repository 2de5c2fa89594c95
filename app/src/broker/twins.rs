//! In-memory twins of the ports the broker runs on, for its unit tests: a replicated log of one
//! node that applies every proposal through the domain's rules on a `MemStore`, the state
//! reader over that store, and a clock the test moves.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use queen_domain::command::Entry;
use queen_domain::{MemStore, StateRead, Txn, apply_entry};
use queen_ports::{
    BackendError, BoxFuture, Clock, LogProgress, ProposeError, RaftRole, ReplicatedLog,
    StateReader, StoreFigures,
};

/// The applied state, in memory.
#[derive(Default)]
pub(crate) struct MemState {
    store: Mutex<MemStore>,
}

impl StateReader for MemState {
    fn view(&self) -> Box<dyn StateRead + Send + '_> {
        Box::new(
            self.store
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        )
    }

    fn figures(&self) -> StoreFigures {
        StoreFigures::default()
    }

    fn memtable_bytes(&self) -> u64 {
        0
    }

    fn reclaim(&self) -> Result<(), BackendError> {
        Ok(())
    }
}

/// A clock that moves only when the test moves it.
pub(crate) struct ManualClock(AtomicU64);

impl ManualClock {
    pub(crate) fn at(micros: u64) -> Self {
        Self(AtomicU64::new(micros))
    }

    pub(crate) fn advance(&self, by: Duration) {
        self.0.fetch_add(
            u64::try_from(by.as_micros()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }
}

impl Clock for ManualClock {
    fn now_micros(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// A replicated log of one node: every proposal is applied at once through the domain, unless
/// the test scripted failures for the next attempts.
pub(crate) struct FakeLog {
    state: Arc<MemState>,
    role: RaftRole,
    leader: Option<u64>,
    index: AtomicU64,
    attempts: AtomicU64,
    failures: Mutex<(u32, Option<ProposeError>)>,
    /// A follower's milliseconds since a leader's last append (`u64::MAX`: never).
    contact_ms: AtomicU64,
    /// Told of every apply, as the store tells the broker's wake-ups.
    observer: std::sync::OnceLock<Arc<dyn queen_ports::ApplyObserver>>,
}

impl FakeLog {
    /// This node leads.
    pub(crate) fn leader(state: MemState) -> Arc<Self> {
        Self::with_role(state, RaftRole::Leader, Some(1))
    }

    /// This node follows `leader`.
    pub(crate) fn follower(state: MemState, leader: Option<u64>) -> Arc<Self> {
        Self::with_role(state, RaftRole::Follower, leader)
    }

    fn with_role(state: MemState, role: RaftRole, leader: Option<u64>) -> Arc<Self> {
        Arc::new(Self {
            state: Arc::new(state),
            role,
            leader,
            index: AtomicU64::new(0),
            attempts: AtomicU64::new(0),
            failures: Mutex::new((0, None)),
            contact_ms: AtomicU64::new(0),
            observer: std::sync::OnceLock::new(),
        })
    }

    /// A follower last heard from its leader `ms` ago (`None`: never).
    pub(crate) fn set_leader_contact(&self, ms: Option<u64>) {
        self.contact_ms
            .store(ms.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// The state the log applies to.
    pub(crate) fn state(&self) -> Arc<MemState> {
        self.state.clone()
    }

    /// Fail the next `n` proposals with `e` (nothing is applied).
    pub(crate) fn fail_next(&self, n: u32, e: ProposeError) {
        *self.failures.lock().unwrap_or_else(PoisonError::into_inner) = (n, Some(e));
    }

    /// Proposals applied.
    pub(crate) fn proposals(&self) -> u64 {
        self.index.load(Ordering::SeqCst)
    }

    /// Proposals asked for, failed ones included.
    pub(crate) fn attempts(&self) -> u64 {
        self.attempts.load(Ordering::SeqCst)
    }

    fn apply(&self, bytes: &[u8]) -> Result<Vec<u8>, ProposeError> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        {
            let mut f = self.failures.lock().unwrap_or_else(PoisonError::into_inner);
            if f.0 > 0
                && let Some(e) = f.1.clone()
            {
                f.0 -= 1;
                return Err(e);
            }
        }
        let entry = Entry::decode(bytes).map_err(|e| ProposeError::Fatal(e.to_string()))?;
        let mut store = self
            .state
            .store
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let index = self.index.fetch_add(1, Ordering::SeqCst) + 1;
        let mut txn = Txn::new(&*store);
        let response =
            apply_entry(&mut txn, &entry, index).map_err(|e| ProposeError::Fatal(e.to_string()))?;
        let writes = txn.into_writes();
        let changes = queen_store::changes_of(&writes);
        store.commit(writes);
        if let Some(o) = self.observer.get().filter(|o| o.wants()) {
            o.applied(&changes, &*store);
        }
        Ok(response.encode())
    }
}

impl ReplicatedLog for FakeLog {
    fn propose(
        &self,
        command: Vec<u8>,
    ) -> BoxFuture<'_, Result<queen_ports::Answer, ProposeError>> {
        // As bytes, the way a forwarded proposal's answer comes back (the raft node hands a
        // local proposer the built value).
        let result = self.apply(&command).map(queen_ports::Answer::Bytes);
        Box::pin(async move { result })
    }

    fn read_barrier(&self) -> BoxFuture<'_, Result<(), ProposeError>> {
        Box::pin(async { Ok(()) })
    }

    fn progress(&self) -> LogProgress {
        let applied = self.index.load(Ordering::SeqCst);
        LogProgress {
            node_id: 1,
            role: self.role,
            leader: self.leader,
            term: 1,
            applied,
            commit: applied,
            last_log: applied,
            storage_ready: true,
            quorum_ack_ms: (self.role == RaftRole::Leader).then_some(0),
            leader_contact_ms: (self.role == RaftRole::Follower)
                .then(|| self.contact_ms.load(Ordering::Relaxed))
                .filter(|ms| *ms != u64::MAX),
        }
    }

    fn compact(&self, _within: Duration) -> BoxFuture<'_, bool> {
        Box::pin(async { true })
    }
}

/// A broker over the twins: `log` and its state, a manual clock at `clock`, no raft group.
pub(crate) fn broker(
    log: &Arc<FakeLog>,
    clock: Arc<ManualClock>,
    timeout: Duration,
) -> super::Broker {
    let b = super::Broker::new(
        log.clone(),
        log.state(),
        clock,
        queen_telemetry::Telemetry::metrics_only(1),
        timeout,
        Arc::new(|| 0),
    );
    let _ = log.observer.set(b.apply_observer());
    b
}
