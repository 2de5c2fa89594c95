//! The segment log: append-only files of message records, one node-wide stream.
//!
//! A file is `<id, 20 digits>.qseg`: a 16-byte header (`QSEG`, three zero bytes, format 1, the
//! file id little-endian), then records back to back. A record is
//!
//! ```text
//! u32 len | u32 crc32(body) | body
//! body = u8 codec | u64 pid | u64 base_offset | u32 count | u64 stamp | count × (u32 len | value)
//! ```
//!
//! little-endian, `len` the body's length. Codec 0: each value is the domain's encoded message.
//! One record holds the messages one log entry appended to one partition (they share the
//! entry's stamp). Files roll before a record would take one past `SEGMENT_BYTES`, so the same
//! records give the same files, byte for byte, on every replica.
//!
//! The state store says where the log ends (file, length) in the same atomic batch as the
//! index rows of the records it covers; at open everything past that end is cut, and a file
//! shorter than it is refused. Files are written with `pwrite` (in the page cache at once, so a
//! `kill -9` loses nothing written) and fsynced by `sync`, which the store runs before the raft
//! log is purged: until then the raft log holds every entry the segments' unsynced tail came from.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

/// The high bit of a location's file: the location is an entry's command in the raft log's
/// file `file & !RAFT_BIT` (see `Raft`), not a record of this log.
pub(crate) const RAFT_BIT: u64 = 1 << 63;

/// By default a file rolls before a record would take it past this many bytes.
pub const SEGMENT_BYTES: u64 = 64 << 20;
/// The file header.
pub(crate) const HEADER_BYTES: u64 = 16;
const MAGIC: &[u8; 8] = b"QSEG\0\0\0\x01";
/// Record head: body length and checksum.
pub(crate) const RECORD_HEAD: usize = 8;
/// Fixed part of a record body before its values.
pub(crate) const BODY_FIXED: usize = 1 + 8 + 8 + 4 + 8;
/// Codec of records whose values are the domain's encoded messages.
pub(crate) const CODEC_MESSAGES: u8 = 0;
/// Open read handles kept at most.
const OPEN_FILES: usize = 32;
/// Records kept decoded after a read, at most (a pop reads the record its dry run just read,
/// and consecutive pops of a partition read the same record).
const CACHED_RECORDS: usize = 64;
/// Bytes of records kept decoded, at most.
const CACHED_BYTES: usize = 8 << 20;

/// A failure of the segment log.
#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    /// A file operation failed.
    #[error("segment log {path}: {source}")]
    Io {
        /// The file or directory.
        path: String,
        /// Why.
        source: io::Error,
    },
    /// A record or file that the state store counts as written is not there or not intact.
    #[error(
        "segment file {path} is damaged at byte {pos}: {detail}; this node's data cannot be trusted: stop it, move its data directory away and let it rejoin the cluster (it then receives a snapshot)"
    )]
    Damaged {
        /// The file.
        path: String,
        /// Where.
        pos: u64,
        /// What is wrong.
        detail: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> SegmentError + '_ {
    move |source| SegmentError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Where a record lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loc {
    pub file: u64,
    pub pos: u64,
    /// Whole record, head included.
    pub len: u32,
}

/// A record to append: its messages' encoded values in offset order.
pub(crate) struct NewRecord<'a> {
    pub pid: u64,
    pub base: u64,
    pub stamp: u64,
    pub values: Vec<&'a [u8]>,
}

/// What an index row of a record kept in the raft log adds to its location (the command's
/// span): the entry's stamp, a CRC32 of the command's bytes, and which items of the entry's
/// push are the record's messages (`count` of them from `first_item`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Raft {
    pub stamp: u64,
    pub crc: u32,
    pub first_item: u32,
}

/// The raft log's files, once the raft adapter handed them over (`attach_log`).
#[derive(Default)]
pub(crate) struct LogLink(std::sync::RwLock<Option<Arc<dyn queen_ports::LogFiles>>>);

