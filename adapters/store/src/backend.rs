//! The state machine backend: applies committed entries through the domain, writing their
//! effects and the raft metadata in one atomic batch.

use std::sync::atomic::Ordering;

use fjall::PersistMode;
use queen_domain::Txn;
use queen_domain::machine::apply_encoded;
use queen_ports::{ApplyEntry, BackendError, SnapshotChunks, StateMachineBackend};

use crate::snapshot::{Chunks, Row, decode_chunk};
use crate::store::{FjallStore, INSTALLING_KEY, META_KEY};

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
        let writes = txn.into_writes();
        self.rows_written.fetch_add(writes.len() as u64, Ordering::Relaxed);
        // Buffer durability: the batch reaches the OS (survives kill -9); the raft log is the
        // durable record, and `persist` syncs before a snapshot lets the log be purged.
        let mut batch = self.db.batch().durability(Some(PersistMode::Buffer));
        for (k, v) in writes {
            match v {
                Some(v) => batch.insert(&self.state, k, v),
                None => batch.remove(&self.state, k),
            }
        }
        batch.insert(&self.raft, META_KEY, meta);
        batch.commit().map_err(storage)?;
        Ok(responses)
    }

    fn load_meta(&self) -> Result<Option<Vec<u8>>, BackendError> {
        Ok(self.raft.get(META_KEY).map_err(storage)?.map(|v| v.to_vec()))
    }

    fn persist(&self) -> Result<(), BackendError> {
        self.db.persist(PersistMode::SyncData).map_err(storage)
    }

    fn snapshot(&self) -> Result<Box<dyn SnapshotChunks>, BackendError> {
        Ok(Box::new(Chunks::new(self)?))
    }

    fn install_snapshot(&self, chunks: &mut dyn Iterator<Item = Vec<u8>>, meta: Vec<u8>) -> Result<(), BackendError> {
        self.raft.insert(INSTALLING_KEY, b"1").map_err(storage)?;
        self.db.persist(PersistMode::SyncAll).map_err(storage)?;
        self.state.clear().map_err(storage)?;
        for chunk in chunks {
            let rows = decode_chunk(&chunk)?;
            let mut batch = self.db.batch().durability(Some(PersistMode::Buffer));
            for Row(k, v) in rows {
                batch.insert(&self.state, k, v);
            }
            batch.commit().map_err(storage)?;
        }
        let mut batch = self.db.batch().durability(Some(PersistMode::Buffer));
        batch.insert(&self.raft, META_KEY, meta);
        batch.remove(&self.raft, INSTALLING_KEY);
        batch.commit().map_err(storage)?;
        self.db.persist(PersistMode::SyncAll).map_err(storage)
    }
}
