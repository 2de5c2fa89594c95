//! The latest committed values of the few small rows that nearly every applied entry reads: the
//! stamp and the other node-wide counters, queues, partitions by name and by id.
//!
//! These rows are rewritten by every push (a partition's next offset, a queue's count, the
//! stamp), so the engine's memtable holds hundreds of versions of each, and a point read of one
//! searches a skiplist of all of them: 2-6% of a follower's CPU under batch pushes (`perf`,
//! three nodes, `get_rec` under the apply). Apply is the only writer of a slot's rows and runs
//! on one caller at a time, so the values it read or committed last are the rows' values until
//! its next commit: the apply reads them from here and puts what each commit wrote here after
//! the commit succeeded. Nothing else reads this cache (a reader on another thread may see an
//! older view of the engine, which is its own business), and a new slot (open, install) starts
//! with an empty one.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use queen_domain::keys::table;
use queen_domain::{StateRead, StoreError};

use super::Slot;

/// Rows remembered at most; a full cache is emptied and filled again (a node with more queues
/// and partitions than this reads the rest from the engine, as it did without the cache).
const MAX_ROWS: usize = 16_384;

/// Values by key: `None` is a row known to be absent.
#[derive(Default)]
pub(crate) struct HotRows {
    rows: Mutex<HashMap<Vec<u8>, Option<Vec<u8>>>>,
}

/// Whether rows of `key`'s table are kept here.
pub(crate) fn is_hot(key: &[u8]) -> bool {
    matches!(
        key.first(),
        Some(&(table::META | table::QUEUE | table::PARTITION_NAME | table::PARTITION))
    )
}

impl HotRows {
    fn get(&self, key: &[u8]) -> Option<Option<Vec<u8>>> {
        self.rows
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .cloned()
    }

    fn remember(&self, key: &[u8], value: Option<Vec<u8>>) {
        let mut rows = self.rows.lock().unwrap_or_else(PoisonError::into_inner);
        keep(&mut rows, key.to_vec(), value);
    }

    /// What a commit wrote (hot rows only; called after the commit succeeded).
    pub(crate) fn committed(&self, written: Vec<(Vec<u8>, Option<Vec<u8>>)>) {
        if written.is_empty() {
            return;
        }
        let mut rows = self.rows.lock().unwrap_or_else(PoisonError::into_inner);
        for (k, v) in written {
            keep(&mut rows, k, v);
        }
    }

    /// Forget everything (a commit failed: what it read may still be right, but nothing is
    /// kept that a failed write may have touched).
    pub(crate) fn clear(&self) {
        self.rows
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

/// Put a row in, emptying a full cache first (see [`MAX_ROWS`]).
fn keep(rows: &mut HashMap<Vec<u8>, Option<Vec<u8>>>, key: Vec<u8>, value: Option<Vec<u8>>) {
    if rows.len() >= MAX_ROWS && !rows.contains_key(&key) {
        rows.clear();
    }
    rows.insert(key, value);
}

/// The slot as the apply reads it: hot rows from the cache, the rest from the slot.
pub(crate) struct ApplyRead<'a>(pub(crate) &'a Slot);

impl StateRead for ApplyRead<'_> {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        if !is_hot(key) {
            return self.0.get(key);
        }
        if let Some(v) = self.0.hot.get(key) {
            return Ok(v);
        }
        let v = self.0.get(key)?;
        self.0.hot.remember(key, v.clone());
        Ok(v)
    }

    fn scan(
        &self,
        start: &[u8],
        end: &[u8],
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        self.0.scan(start, end, visit)
    }

    fn prefetch_dedup(&self, keys: &[queen_domain::keys::DedupKey]) {
        self.0.prefetch_dedup(keys);
    }
}