impl LogLink {
    pub(crate) fn set(&self, files: Arc<dyn queen_ports::LogFiles>) {
        *self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(files);
    }

    pub(crate) fn get(&self) -> Option<Arc<dyn queen_ports::LogFiles>> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// What the recent records are found by: a location and, for records kept in the raft log
/// (which share their entry's location), the first item (`u32::MAX` for the segment log's).
type CacheKey = (Loc, u32);

/// A record read back.
pub(crate) struct Record {
    pub pid: u64,
    pub base: u64,
    pub body: Vec<u8>,
    count: u32,
}

impl Record {
    /// A record built from messages, as `parse` reads one of this log.
    pub(crate) fn from_values(pid: u64, base: u64, stamp: u64, values: &[Vec<u8>]) -> Record {
        let mut out = Vec::new();
        encode(
            &NewRecord {
                pid,
                base,
                stamp,
                values: values.iter().map(Vec::as_slice).collect(),
            },
            &mut out,
        );
        Record {
            pid,
            base,
            body: out.split_off(RECORD_HEAD),
            count: u32::try_from(values.len()).unwrap_or(u32::MAX),
        }
    }

    /// The record framed as this log stores it (head and body).
    pub(crate) fn framed(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(RECORD_HEAD + self.body.len());
        out.extend_from_slice(&frame_head(&self.body));
        out.extend_from_slice(&self.body);
        out
    }

    /// The values with their offsets, in order.
    pub(crate) fn values(&self) -> impl Iterator<Item = (u64, &[u8])> {
        let mut at = BODY_FIXED;
        let body = &self.body;
        (0..u64::from(self.count)).map_while(move |i| {
            let len = u32::from_le_bytes(body.get(at..at + 4)?.try_into().ok()?) as usize;
            let v = body.get(at + 4..at + 4 + len)?;
            at += 4 + len;
            Some((self.base + i, v))
        })
    }
}

/// Encode one record.
fn encode(r: &NewRecord<'_>, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; RECORD_HEAD]);
    out.push(CODEC_MESSAGES);
    out.extend_from_slice(&r.pid.to_le_bytes());
    out.extend_from_slice(&r.base.to_le_bytes());
    out.extend_from_slice(
        &u32::try_from(r.values.len())
            .unwrap_or(u32::MAX)
            .to_le_bytes(),
    );
    out.extend_from_slice(&r.stamp.to_le_bytes());
    for v in &r.values {
        out.extend_from_slice(&u32::try_from(v.len()).unwrap_or(u32::MAX).to_le_bytes());
        out.extend_from_slice(v);
    }
    let head = frame_head(&out[start + RECORD_HEAD..]);
    out[start..start + RECORD_HEAD].copy_from_slice(&head);
}

/// The head of a record: its body's length and CRC32.
fn frame_head(body: &[u8]) -> [u8; RECORD_HEAD] {
    let mut head = [0u8; RECORD_HEAD];
    head[..4].copy_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_le_bytes());
    head[4..].copy_from_slice(&crc32fast::hash(body).to_le_bytes());
    head
}

fn encoded_len(r: &NewRecord<'_>) -> u64 {
    (RECORD_HEAD + BODY_FIXED + r.values.iter().map(|v| 4 + v.len()).sum::<usize>()) as u64
}

