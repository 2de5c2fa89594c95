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

mod advice;
mod files;
mod flusher;
mod inner;
mod record;
mod recover;
mod storage;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::collections::VecDeque;
use std::fmt::Debug;
use std::fs::File;
use std::io;
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

use self::flusher::Completion;
use self::flusher::FlushRequest;
use self::flusher::FlushStats;
use self::record::Record;
use self::recover::list_archive;
use self::recover::recover;
use crate::type_config::Entry;
use crate::type_config::LogId;
use crate::type_config::TypeConfig;
use crate::type_config::Vote;

/// File name suffix of segment files.
const SEGMENT_SUFFIX: &str = ".seg";

/// The file name of segment `seq`: zero-padded, so names sort in log order.
fn segment_name(seq: u64) -> String {
    format!("{seq:020}{SEGMENT_SUFFIX}")
}
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
    /// Flush in the writer's own call instead of on the flusher thread (the deterministic
    /// simulation runs everything on one thread; never set in the product).
    pub(crate) inline_flush: bool,
}

impl Default for LogStoreOptions {
    fn default() -> Self {
        Self {
            segment_max_bytes: 64 * 1024 * 1024,
            flush_batch_max: 4096,
            cache_max_bytes: 4 * 1024 * 1024,
            inline_flush: false,
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
    /// With `inline_flush`: the flusher's queue, drained by the writer right after it queues.
    inline_rx: Option<(mpsc::Receiver<FlushRequest>, FlushStats)>,
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
    /// Windows of dropped segments a reader asked the kernel to read ahead.
    read_ahead: advice::ReadAhead,
}

impl LogInner {
    /// The sequence number of the active segment, the last one.
    fn active_seq(&self) -> io::Result<u64> {
        self.segments
            .keys()
            .next_back()
            .copied()
            .ok_or_else(|| io::Error::other("raft log has no active segment"))
    }
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
            inline_rx: None,
            cache: VecDeque::new(),
            cache_bytes: 0,
            cache_max_bytes: opts.cache_max_bytes,
            holds: std::collections::HashSet::new(),
            archived: BTreeMap::new(),
            read_ahead: advice::ReadAhead::default(),
        };
        recover(dir, &mut inner, &stats)?;
        inner.archived = list_archive(dir, &stats)?;
        let next_seq = inner.segments.keys().next_back().map_or(1, |s| s + 1);
        inner.start_segment(dir, next_seq, &stats)?;

        let thread_stats = stats.clone();
        let max_batch = opts.flush_batch_max.max(1);
        if opts.inline_flush {
            inner.inline_rx = Some((flush_rx, thread_stats));
        } else {
            std::thread::Builder::new()
                .name("raft-log-flush".into())
                .spawn(move || flusher::run(flush_rx, thread_stats, max_batch))?;
        }

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
