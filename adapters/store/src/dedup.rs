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
//!   small chunks;
//! - a full table is written out, sorted, as an immutable run file of fixed 32-byte entries
//!   `pid | hash | offset` (big-endian, so byte order is key order); a run keeps in memory the
//!   first key of every 4 KiB page (1/128 of its entries), and a lookup reads one page per run;
//! - runs of similar size are merged [`FANOUT`] at a time in a background thread (size-tiered,
//!   so an entry is rewritten about log8(n / MEM_ENTRIES) times), dropping the entries of
//!   messages that retention or a queue deletion removed (messages go from a partition's front,
//!   so an entry is dead when its offset is below the partition's first live one);
//! - a manifest names the runs and the position of the segment log up to which they hold every
//!   message (`covered`). At open the index replays the records after `covered` (at most about
//!   one table's worth, recomputing the hashes from the stored transactionIds); without a
//!   manifest (a new store, a store of layout 2, after a snapshot install) it replays them all.
//!
//! Nothing is ever deleted from the index on the apply path: a lookup answers candidates, and
//! the store keeps only those whose message is still live (the same answer the deleted rows
//! gave), so every replica still decides the same outcome.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

/// Key of an entry: partition id (big-endian) and the 16-byte hash, as in the dedup row's key.
pub(crate) type Key = queen_domain::keys::DedupKey;

/// Bytes of one entry on disk: key and offset.
const ENTRY: usize = 32;
/// Entries per page; runs keep the first key of every page in memory.
const PAGE_ENTRIES: usize = 128;
/// Entries held in memory before they are written out as a run (about 8 MiB of table).
pub(crate) const MEM_ENTRIES: usize = 1 << 17;
/// Runs of similar size merged at once.
const FANOUT: usize = 8;
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
    /// The first key of every page.
    fences: Vec<Key>,
}

impl Run {
    fn name(id: u64) -> String {
        format!("{id:020}.qddx")
    }

    fn open(dir: &Path, id: u64) -> Result<Self, DedupError> {
        let path = dir.join(Self::name(id));
        let file = File::open(&path).map_err(io_err(&path))?;
        let damaged = |detail: &str| DedupError::Damaged {
            path: path.display().to_string(),
            detail: detail.to_owned(),
        };
        let mut h = [0u8; RUN_HEADER as usize];
        file.read_exact_at(&mut h, 0)
            .map_err(|_| damaged("no header"))?;
        if &h[..8] != RUN_MAGIC {
            return Err(damaged("not a dedup run of this format"));
        }
        let entries = u64::from_le_bytes(h[8..16].try_into().unwrap_or_default());
        let len = file.metadata().map_err(io_err(&path))?.len();
        if len != RUN_HEADER + entries * ENTRY as u64 {
            return Err(damaged("length does not match its entry count"));
        }
        let mut fences = Vec::with_capacity(entries.div_ceil(PAGE_ENTRIES as u64) as usize);
        let mut k = [0u8; 24];
        let mut i = 0;
        while i < entries {
            file.read_exact_at(&mut k, RUN_HEADER + i * ENTRY as u64)
                .map_err(io_err(&path))?;
            fences.push(k);
            i += PAGE_ENTRIES as u64;
        }
        Ok(Self {
            id,
            path,
            file,
            entries,
            fences,
        })
    }

    /// Write `entries` (sorted) as run `id`, fsynced.
    fn write(
        dir: &Path,
        id: u64,
        entries: &mut dyn Iterator<Item = (Key, u64)>,
    ) -> Result<Self, DedupError> {
        let path = dir.join(Self::name(id));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(io_err(&path))?;
        let mut w = BufWriter::with_capacity(1 << 20, &file);
        w.write_all(&[0u8; RUN_HEADER as usize])
            .map_err(io_err(&path))?;
        let mut n = 0u64;
        let mut fences = Vec::new();
        for (k, o) in entries {
            if n.is_multiple_of(PAGE_ENTRIES as u64) {
                fences.push(k);
            }
            w.write_all(&k).map_err(io_err(&path))?;
            w.write_all(&o.to_be_bytes()).map_err(io_err(&path))?;
            n += 1;
        }
        w.flush().map_err(io_err(&path))?;
        drop(w);
        let mut h = [0u8; RUN_HEADER as usize];
        h[..8].copy_from_slice(RUN_MAGIC);
        h[8..].copy_from_slice(&n.to_le_bytes());
        file.write_all_at(&h, 0).map_err(io_err(&path))?;
        file.sync_data().map_err(io_err(&path))?;
        Ok(Self {
            id,
            path,
            file,
            entries: n,
            fences,
        })
    }

