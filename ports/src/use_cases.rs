//! The broker's use cases as a client reaches them (the HTTP adapter calls these), with typed
//! answers and typed errors. Nothing here knows a status code: the HTTP adapter maps
//! [`BrokerError`] to status, code and `retry-after` in one place.

use std::future::Future;
use std::time::Duration;

use queen_domain::StateRead;
use queen_domain::command::{
    AckItem, AckOutcome, Command, Outcome, PopCommand, PopOutcome, PushItem, PushOutcome, TxnOp,
    TxnOutcome,
};
use queen_domain::kv::{KvOp, KvOutcome, LockOp, LockResult};
use queen_domain::model::QueueOptions;
use queen_domain::names::{GroupName, QueueName};
use queen_domain::time::Stamp;
use queen_domain::timers::{TimerOp, TimerResult};

use crate::membership::{Member, MembershipError};
use crate::replicated_log::BoxFuture;
use crate::{LogProgress, StoreFigures};

/// Why the disk gate refused a command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiskRefusal {
    /// The client gate is closed.
    #[error(
        "the node's disk would be {projected_pct}% full with this write ({used_pct}% in use, {in_flight} bytes in flight); QUEEN_RAFT_DISK_HIGH_PCT is {high_pct}%"
    )]
    Gate {
        /// Disk use at the last sample, percent.
        used_pct: u64,
        /// Projected use with this write, percent.
        projected_pct: u64,
        /// Bytes admitted since the last sample.
        in_flight: u64,
        /// The threshold.
        high_pct: u8,
    },
    /// The write would take the reserve.
    #[error(
        "the node's disk would keep {free_after} bytes free after this write, below QUEEN_RAFT_DISK_RESERVE_BYTES ({limit} bytes); drain or delete data, or grow the disk"
    )]
    Reserve {
        /// Free bytes projected after the write (0 when it would not fit at all).
        free_after: u64,
        /// The floor this command may not pass.
        limit: u64,
    },
}

