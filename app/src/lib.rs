//! queen-app: configuration, node assembly, the broker's use cases and the shutdown
//! choreography.
//!
//! Owns: validating the settings the binary read from the environment into a `Config` (a bad
//! value names its variable; the test hooks arrive in it too, nothing here reads the
//! environment), wiring the state store, the replicated log, telemetry and the HTTP listener into a
//! node (the client port's front is handed in by the binary), proposing commands with a deadline, long polls woken by commits, the tick that moves
//! broker time and runs housekeeping, and SIGTERM handling (stop accepting, finish requests in
//! flight, stop raft).
//! Must never depend on: anything the adapters should hide (openraft or fjall types do not
//! appear in this crate's logic; only `node.rs` names the adapters to assemble them).

mod broker;
mod cluster;
mod config;
mod disk_gate;
mod error;
mod message_size;
mod node;
mod push_lane;
mod sink;
mod waiters;

pub use broker::Broker;
pub use config::{
    Config, ConfigError, Peer, RawConfig, RawTestHooks, S3CrashPoint, SecretText, TestHooks,
};
pub use error::AppError;
pub use node::{Serving, run};
pub use sink::config::{SinkBoot, SinkConfigError, SinkSettings, from_env as sink_from_env};
pub use sink::{SinkError, SinkHandle, verify_lake};
