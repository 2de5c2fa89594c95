//! Opening the engine and reading state.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};
use queen_domain::keys::table;
use queen_domain::model::MessageHead;
use queen_domain::{StateRead, StoreError};

use crate::dedup::{DedupIndex, FirstLive, Key};
use crate::filter::DedupFilter;
use crate::messages::{self, EngineRead, View, read_err};
use crate::segments::{LogLink, RAFT_BIT, SegmentError, Segments};
use queen_domain::keys::{as_dedup_key, dedup_key};

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
/// layout-3 store opens as it is; builds of layout 3 cannot read index rows of layout 4).
pub(crate) const FORMAT_KEY: &[u8] = b"format";
/// The layout this build writes.
pub(crate) const FORMAT: u32 = 4;
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
}

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
    /// The raft log's files, where records of push entries stay (every slot's segments share it).
    pub(crate) log: Arc<LogLink>,
}

impl FjallStore {
    /// Open (or create) the store.
    ///
    /// # Errors
    /// When the engine cannot open its directory.
    pub fn open(cfg: &StoreConfig) -> Result<Self, StoreOpenError> {
        let err = |source| StoreOpenError::Engine {
            dir: cfg.dir.display().to_string(),
            source,
        };
        let db = Database::builder(&cfg.dir)
            .cache_size(cfg.cache_bytes)
            .max_journaling_size(cfg.journal_bytes)
            .worker_threads(cfg.workers.max(1))
            .open()
            .map_err(err)?;
        let open_state = |name: SlotName| {
            db.keyspace(name.keyspace(), || {
                KeyspaceCreateOptions::default().max_memtable_size(cfg.memtable_bytes)
            })
        };
        let keyspaces = [
            open_state(SlotName::A).map_err(err)?,
            open_state(SlotName::B).map_err(err)?,
        ];
        let raft = db
            .keyspace("raft", KeyspaceCreateOptions::default)
            .map_err(err)?;
        let name = SlotName::from_stored(raft.get(SLOT_KEY).map_err(err)?.as_deref());
        let state = keyspaces[name as usize].clone();
        // The inactive slot holds nothing worth keeping: an interrupted install's partial state,
        // or the old state of a finished install that was not yet cleared.
        let interrupted = raft.get(INSTALLING_KEY).map_err(err)?.is_some();
        if interrupted {
            tracing::warn!(target: "queen-store", "a snapshot install was interrupted: discarding its partial state and keeping the state from before it");
        }
        let spare = &keyspaces[name.other() as usize];
        if interrupted || !spare.is_empty().map_err(err)? {
            spare.clear().map_err(err)?;
        }
        for spare_dir in [
            cfg.dir.join(name.other().segment_dir()),
            cfg.dir.join(name.other().dedup_dir()),
        ] {
            match std::fs::remove_dir_all(&spare_dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    let source = SegmentError::Io {
                        path: spare_dir.display().to_string(),
                        source: e,
                    };
                    return Err(StoreOpenError::Segments {
                        dir: spare_dir.display().to_string(),
                        source,
                    });
                }
                _ => {}
            }
        }
        if interrupted {
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
                detail: format!(
                    "has layout version {format}, written by a newer build of queen (this one reads up to {FORMAT}): run that build, or move the directory away to start this node empty"
                ),
            });
        }
        let end = state
            .get(messages::END_KEY)
            .map_err(err)?
            .and_then(|v| messages::decode_end(&v));
        let seg_dir = cfg.dir.join(name.segment_dir());
        let live = |file: u64| state.get(messages::file_key(file)).ok().flatten().is_some();
        let mut segments =
            Segments::open(&seg_dir, cfg.segment_bytes, end, &live).map_err(|source| {
                StoreOpenError::Segments {
                    dir: seg_dir.display().to_string(),
                    source,
                }
            })?;
        let log = Arc::new(LogLink::default());
        segments.set_log(log.clone());
        let format_err = |detail: String| StoreOpenError::Format {
            dir: cfg.dir.display().to_string(),
            detail,
        };
        if format < FORMAT_DEDUP_FILES {
            // A dedup index left by an interrupted migration may not match what it migrates.
            let _ = std::fs::remove_dir_all(cfg.dir.join(name.dedup_dir()));
        }
        let dedup = open_dedup(&cfg.dir, name, &state, cfg.dedup_mem_entries)
            .map_err(|e| format_err(format!("could not open its dedup index: {e}")))?;
        let active = Arc::new(RwLock::new(Slot {
            name,
            state,
            segments: Arc::new(segments),
            dedup_filter: Arc::new(DedupFilter::new()),
            dedup,
        }));
        let store = Self {
            db,
            raft,
            active,
            keyspaces,
            dir: cfg.dir.clone(),
            segment_bytes: cfg.segment_bytes,
            dedup_mem_entries: cfg.dedup_mem_entries,
            rows_written: Arc::new(AtomicU64::new(0)),
            log,
        };
        if format < FORMAT_DEDUP_FILES {
            store.migrate(&store.slot()).map_err(|e| StoreOpenError::Format {
                dir: cfg.dir.display().to_string(),
                detail: format!("has layout version {format} and could not be migrated to {FORMAT}: {e}; the migration resumes at the next start, or move the directory away to start this node empty"),
            })?;
        }
        store
            .raft
            .insert(FORMAT_KEY, FORMAT.to_le_bytes())
            .map_err(err)?;
        Self::load_dedup(&store.slot())
            .map_err(|e| format_err(format!("could not rebuild its dedup index: {e}")))?;
        Ok(store)
    }

    /// Bring the dedup index of `slot` up to the end of its segment log (the records after what
    /// its runs cover: about one in-memory table's worth after a restart, all of them after a
    /// migration or a snapshot install), then fill the bloom filter from it.
    pub(crate) fn load_dedup(slot: &Slot) -> Result<(), StoreError> {
        let mut failed: Option<StoreError> = None;
        slot.segments
            .scan_records(slot.dedup.covered(), &mut |rec, after| {
                match dedup_entries(rec, 0) {
                    Ok(entries) => slot.dedup.insert_all(entries),
                    Err(e) => {
                        failed.get_or_insert(e);
                    }
                }
                if slot.dedup.full()
                    && let Err(e) = slot.dedup.flush(after)
                {
                    failed.get_or_insert(StoreError::Read(e.to_string()));
                }
            })
            .map_err(|e| StoreError::Read(e.to_string()))?;
        if let Some(e) = failed {
            return Err(e);
        }
        slot.dedup_filter.clear();
        slot.dedup
            .for_each(&mut |k| slot.dedup_filter.insert_key(k))
            .map_err(|e| StoreError::Read(e.to_string()))
    }

    /// Tell the raft log which of its files records of the active slot point into (a file
    /// that none does may go), then bring the dedup index up to date with those records: the
    /// ones after what its runs cover (every one of them after a snapshot install).
    pub(crate) fn hold_raft_files(
        &self,
        log: &Arc<dyn queen_ports::LogFiles>,
    ) -> Result<(), StoreError> {
        let slot = self.slot();
        let lo = messages::file_key(RAFT_BIT);
        let hi = [table::SEGMENT_FILE + 1];
        let mut files = Vec::new();
        for g in slot.state.range(lo.as_slice()..hi.as_slice()) {
            let (k, _) = g.into_inner().map_err(read_err)?;
            if let Some(file) = queen_domain::keys::u64_at(&k, 1) {
                files.push(file & !RAFT_BIT);
            }
        }
        log.set_holds(&files)
            .map_err(|e| StoreError::Read(e.to_string()))?;

        // Records kept in the raft log after what the dedup runs cover, in log order, and the
        // last record kept there.
        let covered = slot.dedup.covered_raft();
        let mut replay: Vec<(u64, u64, u64, u64, messages::IndexVal)> = Vec::new();
        let mut last: Option<(u64, u64, u64, u64, messages::IndexVal)> = None;
        for g in slot
            .state
            .range([table::SEGMENT_INDEX].as_slice()..[table::SEGMENT_INDEX + 1].as_slice())
        {
            let (k, v) = g.into_inner().map_err(read_err)?;
            // A row of 28 bytes is a record of the segment log; any other decodes as one kept
            // in the raft log, or is an error.
            let Some((pid, base)) = messages::index_key_parts(&k).filter(|_| v.len() != 28) else {
                continue;
            };
            let val = messages::IndexVal::decode(&k, &v)?;
            let at = (val.loc.file & !RAFT_BIT, val.loc.pos);
            if last.is_none_or(|l| (l.0, l.1) < at) {
                last = Some((at.0, at.1, pid, base, val));
            }
            if at > covered {
                replay.push((at.0, at.1, pid, base, val));
            }
        }
        // The log is append-only: when its last record the state indexes is whole, so is every
        // earlier one. One that is gone or damaged means the log lost entries this state applied
        // (a machine that lost power before this node's own fsync of them): refuse to serve.
        if let Some((file, pos, pid, base, val)) = last {
            val.read(&slot.segments, pid, base).map_err(|e| {
                StoreError::Read(format!(
                    "the raft log lost entries this state applied (the last kept record, at position {pos} of log file {file}: {e}); move the data directory away and start the node empty, so that it receives a snapshot"
                ))
            })?;
        }
        replay.sort_unstable_by_key(|r| (r.0, r.1, r.2, r.3));
        for (file, pos, pid, base, val) in replay {
            let rec = val
                .read(&slot.segments, pid, base)
                .map_err(|e| StoreError::Read(e.to_string()))?;
            let entries = dedup_entries(&rec, val.skip as usize)?;
            for (key, _) in &entries {
                slot.dedup_filter.insert_key(key);
            }
            slot.dedup.insert_all(entries);
            slot.dedup.note_raft((file, pos));
            if slot.dedup.full() {
                slot.dedup
                    .flush(slot.segments.end())
                    .map_err(|e| StoreError::Read(e.to_string()))?;
            }
        }
        Ok(())
    }

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

    fn reclaim(&self) -> Result<(), queen_ports::BackendError> {
        FjallStore::reclaim(self).map_err(|e| queen_ports::BackendError::Storage(e.to_string()))
    }
}

