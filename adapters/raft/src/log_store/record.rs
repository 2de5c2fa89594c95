//! The on-disk record format of the raft log: what a record says and how it is framed.
//!
//! Frame: `[body length: u32 LE][crc32 of body: u32 LE][body]`, body = postcard of `Record`.
//! A frame that is cut short or whose checksum does not match marks the torn tail of a segment.

use std::io;
use std::io::Read;

use serde::Deserialize;
use serde::Serialize;

use crate::type_config::Entry;
use crate::type_config::LogId;
use crate::type_config::Vote;

/// Bytes before a record body: length and checksum.
pub(crate) const FRAME_HEADER_BYTES: usize = 8;

/// Upper bound of one record body; a larger length field can only be garbage.
pub(crate) const MAX_RECORD_BYTES: u32 = 256 * 1024 * 1024;

/// The version of the record format, written into every segment header.
pub(crate) const FORMAT_VERSION: u32 = 1;

/// The log's durable state as of the start of a segment. Every segment begins with one, so the
/// segments before it can be deleted without losing the vote, `committed` or `last_purged`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SegmentHeader {
    /// Record format version, to refuse a log written by an incompatible future version.
    pub(crate) format: u32,
    /// The vote in force when the segment was started.
    pub(crate) vote: Option<Vote>,
    /// The committed log id in force when the segment was started.
    pub(crate) committed: Option<LogId>,
    /// The last purged log id in force when the segment was started.
    pub(crate) last_purged: Option<LogId>,
}

/// One record of the log's single ordered stream. Vote, entries and pointers share the stream so
/// that one fdatasync orders and covers all of them.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Record {
    /// The first record of every segment.
    Header(SegmentHeader),
    /// A raft log entry.
    Entry(Entry),
    /// A new vote.
    Vote(Vote),
    /// The latest committed log id.
    Committed(Option<LogId>),
    /// Entries up to and including this log id are purged.
    Purged(LogId),
    /// Entries after this log id (or all entries when `None`) are removed.
    TruncateAfter(Option<LogId>),
}

/// About how many bytes `record` takes framed: an entry's command and some room for its log id
/// and the frame; other records are small.
pub(crate) fn encoded_len_hint(record: &Record) -> usize {
    const ROOM: usize = 64;
    match record {
        Record::Entry(e) => match &e.payload {
            openraft::EntryPayload::Normal(c) => ROOM + c.0.len(),
            _ => 4 * ROOM,
        },
        _ => 4 * ROOM,
    }
}

/// Append the framed `record` to `buf`; returns the frame length.
pub(crate) fn encode_into(buf: &mut Vec<u8>, record: &Record) -> io::Result<u32> {
    let start = buf.len();
    buf.extend_from_slice(&[0u8; FRAME_HEADER_BYTES]);
    let body = postcard::to_extend(record, std::mem::take(buf))
        .map_err(|e| io::Error::other(format!("encode log record: {e}")))?;
    *buf = body;
    let body_len = buf.len() - start - FRAME_HEADER_BYTES;
    let body_len = u32::try_from(body_len)
        .ok()
        .filter(|l| *l <= MAX_RECORD_BYTES)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "log record too large"))?;
    let crc = crc32fast::hash(&buf[start + FRAME_HEADER_BYTES..]);
    buf[start..start + 4].copy_from_slice(&body_len.to_le_bytes());
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    Ok(body_len + FRAME_HEADER_BYTES as u32)
}

/// Decode one complete frame (as located by the index).
pub(crate) fn decode_frame(frame: &[u8]) -> io::Result<Record> {
    if frame.len() < FRAME_HEADER_BYTES {
        return Err(corrupt("frame shorter than its header"));
    }
    let (len, crc) = frame_header(&frame[..FRAME_HEADER_BYTES]);
    let body = &frame[FRAME_HEADER_BYTES..];
    if body.len() != len as usize {
        return Err(corrupt("frame length does not match the index"));
    }
    if crc32fast::hash(body) != crc {
        return Err(corrupt("record checksum mismatch"));
    }
    decode_body(body)
}

/// What reading the next frame of a segment gave.
pub(crate) enum ScanItem {
    /// A valid record and its frame length.
    Record(Record, u32),
    /// Clean end of the segment.
    End,
    /// A frame cut short, with a bad length or a bad checksum: a torn tail (or corruption).
    Torn(&'static str),
}

/// Read the next frame from a sequential reader.
pub(crate) fn scan_next(reader: &mut impl Read) -> io::Result<ScanItem> {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    match read_full(reader, &mut header)? {
        0 => return Ok(ScanItem::End),
        n if n < FRAME_HEADER_BYTES => return Ok(ScanItem::Torn("frame header cut short")),
        _ => {}
    }
    let (len, crc) = frame_header(&header);
    if len > MAX_RECORD_BYTES {
        return Ok(ScanItem::Torn("frame length out of range"));
    }
    let mut body = vec![0u8; len as usize];
    if read_full(reader, &mut body)? < body.len() {
        return Ok(ScanItem::Torn("frame body cut short"));
    }
    if crc32fast::hash(&body) != crc {
        return Ok(ScanItem::Torn("record checksum mismatch"));
    }
    match decode_body(&body) {
        Ok(record) => Ok(ScanItem::Record(record, len + FRAME_HEADER_BYTES as u32)),
        // The checksum matched, so the bytes are what we wrote: this is not a torn write.
        Err(e) => Err(e),
    }
}

fn frame_header(h: &[u8]) -> (u32, u32) {
    let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
    let crc = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
    (len, crc)
}

fn decode_body(body: &[u8]) -> io::Result<Record> {
    postcard::from_bytes(body).map_err(|e| corrupt_owned(format!("decode log record: {e}")))
}

/// Read until `buf` is full or EOF; returns the bytes read.
fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

fn corrupt(msg: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn corrupt_owned(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}
