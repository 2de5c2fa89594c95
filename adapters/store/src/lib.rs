//! queen-store: the on-disk state store, on fjall (a pure-Rust LSM engine).
//!
//! Owns: the state the domain reads and writes through `StateRead` (in one of two slots, the
//! `state` or `state_b` keyspace with its segment directory, so an install never overwrites
//! the state it replaces), the `raft` keyspace holding the replicated log's metadata, and the
//! `StateMachineBackend` that applies committed entries through the domain with their metadata
//! in one atomic batch.
//! Snapshots are pinned MVCC views streamed in chunks.
//! Must never depend on: openraft, hyper, tokio. Memory is bounded by the engine's cache and
//! write-buffer settings, never by the backlog.

mod backend;
mod dedup;
mod filter;
mod messages;
mod migrate;
mod observe;
mod samples;
mod segments;
mod snapshot;
mod store;
mod writeback;

pub use observe::changes_of;
pub use samples::SampleFiles;
pub use segments::SegmentError;
pub use store::{FjallStore, ReclaimError, StateView, StoreConfig, StoreOpenError};
