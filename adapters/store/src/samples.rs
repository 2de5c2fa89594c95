//! The node-local analytics log (`queen_ports::SampleLog`): one line of JSON per sample in
//! files named by their first sample's time (`<epoch ms>.jsonl`), in one directory.
//!
//! Bounded two ways, checked at every append:
//! - **retention**: a file whose successor starts before `now - retention` holds only samples
//!   older than that and is deleted; a new file starts every eighth of the retention (between
//!   one second and one hour), so at most about an eighth more than the retention is kept;
//! - **size**: while the files hold more than `max_bytes`, the oldest is deleted (the file being
//!   written is never deleted; it is cut at an eighth of `max_bytes`).
//!
//! Samples are figures for charts, not acknowledged data: lines are written without fsync, and
//! a line torn by a crash is skipped by the reader (it does not parse).

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use queen_ports::{SampleLog, SampleLogError};

/// One file of the log.
#[derive(Debug, Clone)]
struct SampleFile {
    first_ms: u64,
    bytes: u64,
}

#[derive(Debug, Default)]
struct Open {
    /// Every file, oldest first; the last one is written to (when `writer` is set).
    files: Vec<SampleFile>,
    writer: Option<File>,
}

/// The analytics log in a directory.
#[derive(Debug)]
pub struct SampleFiles {
    dir: PathBuf,
    retention_ms: u64,
    max_bytes: u64,
    open: Mutex<Open>,
}

fn err(what: &str, e: impl std::fmt::Display) -> SampleLogError {
    SampleLogError(format!("{what}: {e}"))
}

impl SampleFiles {
    /// Open (or create) the log in `dir`, keeping `retention` of samples and at most
    /// `max_bytes`.
    ///
    /// # Errors
    /// The directory cannot be created or listed.
    pub fn open(dir: &Path, retention: Duration, max_bytes: u64) -> Result<Self, SampleLogError> {
        fs::create_dir_all(dir).map_err(|e| err("cannot create the analytics directory", e))?;
        let mut files = Vec::new();
        for entry in fs::read_dir(dir).map_err(|e| err("cannot list the analytics directory", e))? {
            let entry = entry.map_err(|e| err("cannot list the analytics directory", e))?;
            let name = entry.file_name();
            let Some(first_ms) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".jsonl"))
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            let bytes = entry.metadata().map(|m| m.len()).unwrap_or(0);
            files.push(SampleFile { first_ms, bytes });
        }
        files.sort_by_key(|f| f.first_ms);
        Ok(Self {
            dir: dir.to_owned(),
            retention_ms: u64::try_from(retention.as_millis()).unwrap_or(u64::MAX),
            max_bytes,
            open: Mutex::new(Open {
                files,
                writer: None,
            }),
        })
    }

    fn path(&self, first_ms: u64) -> PathBuf {
        self.dir.join(format!("{first_ms:020}.jsonl"))
    }

    /// How long one file collects samples before the next starts.
    fn span_ms(&self) -> u64 {
        (self.retention_ms / 8).clamp(1000, 3_600_000)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Delete what the bounds no longer allow, oldest first; never the file being written.
    fn prune(&self, o: &mut Open, now_ms: u64) {
        let horizon = now_ms.saturating_sub(self.retention_ms);
        loop {
            let total: u64 = o.files.iter().map(|f| f.bytes).sum();
            let drop_oldest =
                o.files.len() > 1 && (o.files[1].first_ms <= horizon || total > self.max_bytes);
            if !drop_oldest {
                return;
            }
            let gone = o.files.remove(0);
            if let Err(e) = fs::remove_file(self.path(gone.first_ms))
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(target: "queen-store", error = %e, "an old analytics file could not be deleted");
            }
        }
    }
}

