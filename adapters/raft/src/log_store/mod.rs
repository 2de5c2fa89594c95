//! The raft log store: a small segmented append-only log under `dir/log`, behind openraft's
//! `RaftLogStorage` and `RaftLogReader`.
//!
//! Why our own log and not the `raft-log` crate: the requirements (count every fdatasync, one
//! fdatasync per group of appends, completions in submission order, vote ordered with appends,
//! `last_purged` durable before any delete) are each a few lines here and directly testable,
//! while raft-log would need its sync path instrumented from outside and its caches tuned. The
//! format is deliberately simple (see `record.rs`):
//!
//! - One ordered stream of records (entries, vote, committed, purge, truncate) split into segment
//!   files `<seq>.seg`. Each segment starts with a header carrying the vote, `committed` and
//!   `last_purged` in force, so older segments can be deleted whole.
//! - `append` writes the records (readable at once) and queues a flush; the flusher thread
//!   (`flusher.rs`) covers everything queued with one fdatasync and completes in order.
//! - `save_vote` writes a vote record and waits for the flush: durable, and ordered after every
//!   earlier append because it is later in the same stream.
//! - `save_committed` and `truncate_after` write a record without waiting; the next flush covers
//!   them. A lost truncate only brings back entries that were never acknowledged as replaced.
//! - `purge` writes a purge record, waits until it is durable, then deletes the whole segments
//!   below it and fsyncs the directory.
//! - On open, every segment is scanned; a torn tail of the last segment (cut short or bad
//!   checksum) is cut off; damage anywhere else is reported as corruption. Then a fresh segment
//!   is started, so the recovered files are never written again.
//! - The index (log index -> segment, offset) is kept in memory: one small record per live entry,
//!   bounded by the snapshot policy.
//!
//! Writes and the rare segment roll run inline in the caller (page-cache writes, fast); only
//! fdatasync is moved to the flusher. A lock file keeps a second process off the directory.

mod flusher;
mod record;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::collections::VecDeque;
use std::fmt::Debug;
use std::fs::File;
use std::fs::OpenOptions;
use std::io;
use std::io::BufReader;
use std::ops::Bound;
use std::ops::RangeBounds;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::MutexGuard;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::sync::mpsc;

use openraft::OptionalSend;
use openraft::RaftLogReader;
use openraft::entry::RaftEntry;
use openraft::storage::RaftLogStorage;

use self::flusher::Completion;
use self::flusher::FlushRequest;
use self::flusher::FlushStats;
use self::record::FORMAT_VERSION;
use self::record::Record;
use self::record::ScanItem;
use self::record::SegmentHeader;
use crate::type_config::Entry;
use crate::type_config::IOFlushed;
use crate::type_config::LogId;
use crate::type_config::LogState;
use crate::type_config::TypeConfig;
use crate::type_config::Vote;

/// File name suffix of segment files.
const SEGMENT_SUFFIX: &str = ".seg";
/// Name of the lock file that keeps a second process off the log directory.
const LOCK_FILE: &str = "LOCK";
/// Subdirectory of segments purged from the log that the state machine still keeps messages
/// in (see [`LogFiles`]). The log never scans them: they are not part of its state any more.
const ARCHIVE_DIR: &str = "archive";
/// Most archived segments kept open for reads at once.
const ARCHIVE_HANDLES: usize = 32;
/// Largest span read with one pread when serving a range of entries.
const MAX_READ_SPAN: u64 = 8 * 1024 * 1024;

/// Tuning of the log store.
#[derive(Debug, Clone)]
pub(crate) struct LogStoreOptions {
    /// A segment is rolled once it holds at least this many bytes; purge deletes whole segments.
    pub(crate) segment_max_bytes: u64,
    /// Most flush requests covered by one fdatasync.
    pub(crate) flush_batch_max: usize,
    /// Bytes of commands of the latest entries kept in memory, so that replication and apply,
    /// which read what was just appended, take them from there instead of reading the segment
    /// back and decoding it again.
    pub(crate) cache_max_bytes: usize,
}

impl Default for LogStoreOptions {
    fn default() -> Self {
        Self {
            segment_max_bytes: 64 * 1024 * 1024,
            flush_batch_max: 4096,
            cache_max_bytes: 4 * 1024 * 1024,
        }
    }
}

