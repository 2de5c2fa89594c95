//! The broker's use cases behind the HTTP adapter: propose with a deadline, long-poll pops,
//! readiness, status and metrics.

use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use queen_domain::command::{
    AckItem, AckOutcome, Command, Entry, Outcome, PopOutcome, PushItem, PushOutcome, PushStatus,
    Response, TxnOp, TxnOutcome, TxnResult,
};
use queen_domain::kv::{KvOp, KvOutcome, LockOp, LockResult};
use queen_domain::model::QueueOptions;
use queen_domain::names::{GroupName, QueueName};
use queen_domain::reads;
use queen_domain::time::Stamp;
use queen_ports::{
    BoxFuture, BrokerError, ClientApi, Clock, HealthView, Member, MembershipOp, NodeStatus,
    NotReady, PopRequest, PopsStatus, ProposeError, QueueStatus, QueuesStatus, RaftRole,
    ReplicatedLog, SinkLog, StatusView, StorageStatus,
};
use queen_store::FjallStore;
use queen_telemetry::Telemetry;

use crate::message_size;
use crate::waiters::Waiters;

/// The highest log format this build reads (entries are versioned by their command set).
pub(crate) const LOG_KINDS: u32 = 1;
/// A node is ready within this many entries of the commit index.
const READY_LAG_ENTRIES: u64 = 1000;
/// A leader unacknowledged by a majority for longer than this reports `no_quorum` (the
/// election timeout's upper bound).
const LEADER_QUORUM_MS: u64 = 2000;
/// How often a parked pop re-checks on its own (lease expiry and delayed messages are not
/// signalled by a commit).
const RECHECK: Duration = Duration::from_millis(250);
/// A queue deletion this close to the disk gate (percentage points) reclaims the deleted rows'
/// space at once.
const RECLAIM_WITHIN_POINTS: u8 = 10;
/// How long a reclaim waits for a deleted queue's rows to be swept.
const RECLAIM_WAIT: Duration = Duration::from_secs(60);

/// Whether rows of deleted queues are still waiting to be swept by housekeeping (a read
/// failure counts as none: the reclaim then runs at once).
fn graves_pending(store: &FjallStore) -> bool {
    reads::deletions_pending(store).unwrap_or(false)
}

/// The broker: what every route of the client API does.
pub struct Broker {
    log: Arc<dyn ReplicatedLog>,
    store: FjallStore,
    clock: Arc<dyn Clock>,
    telemetry: Telemetry,
    waiters: Waiters,
    request_timeout: Duration,
    fsyncs: Arc<dyn Fn() -> u64 + Send + Sync>,
    started: Instant,
    /// The disk gate: the data directory's last sample and the bytes admitted since.
    disk: crate::disk_gate::DiskGate,
    /// The raft node, for membership changes.
    raft: Option<queen_raft::RaftNode>,
    /// Promotion lag limit.
    promote_max_lag: u64,
    /// Readiness: entries behind the commit index.
    ready_lag_entries: u64,
    /// Readiness: age of the last applied entry (broker time), in ms.
    ready_lag_ms: u64,
    /// Followers forward writes to the leader; when off they answer 503 not_leader.
    client_offload: bool,
    /// The highest log format this node reads (`kinds` in /health).
    kinds: u32,
    /// Group commit for pushes, when the node runs its lane (`run_push_lane`).
    push_lane: Option<crate::push_lane::PushLane>,
    /// Largest payload of one message, KV value or timer payload (`QUEEN_MAX_MESSAGE_BYTES`).
    max_message_bytes: usize,
    /// The S3 sink's block of `/status`, when the sink runs.
    s3_status: std::sync::OnceLock<Box<dyn Fn() -> serde_json::Value + Send + Sync>>,
    /// A store reclaim (after a deletion near the disk gate) is running.
    reclaiming: Arc<std::sync::atomic::AtomicBool>,
}