    /// The offsets stored under `key`.
    fn lookup(&self, key: &Key, out: &mut Vec<u64>) -> Result<(), DedupError> {
        // The last page whose first key is below `key`: equal keys may begin on the page before
        // the one whose fence equals `key`.
        let mut page = self.fences.partition_point(|f| f < key).saturating_sub(1);
        let mut buf = vec![0u8; PAGE_ENTRIES * ENTRY];
        while page < self.fences.len() && self.fences[page] <= *key {
            let first = (page * PAGE_ENTRIES) as u64;
            let n = (self.entries - first).min(PAGE_ENTRIES as u64) as usize;
            let bytes = &mut buf[..n * ENTRY];
            self.file
                .read_exact_at(bytes, RUN_HEADER + first * ENTRY as u64)
                .map_err(io_err(&self.path))?;
            for e in bytes.chunks_exact(ENTRY) {
                let (k, offset) = decode_entry(e);
                match k.cmp(key) {
                    std::cmp::Ordering::Less => {}
                    std::cmp::Ordering::Equal => out.push(offset),
                    std::cmp::Ordering::Greater => return Ok(()),
                }
            }
            page += 1;
        }
        Ok(())
    }

    /// Every entry, in order.
    fn scan(&self, visit: &mut dyn FnMut(Key, u64)) -> Result<(), DedupError> {
        let mut c = RunCursor::new(self);
        while let Some((k, o)) = c.peek()? {
            visit(k, o);
            c.advance();
        }
        Ok(())
    }
}

/// One entry's bytes read back: its key and offset.
fn decode_entry(e: &[u8]) -> (Key, u64) {
    let mut k = [0u8; 24];
    k.copy_from_slice(&e[..24]);
    (
        k,
        u64::from_be_bytes(e[24..ENTRY].try_into().unwrap_or_default()),
    )
}

/// Reads a run's entries in order, a chunk of them at a time.
struct RunCursor<'a> {
    run: &'a Run,
    at: u64,
    buf: Vec<u8>,
    buf_at: u64,
    buf_n: u64,
}

impl<'a> RunCursor<'a> {
    /// Entries read at once (128 KiB).
    const CHUNK: u64 = 4096;

    fn new(run: &'a Run) -> Self {
        Self {
            run,
            at: 0,
            buf: Vec::new(),
            buf_at: 0,
            buf_n: 0,
        }
    }

    /// The entry at the cursor, if any is left.
    fn peek(&mut self) -> Result<Option<(Key, u64)>, DedupError> {
        if self.at >= self.run.entries {
            return Ok(None);
        }
        if self.at >= self.buf_at + self.buf_n {
            let n = (self.run.entries - self.at).min(Self::CHUNK);
            self.buf.resize(n as usize * ENTRY, 0);
            self.run
                .file
                .read_exact_at(&mut self.buf, RUN_HEADER + self.at * ENTRY as u64)
                .map_err(io_err(&self.run.path))?;
            self.buf_at = self.at;
            self.buf_n = n;
        }
        let i = (self.at - self.buf_at) as usize * ENTRY;
        Ok(Some(decode_entry(&self.buf[i..i + ENTRY])))
    }

    fn advance(&mut self) {
        self.at += 1;
    }
}

/// An entry as integers, in the table in memory and in a merge's heap: partition, the hash's
/// two halves (all read big-endian, so their order is the key bytes' order) and the offset.
/// Sorting these compares words; sorting `(Key, u64)` called `memcmp` per comparison (7% of
/// the apply's samples, `perf`, examples/apply_cost).
type Ent = [u64; 4];

fn ent(key: &Key, offset: u64) -> Ent {
    let word =
        |r: std::ops::Range<usize>| u64::from_be_bytes(key[r].try_into().unwrap_or_default());
    [word(0..8), word(8..16), word(16..24), offset]
}