/// Check a record body read from `path` at `pos` and read its fixed fields.
/// Check and parse one record; `path` names its file in an error (built only then).
fn parse(
    path: &dyn Fn() -> PathBuf,
    pos: u64,
    head: &[u8],
    body: Vec<u8>,
) -> Result<Record, SegmentError> {
    let damaged = |detail: String| SegmentError::Damaged {
        path: path().display().to_string(),
        pos,
        detail,
    };
    let len = u32::from_le_bytes(head[0..4].try_into().unwrap_or_default()) as usize;
    let crc = u32::from_le_bytes(head[4..8].try_into().unwrap_or_default());
    if len != body.len() || len < BODY_FIXED {
        return Err(damaged(format!(
            "record length {len} where {} bytes were expected",
            body.len()
        )));
    }
    if crc32fast::hash(&body) != crc {
        return Err(damaged("record checksum mismatch".to_owned()));
    }
    if body[0] != CODEC_MESSAGES {
        return Err(damaged(format!("unknown record codec {}", body[0])));
    }
    let u64_at = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().unwrap_or_default());
    let count = u32::from_le_bytes(body[17..21].try_into().unwrap_or_default());
    Ok(Record {
        pid: u64_at(1),
        base: u64_at(9),
        count,
        body,
    })
}

/// Read the records of `f` (at `path`) from `pos` to `end` in order, each checked, and hand
/// each to `visit` with the position just after it. A record that crosses `end` is damage.
fn walk(
    path: &Path,
    f: &File,
    mut pos: u64,
    end: u64,
    visit: &mut dyn FnMut(Record, u64),
) -> Result<(), SegmentError> {
    use std::io::{BufReader, Read, Seek, SeekFrom};
    let damaged = |pos: u64, detail: &str| SegmentError::Damaged {
        path: path.display().to_string(),
        pos,
        detail: detail.to_owned(),
    };
    let mut r = BufReader::with_capacity(1 << 20, f);
    r.seek(SeekFrom::Start(pos)).map_err(io_err(path))?;
    let mut head = [0u8; RECORD_HEAD];
    while pos < end {
        if pos + RECORD_HEAD as u64 > end {
            return Err(damaged(pos, "a record head crosses the committed end"));
        }
        r.read_exact(&mut head).map_err(io_err(path))?;
        let len = u64::from(u32::from_le_bytes(
            head[0..4].try_into().unwrap_or_default(),
        ));
        if pos + RECORD_HEAD as u64 + len > end {
            return Err(damaged(pos, "a record crosses the committed end"));
        }
        let mut body = vec![0; len as usize];
        r.read_exact(&mut body).map_err(io_err(path))?;
        let rec = parse(&|| path.to_path_buf(), pos, &head, body)?;
        pos += RECORD_HEAD as u64 + len;
        visit(rec, pos);
    }
    Ok(())
}

struct Writer {
    id: u64,
    len: u64,
    file: Arc<File>,
    /// Files written since the last sync.
    unsynced: BTreeSet<u64>,
    dir_unsynced: bool,
    /// Where the kernel was last asked to start writing the active file back.
    written_back: u64,
}

/// Appended bytes after which the kernel is asked to start writing them back (without waiting).
/// Segment files are fsynced only when a snapshot is built; left alone, the kernel lets hundreds
/// of MB of them pile up dirty (measured: 670 MB in the cluster bench) and then writes them at
/// once, which the raft log's fdatasyncs wait behind.
const WRITEBACK_BYTES: u64 = 8 << 20;

/// Ask the kernel to start writing `len` bytes of `file` from `from` back to disk (0: to the
/// end), without waiting for it. Advisory: a failure only means the pages stay dirty until the
/// next sync, which reports real errors.
#[cfg(target_os = "linux")]
fn start_writeback(file: &File, from: u64, len: u64) {
    use std::os::fd::AsRawFd;
    let (Ok(from), Ok(len)) = (i64::try_from(from), i64::try_from(len)) else {
        return;
    };
    // SAFETY: sync_file_range takes a file descriptor and numbers, reads and writes no memory
    // of this process; `file` keeps the descriptor open for the whole call.
    #[allow(unsafe_code)]
    let rc =
        unsafe { libc::sync_file_range(file.as_raw_fd(), from, len, libc::SYNC_FILE_RANGE_WRITE) };
    if rc != 0 {
        tracing::debug!(target: "queen-store", error = %io::Error::last_os_error(), "segment writeback could not be started");
    }
}

