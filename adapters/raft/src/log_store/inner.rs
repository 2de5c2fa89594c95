//! The log's in-memory state under its lock (`LogInner`): appending records, rolling segments,
//! reading entries back, truncating and purging.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use openraft::entry::RaftEntry;

use super::flusher::Completion;
use super::flusher::FlushRequest;
use super::flusher::FlushStats;
use super::record::FORMAT_VERSION;
use super::record::Record;
use super::record::SegmentHeader;
use super::{EntryLoc, LogInner, Segment, Shared, record, segment_name};
use crate::type_config::Entry;
use crate::type_config::LogId;

impl LogInner {
    pub(super) fn last_log_id(&self) -> Option<LogId> {
        self.entries.back().map(|l| l.log_id).or(self.last_purged)
    }

    pub(super) fn header(&self) -> SegmentHeader {
        SegmentHeader {
            format: FORMAT_VERSION,
            vote: self.vote,
            committed: self.committed,
            last_purged: self.last_purged,
        }
    }

    /// Create segment `seq`, write its header and make the new file visible in the directory.
    pub(super) fn start_segment(
        &mut self,
        dir: &Path,
        seq: u64,
        stats: &FlushStats,
    ) -> io::Result<()> {
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
    pub(super) fn write(&mut self, shared: &Shared, records: &[Record]) -> io::Result<()> {
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
    pub(super) fn roll(&mut self, shared: &Shared) -> io::Result<()> {
        let active = self.active_seq()?;
        if let Some(seg) = self.segments.get(&active) {
            shared.stats.sync_data(&seg.file)?;
        }
        self.start_segment(&shared.dir, active + 1, &shared.stats)?;
        tracing::debug!(seq = active + 1, "raft log segment rolled");
        // The segment CACHED_SEGMENTS behind leaves the page cache, live or archived by now.
        if let Some(old) = active.checked_sub(super::advice::CACHED_SEGMENTS)
            && let Ok(file) = super::files::LogFiles::open_file(shared, self, old)
        {
            super::advice::drop_cached(&file, 0, 0);
        }
        Ok(())
    }

    pub(super) fn check_contiguous(&self, records: &[Record]) -> io::Result<()> {
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
    pub(super) fn apply(
        &mut self,
        record: &Record,
        seq: u64,
        offset: u64,
        len: u32,
    ) -> io::Result<()> {
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
                } else if let Some(p) = self.last_purged
                    && idx <= p.index
                {
                    // Left behind in a segment that is not yet deleted.
                    return Ok(());
                }
                // An entry past `last_purged + 1` with nothing before it is no hole yet: an
                // older purge record can sit in a segment before entries whose predecessors a
                // later purge (recorded further on) deleted. `recover` checks the final state.
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
    pub(super) fn truncate_from(&mut self, idx: u64) {
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
    pub(super) fn cache_push(&mut self, e: &Entry) {
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

    pub(super) fn cache_pop_front(&mut self) {
        if let Some(e) = self.cache.pop_front() {
            self.cache_bytes -= cached_size(&e);
        }
    }

    pub(super) fn queue_flush(&self, completion: Completion) -> io::Result<()> {
        let active = self.active_seq()?;
        let file = self
            .segments
            .get(&active)
            .map(|s| s.file.clone())
            .ok_or_else(|| io::Error::other("raft log has no active segment"))?;
        self.flush_tx
            .send(FlushRequest { file, completion })
            .map_err(|_| io::Error::other("raft log flusher stopped"))?;
        if let Some((rx, stats)) = &self.inline_rx {
            let batch: Vec<FlushRequest> = rx.try_iter().collect();
            super::flusher::flush_batch(batch, stats);
        }
        Ok(())
    }

    /// Remove the segments (oldest first, never the active one) whose entries are all purged.
    pub(super) fn take_purgeable_segments(&mut self) -> Vec<(u64, PathBuf)> {
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
pub(super) fn cached_size(e: &Entry) -> usize {
    let payload = match &e.payload {
        openraft::EntryPayload::Normal(c) => c.0.len(),
        _ => 0,
    };
    payload + 64
}
