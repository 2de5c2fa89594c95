//! Why a node stopped with an error, and its exit code.

use std::net::SocketAddr;

/// Why the node stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The data directory could not be created.
    #[error("QUEEN_RAFT_DIR: cannot create {dir}: {source}")]
    DataDir {
        /// Which.
        dir: String,
        /// Why.
        source: std::io::Error,
    },
    /// The state store did not open.
    #[error(transparent)]
    Store(#[from] queen_store::StoreOpenError),
    /// The replicated log did not start.
    #[error("the replicated log did not start: {0}")]
    Raft(#[from] queen_raft::RaftStartError),
    /// The client port could not be bound.
    #[error("PORT: cannot listen on {addr}: {source}")]
    Bind {
        /// Where.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The S3 sink could not start.
    #[error("QUEEN_S3_EMBEDDED=true: {0}")]
    Sink(#[from] crate::sink::SinkError),
    /// The data directory holds a cluster format newer than this build reads.
    #[error(
        "QUEEN_RAFT_DIR: {dir} holds cluster format version {found}, newer than this build reads ({reads}); run a release that reads it"
    )]
    FormatTooNew {
        /// Which directory.
        dir: String,
        /// The version found.
        found: u32,
        /// The highest this build reads.
        reads: u32,
    },
    /// The replicated log stopped on an error while the node ran (a full disk, say).
    #[error(
        "the replicated log stopped: {0}; the node stopped so that it can be started again on its data once the cause is fixed"
    )]
    LogStopped(String),
    /// The data directory was written with another number of raft groups, or a tenant with
    /// data would move to another group.
    #[error("QUEEN_RAFT_GROUPS: {0}")]
    Groups(String),
    /// The cluster version marker cannot be read.
    #[error("QUEEN_RAFT_DIR: cannot read the cluster version marker {path}")]
    FormatMarker {
        /// The marker file.
        path: String,
    },
}

impl AppError {
    /// The process exit code: 2 for data this build must not touch, 1 otherwise.
    #[must_use]
    pub fn exit_code(&self) -> u8 {
        match self {
            AppError::FormatTooNew { .. } | AppError::FormatMarker { .. } | AppError::Groups(_) => {
                2
            }
            _ => 1,
        }
    }
}
