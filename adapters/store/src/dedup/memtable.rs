//! The in-memory table of recent keys: inserts, lookups, and handing its entries over sorted
//! when it is flushed to a run.

use super::{Ent, Key, MemTable, ent, key_of};

impl MemTable {
    pub(super) const CHUNK: usize = 2048;

    pub(super) fn insert(&mut self, key: &Key, offset: u64) {
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
        let k = ent(key, 0);
        let same = |e: &Ent| e[..3] == k[..3];
        for c in &self.chunks {
            let at = c.partition_point(|e| e[..3] < k[..3]);
            out.extend(c[at..].iter().take_while(|e| same(e)).map(|e| e[3]));
        }
        out.extend(self.tail.iter().filter(|e| same(e)).map(|e| e[3]));
    }

    /// Every entry, sorted, without repeats; the table is left empty.
    pub(super) fn take_sorted(&mut self) -> Vec<Ent> {
        let mut all = Vec::with_capacity(self.len);
        for c in self.chunks.drain(..) {
            all.extend(c);
        }
        all.append(&mut self.tail);
        self.len = 0;
        // A stable sort finds the sorted chunks and merges them.
        all.sort();
        all.dedup();
        all
    }

    /// Put back what [`MemTable::take_sorted`] took (a run could not be written).
    pub(super) fn restore(&mut self, sorted: Vec<Ent>) {
        self.len += sorted.len();
        self.chunks.push(sorted);
    }

    pub(super) fn keys(&self) -> impl Iterator<Item = Key> + '_ {
        self.chunks.iter().flatten().chain(&self.tail).map(key_of)
    }
}
