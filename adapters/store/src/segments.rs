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

mod codec;
mod open;
mod read;
mod write;

use std::collections::BTreeSet;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use codec::frame_head;
use queen_domain::model::MessageRecRef;

use crate::writeback::start as start_writeback;

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

/// What an index row of a record kept in the raft log adds to its location: the entry's
/// stamp, a CRC32 of the bytes at the location, and where the record's messages are. Either
/// the location is the whole command and the messages are `count` of its push's items from
/// `first_item` (layout 4), or `first_item` is [`ITEMS_ONLY`] and the location is the bytes of
/// the record's `count` items alone, cut out of the command at their bounds (layout 5), so that
/// a read reads and decodes only its own messages, whatever else the entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Raft {
    pub stamp: u64,
    pub crc: u32,
    pub first_item: u32,
}

/// `Raft::first_item` of a row whose location is the record's items alone.
pub(crate) const ITEMS_ONLY: u32 = u32::MAX;

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
    /// A record of `pid` from `base` at `stamp` whose messages `fill` hands to the closure
    /// it is given, encoded straight into the record's body (as `parse` reads one of this
    /// log); `expected` is how many there should be, so that the body is sized once (by the
    /// first message, and never beyond `limit` bytes: `expected` comes from an index row)
    /// instead of grown step by step. An error is `fill`'s, or a message that could not be
    /// encoded.
    pub(crate) fn build(
        pid: u64,
        base: u64,
        stamp: u64,
        (expected, limit): (usize, usize),
        fill: impl FnOnce(&mut dyn FnMut(&MessageRecRef<'_>)) -> Result<(), String>,
    ) -> Result<Record, String> {
        let mut body = Vec::new();
        codec::body_fixed(pid, base, 0, stamp, &mut body);
        let mut count = 0u32;
        let mut failed = None;
        fill(&mut |m| {
            if count == 0 {
                // Each message: its length, then its encoding.
                let one = 4 + m.size_hint();
                body.reserve(one.saturating_mul(expected).min(limit));
            }
            let at = body.len();
            body.extend_from_slice(&[0; 4]);
            match m.encode_into(&mut body) {
                Ok(()) => {
                    let len = u32::try_from(body.len() - at - 4).unwrap_or(u32::MAX);
                    body[at..at + 4].copy_from_slice(&len.to_le_bytes());
                    count += 1;
                }
                Err(e) => {
                    body.truncate(at);
                    failed.get_or_insert(e);
                }
            }
        })?;
        if let Some(e) = failed {
            return Err(format!("a message could not be encoded: {e}"));
        }
        codec::set_count(&mut body, count);
        Ok(Record {
            pid,
            base,
            body,
            count,
        })
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
const WRITEBACK_BYTES: u64 = crate::writeback::PIECE;

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

    /// Where the log ends: (file id, length).
    pub(crate) fn end(&self) -> (u64, u64) {
        let w = lock(&self.writer);
        (w.id, w.len)
    }

    /// Attach the raft log's files (shared with the store's other segment logs).
    pub(crate) fn set_log(&mut self, log: Arc<LogLink>) {
        self.log = log;
    }

    /// Hold deletions while the caller reads files (a snapshot being sent).
    pub(crate) fn pin(self: &Arc<Self>) -> Pin {
        lock(&self.pins).count += 1;
        Pin(self.clone())
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
}

#[cfg(test)]
mod tests;