/// The dedup entries of a record's messages from its `skip`th on: the key of each message's
/// transactionId and its offset.
fn dedup_entries(
    rec: &crate::segments::Record,
    skip: usize,
) -> Result<Vec<(Key, u64)>, StoreError> {
    rec.values()
        .skip(skip)
        .map(|(offset, v)| {
            let h = queen_domain::codec::decode_head::<MessageHead>(&[], v)?;
            Ok((dedup_key(rec.pid, &h.transaction_id), offset))
        })
        .collect()
}

/// Open the dedup index of slot `name`; one that cannot be read is rebuilt from the segment
/// log (it is derived data), with a warning.
pub(crate) fn open_dedup(
    dir: &Path,
    name: SlotName,
    state: &Keyspace,
    mem_cap: usize,
) -> Result<Arc<DedupIndex>, crate::dedup::DedupError> {
    let path = dir.join(name.dedup_dir());
    let ks = state.clone();
    // On a read error a merge keeps the entries: a dead entry only costs a needless check.
    let first_live: FirstLive =
        Arc::new(move |pid| messages::first_live(&ks, pid).unwrap_or(Some(0)));
    match DedupIndex::open(&path, mem_cap, first_live.clone()) {
        Ok(i) => Ok(Arc::new(i)),
        Err(e) => {
            tracing::warn!(target: "queen-store", error = %e, "the dedup index cannot be read; rebuilding it from the message segments");
            let _ = std::fs::remove_dir_all(&path);
            DedupIndex::open(&path, mem_cap, first_live).map(Arc::new)
        }
    }
}

