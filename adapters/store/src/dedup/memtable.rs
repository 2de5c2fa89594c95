//! The in-memory table of recent keys: inserts, lookups, and handing its entries over sorted
//! when it is flushed to a run.

use super::merge::Losers;
use super::{Ent, Key, MemTable, ent, key_of};
use crate::filter::DedupFilter;

impl MemTable {
    /// Entries of a sorted chunk: 512 KiB. Writing a table out merges its chunks; with 64
    /// chunks of 2048 entries the merge's reads missed the caches at nearly every entry (more
    /// streams than the hardware prefetches), and the flush thread was 3.5% of all samples
    /// under batch pushes (`perf`, three nodes); with 8 it is 1.0%, and `examples/apply_cost
    /// 20000` (the flush thread included) 0.69-0.75 against 0.76-0.80 µs of CPU per message
    /// (32768 entries measured the same as 16384; 8192 0.76-0.82).
    pub(super) const CHUNK: usize = 16384;

    /// Entries of the unsorted tail before it is sorted into a small chunk; every
    /// `CHUNK / SMALL` small chunks are merged into one chunk. A lookup scans the tail, so the
    /// tail stays short: a duplicate found in a tail of 16,384 would cost tens of µs.
    pub(super) const SMALL: usize = 2048;

    /// Blocks of the table's filter: 2^12 blocks of 64 bytes, 256 KiB (16 bits per key when
    /// the table is full: about 0.5% of absent keys pass).
    const FILTER_BLOCKS_LOG2: u32 = 12;

    fn remember(&mut self, key: &Key) {
        self.filter
            .get_or_insert_with(|| DedupFilter::with_blocks_log2(Self::FILTER_BLOCKS_LOG2))
            .insert_key_owned(key);
    }

    pub(super) fn may_hold(&self, key: &Key) -> bool {
        self.filter.as_ref().is_some_and(|f| f.may_hold_key(key))
    }

    pub(super) fn insert(&mut self, key: &Key, offset: u64) {
        self.remember(key);
        self.tail.push(ent(key, offset));
        self.len += 1;
        if self.tail.len() >= Self::SMALL {
            let mut chunk = std::mem::replace(&mut self.tail, Vec::with_capacity(Self::SMALL));
            chunk.sort_unstable();
            self.chunks.push(chunk);
            self.small += 1;
            if self.small * Self::SMALL >= Self::CHUNK {
                // The small chunks are the last ones, and were just written: merged while
                // they are still in the caches.
                let from = self.chunks.len() - self.small;
                let small: Vec<Vec<Ent>> = self.chunks.drain(from..).collect();
                let mut merged = Vec::with_capacity(Self::CHUNK);
                merged.extend(Losers::new(
                    small.iter().map(|c| c.iter().copied()).collect(),
                ));
                self.chunks.push(merged);
                self.small = 0;
            }
        }
    }

    /// The offsets under `key`, in no order, possibly repeated.
    pub(super) fn lookup(&self, key: &Key, out: &mut Vec<u64>) {
        if !self.may_hold(key) {
            return;
        }
        let k = ent(key, 0);
        let same = |e: &Ent| e[..3] == k[..3];
        for c in &self.chunks {
            let at = c.partition_point(|e| e[..3] < k[..3]);
            out.extend(c[at..].iter().take_while(|e| same(e)).map(|e| e[3]));
        }
        out.extend(self.tail.iter().filter(|e| same(e)).map(|e| e[3]));
    }

    /// Every entry, sorted, without repeats (a table handed over to be written out): a merge
    /// of the sorted chunks and the sorted tail, so that writing a table out does not copy it
    /// (a copy was 4 MiB more at each node's peak while a full table was written).
    pub(super) fn sorted(&self) -> impl Iterator<Item = Ent> + '_ {
        let mut tail = self.tail.clone();
        tail.sort_unstable();
        let lists = self
            .chunks
            .iter()
            .map(|c| List::Chunk(c.iter().copied()))
            .chain([List::Tail(tail.into_iter())])
            .collect();
        let mut last = None;
        Losers::new(lists).filter(move |e| last.replace(*e) != Some(*e))
    }

    /// Put back what [`MemTable::sorted`] gave of a table handed over (a run could not be
    /// written).
    pub(super) fn restore(&mut self, sorted: Vec<Ent>) {
        for e in &sorted {
            self.remember(&key_of(e));
        }
        self.len += sorted.len();
        // Before the small chunks, which stay the last ones.
        self.chunks.insert(0, sorted);
    }

    pub(super) fn keys(&self) -> impl Iterator<Item = Key> + '_ {
        self.chunks.iter().flatten().chain(&self.tail).map(key_of)
    }
}

/// A sorted list of a table: one of its chunks, or its tail sorted.
enum List<'a> {
    Chunk(std::iter::Copied<std::slice::Iter<'a, Ent>>),
    Tail(std::vec::IntoIter<Ent>),
}

impl Iterator for List<'_> {
    type Item = Ent;

    fn next(&mut self) -> Option<Ent> {
        match self {
            List::Chunk(c) => c.next(),
            List::Tail(t) => t.next(),
        }
    }
}
