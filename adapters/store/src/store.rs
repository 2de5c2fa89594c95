//! Opening the engine and reading state.

mod hot;
mod open;
mod read;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use fjall::{Database, Keyspace};

use crate::dedup::DedupIndex;
use crate::filter::DedupFilter;
use crate::segments::{LogLink, SegmentError, Segments};
pub(crate) use hot::{ApplyRead, HotRows, is_hot};
pub(crate) use open::open_dedup;
use queen_ports::ApplyObserver;

/// Engine settings that bound memory.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Where the engine keeps its files; the segment log of messages is in `dir/segments`
    /// (or `dir/segments_b`, see [`SlotName`]).
    pub dir: PathBuf,
    /// Block cache in bytes. 16 MiB: messages live in the segment log, so the engine's blocks
    /// hold only small rows (queues, partitions, cursors, leases, the segment index); at 64 MiB
    /// the cache filled over a 5M-message bench and was the largest part of a node's peak RSS.
    pub cache_bytes: u64,
    /// One memtable of the state keyspace, in bytes (sealed ones are flushed in the background).
    /// 8 MiB: since messages moved to the segment log, the engine's rows are small (a dedup row
    /// is about 30 bytes), and fjall counts a memtable's bytes, not its skiplist nodes. In the
    /// three-node bench with a 5M backlog (docs/performance.md), 32 MiB gave 219-238 MiB peak
    /// RSS per node in the rounds and 227-288 in the backlog run; 8 MiB gave 163-176 and
    /// 185-190, at the price of more compaction (3.0x -> 3.7x the message written per node).
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
    /// Dedup entries held in memory before they are written out as a run of the dedup index
    /// (about 60 bytes each; the default 131,072 is about 8 MiB).
    pub dedup_mem_entries: usize,
}

impl StoreConfig {
    /// Defaults sized for a broker node: 16 MiB cache, 8 MiB memtables, 256 MiB journal, one
    /// background thread, 64 MiB segment files.
    #[must_use]
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            cache_bytes: 16 << 20,
            memtable_bytes: 8 << 20,
            journal_bytes: 256 << 20,
            workers: 1,
            segment_bytes: crate::segments::SEGMENT_BYTES,
            dedup_mem_entries: crate::dedup::MEM_ENTRIES,
        }
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
/// Marker written while a snapshot is being installed into the inactive slot: found at open,
/// that slot's partial state is discarded and the active one is kept.
pub(crate) const INSTALLING_KEY: &[u8] = b"installing";
/// Which state slot is active, in the `raft` keyspace: `b"b"` for B; absent (or anything else)
/// for A, so a directory written before slots existed opens on its own state.
pub(crate) const SLOT_KEY: &[u8] = b"slot";
/// The layout version of the store, in the `raft` keyspace. 1 (no key): messages and a
/// text-keyed dedup index as engine rows. 2: messages in the segment log, dedup by hash as
/// engine rows. 3: the dedup index out of the engine, in its own run files (`dedup.rs`). 4: the
/// messages of a push entry may stay in the raft log's files, where the index points (a
/// layout-3 store opens as it is; builds of layout 3 cannot read index rows of layout 4). 5: such
/// an index row may point at the record's items alone instead of the whole entry
/// (`segments::ITEMS_ONLY`; a layout-4 store opens as it is, its rows read as before; builds of
/// layout 4 refuse a store of layout 5 instead of misreading those rows).
pub(crate) const FORMAT_KEY: &[u8] = b"format";
/// The layout this build writes.
pub(crate) const FORMAT: u32 = 5;
/// The first layout with the dedup index in its own files: stores before it are migrated.
const FORMAT_DEDUP_FILES: u32 = 3;

/// One of the two places a whole state can live. A snapshot is installed into the inactive
/// one while the active one stays readable and intact, then one atomic batch makes it active:
/// a crash at any point leaves one complete state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotName {
    /// Keyspace `state`, segments in `dir/segments` (where stores before slots kept theirs).
    A,
    /// Keyspace `state_b`, segments in `dir/segments_b`.
    B,
}

impl SlotName {
    fn from_stored(v: Option<&[u8]>) -> Self {
        if v == Some(b"b") { Self::B } else { Self::A }
    }

    pub(crate) fn stored(self) -> &'static [u8] {
        match self {
            Self::A => b"a",
            Self::B => b"b",
        }
    }

    pub(crate) fn other(self) -> Self {
        match self {
            Self::A => Self::B,
            Self::B => Self::A,
        }
    }

    fn keyspace(self) -> &'static str {
        match self {
            Self::A => "state",
            Self::B => "state_b",
        }
    }

    pub(crate) fn segment_dir(self) -> &'static str {
        match self {
            Self::A => "segments",
            Self::B => "segments_b",
        }
    }

    pub(crate) fn dedup_dir(self) -> &'static str {
        match self {
            Self::A => "dedup",
            Self::B => "dedup_b",
        }
    }
}

/// A whole state: the engine rows and the segment log they index.
#[derive(Clone)]
pub(crate) struct Slot {
    pub(crate) name: SlotName,
    pub(crate) state: Keyspace,
    pub(crate) segments: Arc<Segments>,
    /// Which dedup rows of this slot surely do not exist.
    pub(crate) dedup_filter: Arc<DedupFilter>,
    /// The dedup rows themselves, derived from the segment log.
    pub(crate) dedup: Arc<DedupIndex>,
    /// The latest values of the rows every entry reads, for the apply (see [`HotRows`]).
    pub(crate) hot: Arc<HotRows>,
}

/// The observer a store reports to, set once (shared by every clone of the store); its
/// methods live in `observe.rs`.
pub(crate) type ObserverCell = Arc<OnceLock<Arc<dyn ApplyObserver>>>;

