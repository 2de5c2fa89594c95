//! The bounds of request bodies on the raft port: its own file because both readers of bodies
//! use it, the HTTP server (`server.rs`) and the append stream a connection is upgraded to
//! (`stream.rs`), and the node (`node/`) sets it.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use crate::snapshot_spool::SnapshotSpool;

/// The bounds of request bodies on the raft port.
pub(crate) struct BodyLimits {
    /// Largest body (413 above).
    pub(crate) max_bytes: usize,
    /// How long a whole body may take to arrive (408 after); a snapshot stream's frames one by
    /// one instead.
    pub(crate) timeout: Duration,
    /// Bytes of bodies held at once, one permit per byte (503 when out: the sender retries).
    pub(crate) budget: Arc<Semaphore>,
    /// Where a snapshot stream goes instead of memory: its bound is the disk.
    pub(crate) snapshot_spool: SnapshotSpool,
}
