//! The receiving side of a streamed snapshot: its chunks are spooled to a file in the node's raft
//! directory as they arrive, and the install reads them back one at a time, so a snapshot of any
//! size costs disk, not memory (a few chunks at most are held at once).
//!
//! On-disk format of one spool file (`dir/snapshot-spool/incoming-<n>.spool`): every chunk as a
//! big-endian u32 length followed by its bytes, nothing else. The file lives only as long as one
//! transfer and its install: it is fsynced before the install starts (so a write error the page
//! cache held back surfaces here, as a failed transfer, not as a short read), deleted when the
//! install ends or fails, and every leftover of a process that died is deleted at start. No
//! spooled file is ever read after a restart: the leader sends the snapshot again.

use std::io;
use std::io::Read;
use std::path::Path;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;

use queen_ports::BackendError;
use tokio::io::AsyncWriteExt;

/// The spool directory under the raft directory.
const SPOOL_DIR: &str = "snapshot-spool";
/// Buffer of the writer and the reader: a few syscalls per chunk, not one per frame.
const IO_BUFFER_BYTES: usize = 256 << 10;

/// Where received snapshots are spooled; one per node.
#[derive(Debug)]
pub(crate) struct SnapshotSpool {
    /// `raft_dir/snapshot-spool`.
    dir: PathBuf,
    /// Names files uniquely within this process (leftovers of earlier ones are gone at start).
    next: AtomicU64,
}

impl SnapshotSpool {
    /// Use `raft_dir/snapshot-spool`, creating it and deleting whatever an earlier process left
    /// there (a transfer or install cut by a crash).
    ///
    /// # Errors
    /// The directory cannot be created, listed or cleared.
    pub(crate) fn open(raft_dir: &Path) -> io::Result<SnapshotSpool> {
        let dir = raft_dir.join(SPOOL_DIR);
        std::fs::create_dir_all(&dir)?;
        let mut removed = 0u64;
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            std::fs::remove_file(&path)?;
            removed += 1;
        }
        if removed > 0 {
            tracing::info!(dir = %dir.display(), removed, "deleted snapshot spool files left by an earlier process");
        }
        Ok(SnapshotSpool {
            dir,
            next: AtomicU64::new(0),
        })
    }

    /// A new, empty spool file with a name no other transfer uses.
    ///
    /// # Errors
    /// The file cannot be created.
    pub(crate) async fn create(&self) -> io::Result<SpoolWriter> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.join(format!("incoming-{n}.spool"));
        let file = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .await?;
        Ok(SpoolWriter {
            out: tokio::io::BufWriter::with_capacity(IO_BUFFER_BYTES, file),
            file: SpoolFile { path },
            chunks: 0,
            bytes: 0,
            largest: 0,
        })
    }
}

/// Deletes its file when dropped: after the install, after a failed or refused one, and when a
/// transfer breaks off.
#[derive(Debug)]
struct SpoolFile {
    /// The spooled file.
    path: PathBuf,
}

impl Drop for SpoolFile {
    fn drop(&mut self) {
        match std::fs::remove_file(&self.path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "could not delete a snapshot spool file; it is deleted at the next start")
            }
        }
    }
}

/// A spool file being written by a transfer.
pub(crate) struct SpoolWriter {
    /// Buffered writes to the file.
    out: tokio::io::BufWriter<tokio::fs::File>,
    /// The file, deleted if the transfer never finishes.
    file: SpoolFile,
    /// Chunks written.
    chunks: u64,
    /// Chunk bytes written (without the length prefixes).
    bytes: u64,
    /// The largest chunk written, the bound the reader checks lengths against.
    largest: usize,
}

impl SpoolWriter {
    /// Append one chunk.
    ///
    /// # Errors
    /// A write failure (a full disk among them); the transfer must fail.
    pub(crate) async fn push(&mut self, chunk: &[u8]) -> io::Result<()> {
        let len = u32::try_from(chunk.len()).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, "snapshot chunk above 4 GiB")
        })?;
        self.out.write_all(&len.to_be_bytes()).await?;
        self.out.write_all(chunk).await?;
        self.chunks += 1;
        self.bytes += chunk.len() as u64;
        self.largest = self.largest.max(chunk.len());
        Ok(())
    }

    /// Flush and fsync: the chunks are all on disk before the install reads them.
    ///
    /// # Errors
    /// A write or sync failure.
    pub(crate) async fn finish(mut self) -> io::Result<SpooledSnapshot> {
        self.out.flush().await?;
        self.out.get_mut().sync_all().await?;
        Ok(SpooledSnapshot {
            file: self.file,
            chunks: self.chunks,
            bytes: self.bytes,
            largest: self.largest,
        })
    }
}

/// A complete, fsynced spool file: the snapshot payload on the receiving side.
#[derive(Debug)]
pub(crate) struct SpooledSnapshot {
    /// The file, deleted when this is dropped.
    file: SpoolFile,
    /// How many chunks it holds.
    chunks: u64,
    /// Chunk bytes it holds.
    bytes: u64,
    /// Its largest chunk.
    largest: usize,
}

impl SpooledSnapshot {
    /// Chunks in the file.
    pub(crate) fn chunks(&self) -> u64 {
        self.chunks
    }

