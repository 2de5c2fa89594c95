//! The state store as the domain sees it: ordered bytes-to-bytes, read through `StateRead`,
//! written through a `Txn` overlay that the caller commits atomically.
//!
//! The node backs `StateRead` with its on-disk engine; tests use `MemStore`. A `Txn` can sit on
//! another `Txn`, which is how one entry's effects are rolled back without touching its batch.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ops::Bound;

use crate::keys::{self, DedupKey};
use crate::model::MessageRecRef;
use crate::time::Stamp;

pub use crate::error::StoreError;

/// Read access to ordered state.
pub trait StateRead {
    /// The value under `key`.
    ///
    /// # Errors
    /// Engine failures.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;

    /// Visit every pair with `start <= key < end` in ascending key order until `visit` returns
    /// `false`.
    ///
    /// # Errors
    /// Engine failures.
    fn scan(
        &self,
        start: &[u8],
        end: &[u8],
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError>;

    /// A hint that the dedup rows of `keys` are about to be read, one after the other: a
    /// store whose reads of them miss its caches may start bringing them in at once. Changes
    /// nothing that is read.
    fn prefetch_dedup(&self, _keys: &[DedupKey]) {}
}

/// Pending writes: `Some(value)` puts, `None` deletes.
pub type WriteSet = BTreeMap<Vec<u8>, Option<Vec<u8>>>;

/// A message appended in an overlay: its stored bytes, or the fields of the pushed item it
/// is, borrowed from the entry being applied. A borrowed one is encoded only when something
/// reads it or a store writes it out; a store that keeps the entry instead of the messages
/// never encodes it at all.
#[derive(Debug, Clone)]
pub enum Appended<'a> {
    /// The stored message's bytes.
    Encoded(Vec<u8>),
    /// The message as pushed.
    Pushed(MessageRecRef<'a>),
}

impl Appended<'_> {
    /// The stored message's bytes.
    #[must_use]
    pub fn bytes(&self) -> Cow<'_, [u8]> {
        match self {
            Appended::Encoded(b) => Cow::Borrowed(b),
            Appended::Pushed(m) => Cow::Owned(m.encode()),
        }
    }

    /// The stamp of the push that stored it (`None`: the bytes are not a message).
    #[must_use]
    pub fn stamp(&self) -> Option<Stamp> {
        match self {
            Appended::Encoded(b) => crate::model::message_stamp(b),
            Appended::Pushed(m) => Some(m.stamp),
        }
    }

    /// The same message with nothing borrowed.
    #[must_use]
    pub fn into_owned(self) -> Appended<'static> {
        match self {
            Appended::Encoded(b) => Appended::Encoded(b),
            Appended::Pushed(m) => Appended::Encoded(m.encode()),
        }
    }
}

/// Messages appended to partitions' logs, by (partition, offset): written once, never
/// overwritten, only ever removed from the front by a later delete. Their rows are
/// `keys::message(pid, offset)`; the map's order is the rows' key order.
pub type Appends<'a> = BTreeMap<(u64, u64), Appended<'a>>;

/// Dedup rows staged in an overlay, by key: the offsets stored under the key (`None`: the row
/// is deleted). Kept apart from the other writes, typed and hashed, because a push reads and
/// writes one per message (in a tree of a batch's rows, its inserts were 7% of a follower's
/// CPU under batch pushes, by `perf`); a scan sorts the few it covers.
pub type DedupRows = std::collections::HashMap<DedupKey, Option<Vec<u64>>, keys::DedupKeyState>;

/// What an overlay staged, in its three kinds.
#[derive(Debug, Default)]
pub struct Parts<'a> {
    /// Puts and deletes of rows (message rows' deletes among them).
    pub writes: WriteSet,
    /// Appended messages.
    pub appends: Appends<'a>,
    /// Dedup rows.
    pub dedup: DedupRows,
    /// Whether a queue was created, configured or deleted (see [`Txn::note_queue_options`]).
    pub queue_options: bool,
}

/// A write overlay on top of a readable state: reads see the overlay's own writes first.
///
/// Appends are kept apart from the other writes: a row appended and deleted in the same
/// overlay is still handed to the store as appended (and then deleted), so that a store that
/// keeps appended rows in a log writes the same log whatever the batch boundaries were.
pub struct Txn<'a> {
    base: &'a dyn StateRead,
    writes: WriteSet,
    appends: Appends<'a>,
    /// Dedup rows written through [`Txn::set_dedup`], `put` or `delete`. A row here is newer
    /// than any of its key in `writes` (where only a put of bytes that are not offsets goes).
    dedup: DedupRows,
    /// Where appended messages came from, when the store asked (see [`Txn::record_origins`]).
    origins: Option<Vec<Origin>>,
    /// A queue was created, configured or deleted.
    queue_options: bool,
    /// Some dedup row is in `writes` (put as bytes that are not offsets).
    dedup_bytes_in_writes: bool,
}

