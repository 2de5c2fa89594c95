//! The replicated log as the application sees it.

use std::future::Future;
use std::pin::Pin;

/// A boxed future, so the trait stays object safe without an async-trait dependency.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The role of this node in its raft group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RaftRole {
    /// Orders every write.
    Leader,
    /// Replicates the leader's log.
    Follower,
    /// Campaigning for leadership.
    Candidate,
    /// Replicates without a vote.
    Learner,
    /// Stopped or not yet started.
    Shutdown,
}

/// Progress figures of this node.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LogProgress {
    /// This node's id.
    pub node_id: u64,
    /// Current role.
    pub role: RaftRole,
    /// The leader this node knows, if any.
    pub leader: Option<u64>,
    /// Current term.
    pub term: u64,
    /// Index of the last entry applied to this node's state.
    pub applied: u64,
    /// Index of the last entry known committed.
    pub commit: u64,
    /// Index of the last entry in this node's log.
    pub last_log: u64,
    /// Whether the storage opened and is serving.
    pub storage_ready: bool,
    /// On a leader: milliseconds since a majority last acknowledged it (None elsewhere).
    pub quorum_ack_ms: Option<u64>,
    /// On a follower or learner of several nodes: milliseconds since it last accepted an
    /// append from a leader (None before the first, and on other roles).
    pub leader_contact_ms: Option<u64>,
}

/// Why a proposal did not produce an outcome.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ProposeError {
    /// This node is not the leader; a retry on the leader can help.
    #[error("not the leader (leader: {leader:?})")]
    NotLeader {
        /// The leader this node knows of.
        leader: Option<u64>,
    },
    /// The entry may or may not have committed (leadership changed while it was in flight).
    /// A resend is safe only for idempotent commands.
    #[error("the outcome is unknown")]
    OutcomeUnknown,
    /// The node is shutting down or its raft core stopped; a retry elsewhere can help.
    #[error("the replicated log is unavailable: {0}")]
    Unavailable(String),
    /// A fatal storage error; a person must look.
    #[error("the replicated log failed: {0}")]
    Fatal(String),
}

/// The replicated log.
pub trait ReplicatedLog: Send + Sync + 'static {
    /// Append `command` to the log and wait until it is committed (on a majority of fsynced
    /// disks) and applied on this node; returns the state machine's answer.
    ///
    /// # Errors
    /// See `ProposeError`: a retry helps for `NotLeader` and `Unavailable`.
    fn propose(&self, command: Vec<u8>) -> BoxFuture<'_, Result<crate::Answer, ProposeError>>;

    /// Wait until this node has applied everything the cluster had committed when the call
    /// began (read index).
    ///
    /// # Errors
    /// `NotLeader` or `Unavailable` when no leader can confirm the read point.
    fn read_barrier(&self) -> BoxFuture<'_, Result<(), ProposeError>>;

    /// Current progress figures.
    fn progress(&self) -> LogProgress;

    /// Snapshot what this node applied and drop the log up to it now (not at the next
    /// scheduled snapshot), so the space of deleted messages goes back to the disk; false when
    /// it did not finish within `within`. A log that keeps nothing to compact answers true.
    fn compact(&self, within: std::time::Duration) -> BoxFuture<'_, bool>;
}
