//! Opening the engine and reading state.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode, Readable};
use queen_domain::keys::table;
use queen_domain::{StateRead, StoreError};

use crate::filter::DedupFilter;
use crate::messages::{self, IndexRead, ViewIndex};
use crate::segments::{SegmentError, Segments};

/// Engine settings that bound memory.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Where the engine keeps its files; the segment log of messages is in `dir/segments`.
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
    /// Segment files of messages roll before a record would take one past this size. Every
    /// node of a cluster should use the same value, so replicas keep the same files.
    pub segment_bytes: u64,
}

impl StoreConfig {
    /// Defaults sized for a broker node: 64 MiB cache, 32 MiB memtables, 256 MiB journal, one
    /// background thread, 64 MiB segment files.
    #[must_use]
    pub fn new(dir: PathBuf) -> Self {
        Self { dir, cache_bytes: 64 << 20, memtable_bytes: 32 << 20, journal_bytes: 256 << 20, workers: 1, segment_bytes: crate::segments::SEGMENT_BYTES }
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
    /// The segment log could not open or does not match the state.
    #[error("cannot open the message segments of {dir}: {source}")]
    Segments {
        /// Where.
        dir: String,
        /// Why.
        source: SegmentError,
    },
    /// The store was written by a newer build, or migrating an older layout failed.
    #[error("the state store at {dir} {detail}")]
    Format {
        /// Where.
        dir: String,
        /// What is wrong and what to do.
        detail: String,
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
/// The layout version of the store, in the `raft` keyspace. 1 (no key): messages and a
/// text-keyed dedup index as engine rows. 2: messages in the segment log, dedup by hash.
pub(crate) const FORMAT_KEY: &[u8] = b"format";
/// The layout this build writes.
pub(crate) const FORMAT: u32 = 2;

/// The node's state store.
#[derive(Clone)]
pub struct FjallStore {
    pub(crate) db: Database,
    pub(crate) state: Keyspace,
    pub(crate) raft: Keyspace,
    /// Rows written by apply, for metrics.
    pub(crate) rows_written: Arc<AtomicU64>,
    /// The message segment log.
    pub(crate) segments: Arc<Segments>,
    /// Which dedup rows surely do not exist.
    pub(crate) dedup_filter: Arc<DedupFilter>,
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
        if raft.get(INSTALLING_KEY).map_err(err)?.is_some() {
            tracing::warn!(target: "queen-store", "a snapshot install was interrupted: discarding the partial state");
            state.clear().map_err(err)?;
            raft.remove(META_KEY).map_err(err)?;
            raft.remove(INSTALLING_KEY).map_err(err)?;
            db.persist(PersistMode::SyncAll).map_err(err)?;
        }
        let format = match raft.get(FORMAT_KEY).map_err(err)? {
            Some(v) => u32::from_le_bytes(v.as_ref().try_into().unwrap_or([0xFF; 4])),
            None if state.is_empty().map_err(err)? => FORMAT,
            None => 1,
        };
        if format > FORMAT {
            return Err(StoreOpenError::Format {
                dir: cfg.dir.display().to_string(),
                detail: format!("has layout version {format}, written by a newer build of queen (this one reads up to {FORMAT}): run that build, or move the directory away to start this node empty"),
            });
        }
        let end = state.get(messages::END_KEY).map_err(err)?.and_then(|v| messages::decode_end(&v));
        let seg_dir = cfg.dir.join("segments");
        let live = |file: u64| state.get(messages::file_key(file)).ok().flatten().is_some();
        let segments = Segments::open(&seg_dir, cfg.segment_bytes, end, &live)
            .map_err(|source| StoreOpenError::Segments { dir: seg_dir.display().to_string(), source })?;
        let store = Self { db, state, raft, rows_written: Arc::new(AtomicU64::new(0)), segments: Arc::new(segments), dedup_filter: Arc::new(DedupFilter::new()) };
        if format < FORMAT {
            store.migrate().map_err(|e| StoreOpenError::Format {
                dir: cfg.dir.display().to_string(),
                detail: format!("has layout version {format} and could not be migrated to {FORMAT}: {e}; the migration resumes at the next start, or move the directory away to start this node empty"),
            })?;
        }
        store.raft.insert(FORMAT_KEY, FORMAT.to_le_bytes()).map_err(err)?;
        store.fill_dedup_filter().map_err(|e| StoreOpenError::Format { dir: cfg.dir.display().to_string(), detail: format!("could not read its dedup index: {e}") })?;
        Ok(store)
    }

    /// Rebuild the dedup filter from the dedup rows.
    pub(crate) fn fill_dedup_filter(&self) -> Result<(), StoreError> {
        self.dedup_filter.clear();
        for g in self.state.range([table::DEDUP_HASH]..[table::DEDUP_HASH + 1]) {
            let k = g.key().map_err(read_err)?;
            self.dedup_filter.insert(&k);
        }
        Ok(())
    }

    /// Bytes the engine and the segment log use on disk.
    #[must_use]
    pub fn disk_bytes(&self) -> u64 {
        self.db.disk_space().unwrap_or(0) + self.segments.disk_bytes()
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

    /// Message segment files and their bytes on disk.
    #[must_use]
    pub fn segment_stats(&self) -> (usize, u64) {
        self.segments.stats()
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
        StateView { snap: self.db.snapshot(), state: self.state.clone(), segments: self.segments.clone(), dedup_filter: self.dedup_filter.clone() }
    }
}

/// A visitor of rows; false stops the scan.
type Visit<'a> = dyn FnMut(&[u8], &[u8]) -> bool + 'a;
/// A scan of engine rows in a range; false when the visitor stopped.
type EngineScan<'a> = dyn Fn(&[u8], &[u8], &mut Visit<'_>) -> Result<bool, StoreError> + 'a;
/// A scan of message rows in a range.
type LogScan<'a> = dyn Fn(&[u8], &[u8], &mut Visit<'_>) -> Result<(), StoreError> + 'a;

/// A scan split at the message table: engine rows before it, the segment log inside it, engine
/// rows after it.
fn split_scan(
    start: &[u8],
    end: &[u8],
    visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    engine: &EngineScan<'_>,
    log: &LogScan<'_>,
) -> Result<(), StoreError> {
    // The store's own tables (the segment index and its counters) are not the domain's.
    let end = end.min(&[table::SEGMENT_INDEX][..]);
    if start >= end {
        return Ok(());
    }
    let lo: &[u8] = &[table::MESSAGE];
    let hi: &[u8] = &[table::MESSAGE + 1];
    let go = std::cell::Cell::new(true);
    let mut guarded = |k: &[u8], v: &[u8]| {
        let more = visit(k, v);
        go.set(more);
        more
    };
    if start < lo && !engine(start, end.min(lo), &mut guarded)? {
        return Ok(());
    }
    if go.get() && end > lo && start < hi {
        log(start.max(lo), end.min(hi), &mut guarded)?;
    }
    if go.get() && end > hi {
        engine(start.max(hi), end, &mut guarded)?;
    }
    Ok(())
}

/// Visit an engine range; false when the visitor stopped.
fn visit_engine(iter: fjall::Iter, visit: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<bool, StoreError> {
    for guard in iter {
        let (k, v) = guard.into_inner().map_err(read_err)?;
        if !visit(&k, &v) {
            return Ok(false);
        }
    }
    Ok(true)
}

fn is_message(key: &[u8]) -> bool {
    key.first() == Some(&table::MESSAGE)
}

fn is_own(key: &[u8]) -> bool {
    key.first().is_some_and(|t| *t >= table::SEGMENT_INDEX)
}

impl StateRead for FjallStore {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        if is_message(key) {
            return messages::get(&self.state, &self.segments, key);
        }
        if is_own(key) || self.dedup_filter.surely_absent(key) {
            return Ok(None);
        }
        Ok(self.state.get(key).map_err(read_err)?.map(|v| v.to_vec()))
    }

    fn scan(&self, start: &[u8], end: &[u8], visit: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<(), StoreError> {
        split_scan(
            start,
            end,
            visit,
            &|a, b, v| visit_engine(self.state.range(a..b), v),
            &|a, b, v| messages::scan(&self.state, &self.segments, a, b, v),
        )
    }
}

/// A pinned, consistent view of the state.
pub struct StateView {
    pub(crate) snap: fjall::Snapshot,
    pub(crate) state: Keyspace,
    pub(crate) segments: Arc<Segments>,
    pub(crate) dedup_filter: Arc<DedupFilter>,
}

impl StateRead for StateView {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        if is_message(key) {
            return messages::get(&ViewIndex(&self.snap, &self.state), &self.segments, key);
        }
        if is_own(key) || self.dedup_filter.surely_absent(key) {
            return Ok(None);
        }
        Ok(self.snap.get(&self.state, key).map_err(read_err)?.map(|v| v.to_vec()))
    }

    fn scan(&self, start: &[u8], end: &[u8], visit: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<(), StoreError> {
        let idx = ViewIndex(&self.snap, &self.state);
        split_scan(
            start,
            end,
            visit,
            &|a, b, v| visit_engine(idx.index_range(a, b), v),
            &|a, b, v| messages::scan(&idx, &self.segments, a, b, v),
        )
    }
}
