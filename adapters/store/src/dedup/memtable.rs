//! The in-memory table of recent keys: inserts, lookups, and handing its entries over sorted
//! when it is flushed to a run.

use super::{Ent, Key, MemTable, ent, key_of};
use crate::filter::DedupFilter;

impl MemTable {
    pub(super) const CHUNK: usize = 2048;

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
        if self.tail.len() >= Self::CHUNK {
            let mut chunk = std::mem::replace(&mut self.tail, Vec::with_capacity(Self::CHUNK));
            chunk.sort_unstable();
            self.chunks.push(chunk);
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
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        let mut tail = self.tail.clone();
        tail.sort_unstable();
        let lists: Vec<&[Ent]> = self.chunks.iter().map(Vec::as_slice).collect();
        // The heap names a list by its position; the tail comes after the chunks.
        let tail_i = lists.len();
        let mut at = vec![0usize; tail_i];
        let mut tail_at = 0;
        let mut heap = BinaryHeap::with_capacity(tail_i + 1);
        for (i, c) in lists.iter().enumerate() {
            if let Some(e) = c.first() {
                heap.push(Reverse((*e, i)));
            }
        }
        if let Some(e) = tail.first() {
            heap.push(Reverse((*e, tail_i)));
        }
        let mut last: Option<Ent> = None;
        std::iter::from_fn(move || {
            loop {
                let Reverse((e, i)) = heap.pop()?;
                let next = if i == tail_i {
                    tail_at += 1;
                    tail.get(tail_at).copied()
                } else {
                    at[i] += 1;
                    lists[i].get(at[i]).copied()
                };
                if let Some(n) = next {
                    heap.push(Reverse((n, i)));
                }
                if last != Some(e) {
                    last = Some(e);
                    return Some(e);
                }
            }
        })
    }

    /// Put back what [`MemTable::sorted`] gave of a table handed over (a run could not be
    /// written).
    pub(super) fn restore(&mut self, sorted: Vec<Ent>) {
        for e in &sorted {
            self.remember(&key_of(e));
        }
        self.len += sorted.len();
        self.chunks.push(sorted);
    }

    pub(super) fn keys(&self) -> impl Iterator<Item = Key> + '_ {
        self.chunks.iter().flatten().chain(&self.tail).map(key_of)
    }
}
