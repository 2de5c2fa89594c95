//! Opening the engine and reading state.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode, Readable};
use queen_domain::{StateRead, StoreError};

/// Engine settings that bound memory.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Where the engine keeps its files.
    pub dir: PathBuf,
    /// Block cache in bytes.
    pub cache_bytes: u64,
    /// One memtable of the state keyspace, in bytes (sealed ones are flushed in the background).
    /// Larger memtables mean fewer, larger level-0 tables and so less compaction: 32 MiB
    /// against 16 MiB gave the three-node cluster about a fifth more batch pushes per second;
    /// 64 MiB was no faster and cost 100 MiB more peak RSS (fjall holds up to four sealed
    /// memtables besides the active one before it stalls writes).
    pub memtable_bytes: u64,
    /// Journal size cap on disk (also bounds replay after a crash).
    pub journal_bytes: u64,
    /// Background threads for flushes and compactions.
    ///
    /// One: fjall 3.1's pool, with more than one thread, has its first thread hand every
    /// compaction request straight back to the queue while another thread compacts, so that
    /// thread spins for as long as any compaction runs (a quarter of a three-node cluster's CPU
    /// under sustained pushes, measured with `perf`). A node's flushes and compactions are
    /// serial anyway: they share one disk.
    pub workers: usize,
}

impl StoreConfig {
    /// Defaults sized for a broker node: 64 MiB cache, 32 MiB memtables, 256 MiB journal, one
    /// background thread.
    #[must_use]
    pub fn new(dir: PathBuf) -> Self {
        Self { dir, cache_bytes: 64 << 20, memtable_bytes: 32 << 20, journal_bytes: 256 << 20, workers: 1 }
    }
}

/// The store could not open.
#[derive(Debug, thiserror::Error)]
pub enum StoreOpenError {
    /// The engine refused to open (permissions, corruption, a newer format).
    #[error("cannot open the state store at {dir}: {source}")]
    Engine {
        /// Where.
        dir: String,
        /// Why.
        source: fjall::Error,
    },
}

/// Reclaiming space failed.
#[derive(Debug, thiserror::Error)]
#[error("reclaiming the state store's space failed: {0}")]
pub struct ReclaimError(fjall::Error);

/// Key under which the raft adapter's metadata lives in the `raft` keyspace.
pub(crate) const META_KEY: &[u8] = b"meta";
/// Marker written while a snapshot is being installed: found at open, the state is discarded.
pub(crate) const INSTALLING_KEY: &[u8] = b"installing";

/// The node's state store.
#[derive(Clone)]
pub struct FjallStore {
    pub(crate) db: Database,
    pub(crate) state: Keyspace,
    pub(crate) raft: Keyspace,
    /// Rows written by apply, for metrics.
    pub(crate) rows_written: Arc<AtomicU64>,
}

pub(crate) fn read_err(e: fjall::Error) -> StoreError {
    StoreError::Read(e.to_string())
}

impl FjallStore {
    /// Open (or create) the store.
    ///
    /// # Errors
    /// When the engine cannot open its directory.
    pub fn open(cfg: &StoreConfig) -> Result<Self, StoreOpenError> {
        let err = |source| StoreOpenError::Engine { dir: cfg.dir.display().to_string(), source };
        let db = Database::builder(&cfg.dir)
            .cache_size(cfg.cache_bytes)
            .max_journaling_size(cfg.journal_bytes)
            .worker_threads(cfg.workers.max(1))
            .open()
            .map_err(err)?;
        let state = db
            .keyspace("state", || KeyspaceCreateOptions::default().max_memtable_size(cfg.memtable_bytes))
            .map_err(err)?;
        let raft = db.keyspace("raft", KeyspaceCreateOptions::default).map_err(err)?;
        let store = Self { db, state, raft, rows_written: Arc::new(AtomicU64::new(0)) };
        if store.raft.get(INSTALLING_KEY).map_err(err)?.is_some() {
            tracing::warn!(target: "queen-store", "a snapshot install was interrupted: discarding the partial state");
            store.state.clear().map_err(err)?;
            store.raft.remove(META_KEY).map_err(err)?;
            store.raft.remove(INSTALLING_KEY).map_err(err)?;
            store.db.persist(PersistMode::SyncAll).map_err(err)?;
        }
        Ok(store)
    }

    /// Bytes the engine uses on disk.
    #[must_use]
    pub fn disk_bytes(&self) -> u64 {
        self.db.disk_space().unwrap_or(0)
    }

    /// Engine figures for status pages: (memtable bytes, flushes queued, sealed memtables of
    /// the state keyspace, level-0 runs).
    #[must_use]
    pub fn engine_stats(&self) -> (u64, usize, usize, usize) {
        (
            self.db.write_buffer_size(),
            self.db.outstanding_flushes(),
            self.state.sealed_memtable_count(),
            self.state.l0_table_count(),
        )
    }

    /// Give the space of deleted rows back to the file system now, instead of at the engine's
    /// next compaction of those tables (which a store that stopped growing may never run):
    /// flush both keyspaces' memtables (so deletions reach tables, and the journal behind them
    /// can be dropped), then compact the state keyspace into one run, which drops deleted rows.
    /// Blocking, and it writes the rows still live once more: run it after a large deletion.
    ///
    /// # Errors
    /// An engine error (a failed compaction leaves the tables it read in place).
    pub fn reclaim(&self) -> Result<(), ReclaimError> {
        // fjall's own tests use these hidden calls; they are the engine's "flush now" and
        // "compact everything" (3.1).
        self.state.rotate_memtable_and_wait().map_err(ReclaimError)?;
        self.raft.rotate_memtable_and_wait().map_err(ReclaimError)?;
        self.state.major_compact().map_err(ReclaimError)
    }

    /// Rows written by apply since start.
    #[must_use]
    pub fn rows_written(&self) -> u64 {
        self.rows_written.load(Ordering::Relaxed)
    }

    /// A consistent read view of the current state (for multi-read queries).
    #[must_use]
    pub fn view(&self) -> StateView {
        StateView { snap: self.db.snapshot(), state: self.state.clone() }
    }
}

impl StateRead for FjallStore {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.state.get(key).map_err(read_err)?.map(|v| v.to_vec()))
    }

    fn scan(&self, start: &[u8], end: &[u8], visit: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<(), StoreError> {
        if start >= end {
            return Ok(());
        }
        visit_range(self.state.range(start..end), visit)
    }
}

/// Visit the pairs of a range iterator until `visit` says stop (callers check the bounds:
/// an empty or inverted range never reaches the engine).
fn visit_range(iter: fjall::Iter, visit: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<(), StoreError> {
    for guard in iter {
        let (k, v) = guard.into_inner().map_err(read_err)?;
        if !visit(&k, &v) {
            break;
        }
    }
    Ok(())
}

/// A pinned, consistent view of the state.
pub struct StateView {
    pub(crate) snap: fjall::Snapshot,
    pub(crate) state: Keyspace,
}

impl StateRead for StateView {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.snap.get(&self.state, key).map_err(read_err)?.map(|v| v.to_vec()))
    }

    fn scan(&self, start: &[u8], end: &[u8], visit: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<(), StoreError> {
        if start >= end {
            return Ok(());
        }
        visit_range(self.snap.range(&self.state, start..end), visit)
    }
}
