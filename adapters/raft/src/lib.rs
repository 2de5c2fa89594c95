//! queen-raft: the replicated log of queen, built on openraft 0.10 (pinned alpha).
//!
//! Owns: openraft's type configuration, the raft log store (a segmented append-only log with
//! group commit under `dir/log`), the state machine adapter that drives a
//! `queen_ports::StateMachineBackend`, snapshots (streamed with bounded memory; received ones
//! spooled under `dir/snapshot-spool`), the raft port (an HTTP/1 server and a pooled
//! client: raft RPCs, streamed snapshots, forwarded follower proposals and read indexes), and
//! `RaftNode`, which implements `queen_ports::ReplicatedLog`.
//! Must never leak: any openraft type. The public API is `RaftNode`, its config and errors;
//! everything else crosses through the port types.
//! Must never depend on: the HTTP adapter, the state store engine, or the app.

mod append_budget;
mod body_limits;
mod config;
mod error;
mod log_store;
mod membership;
mod network;
mod node;
mod runtime;
mod server;
mod snapshot_spool;
mod state_machine;
mod stream;
mod type_config;
mod wire;

#[cfg(test)]
mod conformance;
#[cfg(test)]
#[path = "../tests/common/mem_backend.rs"]
mod mem_backend;
#[cfg(test)]
mod sim;

pub use config::DEFAULT_ELECTION_MAX_MS;
pub use config::DEFAULT_ELECTION_MIN_MS;
pub use config::DEFAULT_HEARTBEAT_MS;
pub use config::DEFAULT_SNAPSHOT_EVERY_ENTRIES;
pub use config::MAX_APPEND_BYTES;
pub use config::Peer;
pub use config::RaftNodeConfig;
pub use error::RaftConfigError;
pub use error::RaftShutdownError;
pub use error::RaftStartError;
pub use membership::peer_groups;
pub use node::RaftNode;
