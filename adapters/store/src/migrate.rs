//! Migration of a store in layout 1 (every message an engine row, dedup keyed by the
//! transactionId's text) or 2 (messages in the segment log, dedup rows by hash in the engine)
//! to layout 3 (messages in the segment log, the dedup index in its own files, rebuilt from
//! the segments after the migration).
//!
//! It runs at open, before the node serves anything, in steps that are each one atomic batch
//! (the segment bytes of a step are written before its batch, and cut again at the next open
//! if the batch did not land), so an interrupted migration resumes where it stopped.

use fjall::PersistMode;
use queen_domain::keys::table;
use queen_domain::{Appended, Appends, StoreError, WriteSet};

use crate::messages;
use crate::messages::read_err;
use crate::store::{FjallStore, Slot};

/// A key and its value.
type Pair = (Vec<u8>, Vec<u8>);

/// Rows moved per step.
const STEP_ROWS: usize = 50_000;

impl FjallStore {
    /// The first `STEP_ROWS` engine rows of table `t`.
    fn first_rows(slot: &Slot, t: u8) -> Result<Vec<Pair>, StoreError> {
        let mut rows = Vec::new();
        for g in slot.state.range([t]..[t + 1]) {
            let (k, v) = g.into_inner().map_err(read_err)?;
            rows.push((k.to_vec(), v.to_vec()));
            if rows.len() >= STEP_ROWS {
                break;
            }
        }
        Ok(rows)
    }

    /// Move layout-1 rows of `slot` into layout 2; a no-op on a slot without any.
    pub(crate) fn migrate(&self, slot: &Slot) -> Result<(), StoreError> {
        let fjall_err = |e: fjall::Error| StoreError::Read(e.to_string());
        let mut messages_moved = 0u64;
        loop {
            let rows = Self::first_rows(slot, table::MESSAGE)?;
            if rows.is_empty() {
                break;
            }
            messages_moved += rows.len() as u64;
            let removes: Vec<Vec<u8>> = rows.iter().map(|(k, _)| k.clone()).collect();
            let mut appends = Appends::new();
            for (k, v) in rows {
                let at =
                    queen_domain::keys::message_parts(&k).ok_or_else(|| StoreError::Corrupt {
                        key: queen_domain::codec::escape(&k),
                        detail: "a message key of the wrong length".to_owned(),
                    })?;
                appends.insert(at, Appended::Encoded(v));
            }
            let mut writes = WriteSet::new();
            let staged = messages::stage(&slot.state, &slot.segments, &mut writes, appends, &[])?;
            let mut batch = self.db.batch().durability(Some(PersistMode::Buffer));
            slot.write_rows(
                &mut batch,
                removes.into_iter().map(|k| (k, None)).chain(staged.rows),
            );
            batch.commit().map_err(fjall_err)?;
        }
        // Dedup rows of layouts 1 and 2 go: the dedup index is rebuilt from the segment log
        // (`FjallStore::load_dedup`), which now holds every message.
        let mut dedup_moved = 0u64;
        for t in [table::DEDUP_V1, table::DEDUP_HASH] {
            loop {
                let rows = Self::first_rows(slot, t)?;
                if rows.is_empty() {
                    break;
                }
                dedup_moved += rows.len() as u64;
                let mut batch = self.db.batch().durability(Some(PersistMode::Buffer));
                for (k, _) in rows {
                    batch.remove(&slot.state, k);
                }
                batch.commit().map_err(fjall_err)?;
            }
        }
        // Nothing moved (a store of this layout, or a snapshot from a node of it): nothing to sync.
        if messages_moved + dedup_moved == 0 {
            return Ok(());
        }
        slot.segments
            .sync()
            .map_err(|e| StoreError::Read(e.to_string()))?;
        self.db.persist(PersistMode::SyncAll).map_err(fjall_err)?;
        tracing::info!(target: "queen-store", messages = messages_moved, dedup_rows = dedup_moved, "migrated the state store to layout 3 (messages in segments, the dedup index in its own files)");
        Ok(())
    }
}
