//! A record's bytes: encoding a new record and its frame head, and parsing and walking the
//! records of a file.

use std::fs::File;
use std::path::{Path, PathBuf};

use super::{BODY_FIXED, CODEC_MESSAGES, NewRecord, RECORD_HEAD, Record, SegmentError, io_err};

/// Encode one record.
pub(super) fn encode(r: &NewRecord<'_>, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; RECORD_HEAD]);
    let count = u32::try_from(r.values.len()).unwrap_or(u32::MAX);
    body_fixed(r.pid, r.base, count, r.stamp, out);
    for v in &r.values {
        out.extend_from_slice(&u32::try_from(v.len()).unwrap_or(u32::MAX).to_le_bytes());
        out.extend_from_slice(v);
    }
    let head = frame_head(&out[start + RECORD_HEAD..]);
    out[start..start + RECORD_HEAD].copy_from_slice(&head);
}

/// The fixed part of a record's body ([`BODY_FIXED`] bytes), appended to `out`.
pub(super) fn body_fixed(pid: u64, base: u64, count: u32, stamp: u64, out: &mut Vec<u8>) {
    out.push(CODEC_MESSAGES);
    out.extend_from_slice(&pid.to_le_bytes());
    out.extend_from_slice(&base.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&stamp.to_le_bytes());
}

/// Where a record body's message count sits: after the codec, the partition and the base.
const COUNT_AT: usize = 1 + 8 + 8;

/// Set the message count in a record body that starts with its fixed part.
pub(super) fn set_count(body: &mut [u8], count: u32) {
    body[COUNT_AT..COUNT_AT + 4].copy_from_slice(&count.to_le_bytes());
}

/// The head of a record: its body's length and CRC32.
pub(super) fn frame_head(body: &[u8]) -> [u8; RECORD_HEAD] {
    let mut head = [0u8; RECORD_HEAD];
    head[..4].copy_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_le_bytes());
    head[4..].copy_from_slice(&crc32fast::hash(body).to_le_bytes());
    head
}

pub(super) fn encoded_len(r: &NewRecord<'_>) -> u64 {
    (RECORD_HEAD + BODY_FIXED + r.values.iter().map(|v| 4 + v.len()).sum::<usize>()) as u64
}

/// Check a record body read from `path` at `pos` and read its fixed fields.
/// Check and parse one record; `path` names its file in an error (built only then).
pub(super) fn parse(
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
    let count = u32::from_le_bytes(body[COUNT_AT..COUNT_AT + 4].try_into().unwrap_or_default());
    Ok(Record {
        pid: u64_at(1),
        base: u64_at(9),
        count,
        body,
    })
}

/// Read the records of `f` (at `path`) from `pos` to `end` in order, each checked, and hand
/// each to `visit` with the position just after it. A record that crosses `end` is damage.
pub(super) fn walk(
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