/// An appended message that is item `item` of the push entry being applied, stored at `offset`
/// of partition `pid`: a store that keeps the log's entries can point at the item instead of
/// writing the message again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin {
    /// The partition.
    pub pid: u64,
    /// The message's offset.
    pub offset: u64,
    /// The item's position in the entry's `Command::Push` items.
    pub item: u32,
}

impl<'a> Txn<'a> {
    /// An empty overlay on `base`.
    pub fn new(base: &'a dyn StateRead) -> Self {
        Self {
            base,
            writes: WriteSet::new(),
            appends: Appends::new(),
            dedup: DedupRows::default(),
            origins: None,
            queue_options: false,
            dedup_bytes_in_writes: false,
        }
    }

    /// Note that a queue was created, configured or deleted: what its options say may have
    /// changed (a store tells readers that cache a queue's options, see [`Parts`]).
    pub fn note_queue_options(&mut self) {
        self.queue_options = true;
    }

    /// From now on, note the origin of every message a `Command::Push` entry appends.
    pub fn record_origins(&mut self) {
        self.origins.get_or_insert_with(Vec::new);
    }

    /// The origins noted so far, in the order the messages were appended.
    #[must_use]
    pub fn origins(&self) -> &[Origin] {
        self.origins.as_deref().unwrap_or_default()
    }

    /// Note that the message appended at (`pid`, `offset`) is item `item` of the push entry
    /// being applied.
    pub(crate) fn note_origin(&mut self, pid: u64, offset: u64, item: u32) {
        if let Some(o) = &mut self.origins {
            o.push(Origin { pid, offset, item });
        }
    }

    /// Stage a message appended at `offset` of partition `pid`: the offset must be new (never
    /// stored, never appended before).
    pub fn append(&mut self, pid: u64, offset: u64, message: Appended<'a>) {
        self.appends.insert((pid, offset), message);
    }

