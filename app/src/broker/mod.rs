//! The broker's use cases as the client API reaches them (`queen_ports::ClientApi`), split by
//! responsibility: proposing past the disk gate within the deadline (`propose.rs`), pops that
//! wait (`long_poll.rs`), readiness, status and gauges (`readiness.rs`), membership and space
//! reclaim (`admin.rs`), and the S3 sink's narrow port (`sink_log.rs`). This file assembles
//! them and holds the use cases that are one proposal each.

mod admin;
pub mod analytics;
mod autopilot;
mod delivered;
mod ephemeral;
mod ephemeral_handover;
mod ephemeral_lane;
mod ephemeral_route;
mod long_poll;
mod nodes;
mod producer;
mod propose;
mod purge;
mod readiness;
mod sealing;
mod sink_log;
#[cfg(test)]
pub(crate) mod twins;
mod wakeups;

use std::sync::Arc;
use std::time::{Duration, Instant};

use queen_domain::command::{
    AckItem, AckOutcome, AckStatus, Command, Outcome, PushItem, PushOutcome, PushStatus, Response,
    TxnOp, TxnOutcome,
};
use queen_domain::ids::LeaseId;
use queen_domain::kv::{KvOp, KvOutcome, LockOp, LockResult};
use queen_domain::model::QueueOptions;
use queen_domain::names::{GroupName, QueueName};
use queen_domain::time::Stamp;
use queen_ports::{
    BrokerError, ClientApi, Clock, HealthView, Member, Membership, MembershipOp, PopRequest,
    Popped, RaftRole, ReplicatedLog, StateReader, StatusView,
};
use queen_telemetry::Telemetry;

use crate::message_size;
use propose::Proposer;

/// The highest log format this build reads (entries are versioned by their command set):
/// 2 adds `Command::AsProducer`, 3 `Command::DeleteMessage` and `Command::RetryDeadLetter`,
/// 4 `Command::AckAt`, 5 `Command::PopConflating` and pops that read the ready index
/// (`Command::READY_INDEX_FORMAT`), 6 pops that fill it in bounded steps and refuse a lease id
/// on record (`Command::BOUNDED_FILL_FORMAT`).
pub(crate) const LOG_KINDS: u32 = queen_domain::command::Command::LATEST_FORMAT;

/// How long a tick may wait for its outcome.
const TICK_DEADLINE: std::time::Duration = std::time::Duration::from_secs(3);