/// The raft log store. openraft owns one; readers share its state.
pub(crate) struct LogStore {
    /// State shared with readers.
    shared: Arc<Shared>,
}

/// A log reader handed to openraft's replication and apply tasks.
pub(crate) struct LogReader {
    /// State shared with the store.
    shared: Arc<Shared>,
}

/// Tells whether a log store (or any of its readers) is still alive.
#[derive(Clone)]
pub(crate) struct LogLiveness(Arc<AtomicBool>);

impl LogLiveness {
    /// True once the store and every reader were dropped and the directory lock was released,
    /// so the directory may be reopened. (The Arc's strong count alone is not enough: it drops
    /// to zero before the lock file is closed.)
    pub(crate) fn is_released(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// The locked lock file of a log directory. Dropping it unlocks, then reports the release.
struct DirLock {
    /// The locked file.
    file: File,
    /// Set once the lock is released.
    released: Arc<AtomicBool>,
}

impl Drop for DirLock {
    fn drop(&mut self) {
        let _ = self.file.unlock();
        self.released.store(true, Ordering::Release);
    }
}

/// Where one live entry lives on disk.
#[derive(Debug, Clone)]
struct EntryLoc {
    /// The entry's log id, so log state and ids are answered without disk reads.
    log_id: LogId,
    /// Segment sequence number.
    seq: u64,
    /// Offset of the frame in the segment.
    offset: u64,
    /// Length of the frame.
    len: u32,
}

/// One segment file.
struct Segment {
    /// Path, for deletion.
    path: PathBuf,
    /// Open handle used for writes (active segment), preads and syncs.
    file: Arc<File>,
    /// Bytes written so far (the next write offset).
    size: u64,
    /// Highest entry index ever written into it; it may be deleted once purged past this.
    max_entry_index: Option<u64>,
}

/// The mutable state of the log, behind one mutex.
struct LogInner {
    /// The latest vote.
    vote: Option<Vote>,
    /// The latest committed log id saved by openraft.
    committed: Option<LogId>,
    /// Entries up to here are gone.
    last_purged: Option<LogId>,
    /// Live entries, contiguous and ascending.
    entries: VecDeque<EntryLoc>,
    /// Segments by sequence number; the last one is active.
    segments: BTreeMap<u64, Segment>,
    /// Queue to the flusher. Sent under the lock, so flushes are queued in write order.
    flush_tx: mpsc::Sender<FlushRequest>,
    /// The latest live entries (a suffix of `entries`, contiguous), sharing their command
    /// buffers with what was written.
    cache: VecDeque<Entry>,
    /// Command bytes held by `cache`.
    cache_bytes: usize,
    /// Bound of `cache_bytes`.
    cache_max_bytes: usize,
    /// Segments the state machine keeps messages in: a purge moves them to `archive/` instead
    /// of deleting them.
    holds: std::collections::HashSet<u64>,
    /// Segments in `archive/`, with an open handle for the few read last.
    archived: BTreeMap<u64, Option<Arc<File>>>,
}

/// State shared by the store and its readers.
struct Shared {
    /// The log directory.
    dir: PathBuf,
    /// Tuning.
    opts: LogStoreOptions,
    /// The log state.
    inner: Mutex<LogInner>,
    /// fsync counter and poison flag, shared with the flusher.
    stats: FlushStats,
    /// Held (and locked) for the life of the store.
    dir_lock: DirLock,
}

impl LogStore {
    /// Open (or create) the log in `dir`, recover it, and start its flusher thread.
    ///
    /// Blocking: call it from a blocking context.
    pub(crate) fn open(dir: &Path, opts: LogStoreOptions) -> io::Result<LogStore> {
        let stats = FlushStats {
            fsyncs: Arc::new(AtomicU64::new(0)),
            poisoned: Arc::new(AtomicBool::new(false)),
        };
        let created = !dir.exists();
        std::fs::create_dir_all(dir)?;
        if created {
            stats.sync_dir(dir)?;
            if let Some(parent) = dir.parent() {
                stats.sync_dir(parent)?;
            }
        }
        let lock = File::create(dir.join(LOCK_FILE))?;
        lock.try_lock().map_err(|e| {
            io::Error::new(
                io::ErrorKind::WouldBlock,
                format!("raft log directory {} is in use: {e}", dir.display()),
            )
        })?;

        let (flush_tx, flush_rx) = mpsc::channel();
        let mut inner = LogInner {
            vote: None,
            committed: None,
            last_purged: None,
            entries: VecDeque::new(),
            segments: BTreeMap::new(),
            flush_tx,
            cache: VecDeque::new(),
            cache_bytes: 0,
            cache_max_bytes: opts.cache_max_bytes,
            holds: std::collections::HashSet::new(),
            archived: BTreeMap::new(),
        };
        recover(dir, &mut inner, &stats)?;
        inner.archived = list_archive(dir, &stats)?;
        let next_seq = inner.segments.keys().next_back().map_or(1, |s| s + 1);
        inner.start_segment(dir, next_seq, &stats)?;

        let thread_stats = stats.clone();
        let max_batch = opts.flush_batch_max.max(1);
        std::thread::Builder::new()
            .name("raft-log-flush".into())
            .spawn(move || flusher::run(flush_rx, thread_stats, max_batch))?;

        tracing::info!(
            dir = %dir.display(),
            segments = inner.segments.len(),
            entries = inner.entries.len(),
            last_purged = ?inner.last_purged,
            "raft log opened"
        );
        Ok(LogStore {
            shared: Arc::new(Shared {
                dir: dir.to_path_buf(),
                opts,
                inner: Mutex::new(inner),
                stats,
                dir_lock: DirLock {
                    file: lock,
                    released: Arc::new(AtomicBool::new(false)),
                },
            }),
        })
    }

    /// The counter of fdatasync/fsync calls made by this store.
    pub(crate) fn fsync_counter(&self) -> Arc<AtomicU64> {
        self.shared.stats.fsyncs.clone()
    }

    /// A handle that tells when the store and all its readers are gone (directory lock released).
    pub(crate) fn liveness(&self) -> LogLiveness {
        LogLiveness(self.shared.dir_lock.released.clone())
    }

    /// Write `records` and queue a flush that completes `completion`.
    fn write_and_flush(&self, records: Vec<Record>, completion: Completion) -> io::Result<()> {
        let mut inner = self.shared.lock()?;
        self.shared.check_poison()?;
        inner.write(&self.shared, &records)?;
        inner.queue_flush(completion)
    }

    /// Write `records` and wait until they are durable.
    async fn write_durable(&self, records: Vec<Record>) -> io::Result<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.write_and_flush(records, Completion::Waiter(tx))?;
        rx.await
            .map_err(|_| io::Error::other("raft log flusher stopped"))?
    }
}

impl Shared {
    fn lock(&self) -> io::Result<MutexGuard<'_, LogInner>> {
        self.inner
            .lock()
            .map_err(|_| io::Error::other("raft log state lock poisoned"))
    }

