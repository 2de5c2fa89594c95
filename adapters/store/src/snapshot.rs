//! Snapshots: a pinned MVCC view read out in chunks of about 1 MiB of rows, then the segment
//! files that view's index points into, in chunks of 1 MiB of bytes.
//!
//! Records the sender keeps in its raft log are not sent as they are (the receiver's raft log
//! holds other files, and not the entries a snapshot replaces): as the rows are read, each such
//! record is written out as a record of the segment log into new files after the view's last
//! one, sent as segment chunks between the rows, and its index row is sent pointing there. The
//! view's rows about raft log files and its end of the segment log are replaced by the new
//! files' rows and end, sent after the rows.
//!
//! A chunk of this layout starts with `QSC2` and holds a postcard `Chunk`. A chunk without the
//! magic is a bare list of rows, as nodes of store layout 1 send (their first byte is a row
//! count and the first key's table byte, never `QS`); its message rows are migrated after the
//! install.

use std::collections::VecDeque;
use std::sync::Arc;

use fjall::Readable;
use queen_domain::keys::table;
use queen_ports::{BackendError, SnapshotChunks};
use serde::{Deserialize, Serialize};

use crate::messages::{self, IndexVal};
use crate::segments::{HEADER_BYTES, Loc, Pin, RAFT_BIT, Segments};
use crate::store::{FjallStore, META_KEY, Slot};

const MAGIC: &[u8; 4] = b"QSC2";

/// Rows per chunk are cut at this many bytes.
const CHUNK_BYTES: usize = 1 << 20;

/// One row of a chunk: key and value. Both encode as postcard byte strings (one length, then
/// the bytes copied at once), which is exactly how a `(Vec<u8>, Vec<u8>)` tuple encodes element
/// by element, so chunks written before this type existed install unchanged.
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
pub(crate) struct Row(
    #[serde(with = "serde_bytes")] pub Vec<u8>,
    #[serde(with = "serde_bytes")] pub Vec<u8>,
);

type Rows = Vec<Row>;

/// One chunk of a snapshot.
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
pub(crate) enum Chunk {
    /// Engine rows.
    Rows(Rows),
    /// Bytes of a segment file at an offset.
    Segment {
        file: u64,
        at: u64,
        #[serde(with = "serde_bytes")]
        bytes: Vec<u8>,
    },
}

pub(crate) fn encode_chunk(c: &Chunk) -> Result<Vec<u8>, BackendError> {
    let mut out = MAGIC.to_vec();
    let body = postcard::to_stdvec(c).map_err(|e| BackendError::Storage(e.to_string()))?;
    out.extend_from_slice(&body);
    Ok(out)
}

pub(crate) fn decode_chunk(bytes: &[u8]) -> Result<Chunk, BackendError> {
    let bad = |e: postcard::Error| BackendError::BadSnapshot(e.to_string());
    match bytes.strip_prefix(MAGIC.as_slice()) {
        Some(rest) => postcard::from_bytes(rest).map_err(bad),
        None => postcard::from_bytes::<Rows>(bytes)
            .map(Chunk::Rows)
            .map_err(bad),
    }
}

/// A pinned view and the position reached in it: rows first, then segment files.
pub(crate) struct Chunks {
    snap: fjall::Snapshot,
    state: fjall::Keyspace,
    segments: Arc<Segments>,
    _pin: Pin,
    meta: Vec<u8>,
    /// Next key to read from; `None` once the rows are sent.
    from: Option<Vec<u8>>,
    /// Segment files still to send: (file, next byte, length to send).
    files: Vec<(u64, u64, u64)>,
    /// The segment files of the view as `new` found them, for `restart`.
    all_files: Vec<(u64, u64, u64)>,
    /// The view's end of the segment log, where new files for records kept in the raft log
    /// start (after it).
    end: Option<(u64, u64)>,
    /// The files written out of records kept in the raft log so far.
    out: Materialized,
    /// Chunks ready to go before anything else.
    pending: VecDeque<Vec<u8>>,
}

/// Segment files written, while the rows are read, out of records the sender keeps in its
/// raft log: (file, records in it), the length of the last, and its bytes not yet sent.
#[derive(Default)]
struct Materialized {
    files: Vec<(u64, u64)>,
    len: u64,
    buf: Vec<u8>,
    buf_at: u64,
}