fn not_committed(e: &ProposeError) -> BrokerError {
    match e {
        ProposeError::NotLeader { leader } => BrokerError::NotLeader {
            leader: *leader,
            forwards: true,
        },
        ProposeError::OutcomeUnknown => BrokerError::OutcomeUnknown,
        ProposeError::Unavailable(m) => {
            BrokerError::Unavailable(format!("the replicated log is unavailable: {m}"))
        }
        ProposeError::Fatal(_) => {
            BrokerError::Internal("the node's storage failed; see its log".to_owned())
        }
    }
}

fn kind(c: &Command) -> &'static str {
    match c {
        Command::Tick => "tick",
        Command::Push(_) => "push",
        Command::Pop(_) => "pop",
        Command::Ack { .. } => "ack",
        Command::ExtendLease { .. } => "extend",
        Command::Configure { .. } => "configure",
        Command::DeleteQueue { .. } => "delete_queue",
        Command::Transaction { .. } => "transaction",
        Command::Kv(_) => "kv",
        Command::Timers(_) => "timers",
        Command::DeleteGroup { .. } => "delete_group",
        Command::Seek { .. } => "seek",
        Command::Resubscribe { .. } => "resubscribe",
        Command::Locks(_) => "locks",
        Command::ClusterSettings { .. } => "cluster_settings",
    }
}

impl Broker {
    /// Assemble the use cases over a log, the local state and a clock.
    pub fn new(
        log: Arc<dyn ReplicatedLog>,
        store: FjallStore,
        clock: Arc<dyn Clock>,
        telemetry: Telemetry,
        request_timeout: Duration,
        fsyncs: Arc<dyn Fn() -> u64 + Send + Sync>,
    ) -> Self {
        Self {
            log,
            store,
            clock,
            telemetry,
            waiters: Waiters::default(),
            request_timeout,
            fsyncs,
            started: Instant::now(),
            disk: crate::disk_gate::DiskGate::new(crate::disk_gate::Limits {
                high_pct: 85,
                reserve_bytes: crate::disk_gate::DEFAULT_RESERVE_BYTES,
            }),
            raft: None,
            promote_max_lag: 1000,
            ready_lag_entries: READY_LAG_ENTRIES,
            ready_lag_ms: 2000,
            client_offload: true,
            kinds: LOG_KINDS,
            push_lane: None,
            max_message_bytes: 8 << 20,
            s3_status: std::sync::OnceLock::new(),
            reclaiming: Arc::default(),
        }
    }

    /// Let push requests that arrive while the log is busy share an entry; the node must then
    /// run [`Broker::run_push_lane`].
    #[must_use]
    pub fn with_push_lane(mut self) -> Self {
        self.push_lane = Some(crate::push_lane::PushLane::new());
        self
    }

    /// Send the lane's waiting pushes to the log, a few entries in flight at a time (runs for
    /// the life of the node).
    pub async fn run_push_lane(self: Arc<Self>) {
        let Some(lane) = &self.push_lane else { return };
        loop {
            let (slot, mut batch) = lane.next().await;
            let me = self.clone();
            tokio::spawn(async move {
                let items = std::mem::take(&mut batch.items);
                let result = me
                    .propose(Command::Push(items))
                    .await
                    .and_then(|r| match r.outcome {
                        Outcome::Push(out) => Ok(out),
                        _ => Err(BrokerError::unexpected_outcome()),
                    });
                batch.answer(result);
                drop(slot);
            });
        }
    }

    /// Set the largest payload one message, KV value or timer may carry.
    #[must_use]
    pub fn with_max_message_bytes(mut self, max: usize) -> Self {
        self.max_message_bytes = max;
        self
    }

    /// Show the S3 sink's block on `/status`.
    pub(crate) fn set_s3_status(&self, f: Box<dyn Fn() -> serde_json::Value + Send + Sync>) {
        let _ = self.s3_status.set(f);
    }

