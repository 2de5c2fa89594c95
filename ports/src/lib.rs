//! queen-ports: the traits the application needs from the world, the one trait the replicated
//! log needs from the state machine, and the use cases as the HTTP adapter and the sink call
//! them.
//!
//! Owns: `ReplicatedLog` (propose, read barrier, progress), `StateReader` (the applied state
//! as the application reads it), `Membership` (the admin routes'
//! changes), `StateMachineBackend` (what the raft adapter calls to apply committed entries,
//! persist its metadata atomically with them, and take or install snapshots), the `Clock`, and
//! the use-case ports `ClientApi` and `SinkLog` with their typed answers and the typed
//! `BrokerError` (the HTTP adapter maps it to status codes in one place).
//! Must never depend on: tokio, hyper, openraft, fjall, object_store, or any file system code.
//! Payloads that cross the log and state-machine traits are opaque (bytes, or an answer the
//! raft adapter only hands over or encodes), so no adapter type leaks through; the use cases
//! speak the domain's commands and outcomes.

mod analytics;
mod cipher;
mod clock;
mod ephemeral;
mod membership;
mod peers;
mod replicated_log;
mod state_machine;
mod state_reader;
mod use_cases;

pub use analytics::{
    AnalyticsAnswer, AnalyticsQuery, AnalyticsScope, QueueSeries, SampleLog, SampleLogError,
};
pub use cipher::{Opened, PayloadCipher};
pub use clock::{Clock, SystemClock};
pub use ephemeral::{EphemeralAnswer, EphemeralOp, EphemeralQueue};
pub use membership::{Member, Membership, MembershipChange, MembershipError};
pub use peers::{PeerCallError, PeerCalls, PeerHandler};
pub use replicated_log::{BoxFuture, LogProgress, ProposeError, RaftRole, ReplicatedLog};
pub use state_machine::{
    Answer, AppliedChanges, ApplyEntry, ApplyObserver, BackendError, BuiltAnswer, LogFiles,
    LogSpan, SnapshotChunks, StateMachineBackend,
};
pub use state_reader::{StateReader, StoreFigures};
pub use use_cases::{
    AutopilotAsk, AutopilotEcho, BrokerError, ClientApi, DiskRefusal, EncryptionStatus, HealthView,
    MembershipOp, NodeStatus, NotReady, PopRequest, Popped, PopsStatus, PurgeReport, QueueStatus,
    QueuesStatus, SinkLog, StatusView, StorageStatus,
};
