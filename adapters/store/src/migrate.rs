//! Migration of a store in layout 1 (every message an engine row, dedup keyed by the
//! transactionId's text) to layout 2 (messages in the segment log, dedup by hash).
//!
//! It runs at open, before the node serves anything, in steps that are each one atomic batch
//! (the segment bytes of a step are written before its batch, and cut again at the next open
//! if the batch did not land), so an interrupted migration resumes where it stopped.

use fjall::PersistMode;
use queen_domain::keys::{self, table};
use queen_domain::model::DedupRec;
use queen_domain::{Appends, StoreError, WriteSet};

use crate::messages;
use crate::store::{FjallStore, Slot, read_err};

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
            let appends: Appends = rows.into_iter().collect();
            let mut writes = WriteSet::new();
            let staged = messages::stage(&slot.state, &slot.segments, &mut writes, appends)?;
            let mut batch = self.db.batch().durability(Some(PersistMode::Buffer));
            slot.write_rows(
                &mut batch,
                removes.into_iter().map(|k| (k, None)).chain(staged.rows),
            );
            batch.commit().map_err(fjall_err)?;
        }
        let mut dedup_moved = 0u64;
        loop {
            let rows = Self::first_rows(slot, table::DEDUP_V1)?;
            if rows.is_empty() {
                break;
            }
            dedup_moved += rows.len() as u64;
            let mut batch = self.db.batch().durability(Some(PersistMode::Buffer));
            let mut lists: std::collections::BTreeMap<Vec<u8>, Vec<u64>> =
                std::collections::BTreeMap::new();
            for (k, v) in rows {
                batch.remove(&slot.state, k.clone());
                let (Some(pid), Some(txn)) = (
                    keys::u64_at(&k, 1),
                    k.get(9..).and_then(|t| std::str::from_utf8(t).ok()),
                ) else {
                    continue;
                };
                let d: DedupRec = queen_domain::codec::decode(&k, &v)?;
                let key = keys::dedup(pid, txn);
                if !lists.contains_key(&key) {
                    let have: Vec<u64> = match slot.state.get(&key).map_err(read_err)? {
                        Some(b) => queen_domain::codec::decode(&key, &b)?,
                        None => Vec::new(),
                    };
                    lists.insert(key.clone(), have);
                }
                let list = lists.entry(key).or_default();
                if !list.contains(&d.offset) {
                    list.push(d.offset);
                }
            }
            slot.write_rows(
                &mut batch,
                lists
                    .into_iter()
                    .map(|(k, list)| (k, Some(queen_domain::codec::encode(&list)))),
            );
            batch.commit().map_err(fjall_err)?;
        }
        // Nothing moved (a store of this layout, or a snapshot from a node of it): nothing to sync.
        if messages_moved + dedup_moved == 0 {
            return Ok(());
        }
        slot.segments
            .sync()
            .map_err(|e| StoreError::Read(e.to_string()))?;
        self.db.persist(PersistMode::SyncAll).map_err(fjall_err)?;
        tracing::info!(target: "queen-store", messages = messages_moved, dedup_rows = dedup_moved, "migrated the state store to layout 2 (messages in segments)");
        Ok(())
    }
}