    fn check_poison(&self) -> io::Result<()> {
        if self.stats.poisoned.load(Ordering::Acquire) {
            return Err(io::Error::other(
                "raft log is poisoned by an earlier failed fdatasync",
            ));
        }
        Ok(())
    }

    /// Read entries with index in `[start, end)` that exist: the latest from the cache, older
    /// ones from their segments.
    fn read_range(&self, start: u64, end: u64) -> io::Result<Vec<Entry>> {
        let (locs, cached): (Vec<(EntryLoc, Arc<File>)>, Vec<Entry>) = {
            let inner = self.lock()?;
            let Some(first) = inner.entries.front().map(|l| l.log_id.index) else {
                return Ok(Vec::new());
            };
            let from = start.max(first);
            if from >= end {
                return Ok(Vec::new());
            }
            let cache_first = inner.cache.front().map_or(u64::MAX, |e| e.log_id.index);
            let cached: Vec<Entry> = if end > cache_first {
                let skip = from.saturating_sub(cache_first) as usize;
                let take = (end - cache_first.max(from)) as usize;
                inner.cache.iter().skip(skip).take(take).cloned().collect()
            } else {
                Vec::new()
            };
            let disk_end = end.min(cache_first);
            let mut out = Vec::new();
            let mut idx = from;
            while idx < disk_end {
                let Some(loc) = inner.entries.get((idx - first) as usize) else {
                    break;
                };
                let file = inner
                    .segments
                    .get(&loc.seq)
                    .map(|s| s.file.clone())
                    .ok_or_else(|| {
                        io::Error::other("raft log index points at a missing segment")
                    })?;
                out.push((loc.clone(), file));
                idx += 1;
            }
            (out, cached)
        };

        let mut entries = Vec::with_capacity(locs.len());
        let mut i = 0;
        while i < locs.len() {
            // Group consecutive locations in one segment into one pread.
            let (head, file) = &locs[i];
            let mut j = i + 1;
            let mut span_end = head.offset + u64::from(head.len);
            while j < locs.len()
                && locs[j].0.seq == head.seq
                && locs[j].0.offset >= span_end
                && locs[j].0.offset + u64::from(locs[j].0.len) - head.offset <= MAX_READ_SPAN
            {
                span_end = locs[j].0.offset + u64::from(locs[j].0.len);
                j += 1;
            }
            let mut buf = vec![0u8; (span_end - head.offset) as usize];
            file.read_exact_at(&mut buf, head.offset)?;
            for (loc, _) in &locs[i..j] {
                let from = (loc.offset - head.offset) as usize;
                let frame = &buf[from..from + loc.len as usize];
                match record::decode_frame(frame)? {
                    Record::Entry(e) if e.log_id == loc.log_id => entries.push(e),
                    _ => {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("raft log index does not match the record at {}", loc.log_id),
                        ));
                    }
                }
            }
            i = j;
        }
        entries.extend(cached);
        Ok(entries)
    }
}