/// Why a use case did not answer with an outcome, by what the caller can do about it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BrokerError {
    /// This node does not lead and cannot hand the request to the leader; a retry (on the
    /// leader) can help. `forwards` is false when the node was told not to forward
    /// (`QUEEN_RAFT_CLIENT_OFFLOAD=false`).
    #[error("{}", not_leader(*leader, *forwards))]
    NotLeader {
        /// The leader this node knows of.
        leader: Option<u64>,
        /// Whether this node forwards its clients' writes.
        forwards: bool,
    },
    /// Leadership changed while the request was in flight: it may or may not have applied. A
    /// retry is safe for idempotent requests (pushes with the same transactionIds).
    #[error("leadership changed while the request was in flight; it may or may not have applied")]
    OutcomeUnknown,
    /// The request deadline passed; the outcome is unknown as for `OutcomeUnknown`.
    #[error("the request deadline elapsed")]
    Timeout,
    /// The data directory's disk refused the write.
    #[error(transparent)]
    DiskFull(#[from] DiskRefusal),
    /// The node cannot serve now (stopping, its log unavailable); a retry can help.
    #[error("{0}")]
    Unavailable(String),
    /// The request is not valid: `field` names what is wrong.
    #[error("{field} {problem}")]
    Invalid {
        /// The field, as the client named it.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A payload is larger than one message may carry (`QUEEN_MAX_MESSAGE_BYTES`).
    #[error("{field} is {len} bytes; a message may carry at most {max} (QUEEN_MAX_MESSAGE_BYTES)")]
    TooLarge {
        /// The item, as the client named it (`items[3].payload`).
        field: String,
        /// Its size.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The queue has `encryptionEnabled` and this node holds no `QUEEN_ENCRYPTION_KEY`, so it
    /// cannot store the payload as the queue asks (it is never stored in the clear).
    #[error(
        "queue '{queue}' has encryptionEnabled, and this node has no QUEEN_ENCRYPTION_KEY to encrypt its payloads; nothing was stored"
    )]
    EncryptionRequired {
        /// The queue.
        queue: String,
    },
    /// A membership change was refused.
    #[error(transparent)]
    Membership(#[from] MembershipError),
    /// An ephemeral push was refused by a bound; nothing of it was kept.
    #[error(transparent)]
    EphemeralRefused(#[from] queen_domain::ephemeral::PushRefusal),
    /// The ephemeral queue is not there (only `depth` says so).
    #[error("ephemeral queue '{queue}' does not exist")]
    EphemeralQueueNotFound {
        /// The queue, as the client named it.
        queue: String,
    },
    /// The node failed; the sentence never carries a secret and points at the node's log.
    #[error("{0}")]
    Internal(String),
}

fn not_leader(leader: Option<u64>, forwards: bool) -> String {
    if forwards {
        format!("this node does not lead (leader: {leader:?})")
    } else {
        format!(
            "this node does not lead and does not forward (QUEEN_RAFT_CLIENT_OFFLOAD=false); leader: {leader:?}"
        )
    }
}

impl BrokerError {
    /// The answer to an outcome of the wrong kind (a bug: the log answered another command).
    #[must_use]
    pub fn unexpected_outcome() -> Self {
        BrokerError::Internal("unexpected outcome".to_owned())
    }
}

/// A parsed pop request.
#[derive(Debug, Clone)]
pub struct PopRequest {
    /// The command to propose when something is deliverable (its lease id is replaced by the
    /// application with a fresh one per attempt).
    pub command: PopCommand,
    /// Long poll.
    pub wait: bool,
    /// Long-poll limit.
    pub timeout: Duration,
    /// The autopilot (`autopilot=true`): the broker chooses the knobs the client left out.
    pub autopilot: Option<AutopilotAsk>,
    /// The pop declares conflation (`conflation=true`, contract 2.0.8): it is proposed as
    /// `Command::PopConflating`, and its answer, empty or not, carries the conflation echo.
    pub conflation: bool,
}

/// What an autopilot pop brings for the broker's choice (contract 2.0.7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AutopilotAsk {
    /// The knobs the client set: used exactly as set.
    pub set: queen_domain::autopilot::SetKnobs,
    /// Who pops, as the broker tells its consumers apart (the peer's address): the recent pops
    /// the choice looks at are this consumer's of this queue and group.
    pub consumer: String,
}

/// What an autopilot pop used, echoed to the client (`"autopilot": {...}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutopilotEcho {
    /// Sweep width.
    pub partitions: u32,
    /// Message budget.
    pub batch: u32,
    /// How long a consumer that does not wait should sleep after this answer if it was empty
    /// (0: no advice).
    pub wait_ms: u32,
}

/// A pop's answer: what it delivered, and the autopilot's echo when the pop engaged it.
#[derive(Debug, Clone)]
pub struct Popped {
    /// The claims.
    pub outcome: PopOutcome,
    /// The knobs the autopilot used.
    pub autopilot: Option<AutopilotEcho>,
}

/// One pass of a tenant purge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PurgeReport {
    /// Partitions of the queues this pass deleted.
    pub partitions_deleted: u64,
    /// Nothing of the tenant was left when the pass ended.
    pub done: bool,
}

/// A membership change or listing (admin routes on the client port).
#[derive(Debug, Clone)]
pub enum MembershipOp {
    /// List the members.
    List,
    /// Add a learner.
    AddLearner {
        /// Node id.
        id: u64,
        /// Raft address.
        raft: String,
        /// Client address.
        http: String,
    },
    /// Promote learners.
    Promote {
        /// Ids.
        ids: Vec<u64>,
        /// Skip the lag and quorum checks.
        force: bool,
    },
    /// Remove a member.
    Remove {
        /// Node id.
        id: u64,
    },
}

