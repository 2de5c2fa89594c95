//! The raft node's configuration: what the app sets, its defaults, its validation, and how it
//! maps onto openraft's `Config`.

use std::path::PathBuf;

use crate::error::RaftConfigError;

/// Default heartbeat interval (ms): well below half the minimum election timeout.
pub const DEFAULT_HEARTBEAT_MS: u64 = 100;
/// Default minimum election timeout (ms): four heartbeats, and several times a slow fsync.
pub const DEFAULT_ELECTION_MIN_MS: u64 = 400;
/// Default maximum election timeout (ms). openraft also uses it as the leader lease: a voter
/// refuses every candidate for this long after it last heard the leader, so after a leader dies
/// the first election that can win starts about this long after its last heartbeat. 700 puts a
/// serving leader 1.1-1.3 s after a kill -9 on loopback (1,000 gave 1.55-1.87 s; see
/// docs/performance.md, "Failover").
pub const DEFAULT_ELECTION_MAX_MS: u64 = 700;
/// Default number of entries between two snapshots.
pub const DEFAULT_SNAPSHOT_EVERY_ENTRIES: u64 = 20_000;

/// Entries kept in the log below a snapshot, so briefly lagging followers catch up from the log
/// instead of a snapshot (and so a purge during a snapshot transfer does not strand them).
const MAX_IN_SNAPSHOT_LOG_TO_KEEP: u64 = 10_000;
/// Purge in large steps, so purges are rare and delete whole segments.
const PURGE_BATCH_SIZE: u64 = 1024;
/// Time budget (ms) of one snapshot chunk on the wire.
const INSTALL_SNAPSHOT_TIMEOUT_MS: u64 = 10_000;
/// Entries per AppendEntries RPC, at most. openraft reads this many entries from the log before
/// the append is cut to `MAX_APPEND_BYTES`; 256 entries of 100 pushed 256-byte messages are about
/// that size, so a follower that lags does not make the leader read four times what it sends.
const MAX_PAYLOAD_ENTRIES: u64 = 256;

/// A member of the raft group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// The member's raft node id.
    pub id: u64,
    /// Where its raft port listens (`host:port`), for raft RPCs.
    pub raft_addr: String,
    /// Where its client HTTP API listens, so clients can be pointed at the leader.
    pub http_addr: String,
}

/// Configuration of one raft node.
#[derive(Debug, Clone)]
pub struct RaftNodeConfig {
    /// This node's id; unique within the group and never reused.
    pub node_id: u64,
    /// The node's raft directory (`QUEEN_RAFT_DIR`); the log lives in `dir/log`.
    pub dir: PathBuf,
    /// The voters of the group; empty or one entry means a single voter (this node).
    pub peers: Vec<Peer>,
    /// Shared secret of the raft port, sent with every raft RPC; required with several voters.
    pub token: Option<String>,
    /// Leader heartbeat interval in milliseconds.
    pub heartbeat_ms: u64,
    /// Lower bound of the randomized election timeout in milliseconds.
    pub election_min_ms: u64,
    /// Upper bound of the randomized election timeout in milliseconds.
    pub election_max_ms: u64,
    /// Build a snapshot (and allow purging the log) every this many applied entries.
    pub snapshot_every_entries: u64,
    /// The log's files roll at this size (64 MiB); a purge deletes (or archives) whole files.
    pub log_segment_bytes: u64,
    /// Start empty and wait to be added by the cluster (`QUEEN_RAFT_JOIN`): never initialize.
    pub join: bool,
    /// The highest log format this build reads, reported to the leader on the raft port.
    pub log_kinds: u32,
    /// The raft groups this process runs (`QUEEN_RAFT_GROUPS`), reported on the raft port so
    /// that a node started with another count can refuse to start.
    pub groups: u16,
    /// Test only: a file listing the node ids (comma separated) this node drops all raft-port
    /// traffic to. `None` (the default, and always outside tests) means no fault layer at all.
    pub faults_file: Option<PathBuf>,
    /// Largest request body the raft port accepts (larger: 413). Appends are split below
    /// [`MAX_APPEND_BYTES`] unless one entry is larger, so this must hold the largest entry.
    pub max_body_bytes: usize,
    /// How long a request body may take to arrive on the raft port (then 408).
    pub body_timeout: std::time::Duration,
    /// Bytes of request bodies the raft port holds in memory at once (then 503, and the sender
    /// retries); snapshot streams are bounded per frame instead.
    pub body_budget_bytes: usize,
}

/// An append sent to one follower carries entries up to this many bytes of commands (at least
/// one entry, whatever its size); the rest follow in the next append.
pub const MAX_APPEND_BYTES: usize = 8 << 20;