    /// The highest log format this node reports (tests pretend other builds with it).
    #[must_use]
    pub(crate) fn with_log_kinds(mut self, kinds: u32) -> Self {
        self.kinds = kinds;
        self
    }

    /// The locally applied state.
    pub(crate) fn store(&self) -> &FjallStore {
        &self.store
    }

    /// Whether followers forward their clients' writes (QUEEN_RAFT_CLIENT_OFFLOAD).
    #[must_use]
    pub fn with_client_offload(mut self, on: bool) -> Self {
        self.client_offload = on;
        self
    }

    /// Attach the raft node (membership routes) and the readiness and promotion limits.
    #[must_use]
    pub fn with_cluster(
        mut self,
        raft: queen_raft::RaftNode,
        promote_max_lag: u64,
        ready_lag_entries: u64,
        ready_lag_ms: u64,
    ) -> Self {
        self.raft = Some(raft);
        self.promote_max_lag = promote_max_lag;
        self.ready_lag_entries = ready_lag_entries;
        self.ready_lag_ms = ready_lag_ms;
        self
    }

    /// Set the disk gate's threshold (percent) and the reserve it keeps free (bytes).
    #[must_use]
    pub fn with_disk_gate(mut self, high_pct: u8, reserve_bytes: u64) -> Self {
        self.disk = crate::disk_gate::DiskGate::new(crate::disk_gate::Limits {
            high_pct,
            reserve_bytes,
        });
        self
    }

    /// Record a sample of the data directory's file system: its size and the bytes in use.
    pub fn set_disk_use(&self, total_bytes: u64, used_bytes: u64) {
        self.disk.sample(total_bytes, used_bytes);
    }

