//! Writing large files without stalling the raft log's fdatasyncs.
//!
//! Left alone, the kernel lets a file written in one go pile up dirty in the page cache and
//! writes it back all at once, at the file's own fsync or at the dirty-page deadline. On ext4
//! (ordered data) the raft log's next fdatasync then commits the journal behind those writes,
//! and every push in flight waits for them. So a large write asks the kernel to start writing
//! each piece back as soon as it is written, and waits for the piece before it, so that never
//! more than two pieces are dirty.

use std::fs::File;
use std::io::{self, Write};

/// The bytes of one piece.
pub(crate) const PIECE: u64 = 8 << 20;

/// Ask the kernel to start writing `len` bytes of `file` from `from` back to disk (0: to the
/// end), without waiting for it. Advisory: a failure only means the pages stay dirty until the
/// next sync, which reports real errors.
pub(crate) fn start(file: &File, from: u64, len: u64) {
    range(file, from, len, false);
}

/// Write `len` bytes of `file` from `from` back and wait until they are on disk (not the
/// metadata: the file's own fsync at the end still counts). Advisory like [`start`].
pub(crate) fn settle(file: &File, from: u64, len: u64) {
    range(file, from, len, true);
}

#[cfg(target_os = "linux")]
fn range(file: &File, from: u64, len: u64, wait: bool) {
    use std::os::fd::AsRawFd;
    let (Ok(from), Ok(len)) = (i64::try_from(from), i64::try_from(len)) else {
        return;
    };
    let flags = if wait {
        libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER
    } else {
        libc::SYNC_FILE_RANGE_WRITE
    };
    // SAFETY: sync_file_range takes a file descriptor and numbers, reads and writes no memory
    // of this process; `file` keeps the descriptor open for the whole call.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::sync_file_range(file.as_raw_fd(), from, len, flags) };
    if rc != 0 {
        tracing::debug!(target: "queen-store", error = %io::Error::last_os_error(), "writeback could not be started");
    }
}

#[cfg(not(target_os = "linux"))]
fn range(_file: &File, _from: u64, _len: u64, _wait: bool) {}

/// A buffered writer of a new file from its start that starts each [`PIECE`] on its way to
/// disk once written, and waits for the one before it.
pub(crate) struct Paced<'a> {
    file: &'a File,
    buf: Vec<u8>,
    /// Bytes handed to the file.
    written: u64,
    /// Where the kernel was last asked to start writing back.
    started: u64,
}

impl<'a> Paced<'a> {
    /// Buffer this many bytes between writes to the file.
    const BUFFER: usize = 1 << 20;

    pub(crate) fn new(file: &'a File) -> Self {
        Self {
            file,
            buf: Vec::with_capacity(Self::BUFFER),
            written: 0,
            started: 0,
        }
    }

    fn write_out(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let mut f = self.file;
        f.write_all(&self.buf)?;
        self.written += self.buf.len() as u64;
        self.buf.clear();
        self.pace();
        Ok(())
    }

    /// Once a piece has been written since the last request, start it on its way to disk and
    /// wait for the piece before it.
    fn pace(&mut self) {
        if self.written - self.started >= PIECE {
            if self.started >= PIECE {
                settle(self.file, self.started - PIECE, PIECE);
            }
            start(self.file, self.started, self.written - self.started);
            self.started = self.written;
        }
    }
}

impl Write for Paced<'_> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        if self.buf.len() + b.len() > Self::BUFFER {
            self.write_out()?;
        }
        if b.len() >= Self::BUFFER {
            let mut f = self.file;
            f.write_all(b)?;
            self.written += b.len() as u64;
            self.pace();
            return Ok(b.len());
        }
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.write_out()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    #[test]
    fn a_paced_file_holds_exactly_what_was_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = File::create(&path).unwrap();
        let mut w = Paced::new(&file);
        let mut expect = Vec::new();
        // Small writes across many pieces, and one larger than the buffer.
        for i in 0..700_000u64 {
            let b = (i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).to_le_bytes();
            w.write_all(&b).unwrap();
            expect.extend_from_slice(&b);
            if i == 300_000 {
                let big = vec![7u8; 3 << 20];
                w.write_all(&big).unwrap();
                expect.extend_from_slice(&big);
            }
        }
        let more = vec![1u8; 20 << 20];
        w.write_all(&more).unwrap();
        expect.extend_from_slice(&more);
        w.flush().unwrap();
        drop(w);
        file.sync_data().unwrap();
        let mut got = Vec::new();
        File::open(&path).unwrap().read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), expect.len());
        assert!(got == expect, "contents differ");
    }
}
