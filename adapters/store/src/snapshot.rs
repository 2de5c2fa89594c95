//! Snapshots: a pinned MVCC view read out in chunks of about 1 MiB of rows.

use fjall::Readable;
use queen_ports::{BackendError, SnapshotChunks};
use serde::{Deserialize, Serialize};

use crate::store::{FjallStore, META_KEY};

/// Rows per chunk are cut at this many bytes.
const CHUNK_BYTES: usize = 1 << 20;

/// One row of a chunk: key and value. Both encode as postcard byte strings (one length, then
/// the bytes copied at once), which is exactly how a `(Vec<u8>, Vec<u8>)` tuple encodes element
/// by element, so chunks written before this type existed install unchanged.
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
pub(crate) struct Row(#[serde(with = "serde_bytes")] pub Vec<u8>, #[serde(with = "serde_bytes")] pub Vec<u8>);

type Rows = Vec<Row>;

pub(crate) fn decode_chunk(bytes: &[u8]) -> Result<Rows, BackendError> {
    postcard::from_bytes(bytes).map_err(|e| BackendError::BadSnapshot(e.to_string()))
}

/// A pinned view and the position reached in it.
pub(crate) struct Chunks {
    snap: fjall::Snapshot,
    state: fjall::Keyspace,
    meta: Vec<u8>,
    /// Next key to read from; `None` once the view is exhausted.
    from: Option<Vec<u8>>,
}

impl Chunks {
    pub(crate) fn new(store: &FjallStore) -> Result<Self, BackendError> {
        let snap = store.db.snapshot();
        let meta = snap
            .get(&store.raft, META_KEY)
            .map_err(|e| BackendError::Storage(e.to_string()))?
            .map(|v| v.to_vec())
            .unwrap_or_default();
        Ok(Self { snap, state: store.state.clone(), meta, from: Some(Vec::new()) })
    }
}

impl SnapshotChunks for Chunks {
    fn meta(&self) -> Vec<u8> {
        self.meta.clone()
    }

    fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, BackendError> {
        let Some(from) = self.from.take() else { return Ok(None) };
        let mut rows: Rows = Vec::new();
        let mut bytes = 0;
        let mut next = None;
        for guard in self.snap.range(&self.state, from..) {
            let (k, v) = guard.into_inner().map_err(|e| BackendError::Storage(e.to_string()))?;
            if bytes >= CHUNK_BYTES {
                next = Some(k.to_vec());
                break;
            }
            bytes += k.len() + v.len();
            rows.push(Row(k.to_vec(), v.to_vec()));
        }
        self.from = next;
        if rows.is_empty() {
            return Ok(None);
        }
        postcard::to_stdvec(&rows).map(Some).map_err(|e| BackendError::Storage(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::{Row, decode_chunk};

    /// Chunks keep the encoding of the tuple rows older nodes send and read, in both directions.
    #[test]
    fn rows_keep_the_tuple_encoding() {
        for len in [0usize, 1, 127, 128, 300, 70_000] {
            let value: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let tuples: Vec<(Vec<u8>, Vec<u8>)> = vec![(b"k1".to_vec(), value.clone()), (vec![5; len % 200], Vec::new())];
            let rows: Vec<Row> = tuples.iter().map(|(k, v)| Row(k.clone(), v.clone())).collect();
            let old = postcard::to_stdvec(&tuples).expect("encodes");
            assert_eq!(old, postcard::to_stdvec(&rows).expect("encodes"), "value of {len} bytes");
            assert_eq!(decode_chunk(&old).expect("decodes"), rows);
        }
    }

    #[test]
    fn a_cut_chunk_is_refused() {
        let rows = vec![Row(b"key".to_vec(), vec![7; 100])];
        let bytes = postcard::to_stdvec(&rows).expect("encodes");
        assert!(decode_chunk(&bytes[..bytes.len() - 1]).is_err());
    }
}