    /// The staged writes, appends and dedup rows apart, for a store that keeps appends in a
    /// log and dedup rows in an index of its own. A delete of an appended row is in the writes
    /// (as `None`).
    #[must_use]
    pub fn into_parts(self) -> Parts<'a> {
        Parts {
            writes: self.writes,
            appends: self.appends,
            dedup: self.dedup,
            queue_options: self.queue_options,
        }
    }

    /// [`Txn::into_parts`] with nothing borrowed, for a child overlay whose parent absorbs
    /// them once the child (and its borrow of the parent) is gone.
    #[must_use]
    pub fn into_owned_parts(self) -> Parts<'static> {
        let appends = self
            .appends
            .into_iter()
            .map(|(k, v)| (k, v.into_owned()))
            .collect();
        Parts {
            writes: self.writes,
            appends,
            dedup: self.dedup,
            queue_options: self.queue_options,
        }
    }

    /// Merge a child's parts into this overlay (the child committed).
    pub fn absorb_parts(&mut self, parts: Parts<'static>) {
        self.appends.extend(parts.appends);
        for k in parts.writes.keys() {
            if let Some(d) = keys::as_dedup_key(k) {
                self.dedup.remove(&d);
                self.dedup_bytes_in_writes = true;
            }
        }
        self.writes.extend(parts.writes);
        self.dedup.extend(parts.dedup);
        self.queue_options |= parts.queue_options;
    }

    /// The offsets stored under dedup row `key`, as this overlay sees them.
    ///
    /// # Errors
    /// Store failures; a row that does not hold offsets.
    pub fn dedup_offsets(&self, key: &DedupKey) -> Result<Option<Vec<u64>>, StoreError> {
        if let Some(v) = self.dedup.get(key) {
            return Ok(v.clone());
        }
        // On the stack: this runs for every pushed message.
        let mut row = [0u8; 25];
        row[0] = keys::table::DEDUP_HASH;
        row[1..].copy_from_slice(key);
        // A dedup row sits in `writes` only when it was put as bytes that are not offsets
        // (see `put`); the tree of writes is searched only then (its key comparisons were 5%
        // of a replica's apply under batch pushes, `perf`, examples/apply_cost).
        let staged = if self.dedup_bytes_in_writes {
            self.writes.get(&row[..])
        } else {
            None
        };
        let bytes = match staged {
            Some(v) => v.clone(),
            None => self.base.get(&row)?,
        };
        bytes.map(|b| crate::codec::decode(&row, &b)).transpose()
    }

    /// Room for `n` more dedup rows (a push of `n` items stages one per stored message).
    pub fn reserve_dedup(&mut self, n: usize) {
        self.dedup.reserve(n);
    }

    /// Stage dedup row `key` holding `offsets`.
    pub fn set_dedup(&mut self, key: DedupKey, offsets: Vec<u64>) {
        self.dedup.insert(key, Some(offsets));
    }

    /// Stage a put.
    pub fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        if let Some(d) = keys::as_dedup_key(&key) {
            if let Ok(offsets) = crate::codec::decode::<Vec<u64>>(&key, &value) {
                self.dedup.insert(d, Some(offsets));
                return;
            }
            // Not offsets: kept as bytes, and newer than the typed row it replaces.
            self.dedup.remove(&d);
            self.dedup_bytes_in_writes = true;
        }
        self.writes.insert(key, Some(value));
    }

    /// Stage a delete.
    pub fn delete(&mut self, key: Vec<u8>) {
        if let Some(d) = keys::as_dedup_key(&key) {
            self.dedup.insert(d, None);
            return;
        }
        self.writes.insert(key, None);
    }

    /// The staged writes, appends included as puts, to commit atomically.
    #[must_use]
    pub fn into_writes(self) -> WriteSet {
        let mut all: WriteSet = self
            .appends
            .iter()
            .map(|(&(pid, offset), v)| (keys::message(pid, offset), Some(v.bytes().into_owned())))
            .collect();
        all.extend(self.writes);
        all.extend(
            self.dedup
                .iter()
                .map(|(k, v)| (keys::dedup_row(k), v.as_ref().map(crate::codec::encode))),
        );
        all
    }

    /// Merge a child's writes into this overlay (the child committed).
    pub fn absorb(&mut self, writes: WriteSet) {
        for (k, v) in writes {
            match v {
                Some(v) => self.put(k, v),
                None => self.delete(k),
            }
        }
    }

    /// How many writes and appends are staged.
    #[must_use]
    pub fn len(&self) -> usize {
        self.writes.len() + self.appends.len() + self.dedup.len()
    }

    /// Whether nothing is staged.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty() && self.appends.is_empty() && self.dedup.is_empty()
    }
}

/// The first (partition, offset) whose message row's key is at or after `start`, or `None`
/// when every message row's key is before it. (Approximate for a `start` inside the message
/// table longer than a row's key: the caller still compares keys.)
fn first_message_at(start: &[u8]) -> Option<(u64, u64)> {
    match start.first() {
        None => Some((0, 0)),
        Some(&t) if t < keys::table::MESSAGE => Some((0, 0)),
        Some(&t) if t > keys::table::MESSAGE => None,
        Some(_) => {
            let mut padded = [0u8; 16];
            let tail = &start[1..start.len().min(17)];
            padded[..tail.len()].copy_from_slice(tail);
            let word = |r: std::ops::Range<usize>| {
                u64::from_be_bytes(padded[r].try_into().unwrap_or_default())
            };
            Some((word(0..8), word(8..16)))
        }
    }
}

/// A row of an overlay: key and value (`None`: deleted).
type Row<'s> = (Cow<'s, [u8]>, Option<Cow<'s, [u8]>>);

/// Two ascending streams of rows as one; of a key in both, the second's row is kept when
/// `second_wins`, else the first's.
fn merge_rows<'s>(
    first: impl Iterator<Item = Row<'s>> + 's,
    second: impl Iterator<Item = Row<'s>> + 's,
    second_wins: bool,
) -> impl Iterator<Item = Row<'s>> + 's {
    let mut f = first.peekable();
    let mut s = second.peekable();
    std::iter::from_fn(move || match (f.peek(), s.peek()) {
        (Some(x), Some(y)) => match x.0.cmp(&y.0) {
            std::cmp::Ordering::Less => f.next(),
            std::cmp::Ordering::Greater => s.next(),
            std::cmp::Ordering::Equal if second_wins => {
                f.next();
                s.next()
            }
            std::cmp::Ordering::Equal => {
                s.next();
                f.next()
            }
        },
        (Some(_), None) => f.next(),
        (None, _) => s.next(),
    })
}

