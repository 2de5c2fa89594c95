//! The locally applied state as the application reads it: consistent views for reads and long
//! polls, the store's figures for the status page and the disk gate, and a reclaim of deleted
//! rows' space. The store adapter implements it; the application's tests use an in-memory twin.

use queen_domain::StateRead;

use crate::BackendError;

/// What the state store holds and is doing, for the status page.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StoreFigures {
    /// Bytes of the store on disk.
    pub disk_bytes: u64,
    /// Bytes in its memtables (written to its journal, to be written again as tables).
    pub memtable_bytes: u64,
    /// Memtable flushes waiting.
    pub flushes_queued: usize,
    /// Sealed memtables.
    pub sealed_memtables: usize,
    /// Tables in level 0.
    pub level0_tables: usize,
    /// Message segment files.
    pub segment_files: usize,
    /// Bytes in message segment files.
    pub segment_bytes: u64,
    /// Runs of the dedup index on disk.
    pub dedup_runs: usize,
    /// Entries in those runs.
    pub dedup_run_entries: u64,
    /// Entries of the dedup index in memory.
    pub dedup_memory_entries: usize,
}

/// The locally applied state.
pub trait StateReader: Send + Sync + 'static {
    /// A consistent view of everything applied so far.
    fn view(&self) -> Box<dyn StateRead + Send + '_>;
    /// The store's figures.
    fn figures(&self) -> StoreFigures;
    /// Bytes in the memtables alone (read on every proposal by the disk gate: cheap).
    fn memtable_bytes(&self) -> u64;
    /// A number that changes (after the change is readable) whenever a queue may have been
    /// created, configured or deleted, or the whole state replaced: a reader may keep what a
    /// queue's options said while it stays the same. `None`: the store does not tell, and
    /// nothing read may be kept.
    fn queue_options_epoch(&self) -> Option<u64> {
        None
    }
    /// Bytes the stored messages of these partitions take (what a storage quota counts); one
    /// read per stored record, so callers keep it off hot paths.
    fn stored_bytes(&self, _pids: &[u64]) -> u64 {
        0
    }
    /// Give the space of deleted rows back now (flush and compact); blocking, seconds.
    ///
    /// # Errors
    /// The engine failed.
    fn reclaim(&self) -> Result<(), BackendError>;
}