/// The broker: what every route of the client API does.
pub struct Broker {
    proposer: Proposer,
    log: Arc<dyn ReplicatedLog>,
    state: Arc<dyn StateReader>,
    clock: Arc<dyn Clock>,
    telemetry: Telemetry,
    /// Waiting pops, woken by what this node applies (`wakeups.rs`).
    wakeups: Arc<wakeups::Wakeups>,
    fsyncs: Arc<dyn Fn() -> u64 + Send + Sync>,
    started: Instant,
    /// The raft group's membership, for the admin routes.
    membership: Option<Arc<dyn Membership>>,
    /// Promotion lag limit.
    promote_max_lag: u64,
    /// Readiness: entries behind the commit index.
    ready_lag_entries: u64,
    /// Readiness: age of the last applied entry (broker time), in ms.
    ready_lag_ms: u64,
    /// The highest log format this node reads (`kinds` in /health).
    kinds: u32,
    /// Group commit for pushes, when the node runs its lane (`run_push_lane`).
    push_lane: Option<crate::push_lane::PushLane>,
    /// Whether a push was stored without its producer (a cluster below log format 2) yet.
    unstamped_warned: std::sync::atomic::AtomicBool,
    /// Where this node's pops delivered their messages, for the acks that follow them.
    delivered: delivered::Delivered,
    /// Each consumer's recent autopilot pops, which size its next one (`autopilot.rs`).
    autopilot: autopilot::Memory,
    /// Largest payload of one message, KV value or timer payload (`QUEEN_MAX_MESSAGE_BYTES`).
    max_message_bytes: usize,
    /// The S3 sink's block of `/status`, when the sink runs.
    s3_status: std::sync::OnceLock<Box<dyn Fn() -> serde_json::Value + Send + Sync>>,
    /// A store reclaim (after a deletion near the disk gate) is running.
    reclaiming: Arc<std::sync::atomic::AtomicBool>,
    /// Seals and opens payloads of encrypted queues (`sealing.rs`).
    cipher: Arc<dyn queen_ports::PayloadCipher>,
    /// Whether `cipher` holds a key (`QUEEN_ENCRYPTION_KEY`).
    has_key: bool,
    /// Which queues are flagged for encryption, as read at a store's queue-options epoch
    /// (`sealing.rs`).
    flags: sealing::Flags,
    /// The ephemeral rings this node owns (`ephemeral.rs`).
    ephemeral: ephemeral::EphemeralRings,
    /// Calls to the other members (ephemeral operations go to their partition's owner).
    peers: Option<Arc<dyn queen_ports::PeerCalls>>,
    /// Members this node saw fail (`ephemeral_route.rs`).
    eph_owners: ephemeral_route::Owners,
    /// Pushes waiting to be handed to their owner, grouped per owner (`ephemeral_lane.rs`).
    eph_lanes: ephemeral_lane::Lanes,
    /// While this node stops: operations hold it shared, a shipment of rings exclusively, so
    /// no operation sees a ring between its detach here and its adoption there.
    eph_ship_lock: tokio::sync::RwLock<()>,
    /// The node-local analytics samples (`analytics.rs`), when sampling is on.
    samples: Option<Arc<dyn queen_ports::SampleLog>>,
    /// Requests served and those answered 5xx, for the worker series.
    requests: (std::sync::atomic::AtomicU64, std::sync::atomic::AtomicU64),
    /// The node's own sink settings (`QUEEN_S3_*`), when the embedded sink runs: tenant sinks
    /// take their node-wide settings from it.
    sink_node: Option<Arc<crate::SinkSettings>>,
    /// This broker's raft group on a node of several (`QUEEN_RAFT_GROUPS`): its figures carry
    /// a `group` label. `None` with one group.
    group: Option<u16>,
    /// On a node of several groups, the state of the group that holds the embedded proxy's
    /// directory, when it is another group's.
    directory: std::sync::OnceLock<Arc<dyn StateReader>>,
    /// On group 0 of a node of several groups: the other groups' states, whose queues the
    /// analytics samples take in too.
    sampled_groups: std::sync::OnceLock<Vec<Arc<dyn StateReader>>>,
}

impl Broker {
    /// Assemble the use cases over a log, the local state and a clock.
    pub fn new(
        log: Arc<dyn ReplicatedLog>,
        state: Arc<dyn StateReader>,
        clock: Arc<dyn Clock>,
        telemetry: Telemetry,
        request_timeout: Duration,
        fsyncs: Arc<dyn Fn() -> u64 + Send + Sync>,
    ) -> Self {
        Self {
            proposer: Proposer::new(
                log.clone(),
                clock.clone(),
                state.clone(),
                telemetry.clone(),
                request_timeout,
            ),
            log,
            state,
            clock,
            telemetry,
            wakeups: Arc::default(),
            fsyncs,
            started: Instant::now(),
            membership: None,
            promote_max_lag: 1000,
            ready_lag_entries: readiness::READY_LAG_ENTRIES,
            ready_lag_ms: 2000,
            kinds: LOG_KINDS,
            push_lane: None,
            unstamped_warned: std::sync::atomic::AtomicBool::new(false),
            delivered: delivered::Delivered::default(),
            autopilot: autopilot::Memory::default(),
            max_message_bytes: 8 << 20,
            s3_status: std::sync::OnceLock::new(),
            reclaiming: Arc::default(),
            cipher: Arc::new(queen_crypto::NoKey),
            has_key: false,
            flags: sealing::Flags::default(),
            ephemeral: ephemeral::EphemeralRings::new(queen_domain::ephemeral::Limits::default()),
            peers: None,
            eph_owners: ephemeral_route::Owners::default(),
            eph_lanes: ephemeral_lane::Lanes::default(),
            eph_ship_lock: tokio::sync::RwLock::new(()),
            samples: None,
            requests: Default::default(),
            group: None,
            directory: std::sync::OnceLock::new(),
            sampled_groups: std::sync::OnceLock::new(),
            sink_node: None,
        }
    }