#[cfg(not(target_os = "linux"))]
fn start_writeback(_file: &File, _from: u64, _len: u64) {}

struct Pins {
    count: usize,
    doomed: Vec<u64>,
}

/// The segment log of one node.
pub(crate) struct Segments {
    dir: PathBuf,
    roll_at: u64,
    writer: Mutex<Writer>,
    open: Mutex<Vec<(u64, Arc<File>)>>,
    pins: Mutex<Pins>,
    /// Recently read records, newest first, by location and (for records kept in the raft
    /// log, which share their entry's location) first item.
    recent: Mutex<std::collections::VecDeque<(CacheKey, Arc<Record>)>>,
    /// The raft log's files, for records kept there.
    log: Arc<LogLink>,
}

/// While held, no segment file is deleted (deletions wait for the last pin).
pub(crate) struct Pin(Arc<Segments>);

impl Drop for Pin {
    fn drop(&mut self) {
        let doomed = {
            let mut p = lock(&self.0.pins);
            p.count -= 1;
            if p.count > 0 {
                return;
            }
            std::mem::take(&mut p.doomed)
        };
        for id in doomed {
            self.0.remove_file(id);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Segments {
    pub(crate) fn path(&self, id: u64) -> PathBuf {
        self.dir.join(format!("{id:020}.qseg"))
    }

    /// The ids of the files in the directory, ascending.
    fn list(dir: &Path) -> Result<Vec<u64>, SegmentError> {
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

    /// The header every file of the log starts with.
    pub(crate) fn header(id: u64) -> Vec<u8> {
        let mut h = Vec::with_capacity(HEADER_BYTES as usize);
        h.extend_from_slice(MAGIC);
        h.extend_from_slice(&id.to_le_bytes());
        h
    }

    /// The size at which files roll.
    pub(crate) fn roll_at(&self) -> u64 {
        self.roll_at
    }

    fn create(dir: &Path, id: u64) -> Result<File, SegmentError> {
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
    fn check_file(path: &Path, f: &File, end: u64) -> Result<(), SegmentError> {
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

    /// Where the log ends: (file id, length).
    pub(crate) fn end(&self) -> (u64, u64) {
        let w = lock(&self.writer);
        (w.id, w.len)
    }

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

    fn write(&self, w: &mut Writer, buf: &[u8], at: u64) -> Result<(), SegmentError> {
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

    fn cache(&self, id: u64, f: Arc<File>) {
        let mut open = lock(&self.open);
        open.retain(|(i, _)| *i != id);
        open.insert(0, (id, f));
        open.truncate(OPEN_FILES);
    }

    fn file(&self, id: u64) -> Result<Arc<File>, SegmentError> {
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
    /// push entry there from item `raft.first_item`, checked against the entry's CRC.
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
            let values = queen_domain::pushed::pushed_messages(
                &bytes,
                raft.stamp,
                raft.first_item as usize,
                count as usize,
            )
            .map_err(|e| damaged(e.to_string()))?;
            Ok(Record::from_values(pid, base, raft.stamp, &values))
        })
    }

    /// Attach the raft log's files (shared with the store's other segment logs).
    pub(crate) fn set_log(&mut self, log: Arc<LogLink>) {
        self.log = log;
    }

    fn cached(
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

    fn read_uncached(&self, loc: Loc) -> Result<Record, SegmentError> {
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

    /// Hold deletions while the caller reads files (a snapshot being sent).
    pub(crate) fn pin(self: &Arc<Self>) -> Pin {
        lock(&self.pins).count += 1;
        Pin(self.clone())
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

    fn remove_file(&self, id: u64) {
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

    /// Bytes of every segment file.
    pub(crate) fn disk_bytes(&self) -> u64 {
        self.stats().1
    }

    /// How many segment files there are and their bytes.
    pub(crate) fn stats(&self) -> (usize, u64) {
        let Ok(ids) = Self::list(&self.dir) else {
            return (0, 0);
        };
        let bytes = ids
            .iter()
            .filter_map(|id| std::fs::metadata(self.path(*id)).ok())
            .map(|m| m.len())
            .sum();
        (ids.len(), bytes)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(pid: u64, base: u64, n: usize, size: usize) -> (u64, u64, Vec<Vec<u8>>) {
        (
            pid,
            base,
            (0..n).map(|i| vec![(i % 250) as u8; size]).collect(),
        )
    }

    fn append(s: &Segments, recs: &[(u64, u64, Vec<Vec<u8>>)]) -> Vec<Loc> {
        let new: Vec<NewRecord<'_>> = recs
            .iter()
            .map(|(pid, base, vals)| NewRecord {
                pid: *pid,
                base: *base,
                stamp: 7,
                values: vals.iter().map(Vec::as_slice).collect(),
            })
            .collect();
        s.append(&new).unwrap().0
    }

    #[test]
    fn records_read_back_and_a_torn_tail_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let s = Segments::open(dir.path(), SEGMENT_BYTES, None, &|_| true).unwrap();
        let locs = append(&s, &[rec(1, 0, 3, 10), rec(2, 5, 1, 0)]);
        let r = s.read(locs[0]).unwrap();
        assert_eq!((r.pid, r.base), (1, 0));
        let vals: Vec<(u64, Vec<u8>)> = r.values().map(|(o, v)| (o, v.to_vec())).collect();
        assert_eq!(
            vals,
            vec![(0, vec![0; 10]), (1, vec![1; 10]), (2, vec![2; 10])]
        );
        let end = s.end();
        append(&s, &[rec(3, 0, 2, 100)]);
        drop(s);
        // Reopened at the earlier end: the later record is cut.
        let s = Segments::open(dir.path(), SEGMENT_BYTES, Some(end), &|_| true).unwrap();
        assert_eq!(s.end(), end);
        assert_eq!(std::fs::metadata(s.path(1)).unwrap().len(), end.1);
        assert!(s.read(locs[1]).is_ok());
    }

    #[test]
    fn a_short_or_corrupt_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let s = Segments::open(dir.path(), SEGMENT_BYTES, None, &|_| true).unwrap();
        let locs = append(&s, &[rec(1, 0, 3, 10)]);
        let end = s.end();
        drop(s);
        let path = dir.path().join(format!("{:020}.qseg", 1));
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&[0xFF], locs[0].pos + 20).unwrap();
        let e = Segments::open(dir.path(), SEGMENT_BYTES, Some(end), &|_| true)
            .err()
            .expect("corrupt record refused");
        assert!(e.to_string().contains("checksum"), "{e}");
        f.set_len(end.1 - 1).unwrap();
        let e = Segments::open(dir.path(), SEGMENT_BYTES, Some(end), &|_| true)
            .err()
            .expect("short file refused");
        assert!(e.to_string().contains("ends at"), "{e}");
    }

    #[test]
    fn files_roll_at_the_same_records_and_pins_hold_deletion() {
        let dir = tempfile::tempdir().unwrap();
        let s = Arc::new(Segments::open(dir.path(), SEGMENT_BYTES, None, &|_| true).unwrap());
        let big = (SEGMENT_BYTES / 3) as usize;
        let locs = append(
            &s,
            &[
                rec(1, 0, 1, big),
                rec(1, 1, 1, big),
                rec(1, 2, 1, big),
                rec(1, 3, 1, 10),
            ],
        );
        assert_eq!(
            locs.iter().map(|l| l.file).collect::<Vec<_>>(),
            vec![1, 1, 2, 2]
        );
        let pin = s.pin();
        s.release(1);
        assert!(s.path(1).exists());
        drop(pin);
        assert!(!s.path(1).exists());
        assert!(s.read(locs[3]).is_ok());
    }
}
