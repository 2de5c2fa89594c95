//! Errors of this crate's own API (start, config, shutdown), and how openraft's errors map to
//! the port's `ProposeError` (one place, used by the node and by the raft port's server).

use openraft::errors::{ClientWriteError, Fatal, LinearizableReadError, RaftError};
use queen_ports::ProposeError;

use crate::type_config::TypeConfig;

/// A configuration value that cannot work.
#[derive(Debug, thiserror::Error)]
pub enum RaftConfigError {
    /// A field has a value outside its allowed range.
    #[error("invalid raft config {field}: {reason}")]
    Invalid {
        /// The field's name.
        field: &'static str,
        /// Why the value cannot work.
        reason: String,
    },
}

/// Why a raft node did not start.
#[derive(Debug, thiserror::Error)]
pub enum RaftStartError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] RaftConfigError),
    /// The raft log could not be opened or recovered (I/O error, corruption, directory in use).
    #[error("raft log at {path} failed to open: {source}")]
    LogStore {
        /// The log directory.
        path: std::path::PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The directory where received snapshots are spooled could not be created or cleared.
    #[error("snapshot spool at {path} failed to open: {source}")]
    SnapshotSpool {
        /// The spool's parent (the raft directory).
        path: std::path::PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The state machine backend could not be read.
    #[error("state machine failed to open: {0}")]
    StateMachine(std::io::Error),
    /// The raft core refused to start or to initialize.
    #[error("raft core failed to start: {0}")]
    Raft(String),
    /// The raft port could not be bound.
    #[error("raft port {addr} could not be bound: {source}")]
    Listen {
        /// The address from this node's peer entry.
        addr: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The configuration asks for something this build cannot do yet.
    #[error("unsupported raft setup: {0}")]
    Unsupported(String),
}

/// Why a shutdown did not complete cleanly.
#[derive(Debug, thiserror::Error)]
pub enum RaftShutdownError {
    /// The raft core task ended abnormally.
    #[error("raft core did not stop cleanly: {0}")]
    Core(String),
    /// The log store was still held after the core stopped, so the directory stays locked.
    #[error("raft log was not released within {0:?}")]
    LogNotReleased(std::time::Duration),
}

/// A stopped or failed raft core, as the application sees it.
fn map_fatal(e: Fatal<TypeConfig>) -> ProposeError {
    match e {
        Fatal::Stopped => ProposeError::Unavailable("raft node stopped".into()),
        Fatal::Panicked => ProposeError::Fatal("raft core panicked".into()),
        Fatal::StorageError(e) => ProposeError::Fatal(e.to_string()),
    }
}

pub(crate) fn map_write_error(
    e: RaftError<TypeConfig, ClientWriteError<TypeConfig>>,
) -> ProposeError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => ProposeError::NotLeader {
            leader: f.leader_id,
        },
        RaftError::APIError(ClientWriteError::LogEntryDiscarded(_)) => ProposeError::OutcomeUnknown,
        // Neither can happen for a plain command without preconditions.
        RaftError::APIError(e @ ClientWriteError::ChangeMembershipError(_))
        | RaftError::APIError(e @ ClientWriteError::PreconditionFailed(_)) => {
            ProposeError::Unavailable(e.to_string())
        }
        RaftError::Fatal(f) => map_fatal(f),
    }
}

pub(crate) fn map_read_error(
    e: RaftError<TypeConfig, LinearizableReadError<TypeConfig>>,
) -> ProposeError {
    match e {
        RaftError::APIError(LinearizableReadError::ForwardToLeader(f)) => ProposeError::NotLeader {
            leader: f.leader_id,
        },
        RaftError::APIError(e @ LinearizableReadError::QuorumNotEnough(_)) => {
            ProposeError::Unavailable(e.to_string())
        }
        RaftError::Fatal(f) => map_fatal(f),
    }
}