    /// The disk gate (see `disk_gate`): a client command that adds data is refused when what it
    /// and everything admitted since the last sample will write would pass the threshold; every
    /// command is refused when it would take the reserve. Pops, acks, lease extensions, ticks,
    /// deletions and the sink's own writes (`internal`) pass a closed gate so consumers drain.
    fn gate(
        &self,
        admission: crate::disk_gate::Admission,
        kind: &'static str,
        bytes: usize,
    ) -> Result<crate::disk_gate::Admitted<'_>, BrokerError> {
        let memtable = self.store.engine_stats().0;
        self.disk
            .admit(u64::try_from(bytes).unwrap_or(u64::MAX), admission, memtable)
            .map_err(|refusal| {
                tracing::debug!(target: "queen-app", kind, error = %refusal, "refused at the disk gate");
                BrokerError::DiskFull(refusal)
            })
    }

    /// After a queue deletion near the disk gate, give the deleted rows' space back soon (one
    /// reclaim at a time): otherwise it returns only when the store next compacts those tables,
    /// and a node at a closed gate has stopped writing the data that would make it compact. The
    /// queue's rows are deleted by the next ticks in bounded steps (its "graves"), so the
    /// reclaim waits until none is left (at most `RECLAIM_WAIT`).
    fn reclaim_near_gate(&self) {
        if !self.disk.near_gate(RECLAIM_WITHIN_POINTS)
            || self.reclaiming.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let (store, running) = (self.store.clone(), self.reclaiming.clone());
        let raft = self.raft.clone();
        tokio::spawn(async move {
            let until = Instant::now() + RECLAIM_WAIT;
            while graves_pending(&store) && Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            // The deleted messages are in raft log files (written once, where the log wrote
            // their entries): a snapshot and a purge up to it let those files go now.
            if let Some(raft) = &raft {
                let started = Instant::now();
                let done = raft.compact_log(RECLAIM_WAIT).await;
                tracing::info!(target: "queen-app", ms = started.elapsed().as_millis(), done, "compacted the raft log near the disk gate");
            }
            let started = Instant::now();
            let done =
                tokio::task::spawn_blocking(move || store.reclaim().map(|()| store.disk_bytes()))
                    .await;
            match done {
                Ok(Ok(bytes)) => {
                    tracing::info!(target: "queen-app", ms = started.elapsed().as_millis(), store_bytes = bytes, "reclaimed deleted rows near the disk gate")
                }
                Ok(Err(e)) => {
                    tracing::warn!(target: "queen-app", error = %e, "reclaiming deleted rows failed")
                }
                Err(e) => {
                    tracing::warn!(target: "queen-app", error = %e, "the reclaim task failed")
                }
            }
            running.store(false, Ordering::Release);
        });
    }

    /// Propose a command and wait for its outcome, up to the request deadline. While no leader
    /// is known the proposal is held and retried (nothing was appended), not failed at once.
    pub async fn propose(&self, command: Command) -> Result<Response, BrokerError> {
        self.propose_as(command, false).await
    }

    /// `propose`, with `internal` set for the node's own writes that pass a closed disk gate.
    async fn propose_as(&self, command: Command, internal: bool) -> Result<Response, BrokerError> {
        let kind = kind(&command);
        let is_tick = matches!(command, Command::Tick);
        let admission = crate::disk_gate::Admission::of(&command, internal);
        let bytes = Entry {
            proposed_at: self.clock.now_micros(),
            command,
        }
        .encode();
        // After encoding, so the gate counts what the log will hold.
        let _admitted = self.gate(admission, kind, bytes.len())?;
        if !self.client_offload && !is_tick {
            let p = self.log.progress();
            if p.role != RaftRole::Leader {
                return Err(BrokerError::NotLeader {
                    leader: p.leader,
                    forwards: false,
                });
            }
        }
        let started = Instant::now();
        let deadline = started + self.request_timeout;
        let result = loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(remaining, self.log.propose(bytes.clone())).await {
                Err(_) => break Err(BrokerError::Timeout),
                Ok(Ok(resp)) => {
                    break Response::decode(&resp).map_err(|e| {
                        tracing::error!(target: "queen-app", error = %e, "undecodable state machine response");
                        BrokerError::Internal("the state machine answered in an unknown format".to_owned())
                    });
                }
                Ok(Err(
                    ProposeError::NotLeader { leader: None } | ProposeError::Unavailable(_),
                )) if Instant::now() + Duration::from_millis(50) < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Ok(Err(e)) => break Err(not_committed(&e)),
            }
        };
        self.telemetry
            .metrics()
            .proposal(kind, result.is_ok(), started.elapsed().as_secs_f64());
        let response = result?;
        if let Outcome::Rejected(why) = &response.outcome {
            tracing::error!(target: "queen-app", why, "the state machine rejected an entry");
            return Err(BrokerError::Internal(
                "the state machine could not read the entry".to_owned(),
            ));
        }
        Ok(response)
    }

    /// Wake parked pops when this node applied entries it did not propose itself (writes that
    /// reached the leader through another node): polls the applied index every 25 ms.
    pub async fn watch_applied(&self, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut last = self.log.progress().applied;
        loop {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(25)) => {}
                _ = stop.changed() => return,
            }
            let now = self.log.progress().applied;
            if now != last {
                last = now;
                if self.waiters.parked() > 0 {
                    self.waiters.wake_all();
                }
            }
        }
    }

    /// Propose a tick (the leader's clock moves broker time; housekeeping runs).
    pub async fn tick(&self) {
        if self.log.progress().role != RaftRole::Leader {
            return;
        }
        match self.propose(Command::Tick).await {
            // A tick may deliver due timers: let parked pops look again.
            Ok(_) => self.waiters.wake_all(),
            Err(e) => tracing::debug!(target: "queen-app", error = %e, "tick not committed"),
        }
    }

    fn progress_gauges(&self) {
        let p = self.log.progress();
        let m = self.telemetry.metrics();
        m.set_raft(p.term, p.applied, p.commit, p.role == RaftRole::Leader);
        m.set_log_fsyncs((self.fsyncs)());
        m.set_store_disk_bytes(self.store.disk_bytes());
        m.set_waiting_pops(self.waiters.parked());
    }

    fn read_error(e: &queen_domain::StoreError) -> BrokerError {
        tracing::error!(target: "queen-app", error = %e, "state read failed");
        BrokerError::Internal("reading the node's state failed; see its log".to_owned())
    }
}