    /// Reach the other members of the cluster (ephemeral operations are served by their
    /// partition's owner); [`Broker::serve_peers`] answers theirs.
    #[must_use]
    pub fn with_peers(mut self, peers: Arc<dyn queen_ports::PeerCalls>) -> Self {
        self.peers = Some(peers);
        self
    }

    /// This broker is group `index` of a node of `count` raft groups: with more than one, its
    /// figures carry a `group` label (metrics, `/status`).
    #[must_use]
    pub fn with_group(mut self, index: u16, count: u16) -> Self {
        self.group = (count > 1).then_some(index);
        self
    }

    /// Read the embedded proxy's directory from `home` (another group's state).
    pub(crate) fn set_directory(&self, home: Arc<dyn StateReader>) {
        let _ = self.directory.set(home);
    }

    /// Take the queues of `others` (the other groups' states) into this broker's analytics
    /// samples.
    pub(crate) fn sample_groups(&self, others: Vec<Arc<dyn StateReader>>) {
        let _ = self.sampled_groups.set(others);
    }

    /// This broker's applied state, as a port.
    pub(crate) fn state_reader(&self) -> Arc<dyn StateReader> {
        self.state.clone()
    }

    /// The raft group this broker serves on a node of several, else `None`.
    #[must_use]
    pub fn group(&self) -> Option<u16> {
        self.group
    }

    /// Answer the operations other members hand to this node.
    pub fn serve_peers(self: &Arc<Self>) {
        if let Some(p) = &self.peers {
            p.serve(Arc::new(ephemeral_route::PeerService(Arc::downgrade(self))));
        }
    }

