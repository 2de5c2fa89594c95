//! The dedup index of a slot, kept out of the LSM engine.
//!
//! The domain reads and writes dedup rows `(DEDUP_HASH, pid, 16-byte hash) -> offsets` like any
//! other row. Stored as engine rows, every message cost one insert into fjall's memtable (a
//! skiplist search of a million random keys: 14% of a leader's CPU under batch pushes, with
//! `perf`), its journal, its flushes and compactions, and memtable memory. The rows are a
//! function of the stored messages (every live message's transactionId, hashed), so this module
//! keeps them as a derived index of the segment log instead, node-local like the bloom filter,
//! and always complete for what the node has applied:
//!
//! - new entries go into a table in memory (at most [`MEM_ENTRIES`]), appended and sorted in
//!   chunks of [`MemTable::CHUNK`];
//! - a full table is handed to a thread of its own (lookups still search it; the apply path
//!   goes on with a new table) and written out, sorted, as an immutable run file of fixed
//!   32-byte entries `pid | hash | offset` (big-endian, so byte order is key order); a run keeps
//!   in memory the first key of every 4 KiB page (1/128 of its entries), and a lookup reads at
//!   most one page per run (mostly a quarter of one, see `Run::lookup`);
//! - runs of similar size are merged [`FANOUT`] at a time in a background thread at a lower
//!   priority (size-tiered, so an entry is rewritten about log16(n / MEM_ENTRIES) times),
//!   dropping the entries of messages that retention or a queue deletion removed (messages go
//!   from a partition's front, so an entry is dead when its offset is below the partition's
//!   first live one);
//! - a manifest names the runs and the position of the segment log up to which they hold every
//!   message (`covered`). At open the index replays the records after `covered` (at most about
//!   one table's worth, recomputing the hashes from the stored transactionIds); without a
//!   manifest (a new store, a store of layout 2, after a snapshot install) it replays them all.
//!
//! Nothing is ever deleted from the index on the apply path: a lookup answers candidates, and
//! the store keeps only those whose message is still live (the same answer the deleted rows
//! gave), so every replica still decides the same outcome.

mod flush;
mod memtable;
mod merge;
mod run;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, RwLock};

/// Key of an entry: partition id (big-endian) and the 16-byte hash, as in the dedup row's key.
pub(crate) type Key = queen_domain::keys::DedupKey;

/// Bytes of one entry on disk: key and offset.
const ENTRY: usize = 32;
/// Entries per page; runs keep the first key of every page in memory.
const PAGE_ENTRIES: usize = 128;
/// Entries held in memory before they are written out as a run (about 8 MiB of table).
pub(crate) const MEM_ENTRIES: usize = 1 << 17;
/// Runs of similar size merged at once. Sixteen, not eight: an entry is written once more per
/// tier, and with eight the third tier began at 8 million entries, whose first merge rewrote
/// 256 MB in one go (in the third round of `queen-bench cluster`, batch pushes cost 9.8 µs of
/// server CPU and 577 B of disk per message in that phase, 8.3 µs and 385-404 B in the rounds
/// before). Lookups read more runs only for keys the bloom filter lets through.
const FANOUT: usize = 16;
const RUN_MAGIC: &[u8; 8] = b"QDDX\0\0\0\x01";
const RUN_HEADER: u64 = 16;
const MANIFEST: &str = "MANIFEST";
const MANIFEST_MAGIC: &[u8; 8] = b"QDDM\0\0\0\x02";
/// Manifests of builds before records were kept in the raft log: no raft position.
const MANIFEST_MAGIC_1: &[u8; 8] = b"QDDM\0\0\0\x01";

/// What a manifest says: where the runs' coverage ends in the segment log and in the raft log,
/// and the runs.
type Manifest = (Option<(u64, u64)>, (u64, u64), Vec<u64>);

/// The first offset of a partition that is still stored (`None`: none is).
pub(crate) type FirstLive = Arc<dyn Fn(u64) -> Option<u64> + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub(crate) enum DedupError {
    #[error("dedup index {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("dedup index {path}: {detail}")]
    Damaged { path: String, detail: String },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> DedupError + '_ {
    move |source| DedupError::Io {
        path: path.display().to_string(),
        source,
    }
}

