//! The openraft type configuration of queen: what an entry carries, what apply answers, and how a
//! node is addressed. Everything here stays inside this crate.

use std::fmt;

use serde::Deserialize;
use serde::Serialize;

/// One application command as it travels through the raft log: opaque bytes encoded by the app.
/// Encoded as one byte string (postcard: length, then the bytes; the same encoding as a sequence
/// of `u8`, so logs and peers of earlier builds read it), not byte by byte. Held as shared
/// `Bytes`, so that the log's cache of recent entries, replication and apply pass one buffer
/// around instead of copying it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Command(pub(crate) bytes::Bytes);

impl fmt::Debug for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Command({} bytes)", self.0.len())
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "command of {} bytes", self.0.len())
    }
}

/// How a member of the raft group is reached. Stored inside membership entries, so it must stay
/// serde-compatible across versions.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct NodeInfo {
    /// The raft port address (`host:port`) peers use for raft RPCs; empty for a lone node.
    pub(crate) raft_addr: String,
    /// The client HTTP address, so a follower can point clients at the leader.
    pub(crate) http_addr: String,
}

openraft::declare_raft_types!(
    /// queen's raft types: commands and responses are opaque bytes.
    pub(crate) TypeConfig:
        D = Command,
        R = Vec<u8>,
        NodeId = u64,
        Node = NodeInfo,
        AsyncRuntime = crate::runtime::QueenRuntime,
);

/// A log id (leader id + index).
pub(crate) type LogId = openraft::type_config::alias::LogIdOf<TypeConfig>;
/// A log entry.
pub(crate) type Entry = <TypeConfig as openraft::RaftTypeConfig>::Entry;
/// A vote.
pub(crate) type Vote = <TypeConfig as openraft::RaftTypeConfig>::Vote;
/// The membership as stored by the state machine.
pub(crate) type StoredMembership = openraft::type_config::alias::StoredMembershipOf<TypeConfig>;
/// Snapshot metadata.
pub(crate) type SnapshotMeta = openraft::type_config::alias::SnapshotMetaOf<TypeConfig>;
/// The completion callback of a log append.
pub(crate) type IOFlushed = openraft::storage::IOFlushed<TypeConfig>;
/// A log store's state (last purged, last log id).
pub(crate) type LogState = openraft::storage::LogState<TypeConfig>;