    /// Set the ephemeral queues' ceilings and defaults (`QUEEN_EPHEMERAL_*`).
    #[must_use]
    pub fn with_ephemeral_limits(mut self, limits: queen_domain::ephemeral::Limits) -> Self {
        self.ephemeral = ephemeral::EphemeralRings::new(limits);
        self
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
                let command = as_producer(batch.producer.take(), Command::Push(items));
                let result = me.proposer.propose_for(command, Outcome::into_push).await;
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

    /// Whether followers forward their clients' writes (QUEEN_RAFT_CLIENT_OFFLOAD).
    #[must_use]
    pub fn with_client_offload(mut self, on: bool) -> Self {
        self.proposer.set_client_offload(on);
        self
    }

    /// Attach the raft group's membership (admin routes) and the readiness and promotion
    /// limits.
    #[must_use]
    pub fn with_cluster(
        mut self,
        membership: Arc<dyn Membership>,
        promote_max_lag: u64,
        ready_lag_entries: u64,
        ready_lag_ms: u64,
    ) -> Self {
        self.membership = Some(membership);
        self.promote_max_lag = promote_max_lag;
        self.ready_lag_entries = ready_lag_entries;
        self.ready_lag_ms = ready_lag_ms;
        self
    }

    /// Set the disk gate's threshold (percent) and the reserve it keeps free (bytes).
    #[must_use]
    pub fn with_disk_gate(mut self, high_pct: u8, reserve_bytes: u64) -> Self {
        self.proposer.set_disk_gate(high_pct, reserve_bytes);
        self
    }

    /// Record a sample of the data directory's file system: its size and the bytes in use.
    pub fn set_disk_use(&self, total_bytes: u64, used_bytes: u64) {
        self.proposer.disk.sample(total_bytes, used_bytes);
        self.telemetry
            .metrics()
            .set_disk(total_bytes, used_bytes, self.proposer.disk.high_pct());
    }

    /// Propose a command and wait for its outcome, up to the request deadline, past the disk
    /// gate (see `propose.rs`).
    pub async fn propose(&self, command: Command) -> Result<Response, BrokerError> {
        self.proposer.propose(command).await
    }

    /// What the store tells of every batch it applies, on this node whether it leads or not:
    /// the waiting pops' wake-ups (`wakeups.rs`).
    pub fn apply_observer(&self) -> Arc<dyn queen_ports::ApplyObserver> {
        self.wakeups.clone()
    }

    /// Propose a tick (the leader's clock moves broker time; housekeeping runs).
    pub async fn tick(&self) {
        if self.log.progress().role != RaftRole::Leader {
            return;
        }
        // Bounded well below the request deadline: a tick proposed just before this node lost
        // the lead (a hand-off, a hand-back to a group's preferred member) may never be
        // answered, and the next tick must not wait behind it. Dropping it is harmless: ticks
        // are housekeeping, and one that still commits applies like any other.
        match tokio::time::timeout(TICK_DEADLINE, self.propose(Command::Tick)).await {
            // What it delivered or released wakes parked pops from the apply.
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::debug!(target: "queen-app", error = %e, "tick not committed"),
            Err(_) => tracing::debug!(target: "queen-app", "tick not answered in time"),
        }
    }

    fn read_error(e: &queen_domain::StoreError) -> BrokerError {
        tracing::error!(target: "queen-app", error = %e, "state read failed");
        BrokerError::Internal("reading the node's state failed; see its log".to_owned())
    }
}

/// Whether timer operations schedule a message.
fn schedules(ops: &[queen_domain::timers::TimerOp]) -> bool {
    ops.iter()
        .any(|op| matches!(op, queen_domain::timers::TimerOp::Schedule { .. }))
}

/// A push, transaction or timer operations on behalf of `producer`, when there is one.
fn as_producer(producer: Option<String>, command: Command) -> Command {
    match producer {
        Some(producer) => Command::AsProducer {
            producer,
            command: Box::new(command),
        },
        None => command,
    }
}

impl ClientApi for Broker {
    async fn push(
        &self,
        mut items: Vec<PushItem>,
        producer: Option<String>,
    ) -> Result<Vec<PushOutcome>, BrokerError> {
        message_size::check_push(&items, self.max_message_bytes)?;
        self.seal_pushes(&mut items)?;
        let producer = self.stamped(producer).await;
        let out = match &self.push_lane {
            // The request's deadline covers its wait in the lane too; past it the outcome is
            // unknown, as for any proposal that timed out (a retry with the same
            // transactionIds is safe).
            Some(lane) => {
                match tokio::time::timeout(
                    self.proposer.request_timeout(),
                    lane.submit(items, producer),
                )
                .await
                {
                    Err(_) => return Err(BrokerError::Timeout),
                    Ok(Err(_)) => {
                        return Err(BrokerError::Unavailable("the node is stopping".to_owned()));
                    }
                    Ok(Ok(out)) => out?,
                }
            }
            None => {
                self.proposer
                    .propose_for(
                        as_producer(producer, Command::Push(items)),
                        Outcome::into_push,
                    )
                    .await?
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
        Ok(out)
    }

    async fn pop(&self, mut req: PopRequest) -> Result<Popped, BrokerError> {
        let queue = req.command.queue.as_str().to_owned();
        let plan = self.autopilot_plan(&mut req, &queue, true)?;
        let mut out = self.long_poll(req).await?;
        self.delivered.remember(&out);
        self.open_pop(&mut out);
        let autopilot = plan.map(|p| self.autopilot_done(p, &out));
        Ok(Popped {
            outcome: out,
            autopilot,
        })
    }

    async fn pop_tagged(
        &self,
        namespace: Option<String>,
        task: Option<String>,
        mut req: PopRequest,
    ) -> Result<(String, Popped), BrokerError> {
        // The queue is chosen among the tagged ones: the consumer is known by its tags.
        let tags = format!(
            "\u{1e}{}\u{1e}{}",
            namespace.as_deref().unwrap_or(""),
            task.as_deref().unwrap_or("")
        );
        let plan = self.autopilot_plan(&mut req, &tags, false)?;
        let (queue, mut out) = self.long_poll_tagged(namespace, task, req).await?;
        self.delivered.remember(&out);
        self.open_pop(&mut out);
        let autopilot = plan.map(|p| self.autopilot_done(p, &out));
        Ok((
            queue,
            Popped {
                outcome: out,
                autopilot,
            },
        ))
    }

    async fn ack(
        &self,
        group: GroupName,
        items: Vec<AckItem>,
    ) -> Result<Vec<AckOutcome>, BrokerError> {
        let statuses: Vec<AckStatus> = items.iter().map(|i| i.status.clone()).collect();
        let out = self
            .proposer
            .propose_for(self.ack_command(group, items), Outcome::into_ack)
            .await?;
        let m = self.telemetry.metrics();
        for (o, s) in out.iter().zip(&statuses) {
            m.acks(
                if o.verdict.success {
                    s.as_str()
                } else {
                    "refused"
                },
                1,
            );
        }
        Ok(out)
    }

    async fn kv(&self, ops: Vec<KvOp>) -> Result<KvOutcome, BrokerError> {
        message_size::check_kv(&ops, self.max_message_bytes, "operations")?;
        self.proposer
            .propose_for(Command::Kv(ops), Outcome::into_kv)
            .await
    }

    async fn ephemeral(
        &self,
        op: queen_ports::EphemeralOp,
    ) -> Result<queen_ports::EphemeralAnswer, BrokerError> {
        self.ephemeral_op(op).await
    }

    async fn locks(&self, ops: Vec<LockOp>) -> Result<Vec<LockResult>, BrokerError> {
        self.proposer
            .propose_for(Command::Locks(ops), Outcome::into_locks)
            .await
    }

    async fn transaction(
        &self,
        mut ops: Vec<TxnOp>,
        required_leases: Vec<LeaseId>,
        kv: Vec<KvOp>,
        mut timers: Vec<queen_domain::timers::TimerOp>,
        producer: Option<String>,
    ) -> Result<TxnOutcome, BrokerError> {
        message_size::check_transaction(&ops, &kv, &timers, self.max_message_bytes)?;
        self.seal_transaction(&mut ops, &mut timers)?;
        // Only a transaction that pushes or schedules has messages to stamp.
        let pushes = ops.iter().any(|op| matches!(op, TxnOp::Push(_))) || schedules(&timers);
        let producer = if pushes {
            self.stamped(producer).await
        } else {
            None
        };
        let command = Command::Transaction {
            ops,
            required_leases,
            kv,
            timers,
        };
        let t = self
            .proposer
            .propose_for(as_producer(producer, command), Outcome::into_transaction)
            .await?;
        Ok(t)
    }

    async fn extend(&self, lease_id: LeaseId) -> Result<Outcome, BrokerError> {
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
        self.check_flag(&name, options.encryption_enabled)?;
        let options = self
            .proposer
            .propose_for(
                Command::Configure {
                    queue,
                    namespace,
                    task,
                    options,
                },
                Outcome::into_configured,
            )
            .await?;
        // New options (a shorter delay, a lease time) are no change of a partition.
        self.wakeups.wake_queue(&name);
        Ok(options)
    }

    async fn delete_queue(&self, queue: QueueName) -> Result<bool, BrokerError> {
        let name = queue.as_str().to_owned();
        let existed = self
            .proposer
            .propose_for(Command::DeleteQueue { queue }, Outcome::into_deleted)
            .await?;
        self.wakeups.wake_queue(&name);
        self.reclaim_near_gate();
        Ok(existed)
    }

    async fn purge_tenant(
        &self,
        tenant: queen_domain::tenant::Tenant,
    ) -> Result<queen_ports::PurgeReport, BrokerError> {
        self.purge_pass(&tenant).await
    }

    async fn timers(
        &self,
        mut ops: Vec<queen_domain::timers::TimerOp>,
        producer: Option<String>,
    ) -> Result<Vec<queen_domain::timers::TimerResult>, BrokerError> {
        message_size::check_timers(&ops, self.max_message_bytes, "timers")?;
        self.seal_timers(&mut ops)?;
        // Only a schedule has a message to stamp (when it is delivered).
        let producer = if schedules(&ops) {
            self.stamped(producer).await
        } else {
            None
        };
        self.proposer
            .propose_for(
                as_producer(producer, Command::Timers(ops)),
                Outcome::into_timers,
            )
            .await
    }

    async fn command(&self, command: Command) -> Result<Outcome, BrokerError> {
        self.require_format(command.format()).await?;
        let queue = match &command {
            Command::Seek { queue, .. } => Some(queue.as_str().to_owned()),
            _ => None,
        };
        let out = self.propose(command).await?.outcome;
        // A seek, a resubscription or a deleted group moves cursors without a partition
        // changing: the apply does not tell it, so the waiters look again.
        match queue {
            Some(q) => self.wakeups.wake_queue(&q),
            None => self.wakeups.wake_all(),
        }
        Ok(out)
    }

    async fn read_barrier(&self) -> Result<(), BrokerError> {
        self.proposer.read_barrier().await
    }

    fn state(&self) -> Box<dyn queen_domain::StateRead + Send + '_> {
        self.state.view()
    }

    fn now(&self) -> Stamp {
        Stamp(self.clock.now_micros())
    }

    async fn analytics(
        &self,
        query: queen_ports::AnalyticsQuery,
    ) -> Result<queen_ports::AnalyticsAnswer, BrokerError> {
        self.analytics_read(query).await
    }

    async fn nodes(&self) -> Result<serde_json::Value, BrokerError> {
        self.cluster_nodes().await
    }

    async fn membership(&self, op: MembershipOp) -> Result<Vec<Member>, BrokerError> {
        self.change_membership(op).await
    }

    fn health(&self) -> HealthView {
        self.readiness()
    }

    async fn status(&self) -> Result<StatusView, BrokerError> {
        self.status_view()
    }

    fn metrics_text(&self) -> String {
        self.progress_gauges();
        self.telemetry.render_prometheus()
    }

    fn observe_request(&self, route: &'static str, status: u16, seconds: f64) {
        self.count_request(status);
        self.telemetry
            .metrics()
            .http_request(route, status, seconds);
    }

    fn open_payload<'a>(&self, stored: &'a [u8]) -> std::borrow::Cow<'a, [u8]> {
        match self.cipher.open(stored) {
            queen_ports::Opened::Plain(p) => std::borrow::Cow::Owned(p),
            _ => std::borrow::Cow::Borrowed(stored),
        }
    }