impl Chunks {
    pub(crate) fn new(store: &FjallStore) -> Result<Self, BackendError> {
        let storage = |e: fjall::Error| BackendError::Storage(e.to_string());
        // One slot throughout: an install may switch the store to the other meanwhile.
        let Slot {
            state, segments, ..
        } = store.slot();
        // Pinned before the view: no file the view points into can go while the chunks live.
        let pin = segments.pin();
        let snap = store.db.snapshot();
        let meta = snap
            .get(&store.raft, META_KEY)
            .map_err(storage)?
            .map(|v| v.to_vec())
            .unwrap_or_default();
        let end = snap
            .get(&state, messages::END_KEY)
            .map_err(storage)?
            .and_then(|v| messages::decode_end(&v));
        let mut files = Vec::new();
        if let Some((end_file, end_len)) = end {
            for g in snap.range(&state, [table::SEGMENT_FILE]..[table::SEGMENT_FILE + 1]) {
                let (k, _) = g.into_inner().map_err(storage)?;
                let Some(file) = queen_domain::keys::u64_at(&k, 1) else {
                    continue;
                };
                if file != end_file && file & RAFT_BIT == 0 {
                    let len = segments
                        .file_len(file)
                        .map_err(|e| BackendError::Storage(e.to_string()))?;
                    files.push((file, 0, len));
                }
            }
            files.push((end_file, 0, end_len));
        }
        Ok(Self {
            snap,
            state,
            segments,
            _pin: pin,
            meta,
            from: Some(Vec::new()),
            all_files: files.clone(),
            files,
            end,
            out: Materialized::default(),
            pending: VecDeque::new(),
        })
    }

    /// Write the record behind a row kept in the raft log into the new files; the row as it is
    /// sent, pointing there.
    fn materialize(&mut self, key: &[u8], val: IndexVal) -> Result<Vec<u8>, BackendError> {
        let storage = |e: String| BackendError::Storage(e);
        let Some((pid, base)) = messages::index_key_parts(key) else {
            return Err(storage("a malformed segment index key".to_owned()));
        };
        let rec = val
            .read(&self.segments, pid, base)
            .map_err(|e| storage(e.to_string()))?;
        let framed = rec.framed();
        let roll = self.out.files.is_empty()
            || (self.out.len + framed.len() as u64 > self.segments.roll_at()
                && self.out.len > HEADER_BYTES);
        if roll {
            self.flush_out()?;
            let id = match self.out.files.last() {
                Some((id, _)) => id + 1,
                None => self.end.map_or(1, |(f, _)| f + 1),
            };
            self.out.files.push((id, 0));
            self.out.buf = Segments::header(id);
            self.out.buf_at = 0;
            self.out.len = HEADER_BYTES;
        }
        let Some((file, records)) = self.out.files.last_mut() else {
            return Err(storage("no file to write a record into".to_owned()));
        };
        *records += 1;
        let loc = Loc {
            file: *file,
            pos: self.out.len,
            len: u32::try_from(framed.len()).unwrap_or(u32::MAX),
        };
        self.out.len += framed.len() as u64;
        self.out.buf.extend_from_slice(&framed);
        if self.out.buf.len() >= CHUNK_BYTES {
            self.flush_out()?;
        }
        Ok(IndexVal {
            loc,
            raft: None,
            ..val
        }
        .encode())
    }

    /// Queue the new files' bytes not yet sent as a segment chunk.
    fn flush_out(&mut self) -> Result<(), BackendError> {
        if let Some((file, _)) = self.out.files.last()
            && !self.out.buf.is_empty()
        {
            let bytes = std::mem::take(&mut self.out.buf);
            let at = self.out.buf_at;
            self.out.buf_at += bytes.len() as u64;
            self.pending.push_back(encode_chunk(&Chunk::Segment {
                file: *file,
                at,
                bytes,
            })?);
        }
        Ok(())
    }

    /// After the rows: the new files' last bytes, their rows and the segment log's end.
    fn finish_rows(&mut self) -> Result<(), BackendError> {
        self.flush_out()?;
        let mut rows = Vec::new();
        for (file, records) in &self.out.files {
            rows.push(Row(
                messages::file_key(*file),
                records.to_le_bytes().to_vec(),
            ));
        }
        let end = match self.out.files.last() {
            Some((file, _)) => Some((*file, self.out.len)),
            None => self.end,
        };
        if let Some(end) = end {
            rows.push(Row(
                messages::END_KEY.to_vec(),
                messages::encode_end(end).to_vec(),
            ));
        }
        self.pending.push_back(encode_chunk(&Chunk::Rows(rows))?);
        Ok(())
    }

    fn next_file_chunk(&mut self) -> Result<Option<Vec<u8>>, BackendError> {
        while let Some(&(file, at, len)) = self.files.first() {
            if at >= len {
                self.files.remove(0);
                continue;
            }
            let n = (len - at).min(CHUNK_BYTES as u64);
            let bytes = self
                .segments
                .read_raw(file, at, n as usize)
                .map_err(|e| BackendError::Storage(e.to_string()))?;
            self.files[0].1 += n;
            return encode_chunk(&Chunk::Segment { file, at, bytes }).map(Some);
        }
        Ok(None)
    }
}

