//! Membership of the raft group as the application changes it: the admin routes' changes,
//! the members they answer, and why a change is refused. The raft adapter implements
//! [`Membership`]; a follower hands a change to the leader unchanged (these types cross the raft
//! port), and every change is idempotent.

use crate::replicated_log::BoxFuture;

/// Why a membership change was refused.
#[derive(Debug, Clone, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum MembershipError {
    /// Changes run on the leader; this node is not it and knows no leader to hand it to.
    #[error("this node does not lead (leader: {leader:?}, its client address: {leader_http:?})")]
    NotLeader {
        /// The leader's id.
        leader: Option<u64>,
        /// The leader's client address, to send the change there.
        leader_http: Option<String>,
    },
    /// A live majority would not exist before or after the change.
    #[error("{0}")]
    NoQuorum(String),
    /// A learner is too far behind to become a voter.
    #[error("learner {id} is {lag} entries behind (limit {limit}); catch up or use force")]
    LearnerBehind {
        /// The learner.
        id: u64,
        /// Entries behind the leader's log.
        lag: u64,
        /// The limit.
        limit: u64,
    },
    /// The last voter cannot be removed.
    #[error("node {0} is the last voter and cannot be removed")]
    LastVoter(u64),
    /// The id is not a member (or not a learner, for a promotion).
    #[error("node {0} is not a member that this change applies to")]
    Unknown(u64),
    /// The node to add reads an older log format than the cluster writes.
    #[error(
        "node {id} reads log format {kinds}, older than the cluster's version {version}; run a newer release on it"
    )]
    FormatTooOld {
        /// The node.
        id: u64,
        /// The highest format it reads.
        kinds: u32,
        /// The cluster's version.
        version: u32,
    },
    /// The change itself failed (another change in flight, leadership lost, ...).
    #[error("membership change failed: {0}")]
    Failed(String),
    /// The leader could not be reached, or its answer was lost: retry (every change is
    /// idempotent).
    #[error("the leader could not be asked: {0}")]
    Unavailable(String),
}

/// A member as the membership routes show it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Member {
    /// Node id.
    pub id: u64,
    /// Raft address.
    pub raft: String,
    /// Client address.
    pub http: String,
    /// Voter (true) or learner.
    pub voter: bool,
    /// Acknowledged a heartbeat within the election timeout (the leader's view; `true` for
    /// the leader itself).
    pub live: bool,
    /// Entries behind the leader's last log entry (the leader's view).
    pub lag: u64,
}

/// A membership change, or a listing, as the admin routes ask for it. A follower hands it to
/// the leader over the raft port unchanged; every change is idempotent.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub enum MembershipChange {
    /// The members as the leader sees them.
    List,
    /// Add a learner (an existing member with the same raft address is accepted).
    AddLearner {
        /// Node id.
        id: u64,
        /// Its raft address.
        raft: String,
        /// Its client address.
        http: String,
        /// The cluster's format version: a node that reads less is refused (0: no check).
        min_kinds: u32,
    },
    /// Promote learners (ids that already vote are accepted).
    Promote {
        /// The learners.
        ids: Vec<u64>,
        /// Promote even when behind or without a live majority after.
        force: bool,
        /// Most entries a learner may lag without `force`.
        max_lag: u64,
    },
    /// Remove a member (an id that is already gone is accepted).
    Remove {
        /// Node id.
        id: u64,
    },
}

/// The raft group's membership, as the application changes it.
pub trait Membership: Send + Sync + 'static {
    /// Run a change (or a listing) on the leader, handed to it when this node does not lead;
    /// answers the members as the leader sees them afterwards.
    ///
    /// # Errors
    /// No leader known or reachable, or the leader's refusal (see [`MembershipError`]).
    fn change(
        &self,
        change: MembershipChange,
    ) -> BoxFuture<'_, Result<Vec<Member>, MembershipError>>;
    /// The members as this node sees them.
    fn members(&self) -> Vec<Member>;
}