fn key_of(e: &Ent) -> Key {
    let mut k = [0u8; 24];
    k[..8].copy_from_slice(&e[0].to_be_bytes());
    k[8..16].copy_from_slice(&e[1].to_be_bytes());
    k[16..].copy_from_slice(&e[2].to_be_bytes());
    k
}

/// Entries not yet in a run: sorted chunks of at most [`MemTable::CHUNK`] entries, and the
/// newest entries unsorted. An insert appends, and a chunk is sorted while it is small enough
/// for the caches; a hash table of the whole table (4 MiB and more) cost a miss to memory per
/// insert, 15% of the apply's samples under batch pushes (`perf`, examples/apply_cost).
/// A lookup (only for a key the filter may have seen) searches each chunk and the tail.
#[derive(Default)]
struct MemTable {
    chunks: Vec<Vec<Ent>>,
    tail: Vec<Ent>,
    /// Entries held, repeats included (a row's offsets are inserted again with each new one).
    len: usize,
}

impl MemTable {
    const CHUNK: usize = 2048;

    fn insert(&mut self, key: &Key, offset: u64) {
        self.tail.push(ent(key, offset));
        self.len += 1;
        if self.tail.len() >= Self::CHUNK {
            let mut chunk = std::mem::replace(&mut self.tail, Vec::with_capacity(Self::CHUNK));
            chunk.sort_unstable();
            self.chunks.push(chunk);
        }
    }

    /// The offsets under `key`, in no order, possibly repeated.
    fn lookup(&self, key: &Key, out: &mut Vec<u64>) {
        let k = ent(key, 0);
        let same = |e: &Ent| e[..3] == k[..3];
        for c in &self.chunks {
            let at = c.partition_point(|e| e[..3] < k[..3]);
            out.extend(c[at..].iter().take_while(|e| same(e)).map(|e| e[3]));
        }
        out.extend(self.tail.iter().filter(|e| same(e)).map(|e| e[3]));
    }

    /// Every entry, sorted, without repeats; the table is left empty.
    fn take_sorted(&mut self) -> Vec<Ent> {
        let mut all = Vec::with_capacity(self.len);
        for c in self.chunks.drain(..) {
            all.extend(c);
        }
        all.append(&mut self.tail);
        self.len = 0;
        // A stable sort finds the sorted chunks and merges them.
        all.sort();
        all.dedup();
        all
    }

    /// Put back what [`MemTable::take_sorted`] took (a run could not be written).
    fn restore(&mut self, sorted: Vec<Ent>) {
        self.len += sorted.len();
        self.chunks.push(sorted);
    }

    fn keys(&self) -> impl Iterator<Item = Key> + '_ {
        self.chunks.iter().flatten().chain(&self.tail).map(key_of)
    }
}

struct Inner {
    mem: MemTable,
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
}

