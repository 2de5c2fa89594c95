//! The state machine backend: applies committed entries through the domain, writing their
//! effects and the raft metadata in one atomic batch.

use std::sync::atomic::Ordering;

use fjall::PersistMode;
use queen_domain::Txn;
use queen_domain::machine::apply_encoded;
use queen_ports::{ApplyEntry, BackendError, SnapshotChunks, StateMachineBackend};

use crate::messages;
use crate::snapshot::{Chunk, Chunks, decode_chunk};
use crate::store::{FjallStore, INSTALLING_KEY, META_KEY, read_err};

fn storage(e: impl std::fmt::Display) -> BackendError {
    BackendError::Storage(e.to_string())
}

impl StateMachineBackend for FjallStore {
    fn apply(&self, entries: Vec<ApplyEntry>, meta: Vec<u8>) -> Result<Vec<Vec<u8>>, BackendError> {
        let mut responses = Vec::with_capacity(entries.len());
        let mut txn = Txn::new(self);
        for e in &entries {
            match &e.command {
                Some(bytes) => {
                    let r = apply_encoded(&mut txn, bytes, e.index).map_err(storage)?;
                    responses.push(r.encode());
                }
                // A new leader's blank entry or a membership change: leases timed under the
                // previous leader are held past their expiry by the clock-skew bound.
                None => {
                    queen_domain::machine::cluster::leader_changed(&mut txn).map_err(storage)?;
                    responses.push(Vec::new());
                }
            }
        }
        let (mut writes, appends) = txn.into_parts();
        // Messages go to the segment log (written here, before the batch that indexes them);
        // what remains of `writes` and the index rows go into one engine batch.
        let read_row = |k: &[u8]| Ok(self.state.get(k).map_err(read_err)?.map(|v| v.to_vec()));
        let staged = messages::stage(&self.state, &read_row, &self.segments, &mut writes, appends).map_err(storage)?;
        self.rows_written.fetch_add((writes.len() + staged.rows.len()) as u64, Ordering::Relaxed);
        // Buffer durability: the batch reaches the OS (survives kill -9); the raft log is the
        // durable record, and `persist` syncs before a snapshot lets the log be purged.
        let mut batch = self.db.batch().durability(Some(PersistMode::Buffer));
        for (k, v) in writes.into_iter().chain(staged.rows) {
            match v {
                Some(v) => {
                    // Before the commit: a reader that can see the row must not be told it is absent.
                    self.dedup_filter.insert(&k);
                    batch.insert(&self.state, k, v);
                }
                None => batch.remove(&self.state, k),
            }
        }
        batch.insert(&self.raft, META_KEY, meta);
        batch.commit().map_err(storage)?;
        for file in staged.released {
            self.segments.release(file);
        }
        Ok(responses)
    }

    fn load_meta(&self) -> Result<Option<Vec<u8>>, BackendError> {
        Ok(self.raft.get(META_KEY).map_err(storage)?.map(|v| v.to_vec()))
    }

    fn persist(&self) -> Result<(), BackendError> {
        // Segments first: the engine must never be durable with index rows whose records are not.
        self.segments.sync().map_err(storage)?;
        self.db.persist(PersistMode::SyncData).map_err(storage)
    }

    fn snapshot(&self) -> Result<Box<dyn SnapshotChunks>, BackendError> {
        Ok(Box::new(Chunks::new(self)?))
    }

    fn install_snapshot(&self, chunks: &mut dyn Iterator<Item = Result<Vec<u8>, BackendError>>, meta: Vec<u8>) -> Result<(), BackendError> {
        self.raft.insert(INSTALLING_KEY, b"1").map_err(storage)?;
        self.db.persist(PersistMode::SyncAll).map_err(storage)?;
        self.state.clear().map_err(storage)?;
        self.segments.clear().map_err(storage)?;
        for chunk in chunks {
            match decode_chunk(&chunk?)? {
                Chunk::Rows(rows) => {
                    let mut batch = self.db.batch().durability(Some(PersistMode::Buffer));
                    for row in rows {
                        batch.insert(&self.state, row.0, row.1);
                    }
                    batch.commit().map_err(storage)?;
                }
                Chunk::Segment { file, at, bytes } => self.segments.write_raw(file, at, &bytes).map_err(storage)?,
            }
        }
        let end = self.state.get(messages::END_KEY).map_err(storage)?.and_then(|v| messages::decode_end(&v));
        self.segments.reopen(end).map_err(storage)?;
        // A snapshot from a node of layout 1 carries messages as rows.
        self.migrate().map_err(storage)?;
        self.fill_dedup_filter().map_err(storage)?;
        let mut batch = self.db.batch().durability(Some(PersistMode::Buffer));
        batch.insert(&self.raft, META_KEY, meta);
        batch.remove(&self.raft, INSTALLING_KEY);
        batch.commit().map_err(storage)?;
        self.db.persist(PersistMode::SyncAll).map_err(storage)
    }
}