/// Why a node is not ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotReady {
    /// Storage still opening, or the node is too far behind the commit index.
    Settling,
    /// No leader known, or a leader that no majority acknowledged lately.
    NoQuorum,
}

impl NotReady {
    /// The word `/health` shows.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            NotReady::Settling => "settling",
            NotReady::NoQuorum => "no_quorum",
        }
    }
}

/// The node's readiness as `/health` shows it.
#[derive(Debug, Clone)]
pub struct HealthView {
    /// Why the node does not serve, or `None` when it serves (knows a leader, caught up,
    /// storage open).
    pub not_ready: Option<NotReady>,
    /// Raft figures.
    pub progress: LogProgress,
    /// The highest log format this build reads.
    pub kinds: u32,
    /// The format the cluster writes.
    pub cluster_version: u32,
    /// The last apply failure, if any.
    pub apply_failure: Option<String>,
}

/// This node, on its status page.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    /// Node id.
    pub id: u64,
    /// Seconds since the node started.
    pub uptime_seconds: u64,
    /// The build's version.
    pub version: &'static str,
}

/// The storage figures of the status page: the store's own figures (written beside, not
/// under, `logFsyncs`) and the raft log's fsyncs.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StorageStatus {
    /// The state store's figures.
    #[serde(flatten)]
    pub store: StoreFigures,
    /// fsyncs of the raft log since start.
    pub log_fsyncs: u64,
}

/// One queue on the status page.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueStatus {
    /// Its name.
    pub name: String,
    /// Messages stored.
    pub messages: u64,
    /// Partitions.
    pub partitions: u64,
    /// Dead letters.
    pub dead_lettered: u64,
    /// Its namespace tag.
    pub namespace: Option<String>,
    /// Its task tag.
    pub task: Option<String>,
}

/// The queues on the status page.
#[derive(Debug, Clone, serde::Serialize)]
pub struct QueuesStatus {
    /// How many queues (at most the first 1000 are listed).
    pub count: usize,
    /// Messages over the listed queues.
    pub messages: u64,
    /// The listed queues.
    pub items: Vec<QueueStatus>,
}

/// Long polls on the status page.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PopsStatus {
    /// Pops parked in a long poll.
    pub waiting: u64,
}

/// The node's status document (`GET /status`).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusView {
    /// The raft group these figures are of, on a node of several (`QUEEN_RAFT_GROUPS`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<u16>,
    /// This node.
    pub node: NodeStatus,
    /// Raft figures.
    pub raft: LogProgress,
    /// The greatest stamp applied here, ISO 8601 with microseconds.
    pub safe_time: String,
    /// Storage figures.
    pub storage: StorageStatus,
    /// Queues.
    pub queues: QueuesStatus,
    /// Long polls.
    pub pops: PopsStatus,
    /// The S3 sink's block, when the sink runs.
    pub s3: Option<serde_json::Value>,
    /// Payload encryption on this node.
    pub encryption: EncryptionStatus,
    /// This node's ephemeral queues: what it holds, its budget, and what members that
    /// crashed were known to hold when they went.
    pub ephemeral: serde_json::Value,
}

/// Payload encryption on the status page.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EncryptionStatus {
    /// Whether this node holds a valid `QUEEN_ENCRYPTION_KEY`.
    pub key_loaded: bool,
    /// The listed queues with `encryptionEnabled` (without a key, their pushes are refused).
    pub encrypted_queues: Vec<String>,
}

