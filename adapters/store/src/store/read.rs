//! Reads: point gets and scans routed to the engine, the dedup index or the segments, and the
//! `StateRead` of a slot, of the store and of a view; a slot's row writes.

use queen_domain::keys::as_dedup_key;
use queen_domain::keys::table;
use queen_domain::{StateRead, StoreError};

use super::{FjallStore, Slot, StateView, Visit};
use crate::dedup::DedupIndex;
use crate::filter::DedupFilter;
use crate::messages::{self, EngineRead, View, read_err};
use crate::segments::Segments;

/// A point read of the domain's state: message rows from the segment log, dedup rows from the
/// dedup index (those the filter rules out without reading it), the store's own tables hidden.
pub(super) fn routed_get(
    engine: &dyn EngineRead,
    segments: &Segments,
    filter: &DedupFilter,
    dedup: &DedupIndex,
    key: &[u8],
) -> Result<Option<Vec<u8>>, StoreError> {
    match key.first() {
        Some(&table::MESSAGE) => messages::get(engine, segments, key),
        Some(&table::DEDUP_HASH) => dedup_get(engine, filter, dedup, key),
        Some(t) if *t >= table::SEGMENT_INDEX => Ok(None),
        _ => engine.get(key),
    }
}

/// A dedup row: the offsets the index holds under the key whose messages are still stored,
/// which is exactly what the row said when rows were deleted with their messages.
pub(super) fn dedup_get(
    engine: &dyn EngineRead,
    filter: &DedupFilter,
    dedup: &DedupIndex,
    key: &[u8],
) -> Result<Option<Vec<u8>>, StoreError> {
    let Some(k) = as_dedup_key(key) else {
        return Ok(None);
    };
    if filter.surely_absent(key) {
        return Ok(None);
    }
    let pid = u64::from_be_bytes(k[..8].try_into().unwrap_or_default());
    let mut offsets = dedup
        .lookup(&k)
        .map_err(|e| StoreError::Read(e.to_string()))?;
    let mut live = Vec::with_capacity(offsets.len());
    for o in offsets.drain(..) {
        if messages::is_live(engine, pid, o)? {
            live.push(o);
        }
    }
    Ok((!live.is_empty()).then(|| queen_domain::codec::encode(&live)))
}

/// A scan of the domain's state, split at the message table: engine rows before it, the
/// segment log inside it, engine rows after it; the store's own tables are not the domain's.
pub(super) fn routed_scan(
    engine: &dyn EngineRead,
    segments: &Segments,
    start: &[u8],
    end: &[u8],
    visit: &mut Visit<'_>,
) -> Result<(), StoreError> {
    let end = end.min(&[table::SEGMENT_INDEX][..]);
    if start >= end {
        return Ok(());
    }
    let lo: &[u8] = &[table::MESSAGE];
    let hi: &[u8] = &[table::MESSAGE + 1];
    let go = std::cell::Cell::new(true);
    let mut guarded = |k: &[u8], v: &[u8]| {
        let more = visit(k, v);
        go.set(more);
        more
    };
    if start < lo && !visit_engine(engine.range(start, end.min(lo)), &mut guarded)? {
        return Ok(());
    }
    if go.get() && end > lo && start < hi {
        messages::scan(engine, segments, start.max(lo), end.min(hi), &mut guarded)?;
    }
    if go.get() && end > hi {
        visit_engine(engine.range(start.max(hi), end), &mut guarded)?;
    }
    Ok(())
}

/// Visit an engine range; false when the visitor stopped.
pub(super) fn visit_engine(iter: fjall::Iter, visit: &mut Visit<'_>) -> Result<bool, StoreError> {
    for guard in iter {
        let (k, v) = guard.into_inner().map_err(read_err)?;
        if !visit(&k, &v) {
            return Ok(false);
        }
    }
    Ok(true)
}

impl Slot {
    /// Stage engine rows (`Some` puts, `None` removes) in `batch`; dedup rows are added to the
    /// filter first, so a reader that can see a row is never told it is absent.
    pub(crate) fn write_rows(
        &self,
        batch: &mut fjall::OwnedWriteBatch,
        rows: impl IntoIterator<Item = (Vec<u8>, Option<Vec<u8>>)>,
    ) {
        for (k, v) in rows {
            match v {
                Some(v) => {
                    self.dedup_filter.insert(&k);
                    batch.insert(&self.state, k, v);
                }
                None => batch.remove(&self.state, k),
            }
        }
    }
}

impl Slot {
    /// Move the dedup rows into the dedup index (and the filter): those the overlay staged
    /// typed, and any put as bytes into `writes`. A row holds every offset under its key (the
    /// domain adds one to what it read); deletes are dropped: the index answers only offsets
    /// whose message is still stored.
    pub(crate) fn take_dedup_rows(
        &self,
        writes: &mut queen_domain::WriteSet,
        dedup: queen_domain::DedupRows,
    ) -> Result<(), StoreError> {
        let mut entries = Vec::with_capacity(dedup.len());
        for (key, offsets) in dedup {
            let Some(offsets) = offsets else { continue };
            self.dedup_filter.insert_key(&key);
            entries.extend(offsets.into_iter().map(|o| (key, o)));
        }
        let (lo, hi) = ([table::DEDUP_HASH], [table::DEDUP_HASH + 1]);
        if writes
            .range::<[u8], _>((
                std::ops::Bound::Included(&lo[..]),
                std::ops::Bound::Excluded(&hi[..]),
            ))
            .next()
            .is_some()
        {
            let mut after = writes.split_off(&[table::DEDUP_HASH + 1][..]);
            let rows = writes.split_off(&[table::DEDUP_HASH][..]);
            writes.append(&mut after);
            for (k, v) in rows {
                let Some(v) = v else { continue };
                let key = as_dedup_key(&k).ok_or_else(|| StoreError::Corrupt {
                    key: queen_domain::codec::escape(&k),
                    detail: "a dedup key of the wrong length".to_owned(),
                })?;
                let offsets: Vec<u64> = queen_domain::codec::decode(&k, &v)?;
                self.dedup_filter.insert_key(&key);
                entries.extend(offsets.into_iter().map(|o| (key, o)));
            }
        }
        self.dedup.insert_all(entries);
        Ok(())
    }
}

impl StateRead for Slot {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        routed_get(
            &self.state,
            &self.segments,
            &self.dedup_filter,
            &self.dedup,
            key,
        )
    }

    fn scan(&self, start: &[u8], end: &[u8], visit: &mut Visit<'_>) -> Result<(), StoreError> {
        routed_scan(&self.state, &self.segments, start, end, visit)
    }

    fn prefetch_dedup(&self, keys: &[queen_domain::keys::DedupKey]) {
        for k in keys {
            self.dedup_filter.prefetch(k);
        }
    }
}

impl StateRead for FjallStore {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.slot().get(key)
    }

    fn scan(&self, start: &[u8], end: &[u8], visit: &mut Visit<'_>) -> Result<(), StoreError> {
        self.slot().scan(start, end, visit)
    }
}

impl StateRead for StateView {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        routed_get(
            &View(&self.snap, &self.state),
            &self.segments,
            &self.dedup_filter,
            &self.dedup,
            key,
        )
    }

    fn scan(&self, start: &[u8], end: &[u8], visit: &mut Visit<'_>) -> Result<(), StoreError> {
        routed_scan(
            &View(&self.snap, &self.state),
            &self.segments,
            start,
            end,
            visit,
        )
    }
}
