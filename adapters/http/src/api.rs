//! What the HTTP adapter needs from the application.

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
use queen_ports::LogProgress;

/// A failure the client should see as an HTTP error.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// Stable snake_case code.
    pub code: &'static str,
    /// A human sentence; never carries a secret.
    pub message: String,
    /// Seconds for a `retry-after` header.
    pub retry_after: Option<u32>,
}

impl ApiError {
    /// A 400 naming the field.
    #[must_use]
    pub fn bad_request(field: &str, problem: &str) -> Self {
        Self {
            status: 400,
            code: "bad_request",
            message: format!("{field} {problem}"),
            retry_after: None,
        }
    }

    /// A 503 after the request deadline passed.
    #[must_use]
    pub fn timeout() -> Self {
        Self {
            status: 503,
            code: "timeout",
            message: "the request deadline elapsed".to_owned(),
            retry_after: Some(1),
        }
    }

    /// Any other status.
    #[must_use]
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
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

/// The node's readiness as `/health` shows it.
#[derive(Debug, Clone)]
pub struct HealthView {
    /// Whether the node serves (knows a leader, caught up, storage open).
    pub ready: bool,
    /// Why not, when not ready (`settling`, `no_quorum`).
    pub reason: Option<&'static str>,
    /// Raft figures.
    pub progress: LogProgress,
    /// The highest log format this build reads.
    pub kinds: u32,
    /// The format the cluster writes.
    pub cluster_version: u32,
    /// The last apply failure, if any.
    pub apply_failure: Option<String>,
}

/// The application's use cases, as the HTTP adapter calls them. Every call either commits
/// (and answers with the outcome) or fails with an `ApiError`.
pub trait Api: Send + Sync + 'static {
    /// Push items (ids already minted).
    fn push(
        &self,
        items: Vec<PushItem>,
    ) -> impl Future<Output = Result<Vec<PushOutcome>, ApiError>> + Send;
    /// Pop, with an optional long poll.
    fn pop(&self, req: PopRequest) -> impl Future<Output = Result<PopOutcome, ApiError>> + Send;
    /// Pop from any queue tagged with `namespace` and/or `task`; answers the queue it popped.
    fn pop_tagged(
        &self,
        namespace: Option<String>,
        task: Option<String>,
        req: PopRequest,
    ) -> impl Future<Output = Result<(String, PopOutcome), ApiError>> + Send;
    /// Acknowledge in one group.
    fn ack(
        &self,
        group: GroupName,
        items: Vec<AckItem>,
    ) -> impl Future<Output = Result<Vec<AckOutcome>, ApiError>> + Send;
    /// Apply acks, pushes and a KV rider as one unit.
    fn transaction(
        &self,
        ops: Vec<TxnOp>,
        required_leases: Vec<String>,
        kv: Vec<KvOp>,
        timers: Vec<queen_domain::timers::TimerOp>,
    ) -> impl Future<Output = Result<TxnOutcome, ApiError>> + Send;
    /// Apply KV operations in one entry.
    fn kv(&self, ops: Vec<KvOp>) -> impl Future<Output = Result<KvOutcome, ApiError>> + Send;
    /// Apply lock operations in one entry.
    fn locks(
        &self,
        ops: Vec<LockOp>,
    ) -> impl Future<Output = Result<Vec<LockResult>, ApiError>> + Send;
    /// Extend a lease; answers `Outcome::Extend`.
    fn extend(&self, lease_id: String) -> impl Future<Output = Result<Outcome, ApiError>> + Send;
    /// Configure a queue.
    fn configure(
        &self,
        queue: QueueName,
        namespace: Option<String>,
        task: Option<String>,
        options: QueueOptions,
    ) -> impl Future<Output = Result<QueueOptions, ApiError>> + Send;
    /// Delete a queue; answers whether it existed.
    fn delete_queue(&self, queue: QueueName)
    -> impl Future<Output = Result<bool, ApiError>> + Send;
    /// Apply timer operations in one entry.
    fn timers(
        &self,
        ops: Vec<queen_domain::timers::TimerOp>,
    ) -> impl Future<Output = Result<Vec<queen_domain::timers::TimerResult>, ApiError>> + Send;
    /// Change or list the raft membership.
    fn membership(
        &self,
        op: MembershipOp,
    ) -> impl Future<Output = Result<serde_json::Value, ApiError>> + Send;
    /// Propose an administrative command and answer its outcome.
    fn command(&self, command: Command) -> impl Future<Output = Result<Outcome, ApiError>> + Send;
    /// Wait until this node has applied everything committed when the read began.
    fn read_barrier(&self) -> impl Future<Output = Result<(), ApiError>> + Send;
    /// A consistent view of this node's applied state.
    fn state(&self) -> Box<dyn StateRead + Send + '_>;
    /// The wall clock, as a stamp (for ages shown on status pages only).
    fn now(&self) -> Stamp;
    /// Readiness.
    fn health(&self) -> HealthView;
    /// The node's status document (`GET /status`).
    fn status(&self) -> impl Future<Output = Result<serde_json::Value, ApiError>> + Send;
    /// Prometheus text.
    fn metrics_text(&self) -> String;
    /// Record one served request (route label, status, seconds).
    fn observe_request(&self, route: &'static str, status: u16, seconds: f64);
}