impl ClientApi for Broker {
    async fn push(&self, items: Vec<PushItem>) -> Result<Vec<PushOutcome>, BrokerError> {
        message_size::check_push(&items, self.max_message_bytes)?;
        let out = match &self.push_lane {
            // The request's deadline covers its wait in the lane too; past it the outcome is
            // unknown, as for any proposal that timed out (a retry with the same
            // transactionIds is safe).
            Some(lane) => {
                match tokio::time::timeout(self.request_timeout, lane.submit(items)).await {
                    Err(_) => return Err(BrokerError::Timeout),
                    Ok(Err(_)) => {
                        return Err(BrokerError::Unavailable("the node is stopping".to_owned()));
                    }
                    Ok(Ok(out)) => out?,
                }
            }
            None => {
                let r = self.propose(Command::Push(items)).await?;
                let Outcome::Push(out) = r.outcome else {
                    return Err(BrokerError::unexpected_outcome());
                };
                out
            }
        };
        let queued = out
            .iter()
            .filter(|o| o.status == PushStatus::Queued)
            .count() as u64;
        let dup = out
            .iter()
            .filter(|o| o.status == PushStatus::Duplicate)
            .count() as u64;
        self.telemetry.metrics().messages_pushed(queued);
        self.telemetry.metrics().messages_duplicate(dup);
        let mut woken: Vec<&str> = Vec::new();
        for o in &out {
            if o.status == PushStatus::Queued && !woken.contains(&o.queue.as_str()) {
                woken.push(&o.queue);
                self.waiters.wake(&o.queue);
            }
        }
        Ok(out)
    }

    async fn pop(&self, req: PopRequest) -> Result<PopOutcome, BrokerError> {
        let deadline = Instant::now()
            + if req.wait {
                req.timeout
            } else {
                Duration::ZERO
            };
        let notify = self.waiters.of(req.command.queue.as_str());
        let mut cmd = req.command;
        let mut parked = None;
        let result = loop {
            // Register for a wake-up before looking, so a commit between the look and the wait
            // is not missed.
            let mut notified = pin!(notify.notified());
            notified.as_mut().enable();
            let would = reads::would_pop(&self.store, Stamp(self.clock.now_micros()), &cmd)
                .map_err(|e| Self::read_error(&e))?;
            if !would.is_empty() {
                cmd.lease_id = uuid::Uuid::now_v7().to_string();
                let r = self.propose(Command::Pop(cmd.clone())).await?;
                if let Outcome::Pop(p) = r.outcome
                    && !p.is_empty()
                {
                    break Ok(p);
                }
                // Another consumer won the race: wait like an empty look.
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                break Ok(PopOutcome {
                    lease_id: String::new(),
                    lease_expires: Stamp(0),
                    claims: Vec::new(),
                });
            }
            if parked.is_none() {
                parked = Some(self.waiters.park());
            }
            let _ = tokio::time::timeout(remaining.min(RECHECK), notified).await;
        };
        drop(parked);
        if let Ok(p) = &result {
            let n: usize = p.claims.iter().map(|c| c.messages.len()).sum();
            self.telemetry.metrics().messages_delivered(n as u64);
        }
        result
    }

