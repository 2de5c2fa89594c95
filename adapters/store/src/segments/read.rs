//! Reading the segment log: records by location (through the open-file and record caches),
//! entries' commands in the raft log's files, scans and raw reads.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::codec::{parse, walk};
use super::{
    CACHED_BYTES, CACHED_RECORDS, CacheKey, HEADER_BYTES, Loc, OPEN_FILES, RAFT_BIT, RECORD_HEAD,
    Raft, Record, SegmentError, Segments, io_err, lock,
};

impl Segments {
    /// Visit every record from `from` (where a record starts; `None`: the log's start) to the
    /// log's end, in order, with the position just after it. Files deleted meanwhile (every
    /// record of them deleted) are skipped.
    pub(crate) fn scan_records(
        &self,
        from: Option<(u64, u64)>,
        visit: &mut dyn FnMut(&Record, (u64, u64)),
    ) -> Result<(), SegmentError> {
        let (end_id, end_len) = self.end();
        for id in Self::list(&self.dir)? {
            if from.is_some_and(|(f, _)| id < f) || id > end_id {
                continue;
            }
            let path = self.path(id);
            let f = match File::open(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_err(&path)(e)),
            };
            let stop = if id == end_id {
                end_len
            } else {
                f.metadata().map_err(io_err(&path))?.len()
            };
            let pos = match from {
                Some((f, p)) if f == id => p.max(HEADER_BYTES),
                _ => HEADER_BYTES,
            };
            walk(&path, &f, pos, stop, &mut |rec, after| {
                visit(&rec, (id, after))
            })?;
        }
        Ok(())
    }

    pub(super) fn cache(&self, id: u64, f: Arc<File>) {
        let mut open = lock(&self.open);
        open.retain(|(i, _)| *i != id);
        open.insert(0, (id, f));
        open.truncate(OPEN_FILES);
    }

    pub(super) fn file(&self, id: u64) -> Result<Arc<File>, SegmentError> {
        {
            let mut open = lock(&self.open);
            if let Some(i) = open.iter().position(|(x, _)| *x == id) {
                let e = open.remove(i);
                let f = e.1.clone();
                open.insert(0, e);
                return Ok(f);
            }
        }
        let path = self.path(id);
        let f = Arc::new(File::open(&path).map_err(io_err(&path))?);
        self.cache(id, f.clone());
        Ok(f)
    }

    /// The record at `loc`, checked (from the recent records when it was read lately).
    pub(crate) fn read(&self, loc: Loc) -> Result<Arc<Record>, SegmentError> {
        self.cached((loc, u32::MAX), || self.read_uncached(loc))
    }

    /// The record of `pid` at `base` kept in the raft log at `loc`: `count` messages of the
    /// push entry there from item `raft.first_item`, or the `count` items at `loc` alone
    /// ([`super::ITEMS_ONLY`]), checked against the CRC of the bytes read.
    pub(crate) fn read_raft(
        &self,
        loc: Loc,
        raft: Raft,
        pid: u64,
        base: u64,
        count: u32,
    ) -> Result<Arc<Record>, SegmentError> {
        self.cached((loc, raft.first_item), || {
            let damaged = |detail: String| SegmentError::Damaged {
                path: format!("raft log file {}", loc.file & !RAFT_BIT),
                pos: loc.pos,
                detail,
            };
            let log = self
                .log
                .get()
                .ok_or_else(|| damaged("the raft log is not attached".to_owned()))?;
            let span = queen_ports::LogSpan {
                file: loc.file & !RAFT_BIT,
                pos: loc.pos,
                len: loc.len,
            };
            let bytes = log.read(span).map_err(|e| damaged(e.to_string()))?;
            if crc32fast::hash(&bytes) != raft.crc {
                return Err(damaged("entry checksum mismatch".to_owned()));
            }
            // A stored message is its item's bytes less the names, plus a stamp: the items'
            // bytes bound the body, with room for the stamps.
            let size = (count as usize, 2 * bytes.len() + 64);
            Record::build(pid, base, raft.stamp, size, |visit| {
                if raft.first_item == super::ITEMS_ONLY {
                    queen_domain::pushed::for_pushed_items(
                        &bytes,
                        raft.stamp,
                        count as usize,
                        visit,
                    )
                } else {
                    queen_domain::pushed::for_pushed_messages(
                        &bytes,
                        raft.stamp,
                        raft.first_item as usize,
                        count as usize,
                        visit,
                    )
                }
                .map_err(|e| e.to_string())
            })
            .map_err(damaged)
        })
    }

    pub(super) fn cached(
        &self,
        key: CacheKey,
        read: impl FnOnce() -> Result<Record, SegmentError>,
    ) -> Result<Arc<Record>, SegmentError> {
        if let Some(r) = lock(&self.recent)
            .iter()
            .find(|(l, _)| *l == key)
            .map(|(_, r)| r.clone())
        {
            return Ok(r);
        }
        let r = Arc::new(read()?);
        let mut recent = lock(&self.recent);
        recent.push_front((key, r.clone()));
        let mut bytes = 0;
        let mut keep = 0;
        for (_, x) in recent.iter() {
            bytes += x.body.len();
            if keep >= CACHED_RECORDS || (keep > 0 && bytes > CACHED_BYTES) {
                break;
            }
            keep += 1;
        }
        recent.truncate(keep);
        Ok(r)
    }

    pub(super) fn read_uncached(&self, loc: Loc) -> Result<Record, SegmentError> {
        // The path is formatted only for an error: reads are hot (every pop and fetch).
        let path = || self.path(loc.file);
        let f = self.file(loc.file)?;
        let mut all = vec![0u8; loc.len as usize];
        f.read_exact_at(&mut all, loc.pos)
            .map_err(|e| io_err(&path())(e))?;
        let body = all.split_off(RECORD_HEAD.min(all.len()));
        if all.len() < RECORD_HEAD {
            return Err(SegmentError::Damaged {
                path: path().display().to_string(),
                pos: loc.pos,
                detail: "short record".to_owned(),
            });
        }
        parse(&path, loc.pos, &all, body)
    }

    /// The length of a file as it is on disk.
    pub(crate) fn file_len(&self, id: u64) -> Result<u64, SegmentError> {
        let path = self.path(id);
        Ok(self.file(id)?.metadata().map_err(io_err(&path))?.len())
    }

    /// Read `len` bytes of file `id` from `at` (for a snapshot).
    pub(crate) fn read_raw(&self, id: u64, at: u64, len: usize) -> Result<Vec<u8>, SegmentError> {
        let path = self.path(id);
        let mut out = vec![0; len];
        self.file(id)?
            .read_exact_at(&mut out, at)
            .map_err(io_err(&path))?;
        Ok(out)
    }
}
