//! Snapshots: a pinned MVCC view read out in chunks of about 1 MiB of rows.

use fjall::Readable;
use queen_ports::{BackendError, SnapshotChunks};

use crate::store::{FjallStore, META_KEY};

/// Rows per chunk are cut at this many bytes.
const CHUNK_BYTES: usize = 1 << 20;

type Rows = Vec<(Vec<u8>, Vec<u8>)>;

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
            rows.push((k.to_vec(), v.to_vec()));
        }
        self.from = next;
        if rows.is_empty() {
            return Ok(None);
        }
        postcard::to_stdvec(&rows).map(Some).map_err(|e| BackendError::Storage(e.to_string()))
    }
}