/// The overlay's rows in `[start, end)`: writes take precedence over appends of the same key
/// (a delete of an appended message), dedup rows over writes (see [`Txn`]).
fn overlay_range<'s>(
    writes: &'s WriteSet,
    appends: &'s Appends<'_>,
    dedup: &'s DedupRows,
    start: &'s [u8],
    end: &'s [u8],
) -> impl Iterator<Item = Row<'s>> + 's {
    let range = (Bound::Included(start), Bound::Excluded(end));
    let w = writes
        .range::<[u8], _>(range)
        .map(|(k, v)| (Cow::Borrowed(k.as_slice()), v.as_deref().map(Cow::Borrowed)));
    let a = first_message_at(start)
        .into_iter()
        .flat_map(move |from| appends.range(from..))
        .map(|(&(pid, offset), v)| (keys::message(pid, offset), v))
        .skip_while(move |(k, _)| k.as_slice() < start)
        .take_while(move |(k, _)| k.as_slice() < end)
        .map(|(k, v)| (Cow::Owned(k), Some(v.bytes())));
    // The rows in range, sorted; none to look at when the range ends before the table or
    // starts after it.
    let (lo, hi) = ([keys::table::DEDUP_HASH], [keys::table::DEDUP_HASH + 1]);
    let mut d: Vec<(Vec<u8>, &Option<Vec<u64>>)> = if end > &lo[..] && start < &hi[..] {
        dedup
            .iter()
            .map(|(k, v)| (keys::dedup_row(k), v))
            .filter(|(k, _)| k.as_slice() >= start && k.as_slice() < end)
            .collect()
    } else {
        Vec::new()
    };
    d.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let d = d.into_iter().map(|(k, v)| {
        (
            Cow::Owned(k),
            v.as_ref().map(|o| Cow::Owned(crate::codec::encode(o))),
        )
    });
    merge_rows(merge_rows(w, a, false), d, true)
}

impl StateRead for Txn<'_> {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        if let Some(d) = keys::as_dedup_key(key)
            && let Some(v) = self.dedup.get(&d)
        {
            return Ok(v.as_ref().map(crate::codec::encode));
        }
        if let Some(v) = self.writes.get(key) {
            return Ok(v.clone());
        }
        if let Some(at) = keys::message_parts(key)
            && let Some(m) = self.appends.get(&at)
        {
            return Ok(Some(m.bytes().into_owned()));
        }
        self.base.get(key)
    }

    fn prefetch_dedup(&self, keys: &[DedupKey]) {
        self.base.prefetch_dedup(keys);
    }

    fn scan(
        &self,
        start: &[u8],
        end: &[u8],
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        if start >= end {
            return Ok(());
        }
        let mut overlay =
            overlay_range(&self.writes, &self.appends, &self.dedup, start, end).peekable();
        let mut stopped = false;
        self.base.scan(start, end, &mut |k, v| {
            // Emit overlay entries that sort before this base key.
            while let Some((ok, ov)) = overlay.peek() {
                if ok.as_ref() >= k {
                    break;
                }
                if let Some(ov) = ov
                    && !visit(ok, ov)
                {
                    stopped = true;
                    return false;
                }
                overlay.next();
            }
            if let Some((ok, ov)) = overlay.peek()
                && ok.as_ref() == k
            {
                let keep = match ov {
                    Some(ov) => visit(k, ov),
                    None => true,
                };
                overlay.next();
                if !keep {
                    stopped = true;
                }
                return keep;
            }
            if !visit(k, v) {
                stopped = true;
                return false;
            }
            true
        })?;
        if !stopped {
            for (ok, ov) in overlay {
                if let Some(ov) = ov
                    && !visit(&ok, &ov)
                {
                    break;
                }
            }
        }
        Ok(())
    }
}

/// An in-memory ordered store: the reference implementation, used by tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MemStore {
    map: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl MemStore {
    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Apply committed writes.
    pub fn commit(&mut self, writes: WriteSet) {
        for (k, v) in writes {
            match v {
                Some(v) => {
                    self.map.insert(k, v);
                }
                None => {
                    self.map.remove(&k);
                }
            }
        }
    }

    /// Number of keys stored.
    #[must_use]
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether nothing is stored.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

impl StateRead for MemStore {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.map.get(key).cloned())
    }

    fn scan(
        &self,
        start: &[u8],
        end: &[u8],
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        if start >= end {
            return Ok(());
        }
        for (k, v) in self
            .map
            .range::<[u8], _>((Bound::Included(start), Bound::Excluded(end)))
        {
            if !visit(k, v) {
                break;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