/// The node's state store.
#[derive(Clone)]
pub struct FjallStore {
    pub(crate) db: Database,
    pub(crate) raft: Keyspace,
    /// The active slot, shared by every clone (the raft backend and the broker read the same
    /// store). Each operation takes a clone of it once and works on that, so an install's
    /// switch is seen whole: never rows of one slot with segments of the other.
    pub(crate) active: Arc<RwLock<Slot>>,
    /// Both slots' keyspaces, A then B (an install writes into the inactive one).
    pub(crate) keyspaces: [Keyspace; 2],
    /// The engine's directory, where each slot's segment directory is.
    pub(crate) dir: PathBuf,
    /// Segment files roll at this size.
    pub(crate) segment_bytes: u64,
    /// Dedup entries in memory before a run is written.
    pub(crate) dedup_mem_entries: usize,
    /// Rows written by apply, for metrics.
    pub(crate) rows_written: Arc<AtomicU64>,
    /// Raised after every committed apply that created, configured or deleted a queue, and
    /// after every snapshot install (see `StateReader::queue_options_epoch`).
    pub(crate) queue_epoch: Arc<AtomicU64>,
    /// The raft log's files, where records of push entries stay (every slot's segments share it).
    pub(crate) log: Arc<LogLink>,
    /// Told of every applied batch (`observe.rs`).
    pub(crate) observer: ObserverCell,
}

impl FjallStore {
    /// The active slot, as one operation should use it throughout.
    pub(crate) fn slot(&self) -> Slot {
        self.active
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Make `slot` the active one for every clone of this store.
    pub(crate) fn switch_to(&self, slot: Slot) {
        *self
            .active
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = slot;
    }

    /// Bytes the engine, the segment log and the dedup index use on disk.
    #[must_use]
    pub fn disk_bytes(&self) -> u64 {
        let slot = self.slot();
        self.db.disk_space().unwrap_or(0) + slot.segments.disk_bytes() + slot.dedup.disk_bytes()
    }

    /// Engine figures for status pages: (memtable bytes, flushes queued, sealed memtables of
    /// the state keyspace, level-0 runs).
    #[must_use]
    pub fn engine_stats(&self) -> (u64, usize, usize, usize) {
        let slot = self.slot();
        (
            self.db.write_buffer_size(),
            self.db.outstanding_flushes(),
            slot.state.sealed_memtable_count(),
            slot.state.l0_table_count(),
        )
    }

    /// Message segment files and their bytes on disk.
    #[must_use]
    pub fn segment_stats(&self) -> (usize, u64) {
        self.slot().segments.stats()
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
        let state = self.slot().state;
        state.rotate_memtable_and_wait().map_err(ReclaimError)?;
        self.raft.rotate_memtable_and_wait().map_err(ReclaimError)?;
        state.major_compact().map_err(ReclaimError)
    }

    /// Rows written by apply since start.
    #[must_use]
    pub fn rows_written(&self) -> u64 {
        self.rows_written.load(Ordering::Relaxed)
    }

    /// A consistent read view of the current state (for multi-read queries). It stays on the
    /// slot active when it was taken, even if an install switches slots meanwhile.
    #[must_use]
    pub fn view(&self) -> StateView {
        let Slot {
            state,
            segments,
            dedup_filter,
            dedup,
            ..
        } = self.slot();
        StateView {
            snap: self.db.snapshot(),
            state,
            segments,
            dedup_filter,
            dedup,
        }
    }

    /// Dedup index figures for status pages: (runs, entries in runs, entries in memory).
    #[must_use]
    pub fn dedup_stats(&self) -> (usize, u64, usize) {
        self.slot().dedup.stats()
    }
}

/// The application reads the applied state through this port.
impl queen_ports::StateReader for FjallStore {
    fn view(&self) -> Box<dyn queen_domain::StateRead + Send + '_> {
        Box::new(FjallStore::view(self))
    }

    fn figures(&self) -> queen_ports::StoreFigures {
        let (memtable_bytes, flushes_queued, sealed_memtables, level0_tables) = self.engine_stats();
        let (segment_files, segment_bytes) = self.segment_stats();
        let (dedup_runs, dedup_run_entries, dedup_memory_entries) = self.dedup_stats();
        queen_ports::StoreFigures {
            disk_bytes: self.disk_bytes(),
            memtable_bytes,
            flushes_queued,
            sealed_memtables,
            level0_tables,
            segment_files,
            segment_bytes,
            dedup_runs,
            dedup_run_entries,
            dedup_memory_entries,
        }
    }

    fn memtable_bytes(&self) -> u64 {
        self.db.write_buffer_size()
    }

    fn queue_options_epoch(&self) -> Option<u64> {
        Some(self.queue_epoch.load(std::sync::atomic::Ordering::Acquire))
    }

    fn stored_bytes(&self, pids: &[u64]) -> u64 {
        let slot = self.slot();
        pids.iter()
            .map(|p| crate::messages::stored_bytes(&slot.state, *p).unwrap_or(0))
            .sum()
    }

    fn reclaim(&self) -> Result<(), queen_ports::BackendError> {
        FjallStore::reclaim(self).map_err(|e| queen_ports::BackendError::Storage(e.to_string()))
    }
}

/// A visitor of rows; false stops the scan.
type Visit<'a> = dyn FnMut(&[u8], &[u8]) -> bool + 'a;

/// A pinned, consistent view of the state.
pub struct StateView {
    pub(crate) snap: fjall::Snapshot,
    pub(crate) state: Keyspace,
    pub(crate) segments: Arc<Segments>,
    pub(crate) dedup_filter: Arc<DedupFilter>,
    pub(crate) dedup: Arc<DedupIndex>,
}
