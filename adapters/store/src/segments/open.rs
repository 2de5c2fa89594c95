//! Opening the segment log: listing and creating files, checking them against the end the
//! state store recorded, cutting what lies past it; and clearing and reopening it.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use super::codec::walk;
use super::{HEADER_BYTES, MAGIC, Pins, SegmentError, Segments, Writer, io_err, lock};

impl Segments {
    /// The ids of the files in the directory, ascending.
    pub(super) fn list(dir: &Path) -> Result<Vec<u64>, SegmentError> {
        let mut ids = Vec::new();
        for e in std::fs::read_dir(dir).map_err(io_err(dir))? {
            let e = e.map_err(io_err(dir))?;
            let name = e.file_name();
            if let Some(id) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".qseg"))
                .and_then(|n| n.parse::<u64>().ok())
            {
                ids.push(id);
            }
        }
        ids.sort_unstable();
        Ok(ids)
    }

    pub(super) fn create(dir: &Path, id: u64) -> Result<File, SegmentError> {
        let path = dir.join(format!("{id:020}.qseg"));
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(io_err(&path))?;
        f.write_all_at(&Self::header(id), 0)
            .map_err(io_err(&path))?;
        Ok(f)
    }

    /// Open the log in `dir`, cut back to `end` (the state store's record of where it ends;
    /// `None` for a store that has never appended): files after it are deleted, the end file is
    /// cut to its length and its records are checked, and files before it for which `live`
    /// says false (their deletion was interrupted) are deleted.
    pub(crate) fn open(
        dir: &Path,
        roll_at: u64,
        end: Option<(u64, u64)>,
        live: &dyn Fn(u64) -> bool,
    ) -> Result<Self, SegmentError> {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let ids = Self::list(dir)?;
        let path_of = |id: u64| dir.join(format!("{id:020}.qseg"));
        let (id, len) = match end {
            None => {
                for id in ids {
                    std::fs::remove_file(path_of(id)).map_err(io_err(&path_of(id)))?;
                }
                Self::create(dir, 1)?;
                (1, HEADER_BYTES)
            }
            Some((eid, elen)) => {
                for &id in &ids {
                    if id > eid || (id < eid && !live(id)) {
                        if id > eid {
                            tracing::info!(target: "queen-store", file = id, "cutting a segment file past the committed end");
                        }
                        std::fs::remove_file(path_of(id)).map_err(io_err(&path_of(id)))?;
                    }
                }
                let path = path_of(eid);
                let f = OpenOptions::new().read(true).write(true).open(&path).map_err(|e| SegmentError::Damaged {
                    path: path.display().to_string(),
                    pos: 0,
                    detail: format!("the state store counts {elen} bytes in this file but it cannot be opened: {e}"),
                })?;
                let size = f.metadata().map_err(io_err(&path))?.len();
                if size < elen {
                    return Err(SegmentError::Damaged {
                        path: path.display().to_string(),
                        pos: size,
                        detail: format!(
                            "the file ends at {size} bytes, the state store counts {elen}"
                        ),
                    });
                }
                if size > elen {
                    tracing::info!(target: "queen-store", file = eid, cut = size - elen, "cutting the segment log's torn tail back to the committed end");
                    f.set_len(elen).map_err(io_err(&path))?;
                    f.sync_data().map_err(io_err(&path))?;
                }
                Self::check_file(&path, &f, elen)?;
                (eid, elen)
            }
        };
        let path = path_of(id);
        let file = Arc::new(
            OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(io_err(&path))?,
        );
        Ok(Self {
            dir: dir.to_path_buf(),
            roll_at,
            writer: Mutex::new(Writer {
                id,
                len,
                file: file.clone(),
                unsynced: BTreeSet::new(),
                dir_unsynced: true,
                written_back: len,
            }),
            open: Mutex::new(vec![(id, file)]),
            pins: Mutex::new(Pins {
                count: 0,
                doomed: Vec::new(),
            }),
            recent: Mutex::new(std::collections::VecDeque::new()),
            log: Arc::default(),
        })
    }

    /// Check the header and every record of a file up to `end`.
    pub(super) fn check_file(path: &Path, f: &File, end: u64) -> Result<(), SegmentError> {
        let damaged = |detail: &str| SegmentError::Damaged {
            path: path.display().to_string(),
            pos: 0,
            detail: detail.to_owned(),
        };
        let mut h = [0u8; HEADER_BYTES as usize];
        f.read_exact_at(&mut h, 0)
            .map_err(|_| damaged("no header"))?;
        if &h[..8] != MAGIC {
            return Err(damaged("not a segment file of this format"));
        }
        walk(path, f, HEADER_BYTES, end, &mut |_, _| {})
    }

    /// Delete every file (a snapshot install replaces the log).
    pub(crate) fn clear(&self) -> Result<(), SegmentError> {
        lock(&self.open).clear();
        lock(&self.recent).clear();
        for id in Self::list(&self.dir)? {
            let path = self.path(id);
            std::fs::remove_file(&path).map_err(io_err(&path))?;
        }
        Ok(())
    }

    /// After an install: sync every file and continue appending at `end` (`None`: the
    /// installed state had no segment log, start a fresh one).
    pub(crate) fn reopen(&self, end: Option<(u64, u64)>) -> Result<(), SegmentError> {
        let (id, len) = match end {
            Some(e) => e,
            None => {
                Self::create(&self.dir, 1)?;
                (1, HEADER_BYTES)
            }
        };
        for other in Self::list(&self.dir)? {
            let path = self.path(other);
            File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(io_err(&path))?;
        }
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err(&self.dir))?;
        let path = self.path(id);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io_err(&path))?;
        let size = f.metadata().map_err(io_err(&path))?.len();
        if size != len {
            return Err(SegmentError::Damaged {
                path: path.display().to_string(),
                pos: size,
                detail: format!("installed file ends at {size}, the installed state counts {len}"),
            });
        }
        let f = Arc::new(f);
        let mut w = lock(&self.writer);
        *w = Writer {
            id,
            len,
            file: f.clone(),
            unsynced: BTreeSet::new(),
            dir_unsynced: false,
            written_back: len,
        };
        drop(w);
        self.cache(id, f);
        Ok(())
    }
}