impl SnapshotChunks for Chunks {
    fn meta(&self) -> Vec<u8> {
        self.meta.clone()
    }

    fn restart(&self) -> Result<Box<dyn SnapshotChunks>, BackendError> {
        // Not a clone of this cursor: it has used up part of `files`. The new pin is taken
        // while this cursor's is held, so no file of the view can go in between.
        Ok(Box::new(Self {
            snap: self.snap.clone(),
            state: self.state.clone(),
            segments: self.segments.clone(),
            _pin: self.segments.pin(),
            meta: self.meta.clone(),
            from: Some(Vec::new()),
            files: self.all_files.clone(),
            all_files: self.all_files.clone(),
            end: self.end,
            out: Materialized::default(),
            pending: VecDeque::new(),
        }))
    }

    fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, BackendError> {
        if let Some(c) = self.pending.pop_front() {
            return Ok(Some(c));
        }
        let Some(from) = self.from.take() else {
            return self.next_file_chunk();
        };
        let mut rows: Rows = Vec::new();
        let mut bytes = 0;
        let mut next = None;
        let snap = self.snap.clone();
        for guard in snap.range(&self.state, from..) {
            let (k, v) = guard
                .into_inner()
                .map_err(|e| BackendError::Storage(e.to_string()))?;
            // Bounded by the rows' bytes and by the records written out of the raft log.
            if bytes >= CHUNK_BYTES || self.pending.len() >= 2 {
                next = Some(k.to_vec());
                break;
            }
            let v = match k.first() {
                // Sent after the rows, for the files written out of the raft log.
                Some(&table::SEGMENT_END) => continue,
                Some(&table::SEGMENT_FILE)
                    if queen_domain::keys::u64_at(&k, 1).is_some_and(|f| f & RAFT_BIT != 0) =>
                {
                    continue;
                }
                Some(&table::SEGMENT_INDEX) if k.len() == 17 && v.len() != 28 => {
                    let val = IndexVal::decode(&k, &v)
                        .map_err(|e| BackendError::Storage(e.to_string()))?;
                    if val.raft.is_some() {
                        self.materialize(&k, val)?
                    } else {
                        v.to_vec()
                    }
                }
                _ => v.to_vec(),
            };
            bytes += k.len() + v.len();
            rows.push(Row(k.to_vec(), v));
        }
        self.from = next;
        if self.from.is_none() {
            self.finish_rows()?;
        }
        if rows.is_empty() {
            return match self.pending.pop_front() {
                Some(c) => Ok(Some(c)),
                None => self.next_file_chunk(),
            };
        }
        // Rows go after the segment bytes they point into were queued: the receiver does not
        // mind the order, but the chunks' sizes stay bounded.
        self.pending.push_back(encode_chunk(&Chunk::Rows(rows))?);
        Ok(self.pending.pop_front())
    }
}

#[cfg(test)]
mod tests {
    use super::{Chunk, Row, decode_chunk, encode_chunk};

    /// Chunks keep the encoding of the tuple rows older nodes send and read, in both directions.
    #[test]
    fn rows_keep_the_tuple_encoding() {
        for len in [0usize, 1, 127, 128, 300, 70_000] {
            let value: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let tuples: Vec<(Vec<u8>, Vec<u8>)> = vec![
                (b"k1".to_vec(), value.clone()),
                (vec![5; len % 200], Vec::new()),
            ];
            let rows: Vec<Row> = tuples
                .iter()
                .map(|(k, v)| Row(k.clone(), v.clone()))
                .collect();
            let old = postcard::to_stdvec(&tuples).expect("encodes");
            assert_eq!(
                old,
                postcard::to_stdvec(&rows).expect("encodes"),
                "value of {len} bytes"
            );
            assert_eq!(
                decode_chunk(&old).expect("decodes"),
                super::Chunk::Rows(rows)
            );
        }
    }

    #[test]
    fn a_cut_chunk_is_refused() {
        let rows = vec![Row(b"key".to_vec(), vec![7; 100])];
        let bytes = postcard::to_stdvec(&rows).expect("encodes");
        assert!(decode_chunk(&bytes[..bytes.len() - 1]).is_err());
        let chunk = encode_chunk(&Chunk::Segment {
            file: 3,
            at: 16,
            bytes: vec![1; 100],
        })
        .expect("encodes");
        assert!(matches!(
            decode_chunk(&chunk).expect("decodes"),
            Chunk::Segment {
                file: 3,
                at: 16,
                ..
            }
        ));
        assert!(decode_chunk(&chunk[..chunk.len() - 1]).is_err());
    }
}