impl LogInner {
    fn last_log_id(&self) -> Option<LogId> {
        self.entries.back().map(|l| l.log_id).or(self.last_purged)
    }

    fn active_seq(&self) -> io::Result<u64> {
        self.segments
            .keys()
            .next_back()
            .copied()
            .ok_or_else(|| io::Error::other("raft log has no active segment"))
    }

    fn header(&self) -> SegmentHeader {
        SegmentHeader {
            format: FORMAT_VERSION,
            vote: self.vote,
            committed: self.committed,
            last_purged: self.last_purged,
        }
    }

    /// Create segment `seq`, write its header and make the new file visible in the directory.
    fn start_segment(&mut self, dir: &Path, seq: u64, stats: &FlushStats) -> io::Result<()> {
        let path = dir.join(segment_name(seq));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        let mut buf = Vec::new();
        record::encode_into(&mut buf, &Record::Header(self.header()))?;
        file.write_all_at(&buf, 0)?;
        stats.sync_dir(dir)?;
        self.segments.insert(
            seq,
            Segment {
                path,
                file: Arc::new(file),
                size: buf.len() as u64,
                max_entry_index: None,
            },
        );
        Ok(())
    }

    /// Check that `records` keep the log contiguous, then write them to the active segment and
    /// apply them to the in-memory state.
    fn write(&mut self, shared: &Shared, records: &[Record]) -> io::Result<()> {
        self.check_contiguous(records)?;

        let active = self.active_seq()?;
        let needs_roll = self
            .segments
            .get(&active)
            .is_some_and(|s| s.size >= shared.opts.segment_max_bytes);
        if needs_roll {
            self.roll(shared)?;
        }
        let seq = self.active_seq()?;

        let mut buf = Vec::with_capacity(records.iter().map(record::encoded_len_hint).sum());
        let mut lens = Vec::with_capacity(records.len());
        for r in records {
            lens.push(record::encode_into(&mut buf, r)?);
        }
        let segment = self
            .segments
            .get_mut(&seq)
            .ok_or_else(|| io::Error::other("raft log has no active segment"))?;
        let base = segment.size;
        if let Err(e) = segment.file.write_all_at(&buf, base) {
            // A partial write leaves garbage that later records would follow; refuse to go on.
            shared.stats.poisoned.store(true, Ordering::Release);
            return Err(e);
        }
        segment.size += buf.len() as u64;

        let mut offset = base;
        for (r, len) in records.iter().zip(lens) {
            self.apply(r, seq, offset, len)?;
            offset += u64::from(len);
        }
        Ok(())
    }

    /// Sync the active segment and start the next one.
    fn roll(&mut self, shared: &Shared) -> io::Result<()> {
        let active = self.active_seq()?;
        if let Some(seg) = self.segments.get(&active) {
            shared.stats.sync_data(&seg.file)?;
        }
        self.start_segment(&shared.dir, active + 1, &shared.stats)?;
        tracing::debug!(seq = active + 1, "raft log segment rolled");
        Ok(())
    }