/// A visitor of rows; false stops the scan.
type Visit<'a> = dyn FnMut(&[u8], &[u8]) -> bool + 'a;

/// A point read of the domain's state: message rows from the segment log, dedup rows from the
/// dedup index (those the filter rules out without reading it), the store's own tables hidden.
fn routed_get(
    engine: &dyn EngineRead,
    segments: &Segments,
    filter: &DedupFilter,
    dedup: &DedupIndex,
    key: &[u8],
) -> Result<Option<Vec<u8>>, StoreError> {
    match key.first() {
        Some(&table::MESSAGE) => messages::get(engine, segments, key),
        Some(&table::DEDUP_HASH) => dedup_get(engine, filter, dedup, key),
        Some(t) if *t >= table::SEGMENT_INDEX => Ok(None),
        _ => engine.get(key),
    }
}

/// A dedup row: the offsets the index holds under the key whose messages are still stored,
/// which is exactly what the row said when rows were deleted with their messages.
fn dedup_get(
    engine: &dyn EngineRead,
    filter: &DedupFilter,
    dedup: &DedupIndex,
    key: &[u8],
) -> Result<Option<Vec<u8>>, StoreError> {
    let Some(k) = as_dedup_key(key) else {
        return Ok(None);
    };
    if filter.surely_absent(key) {
        return Ok(None);
    }
    let pid = u64::from_be_bytes(k[..8].try_into().unwrap_or_default());
    let mut offsets = dedup
        .lookup(&k)
        .map_err(|e| StoreError::Read(e.to_string()))?;
    let mut live = Vec::with_capacity(offsets.len());
    for o in offsets.drain(..) {
        if messages::is_live(engine, pid, o)? {
            live.push(o);
        }
    }
    Ok((!live.is_empty()).then(|| queen_domain::codec::encode(&live)))
}

/// A scan of the domain's state, split at the message table: engine rows before it, the
/// segment log inside it, engine rows after it; the store's own tables are not the domain's.
fn routed_scan(
    engine: &dyn EngineRead,
    segments: &Segments,
    start: &[u8],
    end: &[u8],
    visit: &mut Visit<'_>,
) -> Result<(), StoreError> {
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
    if start < lo && !visit_engine(engine.range(start, end.min(lo)), &mut guarded)? {
        return Ok(());
    }
    if go.get() && end > lo && start < hi {
        messages::scan(engine, segments, start.max(lo), end.min(hi), &mut guarded)?;
    }
    if go.get() && end > hi {
        visit_engine(engine.range(start.max(hi), end), &mut guarded)?;
    }
    Ok(())
}