    /// Chunk bytes in the file.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Read the chunks back in order, one at a time (blocking I/O: call off the async workers).
    ///
    /// # Errors
    /// The file cannot be opened.
    pub(crate) fn reader(&self) -> io::Result<SpoolReader> {
        let file = std::fs::File::open(&self.file.path)?;
        Ok(SpoolReader {
            input: io::BufReader::with_capacity(IO_BUFFER_BYTES, file),
            left: self.chunks,
            largest: self.largest,
            failed: false,
        })
    }
}

/// The chunks of a spool file, in order. A read failure, a short file or a length the writer
/// never wrote is an `Err` item (then the end), never a silent end.
pub(crate) struct SpoolReader {
    /// Buffered reads of the file.
    input: io::BufReader<std::fs::File>,
    /// Chunks still to read.
    left: u64,
    /// The largest chunk the writer wrote.
    largest: usize,
    /// Set after an error: nothing more is read.
    failed: bool,
}

impl SpoolReader {
    fn read_chunk(&mut self) -> io::Result<Vec<u8>> {
        let mut len = [0u8; 4];
        self.input.read_exact(&mut len)?;
        let len = u32::from_be_bytes(len) as usize;
        if len > self.largest {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "chunk length {len} is above the largest written ({})",
                    self.largest
                ),
            ));
        }
        let mut chunk = vec![0u8; len];
        self.input.read_exact(&mut chunk)?;
        Ok(chunk)
    }
}

impl Iterator for SpoolReader {
    type Item = Result<Vec<u8>, BackendError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.left == 0 {
            return None;
        }
        match self.read_chunk() {
            Ok(chunk) => {
                self.left -= 1;
                Some(Ok(chunk))
            }
            Err(e) => {
                self.failed = true;
                Some(Err(BackendError::Storage(format!(
                    "read spooled snapshot chunk ({} left): {e}",
                    self.left
                ))))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SPOOL_DIR;
    use super::SnapshotSpool;

    fn chunks() -> Vec<Vec<u8>> {
        (0..20u8)
            .map(|i| vec![i; 1000 + usize::from(i) * 777])
            .collect()
    }

    /// `chunks()` spooled in a spool under `dir`.
    async fn spool_chunks(dir: &std::path::Path) -> super::SpooledSnapshot {
        let spool = SnapshotSpool::open(dir).expect("open");
        let mut w = spool.create().await.expect("create");
        for c in chunks() {
            w.push(&c).await.expect("push");
        }
        w.finish().await.expect("finish")
    }

    #[tokio::test]
    async fn chunks_come_back_in_order_and_the_file_goes_with_the_snapshot() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spooled = spool_chunks(dir.path()).await;
        assert_eq!(spooled.chunks(), 20);
        let read: Vec<Vec<u8>> = spooled
            .reader()
            .expect("reader")
            .collect::<Result<_, _>>()
            .expect("every chunk");
        assert_eq!(read, chunks());
        // A second reader sees the same (the state machine may be asked to install twice).
        assert_eq!(spooled.reader().expect("reader").count(), 20);
        let files = || {
            std::fs::read_dir(dir.path().join(SPOOL_DIR))
                .expect("list")
                .count()
        };
        assert_eq!(files(), 1);
        drop(spooled);
        assert_eq!(files(), 0, "the spool file is deleted with the snapshot");
    }

    #[tokio::test]
    async fn a_transfer_that_breaks_off_leaves_no_file_and_names_are_fresh() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spool = SnapshotSpool::open(dir.path()).expect("open");
        let mut a = spool.create().await.expect("create");
        let b = spool
            .create()
            .await
            .expect("a second transfer at once gets its own file");
        a.push(b"half").await.expect("push");
        drop(a);
        drop(b);
        assert_eq!(
            std::fs::read_dir(dir.path().join(SPOOL_DIR))
                .expect("list")
                .count(),
            0
        );
    }

    #[tokio::test]
    async fn leftovers_of_a_dead_process_are_deleted_at_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spool_dir = dir.path().join(SPOOL_DIR);
        std::fs::create_dir_all(&spool_dir).expect("mkdir");
        std::fs::write(spool_dir.join("incoming-0.spool"), b"torn").expect("write");
        std::fs::write(spool_dir.join("incoming-7.spool"), b"torn").expect("write");
        let spool = SnapshotSpool::open(dir.path()).expect("open");
        assert_eq!(std::fs::read_dir(&spool_dir).expect("list").count(), 0);
        // The fresh process names its files from 0 again without clashing.
        let w = spool.create().await.expect("create");
        drop(w);
    }

    #[tokio::test]
    async fn a_short_or_damaged_file_is_an_error_not_an_end() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spooled = spool_chunks(dir.path()).await;
        let path = spooled.file.path.clone();

        // Cut in the middle of the 11th chunk.
        let full = std::fs::read(&path).expect("read");
        let cut: usize = chunks()[..10].iter().map(|c| 4 + c.len()).sum::<usize>() + 100;
        std::fs::write(&path, &full[..cut]).expect("cut");
        let items: Vec<_> = spooled.reader().expect("reader").collect();
        assert_eq!(items.len(), 11, "ten chunks, then one error, then nothing");
        assert!(items[..10].iter().all(Result::is_ok));
        assert!(items[10].is_err(), "a short file must fail the install");

        // A length no chunk had (a damaged prefix).
        let mut bad = full.clone();
        bad[0..4].copy_from_slice(&u32::MAX.to_be_bytes());
        std::fs::write(&path, &bad).expect("damage");
        let mut r = spooled.reader().expect("reader");
        assert!(r.next().expect("an item").is_err());
        assert!(r.next().is_none());
    }
}