    fn check_contiguous(&self, records: &[Record]) -> io::Result<()> {
        let mut next = self.last_log_id().map(|l| l.index + 1);
        for r in records {
            if let Record::Entry(e) = r {
                let idx = e.index();
                if let Some(n) = next
                    && idx != n
                {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "append of index {idx} would leave a hole or overwrite; expected {n}"
                        ),
                    ));
                }
                next = Some(idx + 1);
            }
        }
        Ok(())
    }

    /// Apply one record (written or replayed) to the in-memory state.
    fn apply(&mut self, record: &Record, seq: u64, offset: u64, len: u32) -> io::Result<()> {
        match record {
            Record::Header(_) => {}
            Record::Entry(e) => {
                let log_id = e.log_id;
                let idx = log_id.index;
                if let Some(back) = self.entries.back().map(|l| l.log_id.index) {
                    if idx <= back {
                        self.truncate_from(idx);
                    } else if idx != back + 1 {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("raft log has a hole before index {idx}"),
                        ));
                    }
                } else if let Some(p) = self.last_purged {
                    if idx <= p.index {
                        // Left behind in a segment that is not yet deleted.
                        return Ok(());
                    }
                    if idx != p.index + 1 {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("raft log has a hole before index {idx}"),
                        ));
                    }
                }
                self.entries.push_back(EntryLoc {
                    log_id,
                    seq,
                    offset,
                    len,
                });
                self.cache_push(e);
                if let Some(seg) = self.segments.get_mut(&seq) {
                    seg.max_entry_index = Some(seg.max_entry_index.map_or(idx, |m| m.max(idx)));
                }
            }
            Record::Vote(v) => self.vote = Some(*v),
            Record::Committed(c) => self.committed = *c,
            Record::Purged(log_id) => {
                if self.last_purged.is_none_or(|p| p.index < log_id.index) {
                    self.last_purged = Some(*log_id);
                }
                while self
                    .entries
                    .front()
                    .is_some_and(|l| l.log_id.index <= log_id.index)
                {
                    self.entries.pop_front();
                }
                while self
                    .cache
                    .front()
                    .is_some_and(|e| e.log_id.index <= log_id.index)
                {
                    self.cache_pop_front();
                }
            }
            Record::TruncateAfter(after) => match after {
                Some(a) => self.truncate_from(a.index + 1),
                None => {
                    self.entries.clear();
                    self.cache.clear();
                    self.cache_bytes = 0;
                }
            },
        }
        Ok(())
    }

    /// Drop entries with index >= `idx`.
    fn truncate_from(&mut self, idx: u64) {
        while self.entries.back().is_some_and(|l| l.log_id.index >= idx) {
            self.entries.pop_back();
        }
        while self.cache.back().is_some_and(|e| e.log_id.index >= idx) {
            if let Some(e) = self.cache.pop_back() {
                self.cache_bytes -= cached_size(&e);
            }
        }
    }

    /// Keep `e`, just appended after every cached entry, in the cache; drop the oldest cached
    /// entries past the byte bound (one entry larger than the bound is not kept).
    fn cache_push(&mut self, e: &Entry) {
        if self
            .cache
            .back()
            .is_some_and(|b| b.log_id.index + 1 != e.log_id.index)
        {
            // Not contiguous (cannot happen after the checks above): start over.
            self.cache.clear();
            self.cache_bytes = 0;
        }
        self.cache_bytes += cached_size(e);
        self.cache.push_back(e.clone());
        while self.cache_bytes > self.cache_max_bytes && !self.cache.is_empty() {
            self.cache_pop_front();
        }
    }

    fn cache_pop_front(&mut self) {
        if let Some(e) = self.cache.pop_front() {
            self.cache_bytes -= cached_size(&e);
        }
    }

    fn queue_flush(&self, completion: Completion) -> io::Result<()> {
        let active = self.active_seq()?;
        let file = self
            .segments
            .get(&active)
            .map(|s| s.file.clone())
            .ok_or_else(|| io::Error::other("raft log has no active segment"))?;
        self.flush_tx
            .send(FlushRequest { file, completion })
            .map_err(|_| io::Error::other("raft log flusher stopped"))
    }

    /// Remove the segments (oldest first, never the active one) whose entries are all purged.
    fn take_purgeable_segments(&mut self) -> Vec<(u64, PathBuf)> {
        let Some(purged) = self.last_purged.map(|p| p.index) else {
            return Vec::new();
        };
        let Some(active) = self.segments.keys().next_back().copied() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        while let Some((&seq, seg)) = self.segments.iter().next() {
            if seq == active || seg.max_entry_index.is_some_and(|m| m > purged) {
                break;
            }
            if let Some(seg) = self.segments.remove(&seq) {
                out.push((seq, seg.path));
            }
        }
        out
    }
}