/// The application's use cases, as a client reaches them. Every call either commits (and
/// answers with the outcome) or fails with a [`BrokerError`].
pub trait ClientApi: Send + Sync + 'static {
    /// Push items (ids already minted), stamped with `producer` (the token's `sub`) when
    /// there is one.
    fn push(
        &self,
        items: Vec<PushItem>,
        producer: Option<String>,
    ) -> impl Future<Output = Result<Vec<PushOutcome>, BrokerError>> + Send;
    /// Pop, with an optional long poll; with `req.autopilot`, the knobs the client left out are
    /// chosen first (and remembered for this consumer's next pop).
    fn pop(&self, req: PopRequest) -> impl Future<Output = Result<Popped, BrokerError>> + Send;
    /// Pop from any queue tagged with `namespace` and/or `task`; answers the queue it popped.
    fn pop_tagged(
        &self,
        namespace: Option<String>,
        task: Option<String>,
        req: PopRequest,
    ) -> impl Future<Output = Result<(String, Popped), BrokerError>> + Send;
    /// Acknowledge in one group.
    fn ack(
        &self,
        group: GroupName,
        items: Vec<AckItem>,
    ) -> impl Future<Output = Result<Vec<AckOutcome>, BrokerError>> + Send;
    /// Apply acks, pushes and a KV rider as one unit; pushes are stamped with `producer`.
    fn transaction(
        &self,
        ops: Vec<TxnOp>,
        required_leases: Vec<queen_domain::ids::LeaseId>,
        kv: Vec<KvOp>,
        timers: Vec<TimerOp>,
        producer: Option<String>,
    ) -> impl Future<Output = Result<TxnOutcome, BrokerError>> + Send;
    /// Apply KV operations in one entry.
    fn kv(&self, ops: Vec<KvOp>) -> impl Future<Output = Result<KvOutcome, BrokerError>> + Send;
    /// Apply lock operations in one entry.
    fn locks(
        &self,
        ops: Vec<LockOp>,
    ) -> impl Future<Output = Result<Vec<LockResult>, BrokerError>> + Send;
    /// Extend a lease; answers `Outcome::Extend`.
    fn extend(
        &self,
        lease_id: queen_domain::ids::LeaseId,
    ) -> impl Future<Output = Result<Outcome, BrokerError>> + Send;
    /// Configure a queue.
    fn configure(
        &self,
        queue: QueueName,
        namespace: Option<String>,
        task: Option<String>,
        options: QueueOptions,
    ) -> impl Future<Output = Result<QueueOptions, BrokerError>> + Send;
    /// Delete a queue; answers whether it existed.
    fn delete_queue(
        &self,
        queue: QueueName,
    ) -> impl Future<Output = Result<bool, BrokerError>> + Send;
    /// One bounded pass of deleting a tenant's queues, timers, KV rows and sink documents
    /// (never the lake).
    fn purge_tenant(
        &self,
        tenant: queen_domain::tenant::Tenant,
    ) -> impl Future<Output = Result<PurgeReport, BrokerError>> + Send;
    /// Apply timer operations in one entry; the messages they schedule carry `producer`.
    fn timers(
        &self,
        ops: Vec<TimerOp>,
        producer: Option<String>,
    ) -> impl Future<Output = Result<Vec<TimerResult>, BrokerError>> + Send;
    /// An operation on the ephemeral queues (served where the partition's owner is).
    fn ephemeral(
        &self,
        op: crate::EphemeralOp,
    ) -> impl Future<Output = Result<crate::EphemeralAnswer, BrokerError>> + Send;
    /// Every member's own raft figures (this node's first; a member that does not answer is
    /// listed unreachable).
    fn nodes(&self) -> impl Future<Output = Result<serde_json::Value, BrokerError>> + Send;
    /// Time series from this node's analytics samples.
    fn analytics(
        &self,
        query: crate::AnalyticsQuery,
    ) -> impl Future<Output = Result<crate::AnalyticsAnswer, BrokerError>> + Send;
    /// Change or list the raft membership; answers the members as the leader sees them after.
    fn membership(
        &self,
        op: MembershipOp,
    ) -> impl Future<Output = Result<Vec<Member>, BrokerError>> + Send;
    /// Propose an administrative command and answer its outcome.
    fn command(
        &self,
        command: Command,
    ) -> impl Future<Output = Result<Outcome, BrokerError>> + Send;
    /// Wait until this node has applied everything committed when the read began.
    fn read_barrier(&self) -> impl Future<Output = Result<(), BrokerError>> + Send;
    /// A consistent view of this node's applied state.
    fn state(&self) -> Box<dyn StateRead + Send + '_>;
    /// The wall clock, as a stamp (for ages shown on status pages only).
    fn now(&self) -> Stamp;
    /// Readiness.
    fn health(&self) -> HealthView;
    /// The node's status document (`GET /status`).
    fn status(&self) -> impl Future<Output = Result<StatusView, BrokerError>> + Send;
    /// Prometheus text.
    fn metrics_text(&self) -> String;
    /// Record one served request (route label, status, seconds).
    fn observe_request(&self, route: &'static str, status: u16, seconds: f64);
    /// A stored payload as clients see it: the plaintext of a sealed payload (encrypted
    /// queues) this node can open, otherwise the stored bytes.
    fn open_payload<'a>(&self, stored: &'a [u8]) -> std::borrow::Cow<'a, [u8]> {
        std::borrow::Cow::Borrowed(stored)
    }
    /// Bytes a tenant's stored messages take on this node (its storage quota's count), or
    /// `None` when this node cannot tell. Reads one row per stored record: not for hot paths.
    fn retained_bytes(&self, _tenant: &queen_domain::tenant::Tenant) -> Option<u64> {
        None
    }
    /// Whether this node runs the embedded S3 sink (`QUEEN_S3_EMBEDDED`), without which no
    /// tenant sink runs and the control plane's S3 routes are unavailable.
    fn tenant_sinks_available(&self) -> bool {
        false
    }
    /// Check a tenant sink's settings (the control plane's document, without `secretKey` and
    /// `enabled`) with the sink's own rules; the first problem, naming the field.
    ///
    /// # Errors
    /// The problem, as a sentence that never holds a secret.
    fn check_tenant_sink(
        &self,
        _config: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), String> {
        Err("this node runs no S3 sink".to_owned())
    }
    /// `secret` sealed under this node's `QUEEN_ENCRYPTION_KEY` (the payload envelope), or
    /// `None` when the node has no key.
    ///
    /// # Errors
    /// The crypto library failed.
    fn seal_secret(&self, _secret: &[u8]) -> Result<Option<Vec<u8>>, String> {
        Ok(None)
    }
}