impl RaftNodeConfig {
    /// A single-voter node with the default timings.
    pub fn single(node_id: u64, dir: PathBuf) -> Self {
        Self {
            node_id,
            dir,
            peers: Vec::new(),
            token: None,
            heartbeat_ms: DEFAULT_HEARTBEAT_MS,
            election_min_ms: DEFAULT_ELECTION_MIN_MS,
            election_max_ms: DEFAULT_ELECTION_MAX_MS,
            snapshot_every_entries: DEFAULT_SNAPSHOT_EVERY_ENTRIES,
            log_segment_bytes: 64 << 20,
            join: false,
            log_kinds: 1,
            groups: 1,
            faults_file: None,
            max_body_bytes: 64 << 20,
            body_timeout: std::time::Duration::from_secs(30),
            body_budget_bytes: 256 << 20,
        }
    }

    /// The directory of the raft log.
    pub fn log_dir(&self) -> PathBuf {
        self.dir.join("log")
    }

    /// Check every value; names the first bad one.
    ///
    /// # Errors
    /// `RaftConfigError::Invalid` naming the field.
    pub fn validate(&self) -> Result<(), RaftConfigError> {
        let bad =
            |field: &'static str, reason: String| Err(RaftConfigError::Invalid { field, reason });
        if self.dir.as_os_str().is_empty() {
            return bad("dir", "must not be empty".into());
        }
        if self.heartbeat_ms == 0 {
            return bad("heartbeat_ms", "must be above 0".into());
        }
        if self.election_min_ms <= self.heartbeat_ms.saturating_mul(2) {
            return bad(
                "election_min_ms",
                format!(
                    "{} must be more than twice heartbeat_ms ({})",
                    self.election_min_ms, self.heartbeat_ms
                ),
            );
        }
        if self.election_max_ms <= self.election_min_ms {
            return bad(
                "election_max_ms",
                format!(
                    "{} must be above election_min_ms ({})",
                    self.election_max_ms, self.election_min_ms
                ),
            );
        }
        if self.snapshot_every_entries == 0 {
            return bad("snapshot_every_entries", "must be above 0".into());
        }
        let mut ids = std::collections::BTreeSet::new();
        for p in &self.peers {
            if !ids.insert(p.id) {
                return bad("peers", format!("node id {} is listed twice", p.id));
            }
        }
        if !self.peers.is_empty() && !ids.contains(&self.node_id) {
            return bad(
                "peers",
                format!("this node's id {} is not among the peers", self.node_id),
            );
        }
        if self.token.as_deref().is_some_and(str::is_empty) {
            return bad("token", "must not be empty when set".into());
        }
        if !self.is_single_voter() {
            if self.token.is_none() {
                return bad(
                    "token",
                    "a group of several voters needs a shared raft token".into(),
                );
            }
            for p in &self.peers {
                if p.raft_addr.is_empty() {
                    return bad("peers", format!("node {} has no raft address", p.id));
                }
            }
        }
        Ok(())
    }

    /// Whether this node is the only voter.
    pub fn is_single_voter(&self) -> bool {
        self.peers.len() <= 1
    }

    /// Entries kept in the log below a snapshot.
    fn log_kept_below_snapshot(&self) -> u64 {
        MAX_IN_SNAPSHOT_LOG_TO_KEEP.min(self.snapshot_every_entries)
    }

    /// The openraft configuration for these values.
    pub(crate) fn openraft_config(&self) -> Result<openraft::Config, RaftConfigError> {
        let config = openraft::Config {
            cluster_name: "queen".to_string(),
            heartbeat_interval: self.heartbeat_ms,
            election_timeout_min: self.election_min_ms,
            election_timeout_max: self.election_max_ms,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(self.snapshot_every_entries),
            // A node that cannot reach a majority does not raise its term: it asks first
            // whether it could win (pre-vote), so a follower cut off and back does not depose a
            // healthy leader.
            enable_pre_vote: Some(true),
            // Never keep more than one snapshot span below a snapshot (small spans in tests).
            max_in_snapshot_log_to_keep: self.log_kept_below_snapshot(),
            purge_batch_size: PURGE_BATCH_SIZE,
            max_payload_entries: MAX_PAYLOAD_ENTRIES,
            // Per-chunk budget of a streamed snapshot.
            install_snapshot_timeout: INSTALL_SNAPSHOT_TIMEOUT_MS,
            // Keep followers on the log (not a snapshot) unless they lag past one snapshot span.
            replication_lag_threshold: self
                .snapshot_every_entries
                .saturating_add(self.log_kept_below_snapshot()),
            ..Default::default()
        };
        config.validate().map_err(|e| RaftConfigError::Invalid {
            field: "raft",
            reason: e.to_string(),
        })
    }
}