/// What a cached entry counts against the cache's bound: its command's bytes and a fixed
/// overhead for the rest.
fn cached_size(e: &Entry) -> usize {
    let payload = match &e.payload {
        openraft::EntryPayload::Normal(c) => c.0.len(),
        _ => 0,
    };
    payload + 64
}

fn segment_name(seq: u64) -> String {
    format!("{seq:020}{SEGMENT_SUFFIX}")
}

/// Scan every segment in order and rebuild the state; cut a torn tail off the last segment.
fn recover(dir: &Path, inner: &mut LogInner, stats: &FlushStats) -> io::Result<()> {
    let seqs = segment_seqs(dir)?;

    let mut first = true;
    for (i, &seq) in seqs.iter().enumerate() {
        let is_last = i + 1 == seqs.len();
        let path = dir.join(segment_name(seq));
        let file = OpenOptions::new().read(true).write(true).open(&path)?;
        let file_len = file.metadata()?.len();
        inner.segments.insert(
            seq,
            Segment {
                path: path.clone(),
                file: Arc::new(file.try_clone()?),
                size: file_len,
                max_entry_index: None,
            },
        );

        let mut reader = BufReader::with_capacity(1024 * 1024, file);
        let mut offset = 0u64;
        let mut saw_header = false;
        loop {
            match record::scan_next(&mut reader)? {
                ScanItem::End => break,
                ScanItem::Record(rec, len) => {
                    if !saw_header {
                        let Record::Header(h) = &rec else {
                            return Err(io::Error::new(
                                io::ErrorKind::InvalidData,
                                format!(
                                    "raft log segment {} does not start with a header",
                                    path.display()
                                ),
                            ));
                        };
                        if h.format != FORMAT_VERSION {
                            return Err(io::Error::new(
                                io::ErrorKind::InvalidData,
                                format!("raft log format {} is not supported", h.format),
                            ));
                        }
                        if first {
                            inner.vote = h.vote;
                            inner.committed = h.committed;
                            inner.last_purged = h.last_purged;
                            first = false;
                        }
                        saw_header = true;
                    }
                    inner.apply(&rec, seq, offset, len)?;
                    offset += u64::from(len);
                }
                ScanItem::Torn(why) => {
                    if !is_last {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!(
                                "raft log segment {} is corrupt at offset {offset}: {why}",
                                path.display()
                            ),
                        ));
                    }
                    tracing::warn!(
                        segment = %path.display(),
                        offset,
                        dropped_bytes = file_len - offset,
                        reason = why,
                        "cutting torn tail off the raft log"
                    );
                    let seg = inner
                        .segments
                        .get_mut(&seq)
                        .ok_or_else(|| io::Error::other("raft log segment vanished"))?;
                    seg.file.set_len(offset)?;
                    stats.sync_data(&seg.file)?;
                    seg.size = offset;
                    break;
                }
            }
        }

        if !saw_header {
            // Only the newest segment can be headerless: its creation was cut short.
            if !is_last {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("raft log segment {} has no header", path.display()),
                ));
            }
            inner.segments.remove(&seq);
            std::fs::remove_file(&path)?;
            stats.sync_dir(dir)?;
            tracing::warn!(segment = %path.display(), "removed a raft log segment whose creation was cut short");
        }
    }
    Ok(())
}

/// The segments in `archive/` (creating the directory on first use).
fn list_archive(dir: &Path, stats: &FlushStats) -> io::Result<BTreeMap<u64, Option<Arc<File>>>> {
    let archive = dir.join(ARCHIVE_DIR);
    if !archive.exists() {
        std::fs::create_dir(&archive)?;
        stats.sync_dir(dir)?;
    }
    Ok(segment_seqs(&archive)?
        .into_iter()
        .map(|seq| (seq, None))
        .collect())
}

