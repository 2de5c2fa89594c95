//! The flusher thread: group commit for the raft log.
//!
//! Writers put their records into the segment file (readable at once) and then queue a
//! `FlushRequest`. The flusher takes everything queued, makes it durable with ONE fdatasync per
//! distinct file (normally one), and only then completes the requests, in the order they were
//! queued. After a failed fdatasync the log is poisoned for good: the kernel may have dropped the
//! dirty pages, so no later flush can prove durability.

use std::fs::File;
use std::io;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;

use crate::type_config::IOFlushed;

/// Who is told when a flush is done.
pub(crate) enum Completion {
    /// An openraft append.
    Log(IOFlushed),
    /// A caller inside the log store awaiting durability (vote, purge).
    Waiter(tokio::sync::oneshot::Sender<io::Result<()>>),
}

impl Completion {
    fn complete(self, result: io::Result<()>) {
        match self {
            Completion::Log(cb) => cb.io_completed(result),
            Completion::Waiter(tx) => {
                // The waiter may have been cancelled; nothing else to tell.
                let _ = tx.send(result);
            }
        }
    }
}

/// A request to make everything written to `file` so far durable.
pub(crate) struct FlushRequest {
    /// The segment the request's records were written to.
    pub(crate) file: Arc<File>,
    /// Completed after the fdatasync returned.
    pub(crate) completion: Completion,
}

/// Shared counters and flags of the flusher.
#[derive(Clone)]
pub(crate) struct FlushStats {
    /// Number of fdatasync/fsync calls made by the log store (benchmarks read it).
    pub(crate) fsyncs: Arc<AtomicU64>,
    /// Set after a failed sync; writers refuse new records once it is set.
    pub(crate) poisoned: Arc<AtomicBool>,
}

impl FlushStats {
    /// fdatasync `file`, counting the call.
    pub(crate) fn sync_data(&self, file: &File) -> io::Result<()> {
        self.fsyncs.fetch_add(1, Ordering::Relaxed);
        file.sync_data()
    }

    /// fsync a directory so created or removed entries survive a crash, counting the call.
    pub(crate) fn sync_dir(&self, dir: &std::path::Path) -> io::Result<()> {
        self.fsyncs.fetch_add(1, Ordering::Relaxed);
        File::open(dir)?.sync_all()
    }
}

/// Run the flusher until every sender is gone.
pub(crate) fn run(rx: Receiver<FlushRequest>, stats: FlushStats, max_batch: usize) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < max_batch {
            match rx.try_recv() {
                Ok(req) => batch.push(req),
                Err(_) => break,
            }
        }

        flush_batch(batch, &stats);
    }
    tracing::debug!("raft log flusher stopped");
}

/// Make a batch of requests durable with one fdatasync per distinct file, then complete them in
/// order; a failed sync poisons the log for good.
pub(crate) fn flush_batch(batch: Vec<FlushRequest>, stats: &FlushStats) {
    if batch.is_empty() {
        return;
    }
    let result = if stats.poisoned.load(Ordering::Acquire) {
        Err(io::Error::other(
            "raft log is poisoned by an earlier failed fdatasync",
        ))
    } else {
        sync_distinct(&batch, stats)
    };
    if let Err(e) = &result {
        stats.poisoned.store(true, Ordering::Release);
        tracing::error!(error = %e, requests = batch.len(), "raft log fdatasync failed");
    }

    for req in batch {
        let r = match &result {
            Ok(()) => Ok(()),
            Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
        };
        req.completion.complete(r);
    }
}

fn sync_distinct(batch: &[FlushRequest], stats: &FlushStats) -> io::Result<()> {
    let mut synced: Vec<&Arc<File>> = Vec::with_capacity(1);
    for req in batch {
        if synced.iter().any(|f| Arc::ptr_eq(f, &req.file)) {
            continue;
        }
        stats.sync_data(&req.file)?;
        synced.push(&req.file);
    }
    Ok(())
}
