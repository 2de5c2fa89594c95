//! The on-disk record format of the raft log: what a record says and how it is framed.
//!
//! Frame: `[body length: u32 LE][checksum: u32 LE][body]`, body = postcard of `Record`.
//! A frame that is cut short or whose checksum does not match marks the torn tail of a segment.
//!
//! In a format 2 segment every record after the first is checksummed as the crc32 of the
//! segment's sequence number (u64 LE) followed by the body; the first record, the segment's
//! opening, names that sequence number and is checksummed as the body alone. Format 1 segments
//! (written by earlier builds, still read) checksum every body alone and open with a plain
//! header. Seeding with the sequence number is what makes a segment file reusable: a file taken
//! over by a later segment keeps the previous segment's records past the new write head, and
//! those fail the new checksum, so they read as a torn tail and are never served; an opening
//! that names another sequence number is the previous life's. A build that only reads format 1
//! meets an unknown record kind with a valid checksum in the first frame and refuses to open.

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

/// The version of the record format, written into every new segment header.
pub(crate) const FORMAT_VERSION: u32 = 2;
/// The format of segments whose checksums are not seeded (read, never written).
pub(crate) const FORMAT_UNSEEDED: u32 = 1;

/// The checksum of a frame body in a segment with `seed` (its sequence number; `None` for a
/// format 1 segment).
pub(crate) fn checksum(seed: Option<u64>, body: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    if let Some(seed) = seed {
        h.update(&seed.to_le_bytes());
    }
    h.update(body);
    h.finalize()
}

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
    /// The first record of a format 1 segment (read, never written).
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
    /// The first record of a format 2 segment: its header and the segment's own sequence
    /// number, checksummed without a seed.
    Opening {
        /// The log's durable state as of the start of the segment.
        header: SegmentHeader,
        /// The sequence number of the segment it opens.
        seq: u64,
    },
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

/// Append the framed `record` to `buf`, checksummed for a segment with `seed`; returns the
/// frame length.
pub(crate) fn encode_into(
    buf: &mut Vec<u8>,
    record: &Record,
    seed: Option<u64>,
) -> io::Result<u32> {
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
    let crc = checksum(seed, &buf[start + FRAME_HEADER_BYTES..]);
    buf[start..start + 4].copy_from_slice(&body_len.to_le_bytes());
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    Ok(body_len + FRAME_HEADER_BYTES as u32)
}

/// Decode one complete frame (as located by the index) of a segment with `seed`.
pub(crate) fn decode_frame(frame: &[u8], seed: Option<u64>) -> io::Result<Record> {
    if frame.len() < FRAME_HEADER_BYTES {
        return Err(corrupt("frame shorter than its header"));
    }
    let (len, crc) = frame_header(&frame[..FRAME_HEADER_BYTES]);
    let body = &frame[FRAME_HEADER_BYTES..];
    if body.len() != len as usize {
        return Err(corrupt("frame length does not match the index"));
    }
    if checksum(seed, body) != crc {
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

/// Read the next frame of a segment with `seed` from a sequential reader.
pub(crate) fn scan_next(reader: &mut impl Read, seed: Option<u64>) -> io::Result<ScanItem> {
    match scan_raw(reader)? {
        Raw::End => Ok(ScanItem::End),
        Raw::Torn(why) => Ok(ScanItem::Torn(why)),
        Raw::Frame { body, crc } => {
            if checksum(seed, &body) != crc {
                return Ok(ScanItem::Torn("record checksum mismatch"));
            }
            let len = body.len() as u32 + FRAME_HEADER_BYTES as u32;
            // The checksum matched, so the bytes are what we wrote: this is not a torn write.
            Ok(ScanItem::Record(decode_body(&body)?, len))
        }
    }
}

/// What the first frame of segment `seq` says, and which format it is in.
pub(crate) enum HeaderItem {
    /// A header of either format; `seed` is what the rest of the segment is checksummed with.
    Header {
        /// The log's durable state as of the start of the segment.
        header: SegmentHeader,
        /// Its frame length.
        len: u32,
        /// `Some(seq)` for format 2, `None` for format 1.
        seed: Option<u64>,
    },
    /// Nothing, or no opening of this segment: a creation cut short, or a reused file whose
    /// new opening never reached the disk.
    Missing(&'static str),
}

/// Read the first frame of segment `seq`: an opening that names `seq` (format 2), or a plain
/// header that says format 1.
pub(crate) fn scan_header(reader: &mut impl Read, seq: u64) -> io::Result<HeaderItem> {
    let (body, crc) = match scan_raw(reader)? {
        Raw::End => return Ok(HeaderItem::Missing("empty segment")),
        Raw::Torn(why) => return Ok(HeaderItem::Missing(why)),
        Raw::Frame { body, crc } => (body, crc),
    };
    if checksum(None, &body) != crc {
        return Ok(HeaderItem::Missing("header checksum mismatch"));
    }
    let len = body.len() as u32 + FRAME_HEADER_BYTES as u32;
    match decode_body(&body)? {
        Record::Opening { header, seq: s } if s == seq && header.format == FORMAT_VERSION => {
            Ok(HeaderItem::Header {
                header,
                len,
                seed: Some(seq),
            })
        }
        Record::Opening { seq: s, .. } if s != seq => {
            Ok(HeaderItem::Missing("the opening of another segment"))
        }
        Record::Header(header) if header.format == FORMAT_UNSEEDED => Ok(HeaderItem::Header {
            header,
            len,
            seed: None,
        }),
        Record::Opening { header, .. } | Record::Header(header) => Err(corrupt_owned(format!(
            "raft log format {} is not supported",
            header.format
        ))),
        _ => Err(corrupt("segment does not start with a header")),
    }
}

/// A frame read without judging its checksum.
enum Raw {
    End,
    Torn(&'static str),
    Frame { body: Vec<u8>, crc: u32 },
}

fn scan_raw(reader: &mut impl Read) -> io::Result<Raw> {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    match read_full(reader, &mut header)? {
        0 => return Ok(Raw::End),
        n if n < FRAME_HEADER_BYTES => return Ok(Raw::Torn("frame header cut short")),
        _ => {}
    }
    let (len, crc) = frame_header(&header);
    if len > MAX_RECORD_BYTES {
        return Ok(Raw::Torn("frame length out of range"));
    }
    // Read as the bytes come: past a reused file's write head the length is stale garbage, and
    // must not size an allocation beyond what the file holds.
    let mut body = Vec::with_capacity((len as usize).min(1 << 20));
    reader
        .by_ref()
        .take(u64::from(len))
        .read_to_end(&mut body)?;
    if body.len() < len as usize {
        return Ok(Raw::Torn("frame body cut short"));
    }
    Ok(Raw::Frame { body, crc })
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