    async fn pop_tagged(
        &self,
        namespace: Option<String>,
        task: Option<String>,
        req: PopRequest,
    ) -> Result<(String, PopOutcome), BrokerError> {
        let deadline = Instant::now()
            + if req.wait {
                req.timeout
            } else {
                Duration::ZERO
            };
        let mut cmd = req.command;
        loop {
            let view = self.store.view();
            let queues = reads::queues(&view, 100_000).map_err(|e| Self::read_error(&e))?;
            for q in queues.iter().filter(|q| {
                namespace
                    .as_ref()
                    .is_none_or(|n| q.namespace.as_ref() == Some(n))
                    && task.as_ref().is_none_or(|t| q.task.as_ref() == Some(t))
            }) {
                let Ok(name) = QueueName::new(q.name.clone()) else {
                    continue;
                };
                cmd.queue = name;
                let would = reads::would_pop(&self.store, Stamp(self.clock.now_micros()), &cmd)
                    .map_err(|e| Self::read_error(&e))?;
                if would.is_empty() {
                    continue;
                }
                cmd.lease_id = uuid::Uuid::now_v7().to_string();
                if let Outcome::Pop(p) = self.propose(Command::Pop(cmd.clone())).await?.outcome
                    && !p.is_empty()
                {
                    let n: usize = p.claims.iter().map(|c| c.messages.len()).sum();
                    self.telemetry.metrics().messages_delivered(n as u64);
                    return Ok((q.name.clone(), p));
                }
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Ok((
                    String::new(),
                    PopOutcome {
                        lease_id: String::new(),
                        lease_expires: Stamp(0),
                        claims: Vec::new(),
                    },
                ));
            }
            tokio::time::sleep(remaining.min(RECHECK)).await;
        }
    }

    async fn ack(
        &self,
        group: GroupName,
        items: Vec<AckItem>,
    ) -> Result<Vec<AckOutcome>, BrokerError> {
        let statuses: Vec<String> = items.iter().map(|i| i.status.clone()).collect();
        let r = self.propose(Command::Ack { group, items }).await?;
        let Outcome::Ack(out) = r.outcome else {
            return Err(BrokerError::unexpected_outcome());
        };
        let m = self.telemetry.metrics();
        for (o, s) in out.iter().zip(&statuses) {
            m.acks(if o.verdict.success { s } else { "refused" }, 1);
        }
        if out.iter().any(|o| o.verdict.lease_released) {
            self.waiters.wake_all();
        }
        Ok(out)
    }

    async fn kv(&self, ops: Vec<KvOp>) -> Result<KvOutcome, BrokerError> {
        message_size::check_kv(&ops, self.max_message_bytes, "operations")?;
        match self.propose(Command::Kv(ops)).await?.outcome {
            Outcome::Kv(o) => Ok(o),
            _ => Err(BrokerError::unexpected_outcome()),
        }
    }

    async fn locks(&self, ops: Vec<LockOp>) -> Result<Vec<LockResult>, BrokerError> {
        match self.propose(Command::Locks(ops)).await?.outcome {
            Outcome::Locks(o) => Ok(o),
            _ => Err(BrokerError::unexpected_outcome()),
        }
    }

    async fn transaction(
        &self,
        ops: Vec<TxnOp>,
        required_leases: Vec<String>,
        kv: Vec<KvOp>,
        timers: Vec<queen_domain::timers::TimerOp>,
    ) -> Result<TxnOutcome, BrokerError> {
        message_size::check_transaction(&ops, &kv, &timers, self.max_message_bytes)?;
        let r = self
            .propose(Command::Transaction {
                ops,
                required_leases,
                kv,
                timers,
            })
            .await?;
        let Outcome::Transaction(t) = r.outcome else {
            return Err(BrokerError::unexpected_outcome());
        };
        if t.success {
            for res in &t.results {
                if let TxnResult::Push(p) = res
                    && p.status == PushStatus::Queued
                {
                    self.waiters.wake(&p.queue);
                }
            }
            self.waiters.wake_all();
        }
        Ok(t)
    }

    async fn extend(&self, lease_id: String) -> Result<Outcome, BrokerError> {
        Ok(self
            .propose(Command::ExtendLease { lease_id })
            .await?
            .outcome)
    }