/// What the node's own S3 sink needs from the broker: fenced KV batches (its leases, intents,
/// commit pointers and checkpoints) that are not client writes and so pass a closed disk gate,
/// the read barrier, the applied state it reads records from, and the time. Not the client API;
/// object safe, so the sink holds it as `Arc<dyn SinkLog>`.
pub trait SinkLog: Send + Sync + 'static {
    /// Apply KV operations (the first one usually the fence: a put of the lease row at the
    /// version this node last wrote) in one entry.
    fn sink_kv(&self, ops: Vec<KvOp>) -> BoxFuture<'_, Result<KvOutcome, BrokerError>>;
    /// Wait until this node has applied everything committed when the call began.
    fn sink_barrier(&self) -> BoxFuture<'_, Result<(), BrokerError>>;
    /// A consistent view of this node's applied state.
    fn applied(&self) -> Box<dyn StateRead + Send + '_>;
    /// The wall clock, as a stamp.
    fn wall_clock(&self) -> Stamp;
    /// Whether this node is the cluster's only member, as it sees it.
    fn alone(&self) -> bool;
    /// Open a stored payload for the lake (encrypted queues).
    fn open_stored(&self, stored: &[u8]) -> crate::Opened {
        let _ = stored;
        crate::Opened::NotSealed
    }
    /// A consistent view of the state that holds the embedded proxy's directory (the tenants
    /// with sinks of their own): this node's applied state, or on a node of several raft
    /// groups that of the group holding the proxy's reserved tenant.
    fn directory(&self) -> Box<dyn StateRead + Send + '_> {
        self.applied()
    }
}