/// Which opening of each index directory in this process owns it: an index that is dropped
/// and opened again (a test, a store reopened) may still have a merge running in the old one,
/// which must then not write over what the new one keeps.
static OWNERS: Mutex<Vec<(PathBuf, u64)>> = Mutex::new(Vec::new());
static GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn owners() -> std::sync::MutexGuard<'static, Vec<(PathBuf, u64)>> {
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
        {
            let mut o = owners();
            o.retain(|(p, _)| p != dir);
            o.push((dir.to_path_buf(), generation));
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

    /// (covered, covered in the raft log, run ids) of a manifest's bytes (version 1 has no raft
    /// position: its store kept nothing there).
    fn decode_manifest(b: &[u8]) -> Option<Manifest> {
        let u64_at = |i: usize| {
            b.get(i..i + 8)
                .map(|s| u64::from_le_bytes(s.try_into().unwrap_or_default()))
        };
        let (raft, at) = match b.get(..8)? {
            m if m == MANIFEST_MAGIC => ((u64_at(8)?, u64_at(16)?), 24),
            m if m == MANIFEST_MAGIC_1 => ((0, 0), 8),
            _ => return None,
        };
        let covered = (u64_at(at)?, u64_at(at + 8)?);
        let n = u64_at(at + 16)? as usize;
        let ids_at = at + 24;
        let ids = (0..n)
            .map(|i| u64_at(ids_at + 8 * i))
            .collect::<Option<Vec<_>>>()?;
        let end = ids_at + 8 * n;
        let crc = u32::from_le_bytes(b.get(end..end + 4)?.try_into().ok()?);
        (crc32fast::hash(&b[..end]) == crc && b.len() == end + 4).then_some((
            Some(covered),
            raft,
            ids,
        ))
    }

    /// Write the manifest for `runs` and `covered` (atomically: a temporary file renamed over).
    fn write_manifest(
        &self,
        covered: (u64, u64),
        raft: (u64, u64),
        runs: &[Arc<Run>],
    ) -> Result<(), DedupError> {
        let owners = owners();
        if !owners
            .iter()
            .any(|(p, g)| *p == self.dir && *g == self.generation)
        {
            return Err(DedupError::Damaged {
                path: self.dir.display().to_string(),
                detail: "opened again elsewhere in this process; this handle no longer writes"
                    .to_owned(),
            });
        }
        let mut b = Vec::with_capacity(52 + 8 * runs.len());
        b.extend_from_slice(MANIFEST_MAGIC);
        b.extend_from_slice(&raft.0.to_le_bytes());
        b.extend_from_slice(&raft.1.to_le_bytes());
        b.extend_from_slice(&covered.0.to_le_bytes());
        b.extend_from_slice(&covered.1.to_le_bytes());
        b.extend_from_slice(&(runs.len() as u64).to_le_bytes());
        for r in runs {
            b.extend_from_slice(&r.id.to_le_bytes());
        }
        let crc = crc32fast::hash(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        let tmp = self.dir.join("MANIFEST.tmp");
        let f = File::create(&tmp).map_err(io_err(&tmp))?;
        f.write_all_at(&b, 0).map_err(io_err(&tmp))?;
        f.sync_data().map_err(io_err(&tmp))?;
        let path = self.dir.join(MANIFEST);
        std::fs::rename(&tmp, &path).map_err(io_err(&path))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err(&self.dir))
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

    /// Write the table in memory out as a run; `covered` is where the segment log ends after
    /// the last message the table holds (its records must be durable first). Starts a merge in
    /// the background when runs of similar size pile up.
    pub(crate) fn flush(self: &Arc<Self>, covered: (u64, u64)) -> Result<(), DedupError> {
        let _m = self
            .manifest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut g = write(&self.inner);
        let entries = g.mem.take_sorted();
        let id = g.next_id;
        let mut runs = g.runs.clone();
        // On a failure the entries stay in memory, so that no lookup misses them.
        if !entries.is_empty() {
            match Run::write(
                &self.dir,
                id,
                &mut entries.iter().map(|e| (key_of(e), e[3])),
            ) {
                Ok(run) => runs.push(Arc::new(run)),
                Err(e) => {
                    g.mem.restore(entries);
                    return Err(e);
                }
            }
        }
        let raft = g.raft_seen;
        if let Err(e) = self.write_manifest(covered, raft, &runs) {
            if runs.len() > g.runs.len() {
                let _ = std::fs::remove_file(self.dir.join(Run::name(id)));
            }
            g.mem.restore(entries);
            return Err(e);
        }
        g.next_id = id + 1;
        g.runs = runs;
        g.covered = Some(covered);
        g.covered_raft = raft;
        let start = !g.merging && Self::pick(&g.runs, self.mem_cap).is_some();
        if start {
            g.merging = true;
            drop(g);
            let me = self.clone();
            let spawned = std::thread::Builder::new().name("queen-dedup-merge".into()).spawn(move || {
                loop {
                    match me.merge_once() {
                        Ok(true) => {}
                        Ok(false) => break,
                        Err(e) => {
                            tracing::warn!(target: "queen-store", error = %e, "merging dedup runs failed; they stay as they are and are merged later");
                            break;
                        }
                    }
                }
                write(&me.inner).merging = false;
            });
            if spawned.is_err() {
                write(&self.inner).merging = false;
            }
        }
        Ok(())
    }

    /// The runs to merge next: the newest `FANOUT` or more runs whose sizes are within 4x of
    /// the smallest of them, as positions `[from, to)` of the run list.
    fn pick(runs: &[Arc<Run>], mem_cap: usize) -> Option<(usize, usize)> {
        if runs.len() < FANOUT {
            return None;
        }
        // Walk from the newest while sizes stay within a tier.
        let to = runs.len();
        let mut from = to;
        let smallest = runs[to - 1].entries.max(1);
        while from > 0
            && runs[from - 1].entries <= smallest.saturating_mul(4).max(mem_cap as u64 * 2)
        {
            from -= 1;
        }
        (to - from >= FANOUT).then_some((from, to))
    }

    /// Merge one tier; true when another may be due.
    fn merge_once(&self) -> Result<bool, DedupError> {
        let (from, to, picked, id) = {
            let mut g = write(&self.inner);
            let Some((from, to)) = Self::pick(&g.runs, self.mem_cap) else {
                return Ok(false);
            };
            let id = g.next_id;
            g.next_id += 1;
            (from, to, g.runs[from..to].to_vec(), id)
        };
        let merged = self.merge(&picked, id)?;
        let _m = self
            .manifest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut g = write(&self.inner);
        // Flushes only append runs, so the picked ones are still at [from, to).
        let still = g
            .runs
            .get(from..to)
            .is_some_and(|now| now.iter().zip(&picked).all(|(a, b)| a.id == b.id));
        if !still {
            let _ = std::fs::remove_file(&merged.path);
            return Ok(false);
        }
        let merged_path = merged.path.clone();
        let mut runs = g.runs[..from].to_vec();
        if merged.entries > 0 {
            runs.push(Arc::new(merged));
        } else {
            let _ = std::fs::remove_file(&merged.path);
        }
        runs.extend_from_slice(&g.runs[to..]);
        if let Some(covered) = g.covered
            && let Err(e) = self.write_manifest(covered, g.covered_raft, &runs)
        {
            let _ = std::fs::remove_file(&merged_path);
            return Err(e);
        }
        g.runs = runs;
        drop(g);
        for r in picked {
            let _ = std::fs::remove_file(&r.path);
        }
        Ok(true)
    }

    /// A k-way merge of `runs` into run `id`, without the entries of deleted messages.
    ///
    /// The cursors' next entries sit in a heap as [`Ent`]s (the key read as integers, in the
    /// bytes' order), so each entry costs a few integer comparisons instead of a byte
    /// comparison against every run.
    fn merge(&self, runs: &[Arc<Run>], id: u64) -> Result<Run, DedupError> {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        let mut cursors: Vec<RunCursor<'_>> = runs.iter().map(|r| RunCursor::new(r)).collect();
        let mut error = None;
        let mut heap: BinaryHeap<Reverse<(Ent, usize)>> = BinaryHeap::with_capacity(cursors.len());
        let ordered = |(k, offset): (Key, u64), i: usize| Reverse((ent(&k, offset), i));
        for (i, c) in cursors.iter_mut().enumerate() {
            match c.peek() {
                Ok(Some(e)) => heap.push(ordered(e, i)),
                Ok(None) => {}
                Err(e) => return Err(e),
            }
        }
        let mut live_pid: Option<(u64, Option<u64>)> = None;
        let mut last: Option<Ent> = None;
        let first_live = self.first_live.clone();
        let mut next = || -> Option<(Key, u64)> {
            loop {
                let Reverse((e, i)) = heap.pop()?;
                cursors[i].advance();
                match cursors[i].peek() {
                    Ok(Some(e)) => heap.push(ordered(e, i)),
                    Ok(None) => {}
                    Err(e) => {
                        error = Some(e);
                        return None;
                    }
                }
                if last == Some(e) {
                    continue;
                }
                last = Some(e);
                let (pid, offset) = (e[0], e[3]);
                let first = match live_pid {
                    Some((p, f)) if p == pid => f,
                    _ => {
                        let f = first_live(pid);
                        live_pid = Some((pid, f));
                        f
                    }
                };
                if first.is_some_and(|f| offset >= f) {
                    return Some((key_of(&e), offset));
                }
            }
        };
        let run = Run::write(&self.dir, id, &mut std::iter::from_fn(&mut next))?;
        match error {
            Some(e) => {
                let _ = std::fs::remove_file(&run.path);
                Err(e)
            }
            None => Ok(run),
        }
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
            g.mem.len,
        )
    }

    /// Wait (bounded) for a background merge to end, for tests.
    #[cfg(test)]
    pub(crate) fn settle(&self) {
        for _ in 0..500 {
            if !read(&self.inner).merging {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(pid: u64, i: u64) -> Key {
        let mut k = [0u8; 24];
        k[..8].copy_from_slice(&pid.to_be_bytes());
        let h = crc32fast::hash(&i.to_le_bytes());
        k[8..12].copy_from_slice(&h.to_le_bytes());
        k[12..20].copy_from_slice(&i.to_le_bytes());
        k
    }

    fn all_live() -> FirstLive {
        Arc::new(|_| Some(0))
    }

    /// A run holds exactly the header and the entries, whatever its size against a page, and
    /// reads back in order through a merge's cursor and through lookups after a reopen.
    #[test]
    fn runs_of_any_size_are_written_and_read_back_exactly() {
        let dir = tempfile::tempdir().unwrap();
        for (id, n) in [0u64, 1, 127, 128, 129, 32_767, 70_001]
            .into_iter()
            .enumerate()
        {
            let mut entries: Vec<(Key, u64)> = (0..n).map(|i| (key(i % 3, i), i)).collect();
            entries.sort_unstable();
            let run = Run::write(dir.path(), id as u64, &mut entries.iter().copied()).unwrap();
            let bytes = std::fs::read(&run.path).unwrap();
            let mut want = RUN_MAGIC.to_vec();
            want.extend_from_slice(&n.to_le_bytes());
            for (k, o) in &entries {
                want.extend_from_slice(k);
                want.extend_from_slice(&o.to_be_bytes());
            }
            assert!(
                bytes == want,
                "run of {n} entries: {} bytes, want {}",
                bytes.len(),
                want.len()
            );
            let mut back = Vec::new();
            run.scan(&mut |k, o| back.push((k, o))).unwrap();
            assert_eq!(back, entries, "run of {n} entries scanned");
            let again = Run::open(dir.path(), id as u64).unwrap();
            for (k, o) in entries.iter().step_by(997) {
                let mut out = Vec::new();
                again.lookup(k, &mut out).unwrap();
                assert_eq!(out, vec![*o]);
            }
        }
    }

    /// The table in memory finds every offset of a key, in its sorted chunks and in its
    /// unsorted tail, and hands everything back sorted without repeats.
    #[test]
    fn the_table_in_memory_finds_keys_in_chunks_and_tail() {
        let mut m = MemTable::default();
        let n = MemTable::CHUNK as u64 * 3 + 100;
        for i in 0..n {
            m.insert(&key(i % 5, i / 3), i);
            // A row's offsets are inserted again with each new one.
            if i % 7 == 0 {
                m.insert(&key(i % 5, i / 3), i);
            }
        }
        assert_eq!(m.chunks.len(), 3, "{} chunks", m.chunks.len());
        for i in [0, 1, 2047, 2048, 4100, n - 1] {
            let mut out = Vec::new();
            m.lookup(&key(i % 5, i / 3), &mut out);
            out.sort_unstable();
            out.dedup();
            let want: Vec<u64> = (0..n)
                .filter(|j| key(j % 5, j / 3) == key(i % 5, i / 3))
                .collect();
            assert_eq!(out, want, "offsets of entry {i}");
        }
        let mut none = Vec::new();
        m.lookup(&key(9, 9), &mut none);
        assert!(none.is_empty());
        let all = m.take_sorted();
        assert_eq!(all.len() as u64, n, "every entry once");
        assert!(all.windows(2).all(|w| w[0] < w[1]), "sorted, no repeats");
        assert_eq!(m.len, 0);
        assert!(m.keys().next().is_none());
    }

    #[test]
    fn entries_are_found_in_memory_in_runs_and_after_merges_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let idx = Arc::new(DedupIndex::open(dir.path(), MEM_ENTRIES, all_live()).unwrap());
        let n = (MEM_ENTRIES * (FANOUT + 1) + 77) as u64;
        for i in 0..n {
            idx.insert(key(i % 3, i), i);
            if idx.full() {
                idx.flush((1, i)).unwrap();
            }
        }
        idx.insert(key(1, 1), 999_999);
        idx.settle();
        for i in (0..n).step_by(997) {
            let want: Vec<u64> = if i == 1 { vec![1, 999_999] } else { vec![i] };
            assert_eq!(idx.lookup(&key(i % 3, i)).unwrap(), want, "entry {i}");
        }
        assert!(idx.lookup(&key(0, n + 5)).unwrap().is_empty());
        let (runs, _, _) = idx.stats();
        assert!(runs < FANOUT, "{runs} runs after merges");
        let covered = idx.covered();
        drop(idx);
        let again = DedupIndex::open(dir.path(), MEM_ENTRIES, all_live()).unwrap();
        assert_eq!(again.covered(), covered);
        assert_eq!(again.lookup(&key(2, 5)).unwrap(), vec![5]);
        // What was only in memory is gone: the store replays it from the segment log.
        assert!(again.lookup(&key((n - 1) % 3, n - 1)).unwrap().is_empty());
    }

    #[test]
    fn merges_drop_entries_of_deleted_messages() {
        let dir = tempfile::tempdir().unwrap();
        // Partition 7 keeps offsets from 1000 on; partition 8 is gone.
        let first: FirstLive = Arc::new(|pid| match pid {
            7 => Some(1000),
            8 => None,
            _ => Some(0),
        });
        let idx = Arc::new(DedupIndex::open(dir.path(), MEM_ENTRIES, first).unwrap());
        let mut i = 0u64;
        for _ in 0..FANOUT {
            for _ in 0..MEM_ENTRIES {
                idx.insert(key(7 + i % 3, i), i);
                i += 1;
            }
            idx.flush((1, i)).unwrap();
        }
        idx.settle();
        assert_eq!(idx.stats().0, 1);
        assert!(idx.lookup(&key(7, 999)).unwrap().is_empty());
        assert_eq!(idx.lookup(&key(7, 1002)).unwrap(), vec![1002]);
        assert!(idx.lookup(&key(8, 1000)).unwrap().is_empty());
        assert_eq!(idx.lookup(&key(9, 2)).unwrap(), vec![2]);
    }

    /// A merge yields every live entry of its runs once, in key order: the same key under two
    /// offsets stays twice, an entry written to two runs (a replay after a restart) once.
    #[test]
    fn a_merge_keeps_each_live_entry_once_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let first: FirstLive = Arc::new(|pid| (pid != 5).then_some(0));
        let cap = 64;
        let idx = Arc::new(DedupIndex::open(dir.path(), cap, first).unwrap());
        let mut want = std::collections::BTreeSet::new();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for run in 0..FANOUT as u64 {
            for j in 0..cap as u64 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Partitions 1 to 6 (5 is deleted), keys that repeat across runs, and some
                // entries written again under the same offset.
                let pid = 1 + x % 6;
                let k = key(pid, x % 97);
                let offset = if j % 5 == 0 { x % 97 } else { run * 1000 + j };
                idx.insert(k, offset);
                if pid != 5 {
                    want.insert((k, offset));
                }
            }
            idx.flush((1, run)).unwrap();
        }
        idx.settle();
        assert_eq!(idx.stats().0, 1, "the eight runs merged into one");
        let mut got = Vec::new();
        let runs = read(&idx.inner).runs.clone();
        runs[0].scan(&mut |k, o| got.push((k, o))).unwrap();
        assert_eq!(got, want.into_iter().collect::<Vec<_>>());
    }

    #[test]
    fn a_damaged_manifest_or_run_is_an_error_not_a_silent_empty_index() {
        let dir = tempfile::tempdir().unwrap();
        let idx = Arc::new(DedupIndex::open(dir.path(), MEM_ENTRIES, all_live()).unwrap());
        idx.insert(key(1, 1), 1);
        idx.flush((1, 100)).unwrap();
        drop(idx);
        std::fs::write(dir.path().join(MANIFEST), b"garbage").unwrap();
        assert!(DedupIndex::open(dir.path(), MEM_ENTRIES, all_live()).is_err());
    }
}
