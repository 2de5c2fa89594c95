//! queen-ports: the traits the application needs from the world, and the one trait the
//! replicated log needs from the state machine.
//!
//! Owns: `ReplicatedLog` (propose, read barrier, progress), `StateMachineBackend` (what the raft
//! adapter calls to apply committed entries, persist its metadata atomically with them, and take
//! or install snapshots), and the `Clock`.
//! Must never depend on: tokio, hyper, openraft, fjall, object_store, or any file system code.
//! Every payload that crosses these traits is opaque bytes, so no adapter type leaks through.

mod clock;
mod replicated_log;
mod state_machine;

pub use clock::{Clock, SystemClock};
pub use replicated_log::{LogProgress, ProposeError, RaftRole, ReplicatedLog};
pub use state_machine::{
    ApplyEntry, BackendError, LogFiles, LogSpan, SnapshotChunks, StateMachineBackend,
};