/// The sequence numbers of the segment files in `dir`, ascending; a `.seg` file whose name is
/// not a number is left alone, with a warning.
fn segment_seqs(dir: &Path) -> io::Result<Vec<u64>> {
    let mut seqs = Vec::new();
    for dent in std::fs::read_dir(dir)? {
        let dent = dent?;
        let name = dent.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(stem) = name.strip_suffix(SEGMENT_SUFFIX) else {
            continue;
        };
        match stem.parse::<u64>() {
            Ok(seq) => seqs.push(seq),
            Err(_) => tracing::warn!(
                file = name,
                dir = %dir.display(),
                "ignoring unexpected file in raft log directory"
            ),
        }
    }
    seqs.sort_unstable();
    Ok(seqs)
}

/// The log's files as the state machine reads them (`queen_ports::LogFiles`): where each entry's
/// command bytes were written, those bytes, and holds on segments past their purge.
///
/// It does not keep the log alive: once the store and its readers are gone, reads fail.
#[derive(Clone)]
pub(crate) struct LogFiles {
    /// The log's shared state.
    shared: std::sync::Weak<Shared>,
}

impl LogStore {
    /// A handle on the log's files for the state machine.
    pub(crate) fn files(&self) -> LogFiles {
        LogFiles {
            shared: Arc::downgrade(&self.shared),
        }
    }
}

impl LogFiles {
    fn shared(&self) -> io::Result<Arc<Shared>> {
        self.shared
            .upgrade()
            .ok_or_else(|| io::Error::other("the raft log is closed"))
    }

    /// Where the command bytes of live entry `index` are: the last `command_len` bytes of its
    /// record (a record ends with the command, see `record.rs`).
    pub(crate) fn command_span(
        &self,
        index: u64,
        command_len: usize,
    ) -> Option<queen_ports::LogSpan> {
        let shared = self.shared().ok()?;
        let inner = shared.lock().ok()?;
        let first = inner.entries.front()?.log_id.index;
        let loc = inner
            .entries
            .get(usize::try_from(index.checked_sub(first)?).ok()?)?;
        let len = u32::try_from(command_len).ok()?;
        (loc.log_id.index == index && len <= loc.len).then(|| queen_ports::LogSpan {
            file: loc.seq,
            pos: loc.offset + u64::from(loc.len - len),
            len,
        })
    }

    /// The open file of segment `seq`, live or archived.
    fn file(&self, shared: &Shared, seq: u64) -> io::Result<Arc<File>> {
        let mut inner = shared.lock()?;
        if let Some(seg) = inner.segments.get(&seq) {
            return Ok(seg.file.clone());
        }
        match inner.archived.get(&seq) {
            None => Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("raft log segment {seq} is gone"),
            )),
            Some(Some(f)) => Ok(f.clone()),
            Some(None) => {
                let f = Arc::new(File::open(
                    shared.dir.join(ARCHIVE_DIR).join(segment_name(seq)),
                )?);
                let open = inner.archived.values().filter(|h| h.is_some()).count();
                if open >= ARCHIVE_HANDLES {
                    for h in inner.archived.values_mut() {
                        *h = None;
                    }
                }
                inner.archived.insert(seq, Some(f.clone()));
                Ok(f)
            }
        }
    }

    /// Delete the archived segments in `seqs` (already out of `holds`).
    fn delete_archived(shared: &Shared, inner: &mut LogInner, seqs: &[u64]) -> io::Result<()> {
        let archive = shared.dir.join(ARCHIVE_DIR);
        let mut any = false;
        for seq in seqs {
            if inner.archived.remove(seq).is_some() {
                std::fs::remove_file(archive.join(segment_name(*seq)))?;
                any = true;
            }
        }
        if any {
            shared.stats.sync_dir(&archive)?;
        }
        Ok(())
    }
}

fn files_err(e: io::Error) -> queen_ports::BackendError {
    queen_ports::BackendError::Storage(format!("raft log files: {e}"))
}

