//! `LogFiles`: the state machine's handle on the log's segment files (which segments it holds,
//! which archived ones can go), behind the port's `LogFiles`.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::segment_name;
use super::{ARCHIVE_DIR, ARCHIVE_HANDLES, LogInner, LogStore, Shared};

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
    pub(super) fn shared(&self) -> io::Result<Arc<Shared>> {
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

    /// The open file of segment `seq`, live or archived, and the windows of it to read ahead
    /// before reading at `pos` (see `advice.rs`).
    fn file_for_read(
        &self,
        shared: &Shared,
        seq: u64,
        pos: u64,
    ) -> io::Result<(Arc<File>, super::advice::Plan)> {
        let mut inner = shared.lock()?;
        let active = inner.active_seq()?;
        let ahead = inner.read_ahead.plan(seq, active, pos);
        Ok((Self::open_file(shared, &mut inner, seq)?, ahead))
    }

    /// The open file of segment `seq`, live or archived.
    pub(super) fn open_file(
        shared: &Shared,
        inner: &mut LogInner,
        seq: u64,
    ) -> io::Result<Arc<File>> {
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
    pub(super) fn delete_archived(
        shared: &Shared,
        inner: &mut LogInner,
        seqs: &[u64],
    ) -> io::Result<()> {
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

pub(super) fn files_err(e: io::Error) -> queen_ports::BackendError {
    queen_ports::BackendError::Storage(format!("raft log files: {e}"))
}

impl queen_ports::LogFiles for LogFiles {
    fn read(&self, span: queen_ports::LogSpan) -> Result<Vec<u8>, queen_ports::BackendError> {
        let shared = self.shared().map_err(files_err)?;
        let (file, ahead) = self
            .file_for_read(&shared, span.file, span.pos)
            .map_err(files_err)?;
        for (pos, len) in ahead.read {
            super::advice::will_need(&file, pos, len);
        }
        if let Some((pos, len)) = ahead.drop {
            super::advice::drop_cached(&file, pos, len);
        }
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
