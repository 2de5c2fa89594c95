//! queen-domain: every rule that decides an outcome of the broker, with no I/O.
//!
//! Owns: names and their validation, broker time (stamps), the command and response types of
//! the replicated log, and `apply(state, entry) -> outcome` for push (dedup), pop (leases,
//! consumer groups, subscriptions), ack (retries, dead letters), lease extension, queue
//! configuration and deletion, and retention. State is read and written through the
//! `StateRead` trait and a `Txn` write overlay, so the node keeps it on disk while these rules
//! stay pure and testable on an in-memory map.
//!
//! Must never depend on: tokio, hyper, openraft, fjall, object_store, a clock, randomness or the
//! file system. Time arrives only inside entries (`Entry::proposed_at`).

pub mod access;
pub mod analytics;
pub mod autopilot;
pub mod browse;
pub mod codec;
pub mod command;
pub mod ephemeral;
mod error;
pub mod groups;
pub mod ids;
pub mod invariants;
pub mod keys;
pub mod kv;
pub mod machine;
pub mod model;
pub mod names;
pub mod pages;
pub mod proxy;
pub mod pushed;
pub mod reads;
mod scope;
pub mod sink;
pub mod store;
pub mod streams;
pub mod tenant;
pub mod time;
pub mod timers;
pub mod traces;

pub use command::{Command, Entry, Response};
pub use machine::apply_entry;
pub use store::{
    Appended, Appends, DedupRows, MemStore, Origin, Parts, StateRead, StoreError, Txn, WriteSet,
};