    fn tenant_sinks_available(&self) -> bool {
        self.sink_node.is_some()
    }

    fn retained_bytes(&self, tenant: &queen_domain::tenant::Tenant) -> Option<u64> {
        let pids: Vec<u64> = {
            let view = self.state.view();
            let queues = queen_domain::reads::tenant_queues(&*view, tenant, usize::MAX).ok()?;
            let mut pids = Vec::new();
            for q in queues {
                if let Ok(Some(v)) = queen_domain::reads::queue_view(&*view, &q.name) {
                    pids.extend(v.partitions.iter().map(|p| p.pid));
                }
            }
            pids
        };
        Some(self.state.stored_bytes(&pids))
    }

    fn check_tenant_sink(
        &self,
        config: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), String> {
        let Some(node) = &self.sink_node else {
            return Err("this node runs no S3 sink".to_owned());
        };
        // A placeholder secret and tenant: only the settings are checked here.
        crate::sink::config::tenant_settings(config, "unchecked", node, DEFAULT_TENANT_ID)
            .map(|_| ())
    }

    fn seal_secret(&self, secret: &[u8]) -> Result<Option<Vec<u8>>, String> {
        if !self.has_key {
            return Ok(None);
        }
        self.cipher.seal(secret).map(Some)
    }
}

const DEFAULT_TENANT_ID: &str = queen_domain::tenant::DEFAULT_TENANT;

impl Broker {
    /// The node's own sink settings, when the embedded sink runs (tenant sinks need it).
    #[must_use]
    pub fn with_sink_settings(mut self, settings: Option<crate::SinkSettings>) -> Self {
        self.sink_node = settings.map(Arc::new);
        self
    }

    /// The node's own sink settings, when the embedded sink runs.
    #[must_use]
    pub fn sink_settings(&self) -> Option<Arc<crate::SinkSettings>> {
        self.sink_node.clone()
    }
}