impl SampleLog for SampleFiles {
    fn append(&self, at_ms: u64, line: &[u8]) -> Result<(), SampleLogError> {
        let mut o = self.lock();
        let roll = match (&o.writer, o.files.last()) {
            (Some(_), Some(last)) => {
                at_ms >= last.first_ms.saturating_add(self.span_ms())
                    || last.bytes >= (self.max_bytes / 8).max(4096)
                    // The clock went back past the file's start: keep names in time order.
                    || at_ms < last.first_ms
            }
            _ => true,
        };
        if roll {
            // A new file never shares its name with an older one.
            let first_ms = o.files.last().map_or(at_ms, |l| at_ms.max(l.first_ms + 1));
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.path(first_ms))
                .map_err(|e| err("cannot create an analytics file", e))?;
            o.files.push(SampleFile { first_ms, bytes: 0 });
            o.writer = Some(file);
        }
        let mut buf = Vec::with_capacity(line.len() + 1);
        buf.extend_from_slice(line);
        buf.push(b'\n');
        if let Some(w) = o.writer.as_mut() {
            w.write_all(&buf)
                .map_err(|e| err("cannot write an analytics sample", e))?;
        }
        if let Some(last) = o.files.last_mut() {
            last.bytes += buf.len() as u64;
        }
        self.prune(&mut o, at_ms);
        Ok(())
    }

    fn read(
        &self,
        from_ms: u64,
        to_ms: u64,
        f: &mut dyn FnMut(&[u8]) -> bool,
    ) -> Result<(), SampleLogError> {
        let files = self.lock().files.clone();
        for (i, file) in files.iter().enumerate() {
            if file.first_ms > to_ms {
                break;
            }
            // Every sample of this file is older than the next file's first.
            if files.get(i + 1).is_some_and(|n| n.first_ms < from_ms) {
                continue;
            }
            let Ok(handle) = File::open(self.path(file.first_ms)) else {
                // Deleted by a prune since the list was taken.
                continue;
            };
            for line in BufReader::new(handle).split(b'\n') {
                let line = line.map_err(|e| err("cannot read an analytics file", e))?;
                if !line.is_empty() && !f(&line) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    fn bytes(&self) -> u64 {
        self.lock().files.iter().map(|f| f.bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(log: &SampleFiles, from: u64, to: u64) -> Vec<String> {
        let mut out = Vec::new();
        log.read(from, to, &mut |l| {
            out.push(String::from_utf8_lossy(l).into_owned());
            true
        })
        .expect("read");
        out
    }

    #[test]
    fn old_files_go_with_the_retention_and_the_size_bound() {
        let dir = tempfile::tempdir().expect("tempdir");
        // Files of one second (an eighth of eight), kept eight seconds.
        let log = SampleFiles::open(dir.path(), Duration::from_secs(8), 1 << 30).expect("open");
        for s in 0..100u64 {
            log.append(s * 500, format!("{{\"at\":{}}}", s * 500).as_bytes())
                .expect("append");
        }
        let kept = lines(&log, 0, u64::MAX);
        // 50 s of samples at two a second; about nine seconds' worth remain.
        assert!(kept.len() <= 2 * 10, "{}", kept.len());
        assert!(kept.len() >= 2 * 8, "{}", kept.len());
        assert_eq!(kept.last().map(String::as_str), Some("{\"at\":49500}"));
        let files = fs::read_dir(dir.path()).expect("list").count();
        assert!(files <= 10, "{files}");

        // Reopened: the same files, and a read by time skips the older ones.
        drop(log);
        let log = SampleFiles::open(dir.path(), Duration::from_secs(8), 4096).expect("reopen");
        // The file holding 47 s-48 s starts before 48 s: it is read, the one before it is not.
        let read = lines(&log, 48_000, 49_000);
        assert_eq!(read.first().map(String::as_str), Some("{\"at\":47000}"));
        assert!(read.contains(&"{\"at\":48000}".to_owned()));
        // A size bound of 4 KiB: appends push the old files out.
        for s in 100..400u64 {
            log.append(s * 500, &[b'x'; 100]).expect("append");
        }
        assert!(log.bytes() <= 4096 + 512 + 101, "{}", log.bytes());
    }
}