impl queen_ports::LogFiles for LogFiles {
    fn read(&self, span: queen_ports::LogSpan) -> Result<Vec<u8>, queen_ports::BackendError> {
        let shared = self.shared().map_err(files_err)?;
        let file = self.file(&shared, span.file).map_err(files_err)?;
        let mut buf = vec![0u8; span.len as usize];
        file.read_exact_at(&mut buf, span.pos).map_err(files_err)?;
        Ok(buf)
    }

    fn hold(&self, file: u64) {
        if let Ok(shared) = self.shared()
            && let Ok(mut inner) = shared.lock()
        {
            inner.holds.insert(file);
        }
    }

    fn release(&self, file: u64) -> Result<(), queen_ports::BackendError> {
        let shared = self.shared().map_err(files_err)?;
        let mut inner = shared.lock().map_err(files_err)?;
        inner.holds.remove(&file);
        Self::delete_archived(&shared, &mut inner, &[file]).map_err(files_err)
    }

    fn set_holds(&self, files: &[u64]) -> Result<(), queen_ports::BackendError> {
        let shared = self.shared().map_err(files_err)?;
        let mut inner = shared.lock().map_err(files_err)?;
        inner.holds = files.iter().copied().collect();
        let stale: Vec<u64> = inner
            .archived
            .keys()
            .copied()
            .filter(|seq| !inner.holds.contains(seq))
            .collect();
        Self::delete_archived(&shared, &mut inner, &stale).map_err(files_err)
    }
}

/// The store and its readers are both handles on `Shared`, and read the log the same way.
macro_rules! read_the_shared_log {
    ($($handle:ty),+) => {$(
        impl RaftLogReader<TypeConfig> for $handle {
            async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
                &mut self,
                range: RB,
            ) -> Result<Vec<Entry>, io::Error> {
                let (start, end) = bounds(&range);
                self.shared.read_range(start, end)
            }

            async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
                Ok(self.shared.lock()?.vote)
            }
        }
    )+};
}
read_the_shared_log!(LogReader, LogStore);

/// `[start, end)` of a range of log indexes.
fn bounds(range: &impl RangeBounds<u64>) -> (u64, u64) {
    let start = match range.start_bound() {
        Bound::Included(s) => *s,
        Bound::Excluded(s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(e) => e.saturating_add(1),
        Bound::Excluded(e) => *e,
        Bound::Unbounded => u64::MAX,
    };
    (start, end)
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> Result<LogState, io::Error> {
        let inner = self.shared.lock()?;
        Ok(LogState {
            last_purged_log_id: inner.last_purged,
            last_log_id: inner.last_log_id(),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        LogReader {
            shared: self.shared.clone(),
        }
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        self.write_durable(vec![Record::Vote(*vote)]).await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        let mut inner = self.shared.lock()?;
        self.shared.check_poison()?;
        inner.write(&self.shared, &[Record::Committed(committed)])
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        Ok(self.shared.lock()?.committed)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let records: Vec<Record> = entries.into_iter().map(Record::Entry).collect();
        self.write_and_flush(records, Completion::Log(callback))
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        tracing::debug!(after = ?last_log_id, "raft log truncate");
        let mut inner = self.shared.lock()?;
        self.shared.check_poison()?;
        inner.write(&self.shared, &[Record::TruncateAfter(last_log_id)])
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        tracing::debug!(upto = %log_id, "raft log purge");
        // last_purged must be durable before any file goes away.
        self.write_durable(vec![Record::Purged(log_id)]).await?;
        // Under the lock, so that a hold or release cannot fall between the decision and the
        // move: a held segment goes to the archive, any other is deleted.
        let mut inner = self.shared.lock()?;
        let victims = inner.take_purgeable_segments();
        if victims.is_empty() {
            return Ok(());
        }
        let archive = self.shared.dir.join(ARCHIVE_DIR);
        let mut archived = 0;
        for (seq, path) in &victims {
            if inner.holds.contains(seq) {
                std::fs::rename(path, archive.join(segment_name(*seq)))?;
                inner.archived.insert(*seq, None);
                archived += 1;
            } else {
                std::fs::remove_file(path)?;
            }
        }
        drop(inner);
        if archived > 0 {
            self.shared.stats.sync_dir(&archive)?;
        }
        self.shared.stats.sync_dir(&self.shared.dir)?;
        tracing::debug!(
            segments = victims.len(),
            archived,
            "raft log segments purged"
        );
        Ok(())
    }
}
