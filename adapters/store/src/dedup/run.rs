//! A run file on disk: writing one from sorted entries, opening it, looking a key up through
//! its pages, scanning it, and the cursor a merge reads it with.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::{
    DedupError, ENTRY, Ent, Fence, Key, PAGE_ENTRIES, RUN_HEADER, RUN_MAGIC, Run, RunCursor,
    ent_bytes, ent_from, fence, io_err, key_of,
};

impl Run {
    pub(super) fn name(id: u64) -> String {
        format!("{id:020}.qddx")
    }

    pub(super) fn open(dir: &Path, id: u64) -> Result<Self, DedupError> {
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
            fences.push(fence(&k));
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
    pub(super) fn write(
        dir: &Path,
        id: u64,
        entries: &mut dyn Iterator<Item = Ent>,
    ) -> Result<Self, DedupError> {
        let path = dir.join(Self::name(id));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(io_err(&path))?;
        // Paced: a merged run can be hundreds of MB, which written in one go would stall the
        // raft log's fdatasyncs behind its writeback.
        let mut w = crate::writeback::Paced::new(&file);
        w.write_all(&[0u8; RUN_HEADER as usize])
            .map_err(io_err(&path))?;
        let mut n = 0u64;
        let mut fences = Vec::new();
        for e in entries {
            if n.is_multiple_of(PAGE_ENTRIES as u64) {
                fences.push([e[0], e[1], e[2]]);
            }
            w.write_all(&ent_bytes(&e)).map_err(io_err(&path))?;
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
    pub(super) fn lookup(&self, key: &Key, out: &mut Vec<u64>) -> Result<(), DedupError> {
        // The last page whose first key is below `key`: equal keys may begin on the page before
        // the one whose fence equals `key`.
        let want: Fence = fence(key);
        let mut page = self.fences.partition_point(|f| *f < want).saturating_sub(1);
        let mut buf = [0u8; PAGE_ENTRIES * ENTRY];
        while page < self.fences.len() && self.fences[page] <= want {
            let first = (page * PAGE_ENTRIES) as u64;
            let n = (self.entries - first).min(PAGE_ENTRIES as u64) as usize;
            if let Some((lo, hi)) = self.window(page, &want, n) {
                // Most lookups end here: the window brackets the key, so every entry equal to
                // it is inside, and none follows the page.
                let bytes = &mut buf[..(hi - lo) * ENTRY];
                self.file
                    .read_exact_at(bytes, RUN_HEADER + (first + lo as u64) * ENTRY as u64)
                    .map_err(io_err(&self.path))?;
                let (entries, _) = bytes.as_chunks::<ENTRY>();
                let (head, _) = decode_entry(&entries[0]);
                let (tail, _) = decode_entry(&entries[entries.len() - 1]);
                if (lo == 0 || head < *key) && tail > *key {
                    Self::equal_in(entries, key, out);
                    return Ok(());
                }
            }
            let bytes = &mut buf[..n * ENTRY];
            self.file
                .read_exact_at(bytes, RUN_HEADER + first * ENTRY as u64)
                .map_err(io_err(&self.path))?;
            let (entries, _) = bytes.as_chunks::<ENTRY>();
            if Self::equal_in(entries, key, out) {
                return Ok(());
            }
            page += 1;
        }
        Ok(())
    }

    /// Push the offsets of the entries equal to `key` in `entries` (sorted); true when an entry
    /// after them is greater (none can follow on a later page).
    fn equal_in(entries: &[[u8; ENTRY]], key: &Key, out: &mut Vec<u64>) -> bool {
        let lo = entries.partition_point(|e| e[..key.len()] < key[..]);
        for e in &entries[lo..] {
            let (k, offset) = decode_entry(e);
            if k != *key {
                return true;
            }
            out.push(offset);
        }
        false
    }

    /// Where in page `page` (of `n` entries) `want` should sit, as a window of entries
    /// `[lo, hi)` to read instead of the whole page: hashes are uniform, so between the page's
    /// first key and the next page's an entry's position follows its hash's first word (off by
    /// about 6 entries, one standard deviation, in a page of 128). A lookup reads a
    /// quarter of a page, not all of it: copying whole pages out of the page cache was half of
    /// a lookup's time (`perf`, with 5M keys stored). `None` on the run's last page and where
    /// the two fences differ in partition (the caller reads the whole page).
    fn window(&self, page: usize, want: &Fence, n: usize) -> Option<(usize, usize)> {
        const WINDOW: usize = 32;
        let (from, to) = (self.fences[page], *self.fences.get(page + 1)?);
        if n <= WINDOW || from[0] != to[0] || want[0] != from[0] || to[1] <= from[1] {
            return None;
        }
        let span = u128::from(to[1] - from[1]);
        let at = u128::from(want[1].saturating_sub(from[1])) * n as u128 / span;
        let at = usize::try_from(at).ok()?.min(n);
        let lo = at.saturating_sub(WINDOW / 2).min(n - WINDOW);
        Some((lo, lo + WINDOW))
    }

    /// Every entry, in order.
    pub(super) fn scan(&self, visit: &mut dyn FnMut(Key, u64)) -> Result<(), DedupError> {
        let mut c = RunCursor::new(self);
        for e in c.by_ref() {
            visit(key_of(&e), e[3]);
        }
        c.error.take().map_or(Ok(()), Err)
    }
}

/// One entry's bytes read back: its key and offset.
pub(super) fn decode_entry(e: &[u8]) -> (Key, u64) {
    let mut k = [0u8; 24];
    k.copy_from_slice(&e[..24]);
    (
        k,
        u64::from_be_bytes(e[24..ENTRY].try_into().unwrap_or_default()),
    )
}

impl<'a> RunCursor<'a> {
    /// Entries read at once (128 KiB).
    const CHUNK: u64 = 4096;

    pub(super) fn new(run: &'a Run) -> Self {
        Self {
            run,
            at: 0,
            buf: Vec::new(),
            buf_at: 0,
            buf_n: 0,
            error: None,
        }
    }
}

/// The run's entries in order; a read that fails ends them early and leaves its error in
/// `error`.
impl Iterator for RunCursor<'_> {
    type Item = Ent;

    fn next(&mut self) -> Option<Ent> {
        if self.at >= self.run.entries || self.error.is_some() {
            return None;
        }
        if self.at >= self.buf_at + self.buf_n {
            let n = (self.run.entries - self.at).min(Self::CHUNK);
            self.buf.resize(n as usize * ENTRY, 0);
            if let Err(e) = self
                .run
                .file
                .read_exact_at(&mut self.buf, RUN_HEADER + self.at * ENTRY as u64)
            {
                self.error = Some(io_err(&self.run.path)(e));
                return None;
            }
            self.buf_at = self.at;
            self.buf_n = n;
        }
        let i = (self.at - self.buf_at) as usize;
        self.at += 1;
        let (entries, _) = self.buf.as_chunks::<ENTRY>();
        Some(ent_from(&entries[i]))
    }
}
