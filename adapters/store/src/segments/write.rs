//! Writing the segment log: appending records, rolling files, syncing, raw writes, and
//! retiring and removing files no longer needed.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::codec::{encode, encoded_len};
use super::{
    HEADER_BYTES, Loc, NewRecord, RAFT_BIT, SegmentError, Segments, WRITEBACK_BYTES, Writer,
    io_err, lock, start_writeback,
};

impl Segments {
    /// Append `records` in order, rolling files as needed; their locations, in the same order,
    /// and the files this call sealed. Visible to readers only once the caller commits index
    /// rows pointing at them.
    pub(crate) fn append(
        &self,
        records: &[NewRecord<'_>],
    ) -> Result<(Vec<Loc>, Vec<u64>), SegmentError> {
        let mut w = lock(&self.writer);
        let mut locs = Vec::with_capacity(records.len());
        let mut sealed = Vec::new();
        // One buffer of the records' size, not one grown and copied as records are added.
        let total = records
            .iter()
            .map(encoded_len)
            .sum::<u64>()
            .min(self.roll_at);
        let mut buf = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
        let mut buf_at = w.len;
        for r in records {
            let n = encoded_len(r);
            if w.len + n > self.roll_at && w.len > HEADER_BYTES {
                self.write(&mut w, &buf, buf_at)?;
                buf.clear();
                sealed.push(w.id);
                // The sealed file's tail goes to disk in the background too.
                start_writeback(&w.file, w.written_back, 0);
                w.written_back = HEADER_BYTES;
                let id = w.id + 1;
                let f = Arc::new(Self::create(&self.dir, id)?);
                w.id = id;
                w.len = HEADER_BYTES;
                w.file = f.clone();
                w.dir_unsynced = true;
                self.cache(id, f);
                buf_at = w.len;
            }
            locs.push(Loc {
                file: w.id,
                pos: w.len,
                len: u32::try_from(n).unwrap_or(u32::MAX),
            });
            encode(r, &mut buf);
            w.len += n;
        }
        self.write(&mut w, &buf, buf_at)?;
        Ok((locs, sealed))
    }

    pub(super) fn write(&self, w: &mut Writer, buf: &[u8], at: u64) -> Result<(), SegmentError> {
        if buf.is_empty() {
            return Ok(());
        }
        w.file
            .write_all_at(buf, at)
            .map_err(|e| io_err(&self.path(w.id))(e))?;
        w.unsynced.insert(w.id);
        // Whole pages only: a page still being written back is not appended to.
        let end = (at + buf.len() as u64) & !4095;
        if end >= w.written_back + WRITEBACK_BYTES {
            start_writeback(&w.file, w.written_back, end - w.written_back);
            w.written_back = end;
        }
        Ok(())
    }

    /// Make every file written so far durable (and the directory that names them).
    pub(crate) fn sync(&self) -> Result<(), SegmentError> {
        let (ids, active, dir) = {
            let mut w = lock(&self.writer);
            let dir = std::mem::take(&mut w.dir_unsynced);
            (std::mem::take(&mut w.unsynced), (w.id, w.file.clone()), dir)
        };
        for id in ids {
            let f = if id == active.0 {
                Some(active.1.clone())
            } else {
                self.file(id).ok()
            };
            if let Some(f) = f {
                f.sync_data().map_err(io_err(&self.path(id)))?;
            }
        }
        if dir {
            File::open(&self.dir)
                .and_then(|d| d.sync_all())
                .map_err(io_err(&self.dir))?;
        }
        Ok(())
    }

    /// The log of a slot an install replaced: delete every file now or, while a pin is held
    /// (a snapshot being sent), leave them to the next install into this directory or the next
    /// open, which delete every file there first. Pending deletions are dropped either way, so a
    /// pin let go late never deletes a file a later install wrote under the same name.
    pub(crate) fn retire(&self) -> Result<(), SegmentError> {
        let pinned = {
            let mut p = lock(&self.pins);
            p.doomed.clear();
            p.count > 0
        };
        if pinned { Ok(()) } else { self.clear() }
    }

    /// Delete a file no live record is in (at once, or when the last pin goes).
    pub(crate) fn release(&self, id: u64) {
        {
            let mut p = lock(&self.pins);
            if p.count > 0 {
                p.doomed.push(id);
                return;
            }
        }
        self.remove_file(id);
    }

    pub(super) fn remove_file(&self, id: u64) {
        lock(&self.recent).retain(|((l, _), _)| l.file != id);
        if id & RAFT_BIT != 0 {
            if let Some(log) = self.log.get()
                && let Err(e) = log.release(id & !RAFT_BIT)
            {
                tracing::warn!(target: "queen-store", file = id & !RAFT_BIT, error = %e, "could not release a raft log file without live records");
            }
            return;
        }
        lock(&self.open).retain(|(i, _)| *i != id);
        if lock(&self.writer).id == id {
            return;
        }
        if let Err(e) = std::fs::remove_file(self.path(id)) {
            tracing::warn!(target: "queen-store", file = id, error = %e, "could not delete a segment file without live records");
        }
    }

    /// Write bytes of an installed file.
    pub(crate) fn write_raw(&self, id: u64, at: u64, bytes: &[u8]) -> Result<(), SegmentError> {
        let path = self.path(id);
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io_err(&path))?;
        f.write_all_at(bytes, at).map_err(io_err(&path))?;
        Ok(())
    }
}
