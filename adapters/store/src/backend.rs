//! The state machine backend: applies committed entries through the domain, writing their
//! effects and the raft metadata in one atomic batch.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use fjall::PersistMode;
use queen_domain::Txn;
use queen_domain::machine::apply_encoded;
use queen_ports::{Answer, ApplyEntry, BackendError, SnapshotChunks, StateMachineBackend};

use crate::filter::DedupFilter;
use crate::messages::{self, KeptEntry};
use crate::segments::Segments;
use crate::snapshot::{Chunk, Chunks, decode_chunk};
use crate::store::{
    ApplyRead, FjallStore, INSTALLING_KEY, META_KEY, SLOT_KEY, Slot, is_hot, open_dedup,
};

fn storage(e: impl std::fmt::Display) -> BackendError {
    BackendError::Storage(e.to_string())
}

impl StateMachineBackend for FjallStore {
    fn apply(&self, entries: Vec<ApplyEntry>, meta: Vec<u8>) -> Result<Vec<Answer>, BackendError> {
        let mut responses = Vec::with_capacity(entries.len());
        // One slot for the whole batch: installs, which switch slots, run on the same caller as
        // apply, never during it.
        let slot = self.slot();
        let base = ApplyRead(&slot);
        let mut txn = Txn::new(&base);
        // Entries whose command the raft log keeps where it wrote it: (stamp, span, bytes, the
        // range of origins their pushes noted). Only with the log attached.
        let log = self.log.get();
        let keep = log.is_some();
        if keep {
            txn.record_origins();
        }
        let mut kept: Vec<(u64, queen_ports::LogSpan, &[u8], std::ops::Range<usize>)> = Vec::new();
        for e in &entries {
            match &e.command {
                Some(bytes) => {
                    let from = txn.origins().len();
                    let r = apply_encoded(&mut txn, bytes, e.index, e.answered).map_err(storage)?;
                    let to = txn.origins().len();
                    if keep
                        && to > from
                        && let Some(span) = e.span
                    {
                        kept.push((r.stamp.0, span, &bytes[..], from..to));
                    }
                    // Nobody here waits for it: its state changes are made, its answer is not.
                    // Somebody does: it takes the response as built, not encoded.
                    responses.push(if e.answered {
                        Answer::Built(Box::new(r))
                    } else {
                        Answer::Bytes(Vec::new())
                    });
                }
                // A new leader's blank entry or a membership change: leases timed under the
                // previous leader are held past their expiry by the clock-skew bound.
                None => {
                    queen_domain::machine::cluster::leader_changed(&mut txn).map_err(storage)?;
                    responses.push(Answer::Bytes(Vec::new()));
                }
            }
        }
        let origins = txn.origins().to_vec();
        let queen_domain::Parts {
            mut writes,
            appends,
            dedup,
            queue_options,
        } = txn.into_parts();
        // What waiting pops care about, read before the writes go into the engine's batch.
        let observed = self
            .observer_wanting()
            .map(|o| (o.clone(), crate::observe::changes_of(&writes)));
        let kept: Vec<KeptEntry<'_>> = kept
            .into_iter()
            .map(|(stamp, span, bytes, range)| KeptEntry {
                stamp,
                span,
                bytes,
                origins: &origins[range],
            })
            .collect();
        // Messages go to the segment log (written here, before the batch that indexes them),
        // except those whose entry the raft log keeps; what remains of `writes` and the index
        // rows go into one engine batch.
        let staged = messages::stage(&slot.state, &slot.segments, &mut writes, appends, &kept)
            .map_err(storage)?;
        if let Some(log) = &log {
            for file in &staged.held {
                log.hold(*file);
            }
        }
        // Dedup rows go to the dedup index, before the batch: a reader that finds an entry whose
        // record is not indexed yet drops it as not live, the same answer as before the batch.
        slot.take_dedup_rows(&mut writes, dedup).map_err(storage)?;
        if let Some(last) = kept.iter().map(|k| (k.span.file, k.span.pos)).max() {
            slot.dedup.note_raft(last);
        }
        self.rows_written
            .fetch_add((writes.len() + staged.rows.len()) as u64, Ordering::Relaxed);
        // The hot rows this batch writes, for the apply's cache once the batch is committed.
        let hot: Vec<(Vec<u8>, Option<Vec<u8>>)> = writes
            .iter()
            .chain(staged.rows.iter().map(|(k, v)| (k, v)))
            .filter(|(k, _)| is_hot(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        // Buffer durability: the batch reaches the OS (survives kill -9); the raft log is the
        // durable record, and `persist` syncs before a snapshot lets the log be purged.
        let mut batch = self.db.batch().durability(Some(PersistMode::Buffer));
        slot.write_rows(&mut batch, writes.into_iter().chain(staged.rows));
        batch.insert(&self.raft, META_KEY, meta);
        if let Err(e) = batch.commit() {
            slot.hot.clear();
            return Err(storage(e));
        }
        slot.hot.committed(hot);
        if queue_options {
            // After the commit: a reader that sees the new number reads the new options.
            self.queue_epoch.fetch_add(1, Ordering::Release);
        }
        if let Some((observer, changes)) = observed
            && !changes.is_empty()
        {
            observer.applied(&changes, &*queen_ports::StateReader::view(self));
        }
        for file in staged.released {
            slot.segments.release(file);
        }
        if slot.dedup.full() {
            // Every message up to the log's end is in the table being written out (in a
            // thread of its own: the next entries go into a new table meanwhile).
            slot.dedup.flush_behind(slot.segments.end());
        }
        Ok(responses)
    }

    fn load_meta(&self) -> Result<Option<Vec<u8>>, BackendError> {
        Ok(self
            .raft
            .get(META_KEY)
            .map_err(storage)?
            .map(|v| v.to_vec()))
    }

    fn persist(&self) -> Result<(), BackendError> {
        // Segments first: the engine must never be durable with index rows whose records are not.
        self.slot().segments.sync().map_err(storage)?;
        self.db.persist(PersistMode::SyncData).map_err(storage)
    }

    fn snapshot(&self) -> Result<Box<dyn SnapshotChunks>, BackendError> {
        Ok(Box::new(Chunks::new(self)?))
    }

    /// Staged: the chunks go into the inactive slot while the active one stays as it was; one
    /// atomic batch then stores the new meta and makes that slot active. A crash before that
    /// batch leaves the old state and meta (the next open discards the partial slot); after it,
    /// the new ones.
    fn attach_log(&self, files: Arc<dyn queen_ports::LogFiles>) -> Result<(), BackendError> {
        self.log.set(files.clone());
        self.hold_raft_files(&files).map_err(storage)
    }

    fn install_snapshot(
        &self,
        chunks: &mut dyn Iterator<Item = Result<Vec<u8>, BackendError>>,
        meta: Vec<u8>,
    ) -> Result<(), BackendError> {
        let old = self.slot();
        let name = old.name.other();
        self.raft.insert(INSTALLING_KEY, b"1").map_err(storage)?;
        self.db.persist(PersistMode::SyncAll).map_err(storage)?;
        let state = self.keyspaces[name as usize].clone();
        state.clear().map_err(storage)?;
        // Opened with no end: every file left in the slot's directory is deleted.
        let mut segments = Segments::open(
            &self.dir.join(name.segment_dir()),
            self.segment_bytes,
            None,
            &|_| false,
        )
        .map_err(storage)?;
        segments.set_log(self.log.clone());
        segments.clear().map_err(storage)?;
        let dedup = open_dedup(&self.dir, name, &state, self.dedup_mem_entries).map_err(storage)?;
        dedup.clear().map_err(storage)?;
        for chunk in chunks {
            match decode_chunk(&chunk?)? {
                Chunk::Rows(rows) => {
                    let mut batch = self.db.batch().durability(Some(PersistMode::Buffer));
                    for row in rows {
                        batch.insert(&state, row.0, row.1);
                    }
                    batch.commit().map_err(storage)?;
                }
                Chunk::Segment { file, at, bytes } => {
                    segments.write_raw(file, at, &bytes).map_err(storage)?
                }
            }
        }
        let end = state
            .get(messages::END_KEY)
            .map_err(storage)?
            .and_then(|v| messages::decode_end(&v));
        // Fsyncs every file and the directory: they are durable before the batch below.
        segments.reopen(end).map_err(storage)?;
        let new = Slot {
            name,
            state,
            segments: Arc::new(segments),
            dedup_filter: Arc::new(DedupFilter::new()),
            dedup,
            hot: Arc::default(),
        };
        // A snapshot from a node of layout 1 carries messages as rows, one of layout 2 dedup rows.
        self.migrate(&new).map_err(storage)?;
        Self::load_dedup(&new).map_err(storage)?;
        let mut batch = self.db.batch().durability(Some(PersistMode::Buffer));
        batch.insert(&self.raft, META_KEY, meta);
        batch.insert(&self.raft, SLOT_KEY, name.stored());
        batch.remove(&self.raft, INSTALLING_KEY);
        batch.commit().map_err(storage)?;
        self.db.persist(PersistMode::SyncAll).map_err(storage)?;
        self.switch_to(new);
        self.queue_epoch.fetch_add(1, Ordering::Release);
        // The new state keeps nothing in the raft log (a snapshot carries its messages).
        if let Some(log) = self.log.get() {
            self.hold_raft_files(&log).map_err(storage)?;
        }
        // The old slot is garbage now; if this fails the next open or install clears it.
        if let Err(e) = clear_slot(&old) {
            tracing::warn!(target: "queen-store", slot = ?old.name, error = %e, "could not clear the state slot an install replaced; it is cleared at the next start");
        }
        Ok(())
    }
}

/// Empty a slot that is no longer active (its segment files may wait for a pin, see `retire`).
fn clear_slot(slot: &Slot) -> Result<(), BackendError> {
    slot.state.clear().map_err(storage)?;
    slot.dedup.clear().map_err(storage)?;
    slot.segments.retire().map_err(storage)
}