    async fn configure(
        &self,
        queue: QueueName,
        namespace: Option<String>,
        task: Option<String>,
        options: QueueOptions,
    ) -> Result<QueueOptions, BrokerError> {
        let name = queue.as_str().to_owned();
        let r = self
            .propose(Command::Configure {
                queue,
                namespace,
                task,
                options,
            })
            .await?;
        self.waiters.wake(&name);
        match r.outcome {
            Outcome::Configured(o) => Ok(o),
            _ => Err(BrokerError::unexpected_outcome()),
        }
    }

    async fn delete_queue(&self, queue: QueueName) -> Result<bool, BrokerError> {
        let name = queue.as_str().to_owned();
        let r = self.propose(Command::DeleteQueue { queue }).await?;
        self.waiters.forget(&name);
        self.reclaim_near_gate();
        match r.outcome {
            Outcome::Deleted { existed } => Ok(existed),
            _ => Err(BrokerError::unexpected_outcome()),
        }
    }

    async fn timers(
        &self,
        ops: Vec<queen_domain::timers::TimerOp>,
    ) -> Result<Vec<queen_domain::timers::TimerResult>, BrokerError> {
        message_size::check_timers(&ops, self.max_message_bytes, "timers")?;
        match self.propose(Command::Timers(ops)).await?.outcome {
            Outcome::Timers(r) => Ok(r),
            _ => Err(BrokerError::unexpected_outcome()),
        }
    }

    async fn command(&self, command: Command) -> Result<Outcome, BrokerError> {
        let queue = match &command {
            Command::Seek { queue, .. } => Some(queue.as_str().to_owned()),
            _ => None,
        };
        let out = self.propose(command).await?.outcome;
        match queue {
            Some(q) => self.waiters.wake(&q),
            None => self.waiters.wake_all(),
        }
        Ok(out)
    }

    async fn read_barrier(&self) -> Result<(), BrokerError> {
        let deadline = self.request_timeout;
        match tokio::time::timeout(deadline, self.log.read_barrier()).await {
            Err(_) => Err(BrokerError::Timeout),
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(not_committed(&e)),
        }
    }