struct Run {
    id: u64,
    path: PathBuf,
    file: File,
    entries: u64,
    /// The first key of every page, as integers (a lookup's binary search compares words,
    /// not bytes).
    fences: Vec<Fence>,
}

/// Reads a run's entries in order, a chunk of them at a time.
struct RunCursor<'a> {
    run: &'a Run,
    at: u64,
    buf: Vec<u8>,
    buf_at: u64,
    buf_n: u64,
    /// A read failed: the entries ended early.
    error: Option<DedupError>,
}

/// An entry as integers, in the table in memory and in a merge's heap: partition, the hash's
/// two halves (all read big-endian, so their order is the key bytes' order) and the offset.
/// Sorting these compares words; sorting `(Key, u64)` called `memcmp` per comparison (7% of
/// the apply's samples, `perf`, examples/apply_cost).
type Ent = [u64; 4];

fn ent(key: &Key, offset: u64) -> Ent {
    let mut bytes = [0u8; ENTRY];
    bytes[..24].copy_from_slice(key);
    bytes[24..].copy_from_slice(&offset.to_be_bytes());
    ent_from(&bytes)
}

/// An entry from its bytes in a run: four big-endian words, so bytes and integers sort alike.
fn ent_from(bytes: &[u8; ENTRY]) -> Ent {
    let (words, _) = bytes.as_chunks::<8>();
    std::array::from_fn(|i| u64::from_be_bytes(words[i]))
}

/// An entry's bytes in a run; the inverse of [`ent_from`].
fn ent_bytes(e: &Ent) -> [u8; ENTRY] {
    let mut bytes = [0u8; ENTRY];
    let (words, _) = bytes.as_chunks_mut::<8>();
    for (to, word) in words.iter_mut().zip(e) {
        *to = word.to_be_bytes();
    }
    bytes
}

/// A key as integers, in the key bytes' order: what a run keeps of each page.
type Fence = [u64; 3];

fn fence(key: &Key) -> Fence {
    let e = ent(key, 0);
    [e[0], e[1], e[2]]
}

fn key_of(e: &Ent) -> Key {
    let mut k = [0u8; 24];
    k.copy_from_slice(&ent_bytes(e)[..24]);
    k
}

/// Entries not yet in a run: sorted chunks of at most [`MemTable::CHUNK`] entries, and the
/// newest entries unsorted. An insert appends; every [`MemTable::SMALL`] entries are sorted
/// into a small chunk, and every few small chunks merged into one, while they are in the
/// caches; a hash table of the whole table (4 MiB and more) cost a miss to memory per
/// insert, 15% of the apply's samples under batch pushes (`perf`, examples/apply_cost).
/// A lookup (only for a key the filter may have seen) searches each chunk and the tail.
#[derive(Default)]
struct MemTable {
    chunks: Vec<Vec<Ent>>,
    /// How many of the last chunks are small ones ([`MemTable::SMALL`] entries), not yet
    /// merged into one of [`MemTable::CHUNK`].
    small: usize,
    tail: Vec<Ent>,
    /// Entries held, repeats included (a row's offsets are inserted again with each new one).
    len: usize,
    /// A bloom filter of the keys held, so that a lookup skips the search of every chunk for
    /// a key the table does not hold. Made at the first insert.
    filter: Option<crate::filter::DedupFilter>,
}

struct Inner {
    mem: MemTable,
    /// A full table being written out as a run behind the apply path: lookups search it until
    /// the run that holds it is in `runs`.
    frozen: Option<Arc<MemTable>>,
    /// Raised by [`DedupIndex::clear`]: a run written for an earlier epoch is dropped.
    epoch: u64,
    /// Oldest first.
    runs: Vec<Arc<Run>>,
    next_id: u64,
    /// The runs hold every message of the segment log before this position.
    covered: Option<(u64, u64)>,
    /// ... and every message of a record kept in the raft log at or before this (file,
    /// position) of its entry.
    covered_raft: (u64, u64),
    /// The greatest such position of an entry whose messages were inserted.
    raft_seen: (u64, u64),
    merging: bool,
}