/// Visit an engine range; false when the visitor stopped.
fn visit_engine(iter: fjall::Iter, visit: &mut Visit<'_>) -> Result<bool, StoreError> {
    for guard in iter {
        let (k, v) = guard.into_inner().map_err(read_err)?;
        if !visit(&k, &v) {
            return Ok(false);
        }
    }
    Ok(true)
}

impl Slot {
    /// Stage engine rows (`Some` puts, `None` removes) in `batch`; dedup rows are added to the
    /// filter first, so a reader that can see a row is never told it is absent.
    pub(crate) fn write_rows(
        &self,
        batch: &mut fjall::OwnedWriteBatch,
        rows: impl IntoIterator<Item = (Vec<u8>, Option<Vec<u8>>)>,
    ) {
        for (k, v) in rows {
            match v {
                Some(v) => {
                    self.dedup_filter.insert(&k);
                    batch.insert(&self.state, k, v);
                }
                None => batch.remove(&self.state, k),
            }
        }
    }
}

impl Slot {
    /// Move the dedup rows into the dedup index (and the filter): those the overlay staged
    /// typed, and any put as bytes into `writes`. A row holds every offset under its key (the
    /// domain adds one to what it read); deletes are dropped: the index answers only offsets
    /// whose message is still stored.
    pub(crate) fn take_dedup_rows(
        &self,
        writes: &mut queen_domain::WriteSet,
        dedup: queen_domain::DedupRows,
    ) -> Result<(), StoreError> {
        let mut entries = Vec::with_capacity(dedup.len());
        for (key, offsets) in dedup {
            let Some(offsets) = offsets else { continue };
            self.dedup_filter.insert_key(&key);
            entries.extend(offsets.into_iter().map(|o| (key, o)));
        }
        let (lo, hi) = ([table::DEDUP_HASH], [table::DEDUP_HASH + 1]);
        if writes
            .range::<[u8], _>((
                std::ops::Bound::Included(&lo[..]),
                std::ops::Bound::Excluded(&hi[..]),
            ))
            .next()
            .is_some()
        {
            let mut after = writes.split_off(&[table::DEDUP_HASH + 1][..]);
            let rows = writes.split_off(&[table::DEDUP_HASH][..]);
            writes.append(&mut after);
            for (k, v) in rows {
                let Some(v) = v else { continue };
                let key = as_dedup_key(&k).ok_or_else(|| StoreError::Corrupt {
                    key: queen_domain::codec::escape(&k),
                    detail: "a dedup key of the wrong length".to_owned(),
                })?;
                let offsets: Vec<u64> = queen_domain::codec::decode(&k, &v)?;
                self.dedup_filter.insert_key(&key);
                entries.extend(offsets.into_iter().map(|o| (key, o)));
            }
        }
        self.dedup.insert_all(entries);
        Ok(())
    }
}

impl StateRead for Slot {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        routed_get(
            &self.state,
            &self.segments,
            &self.dedup_filter,
            &self.dedup,
            key,
        )
    }

    fn scan(&self, start: &[u8], end: &[u8], visit: &mut Visit<'_>) -> Result<(), StoreError> {
        routed_scan(&self.state, &self.segments, start, end, visit)
    }

    fn prefetch_dedup(&self, keys: &[queen_domain::keys::DedupKey]) {
        for k in keys {
            self.dedup_filter.prefetch(k);
        }
    }
}

impl StateRead for FjallStore {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.slot().get(key)
    }

    fn scan(&self, start: &[u8], end: &[u8], visit: &mut Visit<'_>) -> Result<(), StoreError> {
        self.slot().scan(start, end, visit)
    }
}

/// A pinned, consistent view of the state.
pub struct StateView {
    pub(crate) snap: fjall::Snapshot,
    pub(crate) state: Keyspace,
    pub(crate) segments: Arc<Segments>,
    pub(crate) dedup_filter: Arc<DedupFilter>,
    pub(crate) dedup: Arc<DedupIndex>,
}

impl StateRead for StateView {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        routed_get(
            &View(&self.snap, &self.state),
            &self.segments,
            &self.dedup_filter,
            &self.dedup,
            key,
        )
    }

    fn scan(&self, start: &[u8], end: &[u8], visit: &mut Visit<'_>) -> Result<(), StoreError> {
        routed_scan(
            &View(&self.snap, &self.state),
            &self.segments,
            start,
            end,
            visit,
        )
    }
}