    fn state(&self) -> Box<dyn queen_domain::StateRead + Send + '_> {
        Box::new(self.store.view())
    }

    fn now(&self) -> Stamp {
        Stamp(self.clock.now_micros())
    }

    async fn membership(&self, op: MembershipOp) -> Result<Vec<Member>, BrokerError> {
        use queen_ports::{Membership, MembershipChange};
        let Some(raft) = &self.raft else {
            return Err(BrokerError::Unavailable(
                "this node has no raft group".to_owned(),
            ));
        };
        // A follower hands the change to the leader (raft port); the leader checks and runs it.
        let change = match op {
            MembershipOp::List => MembershipChange::List,
            MembershipOp::AddLearner { id, raft: r, http } => {
                let min_kinds = reads::cluster_version(&self.store).unwrap_or(0);
                MembershipChange::AddLearner {
                    id,
                    raft: r,
                    http,
                    min_kinds,
                }
            }
            MembershipOp::Promote { ids, force } => MembershipChange::Promote {
                ids,
                force,
                max_lag: self.promote_max_lag,
            },
            MembershipOp::Remove { id } => MembershipChange::Remove { id },
        };
        // A membership change has the request deadline too: past it the outcome is unknown
        // (every change is idempotent, so a retry is safe).
        match tokio::time::timeout(self.request_timeout, raft.change(change)).await {
            Err(_) => Err(BrokerError::Timeout),
            Ok(result) => Ok(result?),
        }
    }

    fn health(&self) -> HealthView {
        let p = self.log.progress();
        let lag = p.commit.saturating_sub(p.applied);
        // Time behind: the leader ticks every second, so a node that applied the latest
        // entries has a recent safeTime (broker time, compared with this node's clock).
        let age_ms = reads::safe_time(&self.store)
            .map(|s| self.clock.now_micros().saturating_sub(s.0) / 1000)
            .unwrap_or(u64::MAX);
        // A leader that no majority acknowledged within an election timeout has lost its quorum.
        let leader_alone = p.quorum_ack_ms.is_some_and(|ms| ms > LEADER_QUORUM_MS);
        let not_ready = if !p.storage_ready {
            Some(NotReady::Settling)
        } else if p.leader.is_none() || leader_alone {
            Some(NotReady::NoQuorum)
        } else if lag > self.ready_lag_entries && age_ms > self.ready_lag_ms {
            Some(NotReady::Settling)
        } else {
            None
        };
        HealthView {
            not_ready,
            progress: p,
            kinds: self.kinds,
            cluster_version: reads::cluster_version(&self.store).unwrap_or(0),
            apply_failure: None,
        }
    }

    async fn status(&self) -> Result<StatusView, BrokerError> {
        let view = self.store.view();
        let queues = reads::queues(&view, 1000).map_err(|e| Self::read_error(&e))?;
        let safe = reads::safe_time(&view).map_err(|e| Self::read_error(&e))?;
        let p = self.log.progress();
        let (memtable_bytes, flushes_queued, sealed_memtables, level0_tables) =
            self.store.engine_stats();
        let (segment_files, segment_bytes) = self.store.segment_stats();
        let (dedup_runs, dedup_run_entries, dedup_memory_entries) = self.store.dedup_stats();
        Ok(StatusView {
            node: NodeStatus {
                id: p.node_id,
                uptime_seconds: self.started.elapsed().as_secs(),
                version: env!("CARGO_PKG_VERSION"),
            },
            raft: p,
            safe_time: safe.iso_micros(),
            storage: StorageStatus {
                disk_bytes: self.store.disk_bytes(),
                log_fsyncs: (self.fsyncs)(),
                memtable_bytes,
                flushes_queued,
                sealed_memtables,
                level0_tables,
                segment_files,
                segment_bytes,
                dedup_runs,
                dedup_run_entries,
                dedup_memory_entries,
            },
            queues: QueuesStatus {
                count: queues.len(),
                messages: queues.iter().map(|q| q.messages).sum(),
                items: queues
                    .into_iter()
                    .map(|q| QueueStatus {
                        name: q.name,
                        messages: q.messages,
                        partitions: q.partitions,
                        dead_lettered: q.dead_lettered,
                        namespace: q.namespace,
                        task: q.task,
                    })
                    .collect(),
            },
            pops: PopsStatus {
                waiting: self.waiters.parked(),
            },
            s3: self.s3_status.get().map(|f| f()),
        })
    }

    fn metrics_text(&self) -> String {
        self.progress_gauges();
        self.telemetry.render_prometheus()
    }

    fn observe_request(&self, route: &'static str, status: u16, seconds: f64) {
        self.telemetry
            .metrics()
            .http_request(route, status, seconds);
    }
}

/// The node's own S3 sink: its KV writes (leases, intents, commit pointers, checkpoints) pass a
/// closed disk gate, like acks, so a node above the gate keeps committing its backlog to the
/// lake; only the reserve stops them.
impl SinkLog for Broker {
    fn sink_kv(&self, ops: Vec<KvOp>) -> BoxFuture<'_, Result<KvOutcome, BrokerError>> {
        Box::pin(async move {
            match self.propose_as(Command::Kv(ops), true).await?.outcome {
                Outcome::Kv(o) => Ok(o),
                _ => Err(BrokerError::unexpected_outcome()),
            }
        })
    }

    fn sink_barrier(&self) -> BoxFuture<'_, Result<(), BrokerError>> {
        Box::pin(ClientApi::read_barrier(self))
    }

    fn applied(&self) -> Box<dyn queen_domain::StateRead + Send + '_> {
        Box::new(self.store.view())
    }

    fn wall_clock(&self) -> Stamp {
        Stamp(self.clock.now_micros())
    }

    fn alone(&self) -> bool {
        self.raft.as_ref().is_none_or(|r| r.members().len() <= 1)
    }
}