/// The dedup index of one slot.
pub(crate) struct DedupIndex {
    dir: PathBuf,
    /// Entries held in memory before they are written out.
    mem_cap: usize,
    inner: RwLock<Inner>,
    first_live: FirstLive,
    /// Serialises manifest writes.
    manifest: Mutex<()>,
    /// This opening's mark in `OWNERS`.
    generation: u64,
    /// Whether a table is being written out (one at a time), and its end signalled. Shared
    /// with `OWNERS`, so that a later opening of the directory waits for it.
    flushing: Arc<Flushing>,
}

/// Whether a table is being written out, and a signal when it is no longer.
#[derive(Default)]
pub(super) struct Flushing {
    busy: Mutex<bool>,
    done: Condvar,
}

impl Flushing {
    /// Wait until no table is being written out, then (with `claim`) mark one as being.
    pub(super) fn wait(&self, claim: bool) {
        let mut busy = self
            .busy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while *busy {
            busy = self
                .done
                .wait(busy)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        *busy = claim;
    }

    pub(super) fn end(&self) {
        *self
            .busy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = false;
        self.done.notify_all();
    }
}

/// Which opening of each index directory in this process owns it: an index that is dropped
/// and opened again (a test, a store reopened) may still have a merge running in the old one,
/// which must then not write over what the new one keeps.
/// With each, whether it is writing out a table.
static OWNERS: Mutex<Vec<Owner>> = Mutex::new(Vec::new());

type Owner = (PathBuf, u64, Arc<Flushing>);
static GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn owners() -> std::sync::MutexGuard<'static, Vec<Owner>> {
    OWNERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl DedupIndex {
    /// Open the index in `dir` (created when missing); files the manifest does not name are
    /// deleted. The caller replays the segment log after [`Self::covered`].
    pub(crate) fn open(
        dir: &Path,
        mem_cap: usize,
        first_live: FirstLive,
    ) -> Result<Self, DedupError> {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let generation = GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let flushing = Arc::new(Flushing::default());
        let before = {
            let mut o = owners();
            let before = o.iter().find(|(p, ..)| p == dir).map(|(.., f)| f.clone());
            o.retain(|(p, ..)| p != dir);
            o.push((dir.to_path_buf(), generation, flushing.clone()));
            before
        };
        // An earlier opening in this process may be writing out a table: let it end (its
        // manifest write then fails, as it no longer owns the directory) before this one
        // reads the directory.
        if let Some(before) = before {
            before.wait(false);
        }
        let (covered, covered_raft, ids) = match std::fs::read(dir.join(MANIFEST)) {
            Ok(b) => Self::decode_manifest(&b).ok_or_else(|| DedupError::Damaged {
                path: dir.join(MANIFEST).display().to_string(),
                detail: "unreadable manifest".to_owned(),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (None, (0, 0), Vec::new()),
            Err(e) => return Err(io_err(&dir.join(MANIFEST))(e)),
        };
        for e in std::fs::read_dir(dir).map_err(io_err(dir))? {
            let e = e.map_err(io_err(dir))?;
            let name = e.file_name();
            let name = name.to_string_lossy();
            let keep = name == MANIFEST || ids.iter().any(|id| Run::name(*id) == name);
            if !keep {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let mut runs = Vec::with_capacity(ids.len());
        for &id in &ids {
            runs.push(Arc::new(Run::open(dir, id)?));
        }
        let next_id = ids.iter().max().map_or(1, |m| m + 1);
        Ok(Self {
            dir: dir.to_path_buf(),
            mem_cap: mem_cap.max(1),
            inner: RwLock::new(Inner {
                mem: MemTable::default(),
                frozen: None,
                epoch: 0,
                runs,
                next_id,
                covered,
                covered_raft,
                raft_seen: covered_raft,
                merging: false,
            }),
            first_live,
            manifest: Mutex::new(()),
            generation,
            flushing,
        })
    }

    /// Empty the index and delete its files (a snapshot install rebuilds it).
    pub(crate) fn clear(&self) -> Result<(), DedupError> {
        let _m = self
            .manifest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut g = write(&self.inner);
        let _ = std::fs::remove_file(self.dir.join(MANIFEST));
        for r in g.runs.drain(..) {
            let _ = std::fs::remove_file(&r.path);
        }
        g.mem = MemTable::default();
        g.frozen = None;
        g.epoch += 1;
        g.covered = None;
        g.covered_raft = (0, 0);
        g.raft_seen = (0, 0);
        Ok(())
    }

    /// Where replay must start: every message before it is in a run.
    pub(crate) fn covered(&self) -> Option<(u64, u64)> {
        read(&self.inner).covered
    }

    /// Where the runs' coverage of records kept in the raft log ends: replay the records whose
    /// entry is after this (file, position).
    pub(crate) fn covered_raft(&self) -> (u64, u64) {
        read(&self.inner).covered_raft
    }

    /// The messages of the raft log's entry at `pos` (file, position) were inserted.
    pub(crate) fn note_raft(&self, pos: (u64, u64)) {
        let mut g = write(&self.inner);
        g.raft_seen = g.raft_seen.max(pos);
    }

    /// Note that `key` is stored at `offset`.
    #[cfg(test)]
    pub(crate) fn insert(&self, key: Key, offset: u64) {
        let mut g = write(&self.inner);
        Self::insert_locked(&mut g, key, offset);
    }

    fn insert_locked(g: &mut Inner, key: Key, offset: u64) {
        g.mem.insert(&key, offset);
    }

    /// Several entries under one lock.
    pub(crate) fn insert_all(&self, entries: impl IntoIterator<Item = (Key, u64)>) {
        let mut g = write(&self.inner);
        for (k, o) in entries {
            Self::insert_locked(&mut g, k, o);
        }
    }

    /// Every offset stored under `key`, ascending, without repeats; dead ones included.
    pub(crate) fn lookup(&self, key: &Key) -> Result<Vec<u64>, DedupError> {
        let (mut out, runs) = {
            let g = read(&self.inner);
            let mut out = Vec::new();
            g.mem.lookup(key, &mut out);
            if let Some(f) = &g.frozen {
                f.lookup(key, &mut out);
            }
            (out, g.runs.clone())
        };
        for r in &runs {
            r.lookup(key, &mut out)?;
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    /// Whether the table in memory is full.
    pub(crate) fn full(&self) -> bool {
        read(&self.inner).mem.len >= self.mem_cap
    }

    /// Every entry (runs, then the table in memory), for rebuilding the bloom filter.
    pub(crate) fn for_each(&self, visit: &mut dyn FnMut(&Key)) -> Result<(), DedupError> {
        let runs = read(&self.inner).runs.clone();
        for r in &runs {
            r.scan(&mut |k, _| visit(&k))?;
        }
        let g = read(&self.inner);
        for k in g.mem.keys() {
            visit(&k);
        }
        for k in g.frozen.iter().flat_map(|f| f.keys()) {
            visit(&k);
        }
        Ok(())
    }

    /// Bytes the run files take on disk.
    pub(crate) fn disk_bytes(&self) -> u64 {
        read(&self.inner)
            .runs
            .iter()
            .map(|r| RUN_HEADER + r.entries * ENTRY as u64)
            .sum()
    }

    /// Runs and the entries they hold, for status pages and tests.
    pub(crate) fn stats(&self) -> (usize, u64, usize) {
        let g = read(&self.inner);
        (
            g.runs.len(),
            g.runs.iter().map(|r| r.entries).sum(),
            g.mem.len + g.frozen.as_ref().map_or(0, |f| f.len),
        )
    }

    /// Wait (bounded: a minute) for a background flush and merge to end, for tests. The index's
    /// lock is not held while waiting: a merge needs it to swap its run in.
    #[cfg(test)]
    pub(crate) fn settle(&self) {
        for _ in 0..6000 {
            let done = {
                let g = read(&self.inner);
                !g.merging && g.frozen.is_none()
            };
            if done {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

#[cfg(test)]
mod tests;
