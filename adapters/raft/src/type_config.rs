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

/// What apply answered for an entry, as openraft carries it to the node's proposer: the
/// backend's [`queen_ports::Answer`], handed over as it is. openraft asks that a response be
/// serializable; it never sends one anywhere (a forwarded proposal's answer travels in queen's
/// own forward reply, encoded there), and if it did, a built answer would go as its bytes.
pub(crate) struct Reply(pub(crate) queen_ports::Answer);

impl fmt::Debug for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl Reply {
    /// The answer's bytes, for a proposer on another node.
    pub(crate) fn into_bytes(self) -> Vec<u8> {
        self.0.into_bytes()
    }
}

impl Serialize for Reply {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0.to_bytes())
    }
}

impl<'de> Deserialize<'de> for Reply {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Self(queen_ports::Answer::Bytes(serde_bytes_vec(d)?)))
    }
}

/// A byte string as a vector.
fn serde_bytes_vec<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    struct V;
    impl serde::de::Visitor<'_> for V {
        type Value = Vec<u8>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("bytes")
        }
        fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
            Ok(v.to_vec())
        }
        fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
            Ok(v)
        }
    }
    d.deserialize_byte_buf(V)
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
    /// queen's raft types: commands are opaque bytes, answers opaque values (`Reply`).
    pub(crate) TypeConfig:
        D = Command,
        R = Reply,
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
